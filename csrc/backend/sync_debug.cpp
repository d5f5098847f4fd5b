#include "backend/sync_debug.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace tpu::backend {
namespace {
std::atomic<int> g_mode{0};  // read by every host read: one relaxed load when off
}  // namespace

void set_sync_debug_mode(SyncDebugMode mode) { g_mode.store(static_cast<int>(mode), std::memory_order_relaxed); }

SyncDebugMode sync_debug_mode() { return static_cast<SyncDebugMode>(g_mode.load(std::memory_order_relaxed)); }

void note_synchronizing_op(const char* op) {
  switch (sync_debug_mode()) {
    case SyncDebugMode::Off:
      return;
    case SyncDebugMode::Warn:
      TORCH_WARN("called a synchronizing tpu operation (", op, "): the host waits for device values");
      return;
    case SyncDebugMode::Error:
      TORCH_CHECK(false, "called a synchronizing tpu operation (", op,
                  "): the host would wait for device values (torch.tpu.set_sync_debug_mode)");
  }
}

}  // namespace tpu::backend
