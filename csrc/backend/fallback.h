// The counted CPU fallback for ops without a lowering rule.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>

namespace tpu::backend {
// Copies the op's tpu tensors to the host, runs PyTorch's CPU kernel, copies results
// back (honouring in-place and out=). Counted per op, warned once per op;
// TPU_FALLBACK=error turns it into an error naming the op.
void run_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                  const std::string& reason = "");

// The dispatcher sends an op here when any argument is on tpu, a Generator included, so
// an op that writes a cpu tensor can arrive: cpu0d.add_(tpu0d), or a cpu random op given
// a tpu Generator (DataLoader(generator=torch.Generator("tpu")) draws its seed so).
// Raises CUDA's error for such a call (a written argument, at `written`, not on tpu),
// before anything is written.
void check_written_on_tpu(c10::ArrayRef<c10::IValue> args, c10::ArrayRef<int> written);
}  // namespace tpu::backend
