// PyTorch's C++ meta functions for ops whose active Meta kernel is a Python reference.
#pragma once
#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/operator_name.h>

namespace tpu::backend {

// The C++ (structured) meta function of `name` as a boxed kernel, or nullptr where
// PyTorch has none or the Meta kernel is already C++. Calling it skips the Python
// reference: no interpreter work per new signature, and no torch._dynamo import on a
// process's first op (PyTorch's type-promotion wrapper imports it lazily).
const c10::KernelFunction* cxx_meta_kernel(const c10::OperatorName& name);

}  // namespace tpu::backend
