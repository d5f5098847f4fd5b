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

// Inclusive scan of the associative binary `op` along the last dim of x: pairs are
// combined, their scan found recursively, and the even positions filled in from it
// (the work-efficient form: O(n) work in 2 log2(n) steps).
inline Value inclusive_scan(Builder& b, const Value& x, const std::string& op) {
  int64_t r = x.rank(), n = x.shape().back();
  if (n < 2) return x;
  Shape zero(r, 0), one(r, 1), two(r, 1), lim = x.shape();
  two[r - 1] = 2;
  auto cut = [&](const Value& v, int64_t from, int64_t to, const Shape& step) {
    Shape s0 = zero, s1 = v.shape();
    s0[r - 1] = from;
    s1[r - 1] = to;
    return b.slice(v, s0, s1, step);
  };
  Value pairs = b.binary(op, cut(x, 0, n - 1, two), cut(x, 1, n, two));
  Value odd = inclusive_scan(b, pairs, op);  // positions 1, 3, 5, ...
  int64_t m = odd.shape().back();
  Value rest = b.binary(op, n % 2 ? odd : cut(odd, 0, m - 1, one), cut(x, 2, n, two));  // 2, 4, ...
  Value even = b.concatenate({cut(x, 0, 1, one), rest}, r - 1);
  // Interleaved: even positions from `even`, odd ones from `odd`.
  Shape lo = zero, hi_e = zero, hi_o = zero, in = zero;
  in[r - 1] = 1;
  hi_e[r - 1] = n % 2 ? 0 : 1;
  lo[r - 1] = 1;
  hi_o[r - 1] = n % 2 ? 1 : 0;
  Value fill = b.constant(0, x.dtype());
  Value pe = b.pad(even, fill, zero, hi_e, in), po = b.pad(odd, fill, lo, hi_o, in);
  Value parity = b.binary("stablehlo.remainder", b.iota(Type{DType::I32, x.shape()}, r - 1),
                          b.constant(2, DType::I32, x.shape()));
  return b.select(b.compare(parity, b.constant(0, DType::I32, x.shape()), ir::Cmp::EQ), pe, po);
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
