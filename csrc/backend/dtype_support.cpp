#include "backend/dtype_support.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/TypeProperties.h>
#include <c10/util/Exception.h>

#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tpu::backend {

bool is_limited_support_dtype(c10::ScalarType t) {
  return c10::isFloat8Type(t) || c10::isBarebonesUnsignedType(t);
}

namespace {

// What CPU's kernels run for every dtype (byte moves, and ops that only compare for
// equality): copies, joins, fills, gathers by index, and the functional view copies.
// Read off CPU (notes/s64/parity/cpu_support.py), as PyTorch 2.13 dispatches them.
const std::unordered_set<std::string>& moves() {
  static const std::unordered_set<std::string> ops = {
      "copy", "_to_copy", "clone", "fill", "zero", "cat", "stack", "constant_pad_nd", "repeat", "roll",
      "index", "_unsafe_index", "index_select", "embedding", "where", "masked_select",
      "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter",
      "select_backward", "slice_backward", "diagonal_backward",
      "alias_copy", "as_strided_copy", "diagonal_copy", "expand_copy", "narrow_copy", "permute_copy",
      "split_copy", "split_with_sizes_copy", "squeeze_copy", "t_copy", "transpose_copy", "unbind_copy",
      "unfold_copy", "unsqueeze_copy", "view_copy", "_reshape_copy", "detach_copy", "lift_fresh_copy",
      "empty_like", "full_like", "ones_like", "zeros_like", "new_empty", "new_zeros", "new_ones", "new_full",
      "eq", "ne", "isnan", "equal", "all", "any", "mul",
  };
  return ops;
}

// Byte moves CPU's kernels leave out for these dtypes, which tpu keeps moving bit exact as
// CUDA does: flip_cuda dispatches AT_FLOAT8_TYPES and AT_BAREBONES_UNSIGNED_TYPES; the
// others move opaque bytes there too and were computed here before (test_bit_exact_moves.py).
const std::unordered_set<std::string>& cuda_moves() {
  static const std::unordered_set<std::string> ops = {
      "flip", "gather", "take", "tril", "triu", "scatter", "index_copy", "masked_scatter",
  };
  return ops;
}

// float8 beyond the moves: CPU's abs, its matmuls, eye and index_put (accumulate too).
const std::unordered_set<std::string>& float8_ops() {
  static const std::unordered_set<std::string> ops = {
      "abs", "mm", "addmm", "addbmm", "eye", "_scaled_mm", "_scaled_grouped_mm", "index_put", "_index_put_impl",
      "_unsafe_index_put",
  };
  return ops;
}

// uint16/32/64 beyond the moves: CPU's sums, scans, sort, bit operations and the rounding
// ops (identities), and the float tests. max/min/amax/amin/aminmax are CUDA's: its
// reduction kernels take the unsigned types (ReduceMaxValuesKernel.cu and its siblings)
// where CPU's refuse them; tpu follows CUDA there.
const std::unordered_set<std::string>& unsigned_ops() {
  static const std::unordered_set<std::string> ops = {
      "sum", "nansum", "prod", "cumsum", "cumprod", "logsumexp", "sort", "_unique", "_unique2", "unique_consecutive", "unique_dim",
      "bitwise_and", "bitwise_or", "bitwise_xor", "ceil", "floor", "round", "trunc", "nan_to_num",
      "isclose", "isinf", "isposinf", "isneginf", "isfinite", "signbit",
      "max", "min", "amax", "amin", "aminmax",
      "random.from", "random.to",  // random_(from, to); a plain random_() CPU refuses
  };
  return ops;
}

// The common dtype of a bool-result op's (non-bool) tensor inputs, which CPU's kernel
// dispatches on (and floor_divide's, whose promotion error CPU raises first); raises as
// CPU does where it has no kernel for it.
void refuse_unsupported_inputs(const char* base, c10::ArrayRef<c10::IValue> args) {
  std::vector<at::Tensor> ins;
  for (const c10::IValue& v : args)
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().scalar_type() != c10::kBool)
      ins.push_back(v.toTensor());
  if (ins.empty()) return;
  bool limited = false;
  for (const at::Tensor& t : ins) limited = limited || is_limited_support_dtype(t.scalar_type());
  if (!limited) return;
  refuse_limited_dtype(base, at::native::result_type(ins));  // CPU's promotion error where it has one
}

}  // namespace

void refuse_limited_dtype(const char* op, c10::ScalarType dtype) {
  TORCH_CHECK_NOT_IMPLEMENTED(!is_limited_support_dtype(dtype) || limited_dtype_supported(op, dtype), "\"", op,
                              "\" not implemented for '", dtype, "' (CPU's kernel refuses it too)");
}

bool limited_dtype_supported(const std::string& base, c10::ScalarType dtype) {
  if (moves().count(base) || cuda_moves().count(base)) return true;
  // CPU's isinf (and isfinite, through it) has a float8_e5m2 kernel: the one float8 with infinities.
  if (dtype == c10::ScalarType::Float8_e5m2 && (base == "isinf" || base == "isfinite")) return true;
  if (c10::isFloat8Type(dtype)) return float8_ops().count(base) > 0;
  if (c10::isBarebonesUnsignedType(dtype)) return unsigned_ops().count(base) > 0;
  return true;
}

LimitedDtypeCheck bool_result_dtype_check_for(const std::string& base) {
#define TPU_BOOL_RESULT(op) {#op, [](c10::ArrayRef<c10::IValue> a) { refuse_unsupported_inputs(#op, a); }}
  static const std::unordered_map<std::string, LimitedDtypeCheck> checks = {
      TPU_BOOL_RESULT(lt),          TPU_BOOL_RESULT(le),          TPU_BOOL_RESULT(gt),
      TPU_BOOL_RESULT(ge),          TPU_BOOL_RESULT(logical_and), TPU_BOOL_RESULT(logical_or),
      TPU_BOOL_RESULT(logical_xor), TPU_BOOL_RESULT(logical_not), TPU_BOOL_RESULT(isinf),
      TPU_BOOL_RESULT(isposinf),    TPU_BOOL_RESULT(isneginf),    TPU_BOOL_RESULT(signbit),
      TPU_BOOL_RESULT(isclose),     TPU_BOOL_RESULT(floor_divide),
  };
#undef TPU_BOOL_RESULT
  auto it = checks.find(base);
  return it == checks.end() ? nullptr : it->second;
}

}  // namespace tpu::backend
