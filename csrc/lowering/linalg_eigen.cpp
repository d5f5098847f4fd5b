// Symmetric eigendecomposition (two-sided Jacobi) and SVD (one-sided Jacobi on the
// columns), both with the parallel round-robin ordering kept in a fixed layout: index k
// pairs with k + h (h = n/2, n padded to even with a zero row/column), so a round's n/2
// disjoint rotations act on the two halves with slices and elementwise math (no gathers,
// no index arithmetic), and a static shuffle (slices + concatenate) moves the indices to
// the next round's pairs. n-1 rounds make a sweep and bring the layout back; sweeps run
// until the off-diagonal part (eigh) or the columns' Gram matrix (SVD) passes the test
// that would leave a further sweep without a rotation (or a sweep cap).
// Matrices are flattened to (B, m, n) and scaled to max |a| = 1 first (no overflow).
// Results are sorted like LAPACK's (eigenvalues ascending, singular values descending).
#include <cmath>
#include <functional>

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

static Value swap_last(Builder& b, const Value& x) { return b.transpose(x, {0, 2, 1}); }

static Value matmul3(Builder& b, const Value& x, const Value& y) {
  return b.dot_general(x, y, {0}, {0}, {2}, {1}, x.dtype(), ir::DotPrecision::Highest);
}

// x[lo:hi] along dim of x (B, r, c).
static Value part(Builder& b, const Value& x, int64_t dim, int64_t lo, int64_t hi) {
  Shape start{0, 0, 0}, limit = x.shape();
  start[dim] = lo, limit[dim] = hi;
  return b.slice(x, start, limit, {1, 1, 1});
}

// x[:, lo:hi] of x (B, n).
static Value part2(Builder& b, const Value& x, int64_t lo, int64_t hi) {
  return b.slice(x, {0, lo}, {x.shape()[0], hi}, {1, 1});
}

// The index ranges [lo, hi) that next_round concatenates, over n = 2h indices.
static std::vector<std::pair<int64_t, int64_t>> round_pieces(int64_t h) {
  if (h < 2) return {{0, 2 * h}};
  std::vector<std::pair<int64_t, int64_t>> p{{0, 1}, {h, h + 1}};
  if (h > 2) p.push_back({1, h - 1});
  p.push_back({h + 1, 2 * h});
  p.push_back({h - 1, h});
  return p;
}

// Moves the indices along dim (size n = 2h) to the next round: 0 stays, the others step
// along the cycle 1 -> 2 -> .. -> h-1 -> 2h-1 -> 2h-2 -> .. -> h -> 1 (the circle method:
// any n-1 consecutive rounds pair every two indices once; n-1 steps are the identity).
static Value next_round(Builder& b, const Value& x, int64_t dim) {
  int64_t h = x.shape()[dim] / 2;
  if (h < 2) return x;
  std::vector<Value> parts;
  for (auto [lo, hi] : round_pieces(h)) parts.push_back(part(b, x, dim, lo, hi));
  return b.concatenate(parts, dim);
}

// next_round along both dims of the matrix held as blocks {pp, pq, qp, qq} (B, h, h):
// one concatenation of slices of the blocks, which XLA fuses with their computation
// (shuffling rows, then columns of the assembled matrix wrote it twice more a round).
static Value next_round_2d(Builder& b, const std::vector<Value>& blocks) {
  int64_t batch = blocks[0].shape()[0], h = blocks[0].shape()[1];
  auto pieces = round_pieces(h);
  if (h < 2)
    return b.concatenate({b.concatenate({blocks[0], blocks[1]}, 2), b.concatenate({blocks[2], blocks[3]}, 2)}, 1);
  std::vector<Value> rows;
  for (auto [r0, r1] : pieces) {
    std::vector<Value> cols;
    for (auto [c0, c1] : pieces) {
      int64_t bi = (r0 >= h ? 2 : 0) + (c0 >= h ? 1 : 0), ro = r0 >= h ? h : 0, co = c0 >= h ? h : 0;
      cols.push_back(b.slice(blocks[bi], {0, r0 - ro, c0 - co}, {batch, r1 - ro, c1 - co}, {1, 1, 1}));
    }
    rows.push_back(b.concatenate(cols, 2));
  }
  return b.concatenate(rows, 1);
}

// One rotation per pair (p = k, q = k + h): J[p,p] = J[q,q] = c, J[p,q] = s, J[q,p] = -s
// with t = s/c the smaller root of t^2 + 2 zeta t - 1 = 0, zeta = (a_qq - a_pp) / (2 a_pq),
// so that (J^T a J)[p,q] = 0. Pairs flagged `small` (and degenerate ones) get t = 0.
struct Rotation {
  Value t, c, s;  // (B, h)
  Value active;   // (B, h): the pair is rotated
};

static Rotation rotation(Builder& b, const Value& app, const Value& aqq, const Value& apq, const Value& small) {
  Value diff = sub(b, aqq, app), zero = full_like(b, diff, 0), one = full_like(b, diff, 1);
  Value sgn = b.select(b.compare(diff, zero, Cmp::GE), one, full_like(b, diff, -1));
  Value den = add(b, b.unary("stablehlo.abs", diff),
                  b.unary("stablehlo.sqrt", add(b, mul(b, diff, diff), mul(b, full_like(b, diff, 4), mul(b, apq, apq)))));
  Value active = b.unary("stablehlo.not", b.binary("stablehlo.or", small, b.compare(den, zero, Cmp::EQ)));
  Value t = b.select(active, div(b, mul(b, full_like(b, diff, 2), mul(b, apq, sgn)), b.select(active, den, one)), zero);
  Value c = b.unary("stablehlo.rsqrt", add(b, one, mul(b, t, t)));
  return {t, c, mul(b, t, c), active};
}

// x J along dim 2 (columns p, q become c x_p - s x_q, s x_p + c x_q) or J^T x along dim 1
// (the same on rows), for x (B, r, n) / (B, n, c).
static Value rotate(Builder& b, const Value& x, const Rotation& r, int64_t dim) {
  int64_t h = x.shape()[dim] / 2;
  Value xp = part(b, x, dim, 0, h), xq = part(b, x, dim, h, 2 * h);
  Value c = b.broadcast_in_dim(r.c, xp.shape(), {0, dim}), s = b.broadcast_in_dim(r.s, xp.shape(), {0, dim});
  return b.concatenate({sub(b, mul(b, c, xp), mul(b, s, xq)), add(b, mul(b, s, xp), mul(b, c, xq))}, dim);
}

// J^T y J for symmetric y (B, n, n), by its four (h, h) blocks (each output block mixes
// the four input blocks elementwise: one pass, no intermediate). The pairs' own entries
// take the given values: diagonals app / aqq (B, h), off-diagonals apq (B, h).
static Value two_sided(Builder& b, const Value& y, const Rotation& r, const Value& app, const Value& aqq,
                       const Value& apq) {
  int64_t batch = y.shape()[0], h = y.shape()[1] / 2;
  auto blk = [&](int64_t i, int64_t j) { return b.slice(y, {0, i, j}, {batch, i + h, j + h}, {1, 1, 1}); };
  Value ypp = blk(0, 0), ypq = blk(0, h), yqp = blk(h, 0), yqq = blk(h, h);
  Shape bs{batch, h, h};
  Value cr = b.broadcast_in_dim(r.c, bs, {0, 1}), sr = b.broadcast_in_dim(r.s, bs, {0, 1});
  Value cc = b.broadcast_in_dim(r.c, bs, {0, 2}), sc = b.broadcast_in_dim(r.s, bs, {0, 2});
  auto lin = [&](const Value& c, const Value& x, const Value& s, const Value& z, bool minus) {
    return minus ? sub(b, mul(b, c, x), mul(b, s, z)) : add(b, mul(b, s, x), mul(b, c, z));
  };
  // Rows first (J^T y): row p = c y_p - s y_q, row q = s y_p + c y_q; then columns.
  Value rpp = lin(cr, ypp, sr, yqp, true), rpq = lin(cr, ypq, sr, yqq, true);
  Value rqp = lin(cr, ypp, sr, yqp, false), rqq = lin(cr, ypq, sr, yqq, false);
  Value eye = b.compare(b.iota(Type{DType::I64, bs}, 1), b.iota(Type{DType::I64, bs}, 2), Cmp::EQ);
  auto mend = [&](const Value& z, const Value& v) { return b.select(eye, b.broadcast_in_dim(v, bs, {0, 1}), z); };
  Value zpp = mend(lin(cc, rpp, sc, rpq, true), app), zpq = mend(lin(cc, rpp, sc, rpq, false), apq);
  Value zqp = mend(lin(cc, rqp, sc, rqq, true), apq), zqq = mend(lin(cc, rqp, sc, rqq, false), aqq);
  return next_round_2d(b, {zpp, zpq, zqp, zqq});
}

// x[i, i + off] for i < count of x (B, n, n): a strided slice of x flattened to (B, n*n).
static Value diagonal(Builder& b, const Value& x, int64_t off, int64_t count) {
  int64_t batch = x.shape()[0], n = x.shape()[1];
  Value flat = b.reshape(x, {batch, n * n});
  return b.slice(flat, {0, off}, {batch, off + (count - 1) * (n + 1) + 1}, {1, n + 1});
}

// x (B, r, c) with `rows` / `cols` zero rows / columns added at the end.
static Value pad_zero(Builder& b, const Value& x, int64_t rows, int64_t cols) {
  if (rows == 0 && cols == 0) return x;
  return b.pad(x, b.constant(0, x.dtype()), {0, 0, 0}, {0, rows, cols}, {0, 0, 0});
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

// Runs sweeps of `rounds` rounds over state {x, v...} (the first a matrix, v optional)
// until `done(state)` or the sweep cap; `round(state)` is one round, shuffle included.
using StateFn = std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>;
using DoneFn = std::function<Value(Builder&, const Value&)>;
static std::vector<Value> sweeps(Builder& b, const std::vector<Value>& init, int64_t rounds, const DoneFn& done,
                                 const StateFn& round) {
  std::vector<Value> st{idx_const(b, 0), done(b, init[0])};
  st.insert(st.end(), init.begin(), init.end());
  auto out = b.while_loop(
      st,
      [&](Builder& bb, const std::vector<Value>& s) {
        Value more = bb.compare(s[0], idx_const(bb, kMaxSweeps), Cmp::LT);
        return std::vector<Value>{bb.binary("stablehlo.and", more, bb.unary("stablehlo.not", s[1]))};
      },
      [&](Builder& bb, const std::vector<Value>& s) {
        std::vector<Value> in{idx_const(bb, 0)};
        in.insert(in.end(), s.begin() + 2, s.end());
        auto r = bb.while_loop(
            in,
            [&](Builder& c, const std::vector<Value>& x) {
              return std::vector<Value>{c.compare(x[0], idx_const(c, rounds), Cmp::LT)};
            },
            [&](Builder& c, const std::vector<Value>& x) {
              std::vector<Value> next{add(c, x[0], idx_const(c, 1))};
              auto moved = round(c, std::vector<Value>(x.begin() + 1, x.end()));
              next.insert(next.end(), moved.begin(), moved.end());
              return next;
            });
        std::vector<Value> next{add(bb, s[0], idx_const(bb, 1)), done(bb, r[1])};
        next.insert(next.end(), r.begin() + 1, r.end());
        return next;
      });
  return std::vector<Value>(out.begin() + 2, out.end());
}

// Thousands of rotations leave V (B, n, n) ~sqrt(rotations) eps off orthogonal: one
// Newton-Schulz step, V (3I - V^T V) / 2, takes that to ~eps (two matmuls).
static Value newton_schulz(Builder& b, const Value& v) {
  int64_t batch = v.shape()[0], n = v.shape()[1];
  Value vtv = b.dot_general(v, v, {0}, {0}, {1}, {1}, v.dtype(), ir::DotPrecision::Highest);
  Value three_halves = mul(b, eye3(b, v.dtype(), batch, n, n), full_like(b, vtv, 1.5));
  return matmul3(b, v, sub(b, three_halves, mul(b, vtv, full_like(b, vtv, 0.5))));
}

// Eigen-decomposition of symmetric a (B, n, n): (ascending eigenvalues (B, n), vectors
// (B, n, n), or none without want_v). Pairs with |a_pq| <= eps ||A||_F / sqrt(n) stay
// (<= eps ||A||_2: the looser eps ||A||_F left twice the residual); a rotated
// pair gets a_pq = 0 and its diagonal updated as a_pp - t a_pq, a_qq + t a_pq (exact in
// exact arithmetic, and more accurate than rotating the diagonal entries).
static std::pair<Value, Value> jacobi_eigh(Builder& b, const Value& a, bool want_v) {
  int64_t batch = a.shape()[0], n0 = a.shape()[1], n = n0 + n0 % 2, h = n / 2;
  DType t = a.dtype();
  Value scale = scale_of(b, a);
  Value x = pad_zero(b, divide_by(b, a, scale), n - n0, n - n0);
  Value fro = b.unary("stablehlo.sqrt", reduce_sum(b, mul(b, x, x), {1, 2}));  // (B)
  Value thresh = mul(b, fro, full_like(b, fro, eps_of(t) / std::sqrt(static_cast<double>(n))));
  Value thresh_h = b.broadcast_in_dim(thresh, {batch, h}, {0});
  Shape sq{batch, n, n};
  Value diag = b.compare(b.iota(Type{DType::I64, sq}, 1), b.iota(Type{DType::I64, sq}, 2), Cmp::EQ);
  // |i - j| == h: the entries a_pq, a_qp of each pair.
  auto done = [&](Builder& bb, const Value& y) {
    Value off = reduce_max(bb, bb.select(diag, full_like(bb, y, 0), bb.unary("stablehlo.abs", y)), {1, 2});
    return bb.reduce(bb.compare(off, thresh, Cmp::LE), bb.constant(1, DType::Bool), {0}, "stablehlo.and");
  };
  auto round = [&](Builder& bb, const std::vector<Value>& s) {
    const Value& y = s[0];
    Value d = diagonal(bb, y, 0, n), apq = diagonal(bb, y, h, h);
    Value app = part2(bb, d, 0, h), aqq = part2(bb, d, h, n);
    Value small = bb.compare(bb.unary("stablehlo.abs", apq), thresh_h, Cmp::LE);
    Rotation r = rotation(bb, app, aqq, apq, small);
    Value tq = mul(bb, r.t, apq);
    Value z = two_sided(bb, y, r, sub(bb, app, tq), add(bb, aqq, tq), bb.select(r.active, full_like(bb, apq, 0), apq));
    std::vector<Value> next{z};
    if (want_v) next.push_back(next_round(bb, rotate(bb, s[1], r, 2), 2));
    return next;
  };
  std::vector<Value> init{x};
  if (want_v) init.push_back(eye3(b, t, batch, n, n));
  auto out = sweeps(b, init, n - 1, done, round);
  Value w = part2(b, diagonal(b, out[0], 0, n), 0, n0), v;
  if (want_v) {
    v = n == n0 ? out[1] : b.slice(out[1], {0, 0, 0}, {batch, n0, n0}, {1, 1, 1});
    // The eigenvalues are then the Rayleigh quotients v^T A v (error ~eps ||A|| plus the
    // square of V's).
    v = newton_schulz(b, v);
    Value a0 = divide_by(b, a, scale);
    w = reduce_sum(b, mul(b, v, matmul3(b, a0, v)), {1});
  }
  w = mul(b, w, b.broadcast_in_dim(scale, w.shape(), {0}));
  auto [ws, perm] = sort_keys(b, w, true);
  if (!want_v) return {ws, Value{}};
  return {ws, matmul3(b, v, perm)};
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
  bool want_v = vo.numel() > 0;
  auto [w, v] = jacobi_eigh(b, sym, want_v);
  Value vv = want_v ? b.reshape(v, vo.shape) : b.constant(0, vo.dtype, vo.shape);
  return {b.reshape(w, wo.shape), vv};
}

struct Svd {
  Value u, s, v;  // u (B, m, mu) when asked for, s (B, n) descending, v (B, n, n)
};

// SVD of a (B, m, n) with m >= n by one-sided Jacobi: A V converges to orthogonal
// columns U S. U is then completed (zero singular values, full_matrices) and
// re-orthonormalized by a Householder QR of U's columns, with R's signs folded back.
// want_v false (singular values only) skips V, and so U.
static Svd jacobi_svd(Builder& b, const Value& a, bool want_u, int64_t mu, bool want_v = true) {
  int64_t batch = a.shape()[0], m = a.shape()[1], n0 = a.shape()[2], n = n0 + n0 % 2, h = n / 2;
  DType t = a.dtype();
  want_u = want_u && want_v;
  Value scale = scale_of(b, a);
  Value x0 = divide_by(b, a, scale), x = pad_zero(b, x0, 0, n - n0);
  // Pairs whose columns are orthogonal to tol (relative) stay: g_pq^2 <= tol^2 g_pp g_qq.
  double tol = 2 * eps_of(t) * std::sqrt(static_cast<double>(m));
  Shape sq{batch, n, n};
  Value diag = b.compare(b.iota(Type{DType::I64, sq}, 1), b.iota(Type{DType::I64, sq}, 2), Cmp::EQ);
  auto done = [&](Builder& bb, const Value& y) {
    Value g = bb.dot_general(y, y, {0}, {0}, {1}, {1}, t, ir::DotPrecision::Highest);  // y^T y
    Value d = diagonal(bb, g, 0, n);
    Value bound = mul(bb, full_like(bb, g, tol * tol), mul(bb, bb.broadcast_in_dim(d, sq, {0, 1}),
                                                           bb.broadcast_in_dim(d, sq, {0, 2})));
    Value ok = bb.binary("stablehlo.or", diag, bb.compare(mul(bb, g, g), bound, Cmp::LE));
    return bb.reduce(ok, bb.constant(1, DType::Bool), {0, 1, 2}, "stablehlo.and");
  };
  auto round = [&](Builder& bb, const std::vector<Value>& s) {
    const Value& y = s[0];
    Value yp = part(bb, y, 2, 0, h), yq = part(bb, y, 2, h, n);
    Value d = reduce_sum(bb, mul(bb, yp, yp), {1}), dq = reduce_sum(bb, mul(bb, yq, yq), {1});
    Value g = reduce_sum(bb, mul(bb, yp, yq), {1});
    Value small = bb.compare(mul(bb, g, g), mul(bb, full_like(bb, d, tol * tol), mul(bb, d, dq)), Cmp::LE);
    Rotation r = rotation(bb, d, dq, g, small);
    std::vector<Value> next{next_round(bb, rotate(bb, y, r, 2), 2)};
    if (want_v) next.push_back(next_round(bb, rotate(bb, s[1], r, 2), 2));
    return next;
  };
  std::vector<Value> init{x};
  if (want_v) init.push_back(eye3(b, t, batch, n, n));
  auto out = sweeps(b, init, n - 1, done, round);
  Value y = n == n0 ? out[0] : part(b, out[0], 2, 0, n0), v;
  if (want_v) {
    // As in jacobi_eigh: V made orthogonal to ~eps, and A V recomputed from it, so that
    // U S V^T reproduces A to ~eps instead of the rotations' accumulated rounding.
    v = newton_schulz(b, n == n0 ? out[1] : b.slice(out[1], {0, 0, 0}, {batch, n0, n0}, {1, 1, 1}));
    y = matmul3(b, x0, v);
  }
  Value norms = b.unary("stablehlo.sqrt", reduce_sum(b, mul(b, y, y), {1}));  // (B, n0)
  auto [s, perm] = sort_keys(b, norms, false);
  Svd r{Value{}, mul(b, s, b.broadcast_in_dim(scale, s.shape(), {0})), Value{}};
  if (!want_v) return r;
  r.v = matmul3(b, v, perm);
  if (!want_u) return r;
  n = n0;
  Value ys = matmul3(b, y, perm);
  Value sb = b.broadcast_in_dim(s, ys.shape(), {0, 2});
  Value zero = full_like(b, sb, 0);
  Value is0 = b.compare(sb, zero, Cmp::EQ);
  Value u0 = b.select(is0, zero, div(b, ys, b.select(is0, full_like(b, sb, 1), sb)));
  auto [f, tau] = householder_qr(b, u0);
  Value q = apply_householder(b, f, tau, eye3(b, t, batch, m, mu), true, false, true);
  // sign(R_jj) for j < n (1 where R_jj is 0), 1 for the completed columns.
  Value rd = diagonal(b, b.slice(f, {0, 0, 0}, {batch, n, n}, {1, 1, 1}), 0, n);
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
  Svd r = jacobi_svd(b, x, uv, full ? rows : cols, uv);
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
