// The instruction-set features of the CPU this process runs on. A plugin that generates
// host code (XLA's CPU plugin) compiles for them, so an executable it serialized on one
// machine may use instructions another lacks (AVX-512 on one x86-64, not on the next):
// the on-disk compile cache keys entries by this signature.
#pragma once
#include <string>

namespace tpu::runtime {

// Stable for the process; what the CPU (or an emulator such as valgrind) reports, and on
// x86-64 which register states the OS enables (AVX-512 needs both).
const std::string& host_cpu_signature();

}  // namespace tpu::runtime
