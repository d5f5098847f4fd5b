// CPU's dtype support for the dtypes PyTorch gives only "limited support": float8 (all four
// kinds) and uint16/32/64. CPU's kernels run a few ops on them (copies, joins, indexing,
// fills, and a handful of computations); every other kernel raises NotImplementedError
// from its dtype dispatch. Our lowerings would compute anything, so the lowered kernels
// ask here (through integral_refusal_for) and refuse what CPU refuses.
#pragma once
#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace tpu::backend {

// float8_e4m3fn/e5m2/e4m3fnuz/e5m2fnuz, uint16, uint32, uint64.
bool is_limited_support_dtype(c10::ScalarType t);

// Whether an op (by base name: no overload, no trailing _; or by base.overload where
// CPU's support differs between overloads) runs on CPU (or, where named in
// the .cpp, on CUDA) for a `dtype` of limited support: the dtype of its first tensor
// argument, or of a pointwise op's result.
bool limited_dtype_supported(const std::string& base, c10::ScalarType dtype);

// Raises CPU's NotImplementedError where `op` has no CPU kernel for `dtype` of limited
// support (the ops with kernels of their own: nonzero, unique).
void refuse_limited_dtype(const char* op, c10::ScalarType dtype);


// The check of a pointwise op with a bool result (lt, logical_and, isinf, ...), whose CPU
// kernel dispatches on its inputs' dtype, not the result's; nullptr for other ops.
using LimitedDtypeCheck = void (*)(c10::ArrayRef<c10::IValue> args);
LimitedDtypeCheck bool_result_dtype_check_for(const std::string& base);

}  // namespace tpu::backend
