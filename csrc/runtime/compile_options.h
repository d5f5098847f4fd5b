#pragma once
#include <string>
#include <vector>

namespace tpu::runtime {
// A boolean XLA debug option set on top of the compiler's defaults (by name, as in XLA_FLAGS).
struct CompileOverride {
  std::string name;
  bool value;
};
// A serialized xla.CompileOptionsProto for one replica, one partition, portable
// across the client's devices (the device is picked at execute time).
std::string portable_compile_options(const std::vector<CompileOverride>& overrides = {});
}  // namespace tpu::runtime
