// Small building blocks shared by the search, scan, histogram and index_reduce rules.
#pragma once
#include "lowering/helpers.h"

namespace tpu::lowering::search {

// True where x is NaN (false for non-floats), shaped like x.
inline Value is_nan(Builder& b, const Value& x) {
  if (!is_float(x.dtype())) return b.constant(0, DType::Bool, x.shape());
  return b.compare(x, x, ir::Cmp::NE);
}

inline Value land(Builder& b, const Value& x, const Value& y) { return b.binary("stablehlo.and", x, y); }
inline Value lor(Builder& b, const Value& x, const Value& y) { return b.binary("stablehlo.or", x, y); }
inline Value lnot(Builder& b, const Value& x) { return b.unary("stablehlo.not", x); }

// Elements of 1-D `x` at the int64 positions `idx` (any shape); the result is idx-shaped.
inline Value gather_flat(Builder& b, const Value& x, const Value& idx) {
  Shape s1 = idx.shape();
  s1.push_back(1);
  Value i = b.reshape(b.convert(idx, DType::I64), s1);
  return b.gather(x, i, {}, {0}, {0}, idx.rank(), {1}, idx.shape());
}

// Ascending stable sort along dim with NaN last, carrying the original positions.
inline std::vector<Value> sort_nan_last(Builder& b, const Value& x, int64_t dim) {
  Value idx = b.iota(Type{DType::I64, x.shape()}, dim);
  return b.sort({x, idx}, dim, true, [](Builder& r, const std::vector<Value>& a) {
    Value lt = r.compare(a[0], a[1], ir::Cmp::LT);
    if (!is_float(a[0].dtype())) return std::vector<Value>{lt};
    Value nan_after = land(r, lnot(r, is_nan(r, a[0])), is_nan(r, a[1]));
    return std::vector<Value>{lor(r, lt, nan_after)};
  });
}

// x moved so that `dim` is last, and the permutation that undoes it.
inline Value dim_last(Builder& b, const Value& x, int64_t dim) {
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != dim) perm.push_back(d);
  perm.push_back(dim);
  return b.transpose(x, perm);
}

// INT64_MAX has no exact double: made as (-1 >>> 1).
inline Value extreme(Builder& b, DType t, bool high, const Shape& shape = {}) {
  if (high && t == DType::I64) {
    Value m = b.binary("stablehlo.shift_right_logical", b.constant(-1, t), b.constant(1, t));
    return broadcast_to(b, m, shape);
  }
  return b.constant(high ? highest(t) : lowest(t), t, shape);
}

}  // namespace tpu::lowering::search
