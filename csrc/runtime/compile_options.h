#pragma once
#include <cstdint>
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
// What the client knows of a program when it picks its compile options.
struct ProgramTraits {
  int64_t largest_contraction_macs = -1;  // multiply-adds of its largest dot/convolution; -1: unknown
  int64_t largest_tensor_elements = -1;   // elements of its largest tensor; -1: unknown
  bool uses_float8 = false;               // any float8 element type
  bool fused_graph = false;               // a fused or compiled graph of many ops, not one op's program
};

// TPU_CPU_SMALL_PROGRAM_ELEMENTS: on the XLA CPU plugin, a one-op (Fast) program whose
// largest tensor has at most this many elements compiles without XLA:CPU's fusion
// emitters (xla_cpu_use_fusion_emitters off): 35-50 % less compile time, and at these
// sizes no measurable run time lost (larger programs ran 3-15 % slower without them).
// 0 turns it off. Fused and compiled graphs always keep them, and so does a program with
// float8 tensors: without the emitters XLA:CPU turned NaN into -448 when narrowing to
// float8_e4m3fn (tests/test_quantized.py).
int64_t cpu_small_program_elements();

// TPU_CPU_THREADED_MACS: on the XLA CPU plugin, a one-op program whose largest contraction
// has fewer multiply-adds than this runs its matmuls and convolutions on one thread (XLA's
// xla_cpu_multi_thread_eigen off): handing a small one to the thread pool costs more than
// it gains. 0 turns it off. The default is from benchmarks/eigen_threads.py. Fused and
// compiled graphs keep the threaded default: with it off, XLA:CPU emits every small dot
// as its own LLVM-IR GEMM kernel (100-300 ms of compile each; 98 of a 4-micro-step GPT
// step's 153 dots, about half its LLVM time) instead of calling Eigen.
int64_t cpu_threaded_macs();

// `portable`: the executable may run on any of the client's devices (chosen per launch);
// otherwise it is bound to the default assignment (device 0 of one).
std::string portable_compile_options(CompileEffort effort = CompileEffort::Full,
                                     const std::vector<CompileOverride>& overrides = {}, bool portable = true);

}  // namespace tpu::runtime
