// Device activity for torch.profiler (profiler_kineto.cpp): programs launched while a
// Kineto session with PrivateUse1 activities is recording become device events of the
// op that launched them.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/client.h"

namespace tpu::backend {

extern std::atomic<bool> g_device_tracing;  // a session is recording

// Notes a program just launched on `device` producing `outputs` (times it until they
// are ready). Cheap when no session records.
void note_launch(const std::string& name, int device, const std::vector<runtime::BufferPtr>& outputs);

// The op being dispatched on this thread, for a launch another thread makes for it (a
// Strict launch queued behind its compile): 0 when none or no session records.
uint64_t current_correlation();

// Makes `correlation` this thread's op while alive (0: nothing).
class CorrelationScope {
 public:
  explicit CorrelationScope(uint64_t correlation);
  ~CorrelationScope();
  CorrelationScope(const CorrelationScope&) = delete;
  CorrelationScope& operator=(const CorrelationScope&) = delete;

 private:
  bool pushed_;
};

}  // namespace tpu::backend
