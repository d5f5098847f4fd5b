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
}  // namespace tpu::backend
