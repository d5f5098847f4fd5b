#pragma once
#include <string>
#include <vector>

namespace tpu::runtime {

// How much the compiler optimizes. Full: the compiler's defaults (fused and compiled
// graphs, always). Fast: asked for one-op programs; it lowers XLA's backend (LLVM)
// optimization only when TPU_OP_OPT_LEVEL >= 0 names the level. Off by default: on the XLA
// CPU plugin -O1 saved 0-15 % of compile time but lost vectorization (a 512x512 add or
// softmax ran 1.5-2x slower), see benchmarks/compile_effort.py.
enum class CompileEffort { Full, Fast };

// TPU_OP_OPT_LEVEL: XLA's backend optimization level for Fast compiles; negative
// (the default): Fast compiles like Full.
int fast_backend_level();

// A serialized xla.CompileOptionsProto for one replica, one partition, portable
// across the client's devices (the device is picked at execute time).
// `overrides`: boolean XLA debug options set over the compiler's defaults (by flag name).
struct CompileOverride {
  std::string name;
  bool value;
};
std::string portable_compile_options(CompileEffort effort = CompileEffort::Full,
                                     const std::vector<CompileOverride>& overrides = {});

}  // namespace tpu::runtime
