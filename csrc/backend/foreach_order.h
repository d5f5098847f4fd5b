// Foreach ops that one program cannot run, run element by element as CPU's and CUDA's
// per-tensor paths do: in-place ones over lists whose tensors share memory across
// elements (the same tensor twice, views of one tensor), where each element reads what
// the earlier ones wrote (one program would read every input before any write), and any
// over lists spanning several tpu devices (a program runs on one device).
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace tpu::backend {

// Whether a storage written by element k of list `written_arg` is read or written by a
// different element of any list argument.
bool foreach_elements_share_memory(c10::ArrayRef<c10::IValue> args, int written_arg);

// Whether the tensor lists among `args` hold tensors of more than one tpu device.
bool foreach_spans_devices(c10::ArrayRef<c10::IValue> args);

// Runs the op once per element, in order, on one-element lists (other arguments as they
// are), and replaces its `num_args` arguments on the stack with its returns: each
// returned list is the elements' lists joined (an in-place op returns nothing).
void run_foreach_per_element(const c10::OperatorHandle& op, torch::jit::Stack* stack, int num_args);

}  // namespace tpu::backend
