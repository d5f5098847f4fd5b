// How the process heap treats freed memory. On the XLA CPU plugin device memory is host
// memory from malloc, and every execution allocates its outputs and one temporary
// buffer of the program's size anew: with glibc's defaults those come from fresh
// mappings (mmap for large blocks, per-thread arenas whose heaps are given back when
// empty), so each execution page-faults and zero-fills its whole working set again
// (a fused GPT training step: ~30,000 faults, ~13 % of its CPU time).
#pragma once
#include <cstdint>

namespace tpu::runtime {

// The settings applied at load (unless TPU_HOST_HEAP=0): one malloc arena for all
// threads, no mmap'd blocks, and freed memory at the heap's top kept up to
// `kKeepFreeBytes`, so executions reuse the pages earlier ones touched.
constexpr int64_t kKeepFreeBytes = int64_t{1} << 30;

// Whether the settings were applied in this process (false when TPU_HOST_HEAP=0 or
// the C library refused them).
bool host_heap_reuses_memory();

}  // namespace tpu::runtime
