// Householder QR with LAPACK's conventions (geqrf: reflectors H = I - tau v v^T with
// v[0] = 1 stored below R's diagonal, beta = -sign(alpha) * norm), the product of the
// reflectors (orgqr / householder_product), their application (ormqr) and linalg_qr.
// StableHLO has no factorization op: one while-loop step per reflector, on matrices
// flattened to (B, m, n).
#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

// Shared with linalg_eigen.cpp, which declares them too (SVD completes U with a QR).
void check_decomp_float(DType t);
Value to_batch3(Builder& b, const Value& x);                       // (*, m, n) -> (B, m, n)
Value eye3(Builder& b, DType t, int64_t batch, int64_t m, int64_t n);
Value idx_const(Builder& b, int64_t v);                            // an i64 scalar
std::pair<Value, Value> householder_qr(Builder& b, const Value& a);  // (B,m,n) -> (a, tau (B,k))
// from_identity: c is the identity, so H_i only touches columns >= i (as LAPACK's orgqr).
Value apply_householder(Builder& b, const Value& vs, const Value& tau, const Value& c, bool left,
                        bool transpose, bool from_identity = false);

void check_decomp_float(DType t) {
  if (t != DType::F32 && t != DType::F64) throw Unsupported("decomposition of this dtype");
}

Value to_batch3(Builder& b, const Value& x) {
  int64_t r = x.rank(), m = x.shape()[r - 2], n = x.shape()[r - 1], batch = 1;
  for (int64_t i = 0; i < r - 2; ++i) batch *= x.shape()[i];
  return b.reshape(x, {batch, m, n});
}

Value eye3(Builder& b, DType t, int64_t batch, int64_t m, int64_t n) {
  Type it{DType::I64, {batch, m, n}};
  return b.convert(b.compare(b.iota(it, 1), b.iota(it, 2), Cmp::EQ), t);
}

Value idx_const(Builder& b, int64_t v) { return b.constant(static_cast<double>(v), DType::I64); }

// A scalar (or (B)-shaped) value broadcast over `shape` along the leading dims.
static Value spread(Builder& b, const Value& x, const Shape& shape) {
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x.rank(); ++i) dims.push_back(i);
  return b.broadcast_in_dim(x, shape, dims);
}

// Reflector i as a column (B, rows, 1): zeros above row i, 1 at row i, stored entries below.
static Value reflector(Builder& b, const Value& vs, const Value& i) {
  int64_t batch = vs.shape()[0], rows = vs.shape()[1];
  Value z = idx_const(b, 0);
  Value col = b.dynamic_slice(vs, {z, z, i}, {batch, rows, 1});
  Type it{DType::I64, col.shape()};
  Value row = b.iota(it, 1), at = spread(b, i, col.shape());
  Value v = b.select(b.compare(row, at, Cmp::GT), col, full_like(b, col, 0));
  return b.select(b.compare(row, at, Cmp::EQ), full_like(b, col, 1), v);
}

std::pair<Value, Value> householder_qr(Builder& b, const Value& a) {
  int64_t batch = a.shape()[0], m = a.shape()[1], n = a.shape()[2], k = std::min(m, n);
  DType t = a.dtype();
  Value tau0 = b.constant(0, t, {batch, k});
  auto out = b.while_loop(
      {idx_const(b, 0), a, tau0},
      [&](Builder& bb, const std::vector<Value>& s) {
        return std::vector<Value>{bb.compare(s[0], idx_const(bb, k), Cmp::LT)};
      },
      [&](Builder& bb, const std::vector<Value>& s) {
        Value j = s[0], x = s[1], z = idx_const(bb, 0);
        Shape cs{batch, m, 1}, ss{batch, 1, 1};
        Value col = bb.dynamic_slice(x, {z, z, j}, cs);
        Type ct{DType::I64, cs};
        Value row = bb.iota(ct, 1), jc = spread(bb, j, cs);
        Value below = bb.compare(row, jc, Cmp::GT), at = bb.compare(row, jc, Cmp::EQ);
        Value zero = full_like(bb, col, 0);
        Value alpha = bb.reshape(reduce_sum(bb, bb.select(at, col, zero), {1}), ss);
        Value xn2 = bb.reshape(reduce_sum(bb, bb.select(below, mul(bb, col, col), zero), {1}), ss);
        Value norm = bb.unary("stablehlo.sqrt", add(bb, mul(bb, alpha, alpha), xn2));
        Value zs = full_like(bb, alpha, 0);
        Value beta = bb.select(bb.compare(alpha, zs, Cmp::GE), bb.unary("stablehlo.negate", norm), norm);
        Value trivial = bb.compare(xn2, zs, Cmp::EQ);  // H = I (tau 0), R's entry stays alpha
        Value one = full_like(bb, alpha, 1);
        Value safe_beta = bb.select(trivial, one, beta);
        Value tau = bb.select(trivial, zs, div(bb, sub(bb, safe_beta, alpha), safe_beta));
        Value scale = div(bb, one, bb.select(trivial, one, sub(bb, alpha, safe_beta)));
        Value v = bb.select(at, full_like(bb, col, 1),
                            bb.select(below, mul(bb, col, broadcast_to(bb, scale, cs)), zero));
        // Columns right of j: x - tau v (v^T x).
        Value w = bb.dot_general(v, x, {0}, {0}, {1}, {1}, t, ir::DotPrecision::Highest);  // (B, 1, n)
        Shape full{batch, m, n};
        Value upd = sub(bb, x, mul(bb, broadcast_to(bb, mul(bb, v, broadcast_to(bb, tau, cs)), full),
                                   broadcast_to(bb, w, full)));
        Type ft{DType::I64, full};
        Value rr = bb.iota(ft, 1), cc = bb.iota(ft, 2), jf = spread(bb, j, full);
        // Only A(j:, j+1:) changes, as in LAPACK (NaN elsewhere must not spread).
        Value y = bb.select(bb.binary("stablehlo.and", bb.compare(cc, jf, Cmp::GT), bb.compare(rr, jf, Cmp::GE)),
                            upd, x);
        // Column j: beta on the diagonal, v's tail below it.
        Value colj = bb.compare(cc, jf, Cmp::EQ);
        Value newcol = bb.select(at, broadcast_to(bb, bb.select(trivial, alpha, beta), cs),
                                 bb.select(below, v, col));
        y = bb.select(colj, broadcast_to(bb, newcol, full), y);
        Value taus = bb.dynamic_update_slice(s[2], bb.reshape(tau, {batch, 1}), {z, j});
        return std::vector<Value>{add(bb, j, idx_const(bb, 1)), y, taus};
      });
  return {out[1], out[2]};
}

Value apply_householder(Builder& b, const Value& vs, const Value& tau, const Value& c, bool left,
                        bool transpose, bool from_identity) {
  int64_t k = tau.shape()[1];
  if (k == 0) return c;  // no reflectors (tau's dynamic_slice would not even type-check)
  // Q = H_0 ... H_{k-1}: Q C and C Q^T apply the last reflector first.
  bool forward = left == transpose;
  auto out = b.while_loop(
      {idx_const(b, 0), c},
      [&](Builder& bb, const std::vector<Value>& s) {
        return std::vector<Value>{bb.compare(s[0], idx_const(bb, k), Cmp::LT)};
      },
      [&](Builder& bb, const std::vector<Value>& s) {
        Value i = forward ? s[0] : sub(bb, idx_const(bb, k - 1), s[0]);
        Value x = s[1], z = idx_const(bb, 0);
        Value v = reflector(bb, vs, i);  // (B, r, 1)
        Value ti = bb.dynamic_slice(tau, {z, i}, {tau.shape()[0], 1});
        Shape full = x.shape();
        Value y;
        if (left) {
          Value w = bb.dot_general(v, x, {0}, {0}, {1}, {1}, x.dtype(), ir::DotPrecision::Highest);  // (B, 1, n)
          Value tv = mul(bb, v, broadcast_to(bb, bb.reshape(ti, {full[0], 1, 1}), v.shape()));
          y = sub(bb, x, mul(bb, broadcast_to(bb, tv, full), broadcast_to(bb, w, full)));
        } else {
          Value w = bb.dot_general(x, v, {0}, {0}, {2}, {1}, x.dtype(), ir::DotPrecision::Highest);  // (B, m, 1)
          Value vt = bb.reshape(v, {full[0], 1, full[2]});
          Value tv = mul(bb, vt, broadcast_to(bb, bb.reshape(ti, {full[0], 1, 1}), vt.shape()));
          y = sub(bb, x, mul(bb, broadcast_to(bb, w, full), broadcast_to(bb, tv, full)));
        }
        // H_i changes rows i: (left) or columns i: (right) only, as in LAPACK.
        Type ft{DType::I64, full};
        Value ib = bb.broadcast_in_dim(i, full, {});
        Value touched = bb.compare(bb.iota(ft, left ? 1 : 2), ib, Cmp::GE);
        if (from_identity) touched = bb.binary("stablehlo.and", touched, bb.compare(bb.iota(ft, 2), ib, Cmp::GE));
        y = bb.select(touched, y, x);
        return std::vector<Value>{add(bb, s[0], idx_const(bb, 1)), y};
      });
  return out[1];
}

// Upper triangle of (B, r, c), the rest zero.
static Value upper(Builder& b, const Value& x) {
  Type it{DType::I64, x.shape()};
  return b.select(b.compare(b.iota(it, 2), b.iota(it, 1), Cmp::GE), x, full_like(b, x, 0));
}

static Shape batch_dims(const Type& t) { return Shape(t.shape.begin(), t.shape.end() - 2); }

// x (*, r, c) broadcast to batch + [r, c], flattened to (B, r, c).
static Value batch3(Builder& b, const Value& x, const Shape& batch) {
  Shape s = batch;
  s.push_back(x.shape()[x.rank() - 2]);
  s.push_back(x.shape().back());
  return to_batch3(b, broadcast_to(b, x, s));
}

// geqrf(A) -> (a, tau).
TPU_LOWER(geqrf, "geqrf") {
  Builder& b = ctx.b;
  Value a = ctx.in(0);
  check_decomp_float(a.dtype());
  if (ctx.out(0).numel() == 0) return {a, b.constant(0, a.dtype(), ctx.out(1).shape)};
  auto [f, tau] = householder_qr(b, to_batch3(b, a));
  return {b.reshape(f, ctx.out(0).shape), b.reshape(tau, ctx.out(1).shape)};
}

// linalg_qr(A, mode): reduced (Q m x k, R k x n), complete (Q m x m, R m x n), r (R only).
TPU_LOWER(linalg_qr, "linalg_qr") {
  Builder& b = ctx.b;
  Value a = ctx.in(0);
  check_decomp_float(a.dtype());
  std::string mode = ctx.is_none(1) ? "reduced" : ctx.str(1);
  Type qo = ctx.out(0), ro = ctx.out(1);
  int64_t m = a.shape()[a.rank() - 2], n = a.shape().back(), k = std::min(m, n);
  Value a3 = to_batch3(b, a);
  int64_t batch = a3.shape()[0];
  int64_t qc = mode == "complete" ? m : k, rr = mode == "complete" ? m : k;
  if (a.type.numel() == 0) {
    Value q = mode == "r" ? b.constant(0, qo.dtype, qo.shape)
                          : b.reshape(eye3(b, a.dtype(), batch, m, qc), qo.shape);
    return {q, b.constant(0, ro.dtype, ro.shape)};
  }
  auto [f, tau] = householder_qr(b, a3);
  Value r = upper(b, b.slice(f, {0, 0, 0}, {batch, rr, n}, {1, 1, 1}));
  Value q = mode == "r" ? b.constant(0, qo.dtype, qo.shape)
                        : b.reshape(apply_householder(b, f, tau, eye3(b, a.dtype(), batch, m, qc),
                                                      true, false, true),
                                    qo.shape);
  return {q, b.reshape(r, ro.shape)};
}

// linalg_householder_product(A (m x n), tau (k)): the first n columns of H_0 ... H_{k-1}.
TPU_LOWER(linalg_householder_product, "linalg_householder_product") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  check_decomp_float(o.dtype);
  if (o.numel() == 0) return {b.constant(0, o.dtype, o.shape)};
  Shape batch = batch_dims(o);
  int64_t m = o.shape[o.rank() - 2], n = o.shape.back();
  Value vs = batch3(b, b.convert(ctx.in(0), o.dtype), batch);
  Value tau = b.convert(ctx.in(1), o.dtype);
  Shape ts = batch;
  ts.push_back(tau.shape().back());
  tau = broadcast_to(b, tau, ts);
  tau = b.reshape(tau, {vs.shape()[0], ts.back()});
  Value q = apply_householder(b, vs, tau, eye3(b, o.dtype, vs.shape()[0], m, n), true, false, true);
  return {b.reshape(q, o.shape)};
}

// ormqr(A, tau, C, left, transpose): Q C, Q^T C, C Q or C Q^T with Q from geqrf's A and tau.
TPU_LOWER(ormqr, "ormqr") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  check_decomp_float(o.dtype);
  if (o.numel() == 0) return {b.constant(0, o.dtype, o.shape)};
  bool left = ctx.flag_or(3, true), transpose = ctx.flag_or(4, false);
  Shape batch = batch_dims(o);
  Value vs = batch3(b, b.convert(ctx.in(0), o.dtype), batch);
  Value c = batch3(b, b.convert(ctx.in(2), o.dtype), batch);
  Value tau = b.convert(ctx.in(1), o.dtype);
  Shape ts = batch;
  ts.push_back(tau.shape().back());
  tau = b.reshape(broadcast_to(b, tau, ts), {vs.shape()[0], ts.back()});
  // Only the first min(rows, k) reflectors exist (ATen checks k <= rows).
  return {b.reshape(apply_householder(b, vs, tau, c, left, transpose), o.shape)};
}

}  // namespace tpu::lowering
