// Building blocks of the elementwise-style rule files (elementwise, activation,
// random): math in the output's math dtype, operands broadcast to the output.
#pragma once
#include <functional>

#include "lowering/helpers.h"

namespace tpu::lowering::ew {

using Vs = std::vector<Value>;
using MapFn = std::function<Value(Builder&, const Vs&)>;

Value cst(Builder& b, const Value& like, double v);                        // constant like `like`
Value op1(Builder& b, const char* op, const Value& x);                     // "exponential" ...
Value op2(Builder& b, const char* op, const Value& x, const Value& y);     // "maximum" ...
Value cmp(Builder& b, const Value& x, const Value& y, ir::Cmp c);
Value cmpk(Builder& b, const Value& x, double k, ir::Cmp c);
// "maximum"/"minimum" with a NaN operand giving NaN, whatever the backend's min/max does
// with NaN (XLA:CPU's fast min/max, and the clamp XLA folds a max/min pair into, drop it).
Value nan_minmax(Builder& b, const Value& x, const Value& y, const char* op);
// f16/bf16 compute in f32; bool arithmetic in i32.
DType math_type(DType t);
// Argument i (Tensor or Scalar) as dtype t broadcast to `shape`.
Value operand(Ctx& ctx, int i, DType t, const Shape& shape);
// fn over arguments `idx` in the output's math dtype, cast to the output dtype.
std::vector<Value> map(Ctx& ctx, const std::vector<int>& idx, const MapFn& fn);
// map with each operand cast to the output dtype first (TensorIterator's common-dtype cast).
std::vector<Value> map_cast(Ctx& ctx, const std::vector<int>& idx, const MapFn& fn);
// erf and erfc, float32 or float64 math (each to its dtype's precision).
Value erf(Builder& b, const Value& x);
Value erfc(Builder& b, const Value& x);
// log1p and expm1, corrected where XLA's are not accurate (float64 log1p, float32 expm1).
Value log1p(Builder& b, const Value& x);
Value expm1(Builder& b, const Value& x);
// erf for f32 math: one rational function, fusible into one loop (elementwise.cpp).
Value erf_rational(Builder& b, const Value& x);

}  // namespace tpu::lowering::ew
