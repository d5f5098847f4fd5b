// torch.tpu.set_sync_debug_mode, as torch.cuda's: an op that makes the host wait for
// device values (a read back to the CPU, an output size that depends on values) warns or
// raises, so a training loop's hidden syncs can be found. Explicit waits
// (torch.tpu.synchronize, events, streams) never count.
#pragma once

namespace tpu::backend {

enum class SyncDebugMode { Off = 0, Warn = 1, Error = 2 };

void set_sync_debug_mode(SyncDebugMode mode);
SyncDebugMode sync_debug_mode();

// Called before such an op reads anything: warns, or raises (touching nothing), naming `op`.
void note_synchronizing_op(const char* op);

}  // namespace tpu::backend
