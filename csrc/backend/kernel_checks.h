// Checks CPU's kernels make that PyTorch's meta functions skip: without them a call CPU
// refuses would run on tpu (and cast or read its arguments as it pleases).
#pragma once
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <utility>

namespace tpu::backend {

using KernelCheck = void (*)(c10::ArrayRef<c10::IValue> args);

// The check of an op by its base name (index_put for index_put_ and index_put.out), or
// nullptr; an in-place op whose self CPU checks as its result has its own, by its name
// (addmm_). Runs where a plan is made: the plan key holds what these checks read.
KernelCheck kernel_check_for(const std::string& base);

// Checks of an op's Scalar values, which CPU makes at every call (in its meta function or
// kernel) and the plan key leaves out (Scalars are runtime operands), or nullptr. Run at
// every call, before anything is queued: CPU raises at the call, not at a later read.
KernelCheck value_check_for(const std::string& base);
// The random ops' value checks (random_checks.cpp), which value_check_for includes.
KernelCheck random_value_check_for(const std::string& base);

// The integers an integral dtype holds (bool: 0 and 1; int64's range for the others).
std::pair<int64_t, int64_t> integral_range(c10::ScalarType t);

// Ops whose CPU kernels refuse complex values (their dtype dispatch, which meta functions
// do not check), where our general rules would compute something: the error CPU raises
// (NotImplementedError, or RuntimeError for those CPU checks by hand). `name` is the op's
// name with its overload (max.dim), `base` without it and without a trailing _.
enum class ComplexRefusal { None, NotImplemented, Runtime };
ComplexRefusal complex_refusal_for(const std::string& name, const std::string& base);

// The same for bool and integer inputs: CPU's dtype dispatch of these ops leaves out bool,
// or bool and the integer dtypes it names, where our rules would compute something (or
// fail to compile). Read off the op's first tensor argument, the one CPU dispatches on.
// float8 and uint16/32/64 are refused everywhere CPU's kernels leave them out
// (dtype_support.h), by the same dtype.
ComplexRefusal integral_refusal_for(const std::string& name, const std::string& base, c10::ScalarType dtype);

}  // namespace tpu::backend
