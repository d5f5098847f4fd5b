// Symmetric eigendecomposition (two-sided Jacobi) and SVD (one-sided Jacobi on the
// columns), both with the parallel round-robin ordering: each round rotates n/2 disjoint
// pairs at once with one rotation matrix J, so a round is a few batched dot_generals.
// Rounds run in a while loop until the off-diagonal part is negligible (or a sweep cap).
// Matrices are flattened to (B, m, n) and scaled to max |a| = 1 first (no overflow).
#include <cmath>

#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

// Defined in linalg_qr.cpp.
void check_decomp_float(DType t);
Value to_batch3(Builder& b, const Value& x);
Value eye3(Builder& b, DType t, int64_t batch, int64_t m, int64_t n);
Value idx_const(Builder& b, int64_t v);
std::pair<Value, Value> householder_qr(Builder& b, const Value& a);
Value apply_householder(Builder& b, const Value& vs, const Value& tau, const Value& c, bool left,
                        bool transpose, bool from_identity);

constexpr int64_t kMaxSweeps = 24;

static double eps_of(DType t) { return t == DType::F64 ? 2.220446049250313e-16 : 1.1920928955078125e-07; }

// x (B, n) spread over (B, n, n) along dims {0, d}.
static Value spread2(Builder& b, const Value& x, int64_t d) {
  Shape s{x.shape()[0], x.shape()[1], x.shape()[1]};
  return b.broadcast_in_dim(x, s, {0, d});
}

static Value swap_last(Builder& b, const Value& x) { return b.transpose(x, {0, 2, 1}); }

static Value matmul3(Builder& b, const Value& x, const Value& y) {
  return b.dot_general(x, y, {0}, {0}, {2}, {1}, x.dtype());
}

// Per-row sums of x (B, n, n) where mask holds: (B, n).
static Value masked_rows(Builder& b, const Value& mask, const Value& x) {
  return reduce_sum(b, b.select(mask, x, full_like(b, x, 0)), {2});
}

// The rotation J (B, n, n) of round `round` for the symmetric g (B, n, n): for each pair
// (p < q) of the round, J[p,p] = J[q,q] = c, J[p,q] = s, J[q,p] = -s with t = s/c the
// smaller root of t^2 + 2 zeta t - 1 = 0, zeta = (g_qq - g_pp) / (2 g_pq), so that
// (J^T g J)[p,q] = 0. Pairs with g_pq^2 <= skip^2 |g_pp g_qq| are left alone.
static Value jacobi_rotation(Builder& b, const Value& g, const Value& round, double skip) {
  int64_t batch = g.shape()[0], n = g.shape()[1], big = n + n % 2, rounds = big - 1;
  DType t = g.dtype();
  // Round-robin (circle) pairing of big players: i < big-1 meets (r - i) mod (big-1),
  // or player big-1 when that is itself. Player n (odd n) is a bye.
  Type vt{DType::I64, {n}};
  Value i = b.iota(vt, 0);
  Value r = b.binary("stablehlo.remainder", round, idx_const(b, rounds));
  Value rv = b.broadcast_in_dim(r, {n}, {});
  Value rs = b.constant(static_cast<double>(rounds), DType::I64, {n});
  Value j = b.binary("stablehlo.remainder", add(b, sub(b, rv, i), rs), rs);
  Value lastp = b.binary("stablehlo.remainder", mul(b, r, idx_const(b, big / 2)), idx_const(b, rounds));
  Value top = b.constant(static_cast<double>(big - 1), DType::I64, {n});
  Value p = b.select(b.compare(j, i, Cmp::EQ), top, j);
  p = b.select(b.compare(i, top, Cmp::EQ), b.broadcast_in_dim(lastp, {n}, {}), p);
  Shape sq{batch, n, n}, vec{batch, n};
  Type st{DType::I64, sq};
  Value col = b.iota(st, 2);
  Value partner = b.compare(col, b.broadcast_in_dim(p, sq, {1}), Cmp::EQ);  // k == p[i]
  Value diag = b.compare(col, b.iota(st, 1), Cmp::EQ);
  Value paired = b.broadcast_in_dim(b.compare(p, b.constant(static_cast<double>(n), DType::I64, {n}), Cmp::LT), vec, {1});
  Value lo = b.broadcast_in_dim(b.compare(i, p, Cmp::LT), vec, {1});
  Value d = masked_rows(b, diag, g);
  Value dp = masked_rows(b, partner, spread2(b, d, 2));
  Value gpq = b.select(lo, masked_rows(b, partner, g), masked_rows(b, partner, swap_last(b, g)));
  Value app = b.select(lo, d, dp), aqq = b.select(lo, dp, d);
  Value diff = sub(b, aqq, app), zero = full_like(b, diff, 0), one = full_like(b, diff, 1);
  Value sgn = b.select(b.compare(diff, zero, Cmp::GE), one, full_like(b, diff, -1));
  Value den = add(b, b.unary("stablehlo.abs", diff),
                  b.unary("stablehlo.sqrt", add(b, mul(b, diff, diff), mul(b, full_like(b, diff, 4), mul(b, gpq, gpq)))));
  Value small = b.compare(mul(b, gpq, gpq),
                          mul(b, full_like(b, diff, skip * skip), b.unary("stablehlo.abs", mul(b, app, aqq))), Cmp::LE);
  Value idle = b.binary("stablehlo.or", b.unary("stablehlo.not", paired),
                        b.binary("stablehlo.or", small, b.compare(den, zero, Cmp::EQ)));
  Value tt = b.select(idle, zero, div(b, mul(b, full_like(b, diff, 2), mul(b, gpq, sgn)), b.select(idle, one, den)));
  Value c = b.unary("stablehlo.rsqrt", add(b, one, mul(b, tt, tt)));
  Value s = mul(b, tt, c);
  Value ss = b.select(lo, s, b.unary("stablehlo.negate", s));
  Value zsq = b.constant(0, t, sq);
  return b.select(diag, spread2(b, c, 1), b.select(partner, spread2(b, ss, 1), zsq));
}

// Per-matrix max |x| over (B, r, c), with 1 for zero matrices: (B).
static Value scale_of(Builder& b, const Value& x) {
  Value m = reduce_max(b, b.unary("stablehlo.abs", x), {1, 2});
  return b.select(b.compare(m, full_like(b, m, 0), Cmp::EQ), full_like(b, m, 1), m);
}

static Value divide_by(Builder& b, const Value& x, const Value& s) {
  return div(b, x, b.broadcast_in_dim(s, x.shape(), {0}));
}

// The permutation matrix (B, n, n) putting column perm[c] at c: x P = x[:, perm].
static Value perm_matrix(Builder& b, const Value& perm, DType t) {
  Shape sq{perm.shape()[0], perm.shape()[1], perm.shape()[1]};
  Value rows = b.iota(Type{DType::I64, sq}, 1);
  return b.convert(b.compare(rows, b.broadcast_in_dim(perm, sq, {0, 2}), Cmp::EQ), t);
}

// Sorts keys (B, n) (ascending or descending, stably): (sorted keys, permutation matrix).
static std::pair<Value, Value> sort_keys(Builder& b, const Value& keys, bool ascending) {
  Value idx = b.iota(Type{DType::I64, keys.shape()}, 1);
  auto sorted = b.sort({keys, idx}, 1, true, [&](Builder& r, const std::vector<Value>& a) {
    return std::vector<Value>{r.compare(a[0], a[1], ascending ? Cmp::LT : Cmp::GT)};
  });
  return {sorted[0], perm_matrix(b, sorted[1], keys.dtype())};
}

// Eigen-decomposition of symmetric a (B, n, n): (ascending eigenvalues (B, n), vectors).
static std::pair<Value, Value> jacobi_eigh(Builder& b, const Value& a) {
  int64_t batch = a.shape()[0], n = a.shape()[1], rounds = n + n % 2 - 1;
  DType t = a.dtype();
  Value scale = scale_of(b, a);
  Value x = divide_by(b, a, scale);
  double tol = 2 * eps_of(t) * std::sqrt(static_cast<double>(n));
  Type st{DType::I64, {batch, n, n}};
  Value offd = b.compare(b.iota(st, 1), b.iota(st, 2), Cmp::NE);
  auto out = b.while_loop(
      {idx_const(b, 0), x, eye3(b, t, batch, n, n)},
      [&](Builder& bb, const std::vector<Value>& s) {
        Value sq = mul(bb, s[1], s[1]);
        Value off = reduce_sum(bb, bb.select(offd, sq, full_like(bb, sq, 0)), {1, 2});
        Value all = reduce_sum(bb, sq, {1, 2});
        Value big = bb.compare(off, mul(bb, all, full_like(bb, all, tol * tol)), Cmp::GT);
        Value any = bb.reduce(big, bb.constant(0, DType::Bool), {0}, "stablehlo.or");
        Value more = bb.compare(s[0], idx_const(bb, kMaxSweeps * rounds), Cmp::LT);
        return std::vector<Value>{bb.binary("stablehlo.and", any, more)};
      },
      [&](Builder& bb, const std::vector<Value>& s) {
        Value j = jacobi_rotation(bb, s[1], s[0], 0.0);
        Value y = bb.dot_general(j, matmul3(bb, s[1], j), {0}, {0}, {1}, {1}, t);  // J^T A J
        return std::vector<Value>{add(bb, s[0], idx_const(bb, 1)), y, matmul3(bb, s[2], j)};
      });
  Value w = masked_rows(b, b.compare(b.iota(st, 1), b.iota(st, 2), Cmp::EQ), out[1]);
  w = mul(b, w, b.broadcast_in_dim(scale, w.shape(), {0}));
  auto [ws, perm] = sort_keys(b, w, true);
  return {ws, matmul3(b, out[2], perm)};
}

// Whether every element of x is finite: a bool scalar.
static Value all_finite(Builder& b, const Value& x) {
  Value fin = b.raw("stablehlo.is_finite", {x}, "", Type{DType::Bool, x.shape()});
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x.rank(); ++i) dims.push_back(i);
  return b.reduce(fin, b.constant(1, DType::Bool), dims, "stablehlo.and");
}

// _linalg_eigh(A, UPLO, compute_v) -> (eigenvalues, eigenvectors).
TPU_LOWER(linalg_eigh, "_linalg_eigh") {
  Builder& b = ctx.b;
  Value a = ctx.in(0);
  check_decomp_float(a.dtype());
  Type wo = ctx.out(0), vo = ctx.out(1);
  if (a.type.numel() == 0) return {b.constant(0, wo.dtype, wo.shape), b.constant(0, vo.dtype, vo.shape)};
  bool lower = ctx.is_none(1) || ctx.str(1) == "L";
  Value a3 = to_batch3(b, a);
  Type st{DType::I64, a3.shape()};
  Value keep = b.compare(b.iota(st, 1), b.iota(st, 2), lower ? Cmp::GE : Cmp::LE);
  Value sym = b.select(keep, a3, swap_last(b, a3));  // the named triangle, mirrored
  // LAPACK fails on non-finite input (its error code is not reproduced).
  ctx.check(all_finite(b, sym), "linalg.eigh: The algorithm failed to converge because the input matrix "
                                "is ill-conditioned or has too many repeated eigenvalues");
  auto [w, v] = jacobi_eigh(b, sym);
  Value vv = vo.numel() == 0 ? b.constant(0, vo.dtype, vo.shape) : b.reshape(v, vo.shape);
  return {b.reshape(w, wo.shape), vv};
}

struct Svd {
  Value u, s, v;  // u (B, m, mu) when asked for, s (B, n) descending, v (B, n, n)
};

// SVD of a (B, m, n) with m >= n by one-sided Jacobi: A V converges to orthogonal
// columns U S. U is then completed (zero singular values, full_matrices) and
// re-orthonormalized by a Householder QR of U's columns, with R's signs folded back.
static Svd jacobi_svd(Builder& b, const Value& a, bool want_u, int64_t mu) {
  int64_t batch = a.shape()[0], m = a.shape()[1], n = a.shape()[2], rounds = n + n % 2 - 1;
  DType t = a.dtype();
  Value scale = scale_of(b, a);
  Value x = divide_by(b, a, scale);
  double tol = 2 * eps_of(t) * std::sqrt(static_cast<double>(m));
  auto gram = [&](Builder& bb, const Value& y) { return bb.dot_general(y, y, {0}, {0}, {1}, {1}, t); };
  Type st{DType::I64, {batch, n, n}};
  Value offd = b.compare(b.iota(st, 1), b.iota(st, 2), Cmp::NE);
  auto out = b.while_loop(
      {idx_const(b, 0), x, eye3(b, t, batch, n, n), gram(b, x)},
      [&](Builder& bb, const std::vector<Value>& s) {
        const Value& g = s[3];
        Value d = masked_rows(bb, bb.compare(bb.iota(st, 1), bb.iota(st, 2), Cmp::EQ), g);
        Value dd = mul(bb, spread2(bb, d, 1), spread2(bb, d, 2));
        Value big = bb.compare(mul(bb, g, g), mul(bb, dd, full_like(bb, dd, tol * tol)), Cmp::GT);
        big = bb.binary("stablehlo.and", big, offd);
        Value any = bb.reduce(big, bb.constant(0, DType::Bool), {0, 1, 2}, "stablehlo.or");
        Value more = bb.compare(s[0], idx_const(bb, kMaxSweeps * rounds), Cmp::LT);
        return std::vector<Value>{bb.binary("stablehlo.and", any, more)};
      },
      [&](Builder& bb, const std::vector<Value>& s) {
        Value j = jacobi_rotation(bb, s[3], s[0], tol);
        Value y = matmul3(bb, s[1], j);
        return std::vector<Value>{add(bb, s[0], idx_const(bb, 1)), y, matmul3(bb, s[2], j), gram(bb, y)};
      });
  Value y = out[1];
  Value norms = b.unary("stablehlo.sqrt", reduce_sum(b, mul(b, y, y), {1}));  // (B, n)
  auto [s, perm] = sort_keys(b, norms, false);
  Svd r{Value{}, mul(b, s, b.broadcast_in_dim(scale, s.shape(), {0})), matmul3(b, out[2], perm)};
  if (!want_u) return r;
  Value ys = matmul3(b, y, perm);
  Value sb = b.broadcast_in_dim(s, ys.shape(), {0, 2});
  Value zero = full_like(b, sb, 0);
  Value is0 = b.compare(sb, zero, Cmp::EQ);
  Value u0 = b.select(is0, zero, div(b, ys, b.select(is0, full_like(b, sb, 1), sb)));
  auto [f, tau] = householder_qr(b, u0);
  Value q = apply_householder(b, f, tau, eye3(b, t, batch, m, mu), true, false, true);
  // sign(R_jj) for j < n (1 where R_jj is 0), 1 for the completed columns.
  Value rd = masked_rows(b, b.compare(b.iota(st, 1), b.iota(st, 2), Cmp::EQ),
                         b.slice(f, {0, 0, 0}, {batch, n, n}, {1, 1, 1}));
  Value sg = b.select(b.compare(rd, full_like(b, rd, 0), Cmp::LT), full_like(b, rd, -1), full_like(b, rd, 1));
  if (mu > n) sg = b.concatenate({sg, b.constant(1, t, {batch, mu - n})}, 1);
  r.u = mul(b, q, b.broadcast_in_dim(sg, q.shape(), {0, 2}));
  return r;
}

// Thin SVD of any (B, m, n): U (B, m, k), S (B, k), V (B, n, k).
static Svd thin_svd(Builder& b, const Value& a3) {
  int64_t m = a3.shape()[1], n = a3.shape()[2];
  if (m >= n) return jacobi_svd(b, a3, true, n);
  Svd r = jacobi_svd(b, swap_last(b, a3), true, m);
  return {r.v, r.s, r.u};
}

// _linalg_svd(A, full_matrices, compute_uv, driver) -> (U, S, Vh).
TPU_LOWER(linalg_svd, "_linalg_svd") {
  Builder& b = ctx.b;
  Value a = ctx.in(0);
  check_decomp_float(a.dtype());
  bool full = ctx.flag_or(1, true), uv = ctx.flag_or(2, true);
  Type uo = ctx.out(0), so = ctx.out(1), vo = ctx.out(2);
  int64_t m = a.shape()[a.rank() - 2], n = a.shape().back();
  Value a3 = to_batch3(b, a);
  int64_t batch = a3.shape()[0];
  auto eye_like = [&](const Type& o) {
    int64_t r = o.shape[o.rank() - 2], c = o.shape.back();
    return b.reshape(eye3(b, o.dtype, batch, r, c), o.shape);
  };
  if (a.type.numel() == 0) {
    Value u = uv ? eye_like(uo) : b.constant(0, uo.dtype, uo.shape);
    Value v = uv ? eye_like(vo) : b.constant(0, vo.dtype, vo.shape);
    return {u, b.constant(0, so.dtype, so.shape), v};
  }
  ctx.check(all_finite(b, a3), "linalg.svd: The algorithm failed to converge because the input matrix "
                              "contained non-finite values.");
  bool wide = m < n;  // the SVD of A^T: A = V S U^T
  Value x = wide ? swap_last(b, a3) : a3;
  int64_t rows = wide ? n : m, cols = wide ? m : n;
  Svd r = jacobi_svd(b, x, uv, full ? rows : cols);
  Value s = b.reshape(r.s, so.shape);
  if (!uv) return {b.constant(0, uo.dtype, uo.shape), s, b.constant(0, vo.dtype, vo.shape)};
  Value u = wide ? r.v : r.u;
  Value vh = wide ? swap_last(b, r.u) : swap_last(b, r.v);
  return {b.reshape(u, uo.shape), s, b.reshape(vh, vo.shape)};
}

// linalg_lstsq(A, B, rcond, driver) -> (solution, residuals, rank, singular_values), for
// every driver through the SVD: the minimum-norm solution over the singular values
// above rcond * max (gelsy, gelss, gelsd: what LAPACK's rank-revealing drivers give;
// gels assumes full rank and uses them all). Outputs follow CPU's per-driver rules:
// residuals only for m > n with gels (gelss/gelsd give them only when every matrix
// has full rank, a value-dependent shape: fallback), rank unless gels, singular
// values for gelss/gelsd.
TPU_LOWER(linalg_lstsq, "linalg_lstsq") {
  Builder& b = ctx.b;
  Type xo = ctx.out(0), ro = ctx.out(1), ko = ctx.out(2), so = ctx.out(3);
  check_decomp_float(xo.dtype);
  std::string driver = ctx.is_none(3) ? "gelsy" : ctx.str(3);
  Value a = ctx.in(0), rhs = ctx.in(1);
  int64_t m = a.shape()[a.rank() - 2], n = a.shape().back();
  if (m > n && (driver == "gelss" || driver == "gelsd")) throw Unsupported("lstsq residuals");
  if (xo.numel() == 0 || a.type.numel() == 0) throw Unsupported("empty lstsq");
  bool vec = rhs.rank() == a.rank() - 1;
  if (vec) {
    Shape s = rhs.shape();
    s.push_back(1);
    rhs = b.reshape(rhs, s);
  }
  Shape batch(xo.shape.begin(), xo.shape.end() - (vec ? 1 : 2));
  int64_t nrhs = rhs.shape().back();
  Shape as = batch, bs = batch;
  as.push_back(m), as.push_back(n), bs.push_back(m), bs.push_back(nrhs);
  Value a3 = to_batch3(b, broadcast_to(b, b.convert(a, xo.dtype), as));
  Value b3 = to_batch3(b, broadcast_to(b, b.convert(rhs, xo.dtype), bs));
  Svd r = thin_svd(b, a3);
  double rc = ctx.is_none(2) ? eps_of(xo.dtype) * static_cast<double>(std::max(m, n)) : ctx.f(2);
  if (rc < 0) rc = eps_of(xo.dtype);
  Value smax = b.broadcast_in_dim(reduce_max(b, r.s, {1}), r.s.shape(), {0});
  Value kept = driver == "gels" ? b.constant(1, DType::Bool, r.s.shape())
                                : b.compare(r.s, mul(b, smax, full_like(b, smax, rc)), Cmp::GT);
  Value zero = full_like(b, r.s, 0);
  Value inv = b.select(kept, div(b, full_like(b, r.s, 1), b.select(kept, r.s, full_like(b, r.s, 1))), zero);
  Value c = b.dot_general(r.u, b3, {0}, {0}, {1}, {1}, xo.dtype);  // U^T B: (batch, k, nrhs)
  c = mul(b, c, b.broadcast_in_dim(inv, c.shape(), {0, 1}));
  Value x = matmul3(b, r.v, c);  // (batch, n, nrhs)
  Value res = b.constant(0, ro.dtype, ro.shape);
  if (ro.numel() > 0) {
    Value e = sub(b, b.dot_general(a3, x, {0}, {0}, {2}, {1}, xo.dtype), b3);
    res = b.reshape(reduce_sum(b, mul(b, e, e), {1}), ro.shape);
  }
  Value rank = b.constant(0, ko.dtype, ko.shape);
  if (ko.numel() > 0)
    rank = b.reshape(reduce_sum(b, b.convert(kept, ko.dtype), {1}), ko.shape);
  Value sv = so.numel() > 0 ? b.reshape(r.s, so.shape) : b.constant(0, so.dtype, so.shape);
  return {b.reshape(x, xo.shape), res, rank, sv};
}

}  // namespace tpu::lowering
