// p-norm distances: _cdist_forward/_cdist_backward (between the rows of two batched
// matrices; PyTorch routes the matmul form of p = 2 elsewhere) and
// _pdist_forward/_pdist_backward (between the row pairs i < j of one matrix).
#include <cmath>
#include <limits>

#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

static Value kc(Builder& b, const Value& like, double v) { return full_like(b, like, v); }
static Value ab(Builder& b, const Value& x) { return b.unary("stablehlo.abs", x); }
static Value pw(Builder& b, const Value& x, double p) {
  return b.binary("stablehlo.power", x, kc(b, x, p));
}

// ||d||_p over `dim` of the differences d.
static Value pnorm(Builder& b, const Value& d, double p, int64_t dim) {
  if (p == 0) return reduce_sum(b, b.convert(b.compare(d, kc(b, d, 0), Cmp::NE), d.dtype()), {dim});
  if (std::isinf(p)) return reduce_max(b, ab(b, d), {dim});
  if (p == 1) return reduce_sum(b, ab(b, d), {dim});
  if (p == 2) return b.unary("stablehlo.sqrt", reduce_sum(b, mul(b, d, d), {dim}));
  return pw(b, reduce_sum(b, pw(b, ab(b, d), p), {dim}), 1.0 / p);
}

// d dist / d diff, given the distance broadcast like d (PyTorch's cases, 0 where
// the distance is 0).
static Value pnorm_grad(Builder& b, const Value& d, const Value& dist, double p) {
  Value zero = kc(b, d, 0), sign = b.unary("stablehlo.sign", d);
  Value dist0 = b.compare(dist, zero, Cmp::EQ);
  if (p == 0) return zero;
  if (p == 1) return sign;
  if (std::isinf(p)) return mul(b, sign, b.convert(b.compare(ab(b, d), dist, Cmp::EQ), d.dtype()));
  if (p == 2) return b.select(dist0, zero, div(b, d, dist));
  Value r;
  if (p < 2) {
    r = div(b, mul(b, sign, pw(b, ab(b, d), p - 1)), pw(b, dist, p - 1));
    if (p < 1) dist0 = b.binary("stablehlo.or", dist0, b.compare(d, zero, Cmp::EQ));
  } else {
    r = div(b, mul(b, d, pw(b, ab(b, d), p - 2)), pw(b, dist, p - 1));
  }
  return b.select(dist0, zero, r);
}

static void check_p(double p) {
  if (p < 0 || std::isnan(p)) throw Unsupported("negative p");
}

// x1 (..., P, M), x2 (..., R, M) -> (..., P, R). The differences (..., P, R, M)
// are formed whole: the direct (non-matmul) form PyTorch uses here.
TPU_LOWER(cdist_forward, "_cdist_forward") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  double p = ctx.f(2);
  check_p(p);
  Value x1 = ctx.in(0), x2 = ctx.in(1);
  DType t = acc_type(o.dtype);
  int64_t r = static_cast<int64_t>(o.shape.size());  // batch dims + 2
  Shape full = o.shape;
  full.push_back(x1.shape().back());
  auto expand = [&](const Value& x, int64_t skip) {  // (..., N, M) -> full, N at dim r-2 or r-1
    Shape bs(full.begin(), full.end());
    Value xb = broadcast_to(b, b.convert(x, t), [&] {
      Shape s(o.shape.begin(), o.shape.end() - 2);
      s.push_back(x.shape()[x.rank() - 2]);
      s.push_back(x.shape().back());
      return s;
    }());
    std::vector<int64_t> dims;
    for (int64_t i = 0; i < r + 1; ++i)
      if (i != skip) dims.push_back(i);
    return b.broadcast_in_dim(xb, bs, dims);
  };
  Value d = sub(b, expand(x1, r - 1), expand(x2, r - 2));
  return {b.convert(pnorm(b, d, p, r), o.dtype)};
}

// grad (..., P, R), x1 (..., P, M), x2 (..., R, M), cdist (..., P, R) -> d x1.
TPU_LOWER(cdist_backward, "_cdist_backward") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  double p = ctx.f(3);
  check_p(p);
  DType t = acc_type(o.dtype);
  Value g = b.convert(ctx.in(0), t), x1 = b.convert(ctx.in(1), t), x2 = b.convert(ctx.in(2), t);
  Value dist = b.convert(ctx.in(4), t);
  if (x1.rank() != x2.rank() || x1.shape().size() != g.shape().size()) throw Unsupported("cdist_backward broadcast");
  int64_t r = g.rank();
  Shape full = g.shape();
  full.push_back(x1.shape().back());
  std::vector<int64_t> d1, d2, dg;
  for (int64_t i = 0; i < r + 1; ++i) {
    if (i != r - 1) d1.push_back(i);
    if (i != r - 2) d2.push_back(i);
    if (i != r) dg.push_back(i);
  }
  for (int64_t i = 0; i < r - 2; ++i)
    if (x1.shape()[i] != g.shape()[i] || x2.shape()[i] != g.shape()[i]) throw Unsupported("cdist_backward broadcast");
  Value d = sub(b, b.broadcast_in_dim(x1, full, d1), b.broadcast_in_dim(x2, full, d2));
  Value c = pnorm_grad(b, d, b.broadcast_in_dim(dist, full, dg), p);
  Value gx = reduce_sum(b, mul(b, c, b.broadcast_in_dim(g, full, dg)), {r - 1});
  return {b.convert(gx, o.dtype)};
}

// Row index pairs (i, j), i < j, in row-major order, as two constant vectors.
static std::pair<Value, Value> pairs(Builder& b, int64_t n) {
  std::string is, js;
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j, ++k) {
      is += (k ? ", " : "") + std::to_string(i);
      js += (k ? ", " : "") + std::to_string(j);
    }
  Type t{DType::I64, {k, 1}};
  auto cst = [&](const std::string& v) {
    return b.raw("stablehlo.constant", {}, "value = dense<[" + v + "]> : tensor<" + std::to_string(k) + "xi64>",
                 Type{DType::I64, {k}});
  };
  return {b.reshape(cst(is), t.shape), b.reshape(cst(js), t.shape)};
}

static Value rows(Builder& b, const Value& x, const Value& idx) {
  int64_t k = idx.shape()[0], m = x.shape()[1];
  return b.gather(x, idx, {1}, {0}, {0}, 1, {1, m}, {k, m});
}

TPU_LOWER(pdist_forward, "_pdist_forward") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  double p = ctx.f(1);
  check_p(p);
  Value x = b.convert(ctx.in(0), acc_type(o.dtype));
  if (x.rank() != 2) throw Unsupported("pdist of a non-matrix");
  if (x.shape()[0] < 2) return {b.constant(0, o.dtype, o.shape)};  // no pairs: empty
  auto [i, j] = pairs(b, x.shape()[0]);
  return {b.convert(pnorm(b, sub(b, rows(b, x, i), rows(b, x, j)), p, 1), o.dtype)};
}

// grad (K), self (N, M), p, pdist (K): each pair's gradient added to row i and
// subtracted from row j.
TPU_LOWER(pdist_backward, "_pdist_backward") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  double p = ctx.f(2);
  check_p(p);
  DType t = acc_type(o.dtype);
  Value g = b.convert(ctx.in(0), t), x = b.convert(ctx.in(1), t), dist = b.convert(ctx.in(3), t);
  if (x.rank() != 2) throw Unsupported("pdist of a non-matrix");
  if (x.shape()[0] < 2 || x.shape()[1] == 0) return {b.constant(0, o.dtype, o.shape)};
  auto [i, j] = pairs(b, x.shape()[0]);
  Value d = sub(b, rows(b, x, i), rows(b, x, j));
  const Shape& ks = d.shape();
  Value c = mul(b, pnorm_grad(b, d, b.broadcast_in_dim(dist, ks, {0}), p), b.broadcast_in_dim(g, ks, {0}));
  auto sum = [](Builder& b, const std::vector<Value>& a) { return std::vector<Value>{add(b, a[0], a[1])}; };
  Value acc = b.scatter(b.constant(0, t, x.shape()), i, c, {1}, {0}, {0}, 1, sum);
  acc = b.scatter(acc, j, b.unary("stablehlo.negate", c), {1}, {0}, {0}, 1, sum);
  return {b.convert(acc, o.dtype)};
}

}  // namespace tpu::lowering
