// Symmetric eigendecomposition (two-sided Jacobi) and SVD (one-sided Jacobi on the
// columns), both with the parallel round-robin ordering: each round rotates n/2 disjoint
// pairs at once, elementwise with a gather of each index's partner (O(n^2) a round).
// Rounds run in a while loop until a whole sweep rotates nothing (or a sweep cap).
// Matrices are flattened to (B, m, n) and scaled to max |a| = 1 first (no overflow).
// Results are sorted like LAPACK's (eigenvalues ascending, singular values descending).
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
  return b.dot_general(x, y, {0}, {0}, {2}, {1}, x.dtype(), ir::DotPrecision::Highest);
}

// Per-row sums of x (B, n, n) where mask holds: (B, n).
static Value masked_rows(Builder& b, const Value& mask, const Value& x) {
  return reduce_sum(b, b.select(mask, x, full_like(b, x, 0)), {2});
}

// The pairs of one round of the parallel (round-robin) ordering over n indices.
struct Round {
  Value partner;  // (n, 1) i64: the index paired with i (i itself when i sits out)
  Value lo;       // (B, n): i is the smaller of its pair
  Value paired;   // (B, n)
  Value mask;     // (B, n, n): k == partner[i]
};

// Circle method over big = n rounded up to even: i < big-1 meets (r - i) mod (big-1), or
// big-1 when that is i itself; index n (odd n) is a bye. Any big-1 consecutive rounds
// meet every pair once.
static Round round_pairs(Builder& b, const Value& round, int64_t batch, int64_t n) {
  int64_t big = n + n % 2, rounds = big - 1;
  Type vt{DType::I64, {n}};
  Value i = b.iota(vt, 0);
  Value r = b.binary("stablehlo.remainder", round, idx_const(b, rounds));
  Value rs = b.constant(static_cast<double>(rounds), DType::I64, {n});
  Value j = b.binary("stablehlo.remainder", add(b, sub(b, b.broadcast_in_dim(r, {n}, {}), i), rs), rs);
  Value lastp = b.binary("stablehlo.remainder", mul(b, r, idx_const(b, big / 2)), idx_const(b, rounds));
  Value top = b.constant(static_cast<double>(big - 1), DType::I64, {n});
  Value p = b.select(b.compare(j, i, Cmp::EQ), top, j);
  p = b.select(b.compare(i, top, Cmp::EQ), b.broadcast_in_dim(lastp, {n}, {}), p);
  Value has = b.compare(p, b.constant(static_cast<double>(n), DType::I64, {n}), Cmp::LT);
  p = b.select(has, p, i);
  Shape sq{batch, n, n}, vec{batch, n};
  Value mask = b.compare(b.iota(Type{DType::I64, sq}, 2), b.broadcast_in_dim(p, sq, {1}), Cmp::EQ);
  return {b.reshape(p, {n, 1}), b.broadcast_in_dim(b.compare(i, p, Cmp::LT), vec, {1}),
          b.broadcast_in_dim(has, vec, {1}), mask};
}

// x[..., partner] along dim 2 (columns) or 1 (rows) of x (B, r, c).
static Value permute(Builder& b, const Value& x, const Value& partner, int64_t dim) {
  Shape sizes = x.shape();
  sizes[dim] = 1;
  std::vector<int64_t> offs = dim == 2 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0, 2};
  return b.gather(x, partner, offs, {dim}, {dim}, 1, sizes, x.shape());
}

struct Rotation {
  Value c, ss;   // (B, n): x J = x c - x[:, partner] ss (columns); J^T x likewise on rows
  Value active;  // (B, n): the pair is rotated
};

// Per index of a pair (p < q) with entries g_pp, g_qq, g_pq: J[p,p] = J[q,q] = c,
// J[p,q] = s, J[q,p] = -s with t = s/c the smaller root of t^2 + 2 zeta t - 1 = 0,
// zeta = (g_qq - g_pp) / (2 g_pq), so that (J^T g J)[p,q] = 0. `small` pairs stay.
static Rotation rotation(Builder& b, const Round& rd, const Value& d, const Value& dp,
                         const Value& gpq, const Value& small) {
  Value app = b.select(rd.lo, d, dp), aqq = b.select(rd.lo, dp, d);
  Value diff = sub(b, aqq, app), zero = full_like(b, diff, 0), one = full_like(b, diff, 1);
  Value sgn = b.select(b.compare(diff, zero, Cmp::GE), one, full_like(b, diff, -1));
  Value den = add(b, b.unary("stablehlo.abs", diff),
                  b.unary("stablehlo.sqrt", add(b, mul(b, diff, diff), mul(b, full_like(b, diff, 4), mul(b, gpq, gpq)))));
  Value active = b.binary("stablehlo.and", rd.paired,
                          b.unary("stablehlo.not", b.binary("stablehlo.or", small, b.compare(den, zero, Cmp::EQ))));
  Value tt = b.select(active, div(b, mul(b, full_like(b, diff, 2), mul(b, gpq, sgn)), b.select(active, den, one)), zero);
  Value c = b.unary("stablehlo.rsqrt", add(b, one, mul(b, tt, tt)));
  Value s = mul(b, tt, c);
  // x J's column i adds J[partner, i] x[:, partner]: -s for p, +s for q.
  return {c, b.select(rd.lo, s, b.unary("stablehlo.negate", s)), active};
}

// x J (dim 2) or J^T x (dim 1) for x (B, r, n) / (B, n, c).
static Value rotate(Builder& b, const Value& x, const Round& rd, const Rotation& rot, int64_t dim) {
  Value c = b.broadcast_in_dim(rot.c, x.shape(), {0, dim});
  Value ss = b.broadcast_in_dim(rot.ss, x.shape(), {0, dim});
  return sub(b, mul(b, x, c), mul(b, permute(b, x, rd.partner, dim), ss));
}

// Whether a rotation was applied: (quiet rounds so far + 1) or 0.
static Value next_quiet(Builder& b, const Value& quiet, const Value& active) {
  Value any = b.reduce(active, b.constant(0, DType::Bool), {0, 1}, "stablehlo.or");
  return b.select(any, idx_const(b, 0), add(b, quiet, idx_const(b, 1)));
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
// Pairs with |a_pq| <= eps ||A||_F stay; a rotated pair's a_pq is set to 0. Done after
// a whole sweep of rounds without a rotation.
static std::pair<Value, Value> jacobi_eigh(Builder& b, const Value& a) {
  int64_t batch = a.shape()[0], n = a.shape()[1], rounds = n + n % 2 - 1;
  DType t = a.dtype();
  Value scale = scale_of(b, a);
  Value x = divide_by(b, a, scale);
  Value fro = b.unary("stablehlo.sqrt", reduce_sum(b, mul(b, x, x), {1, 2}));  // (B)
  Value thresh = b.broadcast_in_dim(mul(b, fro, full_like(b, fro, eps_of(t))), {batch, n}, {0});
  Type st{DType::I64, {batch, n, n}};
  Value diag = b.compare(b.iota(st, 1), b.iota(st, 2), Cmp::EQ);
  auto out = b.while_loop(
      {idx_const(b, 0), idx_const(b, 0), x, eye3(b, t, batch, n, n)},
      [&](Builder& bb, const std::vector<Value>& s) {
        Value more = bb.compare(s[0], idx_const(bb, kMaxSweeps * rounds), Cmp::LT);
        return std::vector<Value>{bb.binary("stablehlo.and", more, bb.compare(s[1], idx_const(bb, rounds), Cmp::LT))};
      },
      [&](Builder& bb, const std::vector<Value>& s) {
        Round rd = round_pairs(bb, s[0], batch, n);
        const Value& y = s[2];
        Value d = masked_rows(bb, diag, y);
        Value dp = masked_rows(bb, rd.mask, spread2(bb, d, 2));
        Value gpq = bb.select(rd.lo, masked_rows(bb, rd.mask, y), masked_rows(bb, rd.mask, swap_last(bb, y)));
        Value small = bb.compare(bb.unary("stablehlo.abs", gpq), thresh, Cmp::LE);
        Rotation rot = rotation(bb, rd, d, dp, gpq, small);
        Value z = rotate(bb, rotate(bb, y, rd, rot, 2), rd, rot, 1);
        Value zero_pq = bb.binary("stablehlo.and", rd.mask, spread2(bb, rot.active, 1));
        z = bb.select(zero_pq, full_like(bb, z, 0), z);
        return std::vector<Value>{add(bb, s[0], idx_const(bb, 1)), next_quiet(bb, s[1], rot.active), z,
                                  rotate(bb, s[3], rd, rot, 2)};
      });
  Value w = masked_rows(b, diag, out[2]);
  w = mul(b, w, b.broadcast_in_dim(scale, w.shape(), {0}));
  auto [ws, perm] = sort_keys(b, w, true);
  return {ws, matmul3(b, out[3], perm)};
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
  ctx.check(all_finite(b, sym), "LinAlgError: linalg.eigh: The algorithm failed to converge because the input matrix "
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
  // Pairs whose columns are orthogonal to tol (relative) stay; done after a whole
  // sweep of rounds without a rotation.
  auto out = b.while_loop(
      {idx_const(b, 0), idx_const(b, 0), x, eye3(b, t, batch, n, n)},
      [&](Builder& bb, const std::vector<Value>& s) {
        Value more = bb.compare(s[0], idx_const(bb, kMaxSweeps * rounds), Cmp::LT);
        return std::vector<Value>{bb.binary("stablehlo.and", more, bb.compare(s[1], idx_const(bb, rounds), Cmp::LT))};
      },
      [&](Builder& bb, const std::vector<Value>& s) {
        Round rd = round_pairs(bb, s[0], batch, n);
        const Value& y = s[2];
        Value yp = permute(bb, y, rd.partner, 2);
        Value d = reduce_sum(bb, mul(bb, y, y), {1}), dp = reduce_sum(bb, mul(bb, yp, yp), {1});
        Value gpq = reduce_sum(bb, mul(bb, y, yp), {1});
        Value small = bb.compare(mul(bb, gpq, gpq), mul(bb, full_like(bb, d, tol * tol), mul(bb, d, dp)), Cmp::LE);
        Rotation rot = rotation(bb, rd, d, dp, gpq, small);
        Value c = bb.broadcast_in_dim(rot.c, y.shape(), {0, 2}), ss = bb.broadcast_in_dim(rot.ss, y.shape(), {0, 2});
        Value z = sub(bb, mul(bb, y, c), mul(bb, yp, ss));
        return std::vector<Value>{add(bb, s[0], idx_const(bb, 1)), next_quiet(bb, s[1], rot.active), z,
                                  rotate(bb, s[3], rd, rot, 2)};
      });
  Value y = out[2];
  Value norms = b.unary("stablehlo.sqrt", reduce_sum(b, mul(b, y, y), {1}));  // (B, n)
  auto [s, perm] = sort_keys(b, norms, false);
  Svd r{Value{}, mul(b, s, b.broadcast_in_dim(scale, s.shape(), {0})), matmul3(b, out[3], perm)};
  if (!want_u) return r;
  Value ys = matmul3(b, y, perm);
  Value sb = b.broadcast_in_dim(s, ys.shape(), {0, 2});
  Value zero = full_like(b, sb, 0);
  Value is0 = b.compare(sb, zero, Cmp::EQ);
  Value u0 = b.select(is0, zero, div(b, ys, b.select(is0, full_like(b, sb, 1), sb)));
  auto [f, tau] = householder_qr(b, u0);
  Value q = apply_householder(b, f, tau, eye3(b, t, batch, m, mu), true, false, true);
  // sign(R_jj) for j < n (1 where R_jj is 0), 1 for the completed columns.
  Type st{DType::I64, {batch, n, n}};
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
  ctx.check(all_finite(b, a3), "LinAlgError: linalg.svd: The algorithm failed to converge because the input matrix "
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
  Value c = b.dot_general(r.u, b3, {0}, {0}, {1}, {1}, xo.dtype, ir::DotPrecision::Highest);  // U^T B: (batch, k, nrhs)
  c = mul(b, c, b.broadcast_in_dim(inv, c.shape(), {0, 1}));
  Value x = matmul3(b, r.v, c);  // (batch, n, nrhs)
  Value res = b.constant(0, ro.dtype, ro.shape);
  if (ro.numel() > 0) {
    Value e = sub(b, b.dot_general(a3, x, {0}, {0}, {2}, {1}, xo.dtype, ir::DotPrecision::Highest), b3);
    res = b.reshape(reduce_sum(b, mul(b, e, e), {1}), ro.shape);
  }
  Value rank = b.constant(0, ko.dtype, ko.shape);
  if (ko.numel() > 0)
    rank = b.reshape(reduce_sum(b, b.convert(kept, ko.dtype), {1}), ko.shape);
  Value sv = so.numel() > 0 ? b.reshape(r.s, so.shape) : b.constant(0, so.dtype, so.shape);
  return {b.reshape(x, xo.shape), res, rank, sv};
}

}  // namespace tpu::lowering
