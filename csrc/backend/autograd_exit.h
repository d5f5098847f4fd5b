// At exit: autograd's tpu worker threads must be done with their last backward before
// Python finalizes (see autograd_exit.cpp).
#pragma once

namespace tpu::backend {

// Waits, at most a few seconds, until each tpu device's autograd thread released what its
// last backward held. Call without the GIL.
void settle_autograd_threads();

}  // namespace tpu::backend
