#pragma once
#include <string>

namespace tpu::runtime {
// A serialized xla.CompileOptionsProto for one replica, one partition, portable
// across the client's devices (the device is picked at execute time).
std::string portable_compile_options();
}  // namespace tpu::runtime
