// torch.tpu.memory._record_memory_history / _snapshot, as torch.cuda.memory's: while
// recording, each tpu storage made or freed is an entry (its size, the Python stack that
// made it), and a snapshot lists the live storages recorded and the trace of entries, in
// the format PyTorch's memory visualizer reads.
#pragma once
#include <atomic>
#include <cstdint>

#include <pybind11/pybind11.h>

namespace tpu::backend {

struct StorageData;

extern std::atomic<bool> g_memory_history_on;
// A storage of `bytes` made (bytes > 0) or freed (bytes < 0).
void record_storage_event(const StorageData* s, int64_t bytes);
void bind_memory_history(pybind11::module_& m);

}  // namespace tpu::backend
