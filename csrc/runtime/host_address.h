// Host addresses of device buffers, for plugins whose device memory is this process's
// host memory. Decided from what the plugin reports, never from its name: a buffer made
// over a host array with zero-copy semantics (kImmutableZeroCopy) whose address
// (PJRT_Buffer_UnsafePointer) is that array's address lives in host memory, so this
// device's buffers do. Plugins that copy the array, or lack UnsafePointer, say no.
#pragma once
#include "runtime/client.h"

namespace tpu::runtime {

// Probed once per device (thread-safe).
bool buffers_in_host_memory(Client& client, int device);

// The host address of `b`'s bytes (dense, row-major), once the program writing it has
// finished (waits); null where buffers_in_host_memory() is false. Valid while `b` lives;
// the bytes must only be read (buffers are immutable: programs may alias or cache them).
const void* host_address(Client& client, const Buffer& b);

// The same address, for a caller that may write the bytes in place: one that holds `b`'s
// only reference and knows that no launched program, transfer or other holder can read
// them meanwhile (as a donation would consume the buffer). Null where host_address is.
void* writable_host_address(Client& client, const Buffer& b);

}  // namespace tpu::runtime
