// In-place foreach ops over lists whose tensors share memory across elements (the same
// tensor twice, views of one tensor): CPU's per-tensor path runs the elements in order,
// each reading what the earlier ones wrote. One program over the whole list would read
// every element's inputs before any write.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace tpu::backend {

// Whether a storage written by element k of list `written_arg` is read or written by a
// different element of any list argument.
bool foreach_elements_share_memory(c10::ArrayRef<c10::IValue> args, int written_arg);

// Runs the op once per element, in order, on one-element lists (other arguments as they
// are), and consumes its `num_args` arguments from the stack (the op returns nothing).
void run_foreach_per_element(const c10::OperatorHandle& op, torch::jit::Stack* stack, int num_args);

}  // namespace tpu::backend
