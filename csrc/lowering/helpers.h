// Small building blocks shared by lowering rules.
#pragma once
#include "lowering/registry.h"

namespace tpu::lowering {

// PyTorch's type promotion between two dtypes (no scalar rules).
DType promote(DType a, DType b);
// PyTorch's result_type over operands: tensors with dims outrank 0-dim ones, which
// can only raise the category (bool < integer < float).
DType result_type(const std::vector<Value>& xs);
// Numpy-style broadcast of two shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Whether two shapes broadcast together, and whether `from` expands to `to` (PyTorch's
// is_expandable_to: no more dims, each 1 or equal).
bool broadcastable(const Shape& a, const Shape& b);
bool expandable(const Shape& from, const Shape& to);
// `x` broadcast (right-aligned) to `shape`; leading size-1 dims beyond its rank are
// dropped, any other excess is an internal error.
Value broadcast_to(Builder& b, const Value& x, const Shape& shape);
// `x` converted to `t`, as PyTorch casts (also from/to fp8, which Builder::convert and
// Builder::constant do not cover alone).
Value convert_any(Builder& b, const Value& x, DType t);
// A constant of any dtype (fp8 included) filling `shape`.
Value constant_any(Builder& b, double v, DType t, const Shape& shape = {});
// `x` converted to `t` and broadcast to `shape`.
Value coerce(Builder& b, const Value& x, DType t, const Shape& shape);
// Normalizes a possibly negative dim.
int64_t wrap_dim(int64_t d, int64_t rank);
// A shape as PyTorch's messages print it: [2, 3].
std::string shape_text(const Shape& s);
// Dims argument of a reduction (empty or absent: all dims), normalized and sorted.
std::vector<int64_t> reduce_dims(const std::vector<int64_t>& dims, int64_t rank);
// Constant shaped and typed like `like`.
Value full_like(Builder& b, const Value& like, double v);
// Re-inserts size-1 dims at `dims` (sorted) into a reduced value: keepdim.
Value keep_dims(Builder& b, const Value& reduced, const Shape& in_shape,
                const std::vector<int64_t>& dims);
// Sum / max / min over dims.
Value reduce_sum(Builder& b, const Value& x, const std::vector<int64_t>& dims);
Value reduce_max(Builder& b, const Value& x, const std::vector<int64_t>& dims);
Value reduce_min(Builder& b, const Value& x, const std::vector<int64_t>& dims);
// True (a bool scalar) when every element of integer `idx` lies in [lo, hi).
Value all_in_range(Builder& b, const Value& idx, int64_t lo, int64_t hi);
// ctx.check(all_in_range(...), message), failed at once where no index fits (hi <= lo).
void check_in_range(Ctx& ctx, const Value& idx, int64_t lo, int64_t hi, const std::string& message);
// True (a bool scalar) when every element of bool `pred` is true (NaN tests fail).
Value all_true(Builder& b, const Value& pred);
// The one element of float or integer x where `mask` holds along `dim` (reduced away),
// bit-exact: an OR of the bits with zeros elsewhere keeps NaN and -0.0 (a masked max lost
// NaN to its fill value on the CPU plugin). Zero where the mask holds nowhere.
Value masked_pick(Builder& b, const Value& x, const Value& mask, int64_t dim);
// Rejects (NotImplementedError, as CPU's kernels) a tensor argument that is not float
// or complex, for ops CPU implements for floating types only.
void require_float(Ctx& ctx, int arg, const char* what);
// Lowest / highest value of a dtype (-inf/inf for floats).
double lowest(DType t);
double highest(DType t);
// Type used to accumulate reductions of `t` (f32 for f16/bf16, like CPU/CUDA).
DType acc_type(DType t);
// Elementwise binary op name helpers.
Value add(Builder& b, const Value& x, const Value& y);
Value sub(Builder& b, const Value& x, const Value& y);
Value mul(Builder& b, const Value& x, const Value& y);
Value div(Builder& b, const Value& x, const Value& y);
// x / n correctly rounded, as CPU divides a sum by its count: XLA turns a division by a
// literal into a product with its reciprocal (60000 averaged over 1000 elements gives
// 60000.0039), so n is a runtime operand (Builder::number), a power of two too.
// Complex x keeps the literal: CPU's complex division scales by 1/n too.
Value div_count(Builder& b, const Value& x, double n);
// x (f32/f64) rounded to bf16 or f16 and kept in its dtype, as one op XLA keeps (it may
// drop a convert pair as excess precision).
Value reduce_precision(Builder& b, const Value& x, DType t);
// x * y (f32/f64) rounded on its own: XLA:CPU contracts a product that feeds a sum into
// one fused multiply-add (rounded once). The product's bits pass through an xor with a
// runtime 0 (Builder::number), which neither XLA nor LLVM can see through.
Value mul_uncontracted(Builder& b, const Value& x, const Value& y);
// `c`, made from literals only (a divisor), hidden from XLA's folding as c * (runtime 1).
Value opaque(Builder& b, const Value& c);
// Matrix product of 2-D values with f32 accumulation for low-precision inputs, exact
// in f32 whatever the matmul precision (its users spell sums as products).
Value matmul2d(Builder& b, const Value& x, const Value& y, DType out);
// |z| of complex z (a real value) like C's hypot: inf if a part is infinite, else NaN
// if a part is NaN (XLA's complex abs drops a NaN part).
Value complex_magnitude(Builder& b, const Value& z);
// |z|^2 = re^2 + im^2 of complex z, real.
Value complex_abs_squared(Builder& b, const Value& z);

}  // namespace tpu::lowering
