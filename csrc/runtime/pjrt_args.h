// A PJRT C API argument struct, zeroed and with its struct_size set: every call's
// arguments start this way (the size tells the plugin which fields the caller knows).
#pragma once
#include <cstddef>
#include <cstring>

namespace tpu::runtime {

template <typename T>
T make_args(size_t size) {
  T a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = size;
  return a;
}

}  // namespace tpu::runtime

#define ARGS(T) ::tpu::runtime::make_args<T>(T##_STRUCT_SIZE)
