// LU factorization with partial pivoting (LAPACK getrf semantics: the first row of
// largest |x| is the pivot, pivots are 1-based int32, info is the 1-based index of the
// first zero pivot) and the ops built on it: lu_factor, lu, lu_unpack, lu_solve, det,
// slogdet, inv and solve. The factorization is one while loop over the columns; each
// step works on whole matrices with iota masks, so batch dims ride along as leading dims.
#include <cmath>

#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

// Defined in linalg.cpp.
namespace linalg_base {
void check_float(DType t);
Value to_batch(Builder& b, const Value& x, const Shape& batch);
Value tri_solve(Builder& b, const Value& a, const Value& rhs, bool left, bool lower, bool unit,
                bool transpose);
Shape batch_of(const Type& out);
}  // namespace linalg_base
using namespace linalg_base;

namespace {

struct LU {
  Value lu, piv, info;  // (*, m, n), (*, k) int32, (*) int32
};

Shape lead(const Shape& s, int64_t drop) { return Shape(s.begin(), s.end() - drop); }

std::vector<int64_t> upto(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 0; i < n; ++i) d.push_back(i);
  return d;
}

Value mT(Builder& b, const Value& x) {
  std::vector<int64_t> perm = upto(x.rank());
  std::swap(perm[x.rank() - 1], perm[x.rank() - 2]);
  return b.transpose(x, perm);
}

Value eye_like(Builder& b, const Shape& s, DType t) {
  int64_t r = static_cast<int64_t>(s.size());
  Type it{DType::I64, s};
  return b.convert(b.compare(b.iota(it, r - 2), b.iota(it, r - 1), Cmp::EQ), t);
}

// Row `j` (a scalar i64) of x (*, m, c): (*, 1, c).
static Value row_at(Builder& b, const Value& x, const Value& j) {
  Value z = b.constant(0, DType::I64);
  std::vector<Value> starts(x.rank(), z);
  starts[x.rank() - 2] = j;
  Shape sizes = x.shape();
  sizes[x.rank() - 2] = 1;
  return b.dynamic_slice(x, starts, sizes);
}

// Column `j` of x (*, m, n): (*, m, 1).
static Value col_at(Builder& b, const Value& x, const Value& j) {
  Value z = b.constant(0, DType::I64);
  std::vector<Value> starts(x.rank(), z);
  starts[x.rank() - 1] = j;
  Shape sizes = x.shape();
  sizes.back() = 1;
  return b.dynamic_slice(x, starts, sizes);
}

// Row p[b] of each matrix of x (*, m, c), p (*) i64: (*, 1, c).
static Value row_where(Builder& b, const Value& x, const Value& p) {
  int64_t r = x.rank();
  Value rows = b.iota(Type{DType::I64, x.shape()}, r - 2);
  Value pb = b.broadcast_in_dim(p, x.shape(), upto(r - 2));
  Value red = masked_pick(b, x, b.compare(rows, pb, Cmp::EQ), r - 2);
  Shape s = x.shape();
  s[r - 2] = 1;
  return b.reshape(red, s);
}

// x with rows j (scalar) and p[b] (per matrix) exchanged.
static Value swap_rows(Builder& b, const Value& x, const Value& j, const Value& p) {
  int64_t r = x.rank();
  const Shape& s = x.shape();
  Value rows = b.iota(Type{DType::I64, s}, r - 2);
  Value rj = b.broadcast_in_dim(row_at(b, x, j), s, upto(r));
  Value rp = b.broadcast_in_dim(row_where(b, x, p), s, upto(r));
  Value at_j = b.compare(rows, b.broadcast_in_dim(j, s, {}), Cmp::EQ);
  Value at_p = b.compare(rows, b.broadcast_in_dim(p, s, upto(r - 2)), Cmp::EQ);
  return b.select(at_j, rp, b.select(at_p, rj, x));
}

static Value i64(Builder& b, int64_t v) { return b.constant(static_cast<double>(v), DType::I64); }

static Value less_than(Builder& b, const Value& j, int64_t n) {
  return b.compare(j, i64(b, n), Cmp::LT);
}

LU lu_factor(Builder& b, const Value& a) {
  check_float(a.dtype());
  int64_t r = a.rank(), m = a.shape()[r - 2], n = a.shape()[r - 1], k = std::min(m, n);
  Shape bs = lead(a.shape(), 2), ps = bs;
  ps.push_back(k);
  Value piv0 = b.constant(0, DType::I32, ps), info0 = b.constant(0, DType::I32, bs);
  if (k == 0) return {a, piv0, info0};  // nothing to factor (and no column to slice)
  auto st = b.while_loop(
      {i64(b, 0), a, piv0, info0},
      [&](Builder& b, const std::vector<Value>& s) { return std::vector<Value>{less_than(b, s[0], k)}; },
      [&](Builder& b, const std::vector<Value>& s) {
        Value j = s[0], x = s[1], piv = s[2], info = s[3];
        const Shape& fs = x.shape();
        // Pivot: the first row >= j of largest |x[:, j]|, as LAPACK's idamax: a NaN never
        // wins over a number, except at row j itself, which nothing then exceeds.
        Value col = col_at(b, x, j);
        Value ci = b.iota(Type{DType::I64, col.shape()}, r - 2);
        Value mag = b.unary("stablehlo.abs", col);
        Value at_j = b.compare(ci, b.broadcast_in_dim(j, col.shape(), {}), Cmp::EQ);
        Value nan = b.compare(mag, mag, Cmp::NE);
        Value lead_nan = b.reshape(b.reduce(b.select(at_j, nan, full_like(b, nan, 0)), b.constant(0, DType::Bool),
                                            {r - 2}, "stablehlo.or"), bs);  // (*): row j's |x| is NaN
        mag = b.select(nan, full_like(b, mag, -0.5), mag);
        mag = b.select(b.binary("stablehlo.and", at_j, b.broadcast_in_dim(lead_nan, col.shape(), upto(r - 2))),
                       full_like(b, mag, INFINITY), mag);
        mag = b.select(b.compare(ci, b.broadcast_in_dim(j, col.shape(), {}), Cmp::GE), mag,
                       full_like(b, mag, -1));
        Value mx = b.reshape(b.reduce(mag, b.constant(-2, a.dtype()), {r - 2}, "stablehlo.maximum"), bs);
        Value hit = b.compare(mag, b.broadcast_in_dim(mx, col.shape(), upto(r - 2)), Cmp::EQ);
        Value cand = b.select(hit, ci, full_like(b, ci, static_cast<double>(m)));
        Value p = b.reshape(b.reduce(cand, i64(b, m), {r - 2}, "stablehlo.minimum"), bs);
        Value pi = b.iota(Type{DType::I64, ps}, r - 2);
        Value p1 = b.convert(add(b, p, b.constant(1, DType::I64, bs)), DType::I32);
        piv = b.select(b.compare(pi, b.broadcast_in_dim(j, ps, {}), Cmp::EQ),
                       b.broadcast_in_dim(p1, ps, upto(r - 2)), piv);
        x = swap_rows(b, x, j, p);
        // A zero pivot records info and leaves its column unscaled (it is zero below).
        Value urow = row_at(b, x, j);                                        // (*, 1, n)
        Value d = b.reshape(col_at(b, urow, j), bs);
        Value zero = b.compare(d, full_like(b, d, 0), Cmp::EQ);
        Value first = b.binary("stablehlo.and", zero, b.compare(info, full_like(b, info, 0), Cmp::EQ));
        Value j1 = b.convert(add(b, j, i64(b, 1)), DType::I32);
        info = b.select(first, b.broadcast_in_dim(j1, bs, {}), info);
        Value col2 = col_at(b, x, j);                                        // (*, m, 1)
        Value db = b.broadcast_in_dim(d, col2.shape(), upto(r - 2));
        Value zb = b.broadcast_in_dim(zero, col2.shape(), upto(r - 2));
        Value l = b.select(zb, col2, div(b, col2, db));
        // Rows below j: multipliers in column j, the Schur complement right of it.
        Value rows = b.iota(Type{DType::I64, fs}, r - 2), cols = b.iota(Type{DType::I64, fs}, r - 1);
        Value jf = b.broadcast_in_dim(j, fs, {});
        Value below = b.compare(rows, jf, Cmp::GT);
        Value lf = b.broadcast_in_dim(l, fs, upto(r)), uf = b.broadcast_in_dim(urow, fs, upto(r));
        Value trail = b.binary("stablehlo.and", below, b.compare(cols, jf, Cmp::GT));
        x = b.select(trail, sub(b, x, mul(b, lf, uf)), x);
        x = b.select(b.binary("stablehlo.and", below, b.compare(cols, jf, Cmp::EQ)), lf, x);
        return std::vector<Value>{add(b, j, i64(b, 1)), x, piv, info};
      });
  return {st[1], st[2], st[3]};
}

Value apply_swaps(Builder& b, const Value& piv, const Value& x, bool reverse) {
  int64_t r = x.rank(), k = piv.shape().back();
  Shape bs = lead(x.shape(), 2);
  Shape ps = bs;
  ps.push_back(k);
  if (k == 0) return x;
  Value pv = broadcast_to(b, piv, ps);
  auto st = b.while_loop(
      {i64(b, 0), x},
      [&](Builder& b, const std::vector<Value>& s) { return std::vector<Value>{less_than(b, s[0], k)}; },
      [&](Builder& b, const std::vector<Value>& s) {
        Value j = reverse ? sub(b, i64(b, k - 1), s[0]) : s[0];
        Value z = i64(b, 0);
        std::vector<Value> starts(r - 1, z);
        starts.back() = j;
        Shape one = bs;
        one.push_back(1);
        Value p = b.reshape(b.dynamic_slice(pv, starts, one), bs);
        p = sub(b, b.convert(p, DType::I64), b.constant(1, DType::I64, bs));
        return std::vector<Value>{add(b, s[0], i64(b, 1)), swap_rows(b, s[1], j, p)};
      });
  return st[1];
}

// A X = B (or A^T X = B when adjoint) for A = P L U given by (lu, piv), rhs on the left.
static Value lu_solve_left(Builder& b, const Value& lu, const Value& piv, const Value& rhs,
                           bool adjoint) {
  if (!adjoint) {
    Value y = apply_swaps(b, piv, rhs, false);
    y = tri_solve(b, lu, y, true, true, true, false);
    return tri_solve(b, lu, y, true, false, false, false);
  }
  Value y = tri_solve(b, lu, rhs, true, false, false, true);
  y = tri_solve(b, lu, y, true, true, true, true);
  return apply_swaps(b, piv, y, true);
}

Value lu_solve(Builder& b, const Value& lu, const Value& piv, const Value& rhs, bool left,
               bool adjoint) {
  // X A = B is A^T X^T = B^T.
  if (!left) return mT(b, lu_solve_left(b, lu, piv, mT(b, rhs), !adjoint));
  return lu_solve_left(b, lu, piv, rhs, adjoint);
}

// det(P) for LAPACK pivots (*, k): -1 for an odd number of real exchanges.
Value pivots_sign(Builder& b, const Value& piv, DType t) {
  int64_t r = piv.rank();
  Value pos = add(b, b.iota(piv.type, r - 1), b.constant(1, piv.dtype(), piv.shape()));
  Value moved = b.convert(b.compare(piv, pos, Cmp::NE), DType::I64);
  Value cnt = reduce_sum(b, moved, {r - 1});
  Value odd = b.compare(b.binary("stablehlo.and", cnt, full_like(b, cnt, 1)), full_like(b, cnt, 1), Cmp::EQ);
  return b.select(odd, b.constant(-1, t, cnt.shape()), b.constant(1, t, cnt.shape()));
}

Value diagonal(Builder& b, const Value& x) {
  int64_t r = x.rank(), n = x.shape().back();
  Value on = b.compare(b.iota(Type{DType::I64, x.shape()}, r - 2), b.iota(Type{DType::I64, x.shape()}, r - 1),
                       Cmp::EQ);
  Shape ds = lead(x.shape(), 2);
  ds.push_back(n);
  return masked_pick(b, x, on, r - 2);
}

}  // namespace

// linalg_lu_factor_ex(A, pivot, check_errors) -> (LU, pivots, info).
TPU_LOWER(linalg_lu_factor_ex, "linalg_lu_factor_ex") {
  Value a = ctx.in(0);
  check_float(a.dtype());
  if (!ctx.flag(1)) throw Unsupported("LU without pivoting");
  if (ctx.flag(2)) throw Unsupported("lu_factor_ex with check_errors");
  LU f = lu_factor(ctx.b, a);
  return {f.lu, f.piv, f.info};
}

// lu_unpack(LU, pivots, unpack_data, unpack_pivots) -> (P, L, U).
static std::vector<Value> unpack(Ctx& ctx, const Value& lu, const Value& piv, bool data, bool pivs) {
  Builder& b = ctx.b;
  int64_t r = lu.rank(), m = lu.shape()[r - 2], n = lu.shape()[r - 1], k = std::min(m, n);
  Shape bs = lead(lu.shape(), 2);
  std::vector<Value> outs;
  if (pivs) {
    Shape ms = bs;
    ms.push_back(m), ms.push_back(m);
    Value pt = apply_swaps(b, piv, eye_like(b, ms, lu.dtype()), false);  // P^T
    outs.push_back(b.convert(mT(b, pt), ctx.out(0).dtype));
  } else {
    outs.push_back(b.constant(0, ctx.out(0).dtype, ctx.out(0).shape));
  }
  if (data) {
    Shape ls = bs, us = bs;
    ls.push_back(m), ls.push_back(k);
    us.push_back(k), us.push_back(n);
    Shape z(r, 0), one(r, 1);
    Value l = b.slice(lu, z, ls, one), u = b.slice(lu, z, us, one);
    Value li = b.iota(Type{DType::I64, ls}, r - 2), lj = b.iota(Type{DType::I64, ls}, r - 1);
    Value unit = b.select(b.compare(li, lj, Cmp::EQ), full_like(b, l, 1), full_like(b, l, 0));
    l = b.select(b.compare(li, lj, Cmp::GT), l, unit);
    Value ui = b.iota(Type{DType::I64, us}, r - 2), uj = b.iota(Type{DType::I64, us}, r - 1);
    u = b.select(b.compare(ui, uj, Cmp::LE), u, full_like(b, u, 0));
    outs.push_back(l), outs.push_back(u);
  } else {
    outs.push_back(b.constant(0, ctx.out(1).dtype, ctx.out(1).shape));
    outs.push_back(b.constant(0, ctx.out(2).dtype, ctx.out(2).shape));
  }
  return outs;
}

TPU_LOWER(lu_unpack, "lu_unpack") {
  Value lu = ctx.in(0), piv = ctx.in(1);
  check_float(lu.dtype());
  bool data = ctx.flag(2), pivs = ctx.flag(3);
  if (pivs) {
    int64_t m = lu.shape()[lu.rank() - 2];
    check_in_range(ctx, piv, 1, m + 1,
              "RuntimeError: pivots passed to lu_unpack must be between 1 and LU.size(-2) inclusive."
              "Did you properly pass the result of lu_factor?");
  }
  return unpack(ctx, lu, piv, data, pivs);
}

// linalg_lu(A, pivot) -> (P, L, U).
TPU_LOWER(linalg_lu, "linalg_lu") {
  Value a = ctx.in(0);
  check_float(a.dtype());
  if (!ctx.flag(1)) throw Unsupported("LU without pivoting");
  LU f = lu_factor(ctx.b, a);
  return unpack(ctx, f.lu, f.piv, true, true);
}

// linalg_lu_solve(LU, pivots, B, left, adjoint).
TPU_LOWER(linalg_lu_solve, "linalg_lu_solve") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  check_float(o.dtype);
  if (o.numel() == 0) return {b.constant(0, o.dtype, o.shape)};
  Shape bs = batch_of(o);
  Value lu = to_batch(b, ctx.in(0), bs);
  Shape ps = bs;
  ps.push_back(lu.shape().back());
  Value piv = broadcast_to(b, ctx.in(1), ps);
  Value rhs = to_batch(b, b.convert(ctx.in(2), o.dtype), bs);
  return {lu_solve(b, lu, piv, rhs, ctx.flag(3), ctx.flag(4))};
}

// _linalg_det(A) -> (det, LU, pivots). CPU factors A^T when A is contiguous and A
// otherwise, and the backward picks lu_solve's adjoint flag from A.is_contiguous().
TPU_LOWER(linalg_det, "_linalg_det") {
  Builder& b = ctx.b;
  Value a = ctx.in(0);
  check_float(a.dtype());
  LU f = lu_factor(b, ctx.contiguous(0) ? mT(b, a) : a);
  Value d = b.reduce(diagonal(b, f.lu), b.constant(1, a.dtype()), {a.rank() - 2}, "stablehlo.multiply");
  return {mul(b, pivots_sign(b, f.piv, a.dtype()), d), f.lu, f.piv};
}

// _linalg_slogdet(A) -> (sign, logabsdet, LU, pivots); LU as for _linalg_det.
TPU_LOWER(linalg_slogdet, "_linalg_slogdet") {
  Builder& b = ctx.b;
  Value a = ctx.in(0);
  check_float(a.dtype());
  LU f = lu_factor(b, ctx.contiguous(0) ? mT(b, a) : a);
  Value dg = diagonal(b, f.lu);
  int64_t last = dg.rank() - 1;
  // torch.sign of a NaN is 0 (stablehlo.sign keeps it NaN): a NaN determinant has sign 0, as CPU.
  Value sd = b.unary("stablehlo.sign", dg);
  sd = b.select(b.compare(dg, dg, Cmp::NE), full_like(b, sd, 0), sd);
  Value sg = b.reduce(sd, b.constant(1, a.dtype()), {last}, "stablehlo.multiply");
  Value lad = reduce_sum(b, b.unary("stablehlo.log", b.unary("stablehlo.abs", dg)), {last});
  return {mul(b, pivots_sign(b, f.piv, a.dtype()), sg), lad, f.lu, f.piv};
}

// linalg_inv_ex(A, check_errors) -> (inverse, info): like CPU, A X = I solved through
// the factorization of A.
TPU_LOWER(linalg_inv_ex, "linalg_inv_ex") {
  Builder& b = ctx.b;
  Value a = ctx.in(0);
  check_float(a.dtype());
  if (ctx.flag(1)) throw Unsupported("inv_ex with check_errors");
  LU f = lu_factor(b, a);
  Value x = lu_solve(b, f.lu, f.piv, eye_like(b, a.shape(), a.dtype()), true, false);
  return {x, f.info};
}

// _linalg_solve_ex(A, B, left, check_errors) -> (result, LU, pivots, info), with the LU
// of A itself (as this PyTorch's CPU kernel gives it). B may be a
// (batch of) vector(s): numpy's rule, as in linalg_solve_is_vector_rhs.
TPU_LOWER(linalg_solve_ex, "_linalg_solve_ex") {
  Builder& b = ctx.b;
  Value a = ctx.in(0), rhs = ctx.in(1);
  Type o = ctx.out(0);
  check_float(o.dtype);
  if (ctx.flag(3)) throw Unsupported("solve_ex with check_errors");
  bool left = ctx.flag(2);
  LU f = lu_factor(b, b.convert(a, o.dtype));
  bool vec = rhs.rank() == 1 || (rhs.rank() == a.rank() - 1 && rhs.shape() == lead(a.shape(), 1));
  Shape xs = o.shape;
  if (vec) xs.push_back(1);
  Shape bs = lead(xs, 2);
  Value B = b.reshape(b.convert(rhs, o.dtype), vec ? [&] { Shape s = rhs.shape(); s.push_back(1); return s; }()
                                                     : rhs.shape());
  B = to_batch(b, B, bs);
  Value lu = to_batch(b, f.lu, bs);
  Shape ps = bs;
  ps.push_back(f.piv.shape().back());
  Value x = lu_solve(b, lu, broadcast_to(b, f.piv, ps), B, left, false);
  return {b.reshape(x, o.shape), f.lu, f.piv, f.info};
}

}  // namespace tpu::lowering
