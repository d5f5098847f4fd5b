// Linear algebra: triangular solves (stablehlo.triangular_solve), Cholesky factorization
// (a while loop, for LAPACK's info) and the solves built on it. Batch dims broadcast as in
// PyTorch.
#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

// Helpers shared with linalg_lu*.cpp (declared there).
namespace linalg_base {

void check_float(DType t) {
  if (t != DType::F32 && t != DType::F64) throw Unsupported("linear algebra of this dtype");
}

// x (*, r, c) broadcast to batch + [r, c].
Value to_batch(Builder& b, const Value& x, const Shape& batch) {
  Shape s = batch;
  s.push_back(x.shape()[x.rank() - 2]);
  s.push_back(x.shape().back());
  return broadcast_to(b, x, s);
}

// The lower (or upper) triangle of square matrices, the rest zero.
Value triangle(Builder& b, const Value& a, bool lower) {
  int64_t r = a.rank();
  Type it{DType::I64, a.shape()};
  Value i = b.iota(it, r - 2), j = b.iota(it, r - 1);
  Value keep = b.compare(j, i, lower ? Cmp::LE : Cmp::GE);
  return b.select(keep, a, full_like(b, a, 0));
}

Value tri_solve(Builder& b, const Value& a, const Value& rhs, bool left, bool lower, bool unit,
                       bool transpose) {
  std::string attrs = std::string("left_side = ") + (left ? "true" : "false") +
                      ", lower = " + (lower ? "true" : "false") +
                      ", unit_diagonal = " + (unit ? "true" : "false") +
                      ", transpose_a = #stablehlo<transpose " + (transpose ? "TRANSPOSE" : "NO_TRANSPOSE") + ">";
  return b.raw("stablehlo.triangular_solve", {triangle(b, a, lower), rhs}, attrs, rhs.type);
}

Shape batch_of(const Type& out) { return Shape(out.shape.begin(), out.shape.end() - 2); }

}  // namespace linalg_base
using namespace linalg_base;

// Arguments i and j of a solve, in the output's (float) dtype and broadcast to its batch.
static std::pair<Value, Value> solve_operands(Ctx& ctx, int i, int j) {
  Type o = ctx.out(0);
  check_float(o.dtype);
  Shape batch = batch_of(o);
  return {to_batch(ctx.b, ctx.b.convert(ctx.in(i), o.dtype), batch),
          to_batch(ctx.b, ctx.b.convert(ctx.in(j), o.dtype), batch)};
}

// linalg_solve_triangular(A, B, *, upper, left, unitriangular): A X = B or X A = B.
// An empty output of a solve (nothing to compute): zeros of its type.
static Value empty_out(Ctx& ctx, int j) { return ctx.b.constant(0, ctx.out(j).dtype, ctx.out(j).shape); }

TPU_LOWER(linalg_solve_triangular, "linalg_solve_triangular") {
  if (ctx.out(0).numel() == 0) return {empty_out(ctx, 0)};
  auto [a, rhs] = solve_operands(ctx, 0, 1);
  return {tri_solve(ctx.b, a, rhs, ctx.flag(3), !ctx.flag(2), ctx.flag(4), false)};
}

// triangular_solve(b, A, upper, transpose, unitriangular) -> (solution, A's copy).
TPU_LOWER(triangular_solve, "triangular_solve") {
  Builder& b = ctx.b;
  auto [rhs, a] = solve_operands(ctx, 0, 1);
  if (ctx.out(0).numel() == 0)
    return {empty_out(ctx, 0), ctx.out(1).numel() ? to_batch(b, a, batch_of(ctx.out(1))) : empty_out(ctx, 1)};
  Value x = tri_solve(b, a, rhs, true, !ctx.flag(2), ctx.flag(4), ctx.flag(3));
  return {x, to_batch(b, a, batch_of(ctx.out(1)))};
}

// Right-looking Cholesky of the lower triangle of x (*, n, n), one column per loop step:
// (L, info). info is 1 + the first column whose pivot is not positive (NaN included),
// as LAPACK's potrf reports it; later columns then hold NaN.
static std::pair<Value, Value> cholesky_loop(Builder& b, const Value& x0) {
  int64_t r = x0.rank(), n = x0.shape().back();
  Shape bs = batch_of(x0.type);
  std::vector<int64_t> lead_dims;
  for (int64_t i = 0; i < r - 2; ++i) lead_dims.push_back(i);
  std::vector<int64_t> all = lead_dims;
  all.push_back(r - 2), all.push_back(r - 1);
  Value zero = b.constant(0, DType::I64);
  if (n == 0) return {x0, b.constant(0, DType::I32, bs)};
  auto st = b.while_loop(
      {zero, x0, b.constant(0, DType::I32, bs)},
      [&](Builder& b, const std::vector<Value>& s) {
        return std::vector<Value>{b.compare(s[0], b.constant(static_cast<double>(n), DType::I64), Cmp::LT)};
      },
      [&](Builder& b, const std::vector<Value>& s) {
        Value j = s[0], x = s[1], info = s[2];
        const Shape& fs = x.shape();
        std::vector<Value> starts(r, b.constant(0, DType::I64));
        starts[r - 1] = j;
        Shape cs = fs;
        cs.back() = 1;
        Value col = b.dynamic_slice(x, starts, cs);  // (*, n, 1)
        starts[r - 2] = j;
        Shape one = bs;
        one.push_back(1), one.push_back(1);
        Value d = b.reshape(b.dynamic_slice(x, starts, one), bs);
        Value bad = b.unary("stablehlo.not", b.compare(d, full_like(b, d, 0), Cmp::GT));
        Value fresh = b.compare(info, full_like(b, info, 0), Cmp::EQ);
        Value j1 = b.convert(b.binary("stablehlo.add", j, b.constant(1, DType::I64)), DType::I32);
        info = b.select(b.binary("stablehlo.and", bad, fresh), b.broadcast_in_dim(j1, bs, {}), info);
        Value sq = b.unary("stablehlo.sqrt", d);
        Value ci = b.iota(Type{DType::I64, cs}, r - 2);
        Value jc = b.broadcast_in_dim(j, cs, {});
        Value l = div(b, col, b.broadcast_in_dim(sq, cs, lead_dims));
        l = b.select(b.compare(ci, jc, Cmp::GT), l, full_like(b, l, 0));
        Shape rs = bs;
        rs.push_back(1), rs.push_back(n);
        Value lc = b.broadcast_in_dim(l, fs, all), lr = b.broadcast_in_dim(b.reshape(l, rs), fs, all);
        Value rows = b.iota(Type{DType::I64, fs}, r - 2), cols = b.iota(Type{DType::I64, fs}, r - 1);
        Value jf = b.broadcast_in_dim(j, fs, {});
        Value trail = b.binary("stablehlo.and", b.compare(rows, jf, Cmp::GT), b.compare(cols, jf, Cmp::GT));
        x = b.select(trail, sub(b, x, mul(b, lc, lr)), x);
        Value in_col = b.compare(cols, jf, Cmp::EQ);
        x = b.select(b.binary("stablehlo.and", in_col, b.compare(rows, jf, Cmp::GT)), lc, x);
        Value on_diag = b.binary("stablehlo.and", in_col, b.compare(rows, jf, Cmp::EQ));
        x = b.select(on_diag, b.broadcast_in_dim(sq, fs, lead_dims), x);
        return std::vector<Value>{b.binary("stablehlo.add", j, b.constant(1, DType::I64)), x, info};
      });
  return {triangle(b, st[1], true), st[2]};
}

// The lower factor L (A = L Lᴴ), or for `upper` U = Lᵀ of Aᵀ (A = Uᴴ U), with info.
static std::pair<Value, Value> cholesky_factor(Builder& b, const Value& a, bool upper) {
  if (!upper) return cholesky_loop(b, a);
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < a.rank() - 2; ++i) perm.push_back(i);
  perm.push_back(a.rank() - 1), perm.push_back(a.rank() - 2);
  auto [l, info] = cholesky_loop(b, b.transpose(a, perm));
  return {b.transpose(l, perm), info};
}

// (L or U, info).
TPU_LOWER(linalg_cholesky_ex, "linalg_cholesky_ex") {
  Builder& b = ctx.b;
  Value a = ctx.in(0);
  check_float(a.dtype());
  if (ctx.flag(2)) throw Unsupported("cholesky_ex with check_errors");
  auto [l, info] = cholesky_factor(b, a, ctx.flag(1));
  return {l, b.convert(info, ctx.out(1).dtype)};
}

// cholesky(A, upper): the factor; a matrix that is not positive-definite raises, as
// CPU's info check does (a device check, so at the next synchronization).
TPU_LOWER(cholesky, "cholesky") {
  Builder& b = ctx.b;
  Value a = ctx.in(0);
  check_float(a.dtype());
  auto [l, info] = cholesky_factor(b, a, ctx.flag(1));
  if (info.type.numel() > 0) {
    std::vector<int64_t> all;
    for (int64_t i = 0; i < info.rank(); ++i) all.push_back(i);
    Value worst = info.rank() ? reduce_max(b, info, all) : info;
    ctx.check(b.compare(worst, b.constant(0, DType::I32), Cmp::EQ),
              "LinAlgError: cholesky: The factorization could not be completed because the input is not "
              "positive-definite.");
  }
  return {l};
}

// Solves A X = B with A = L L^T (or U^T U) given the factor: two triangular solves.
TPU_LOWER(cholesky_solve_helper, "_cholesky_solve_helper") {
  Builder& b = ctx.b;
  if (ctx.out(0).numel() == 0) return {empty_out(ctx, 0)};
  auto [rhs, f] = solve_operands(ctx, 0, 1);
  bool upper = ctx.flag(2);
  // lower: L y = B, L^T x = y; upper: U^T y = B, U x = y.
  Value y = tri_solve(b, f, rhs, true, !upper, false, upper);
  return {tri_solve(b, f, y, true, !upper, false, !upper)};
}

// (L L^T)^-1 (or (U^T U)^-1) from the factor: the solve against the identity.
TPU_LOWER(cholesky_inverse, "cholesky_inverse") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  check_float(o.dtype);
  if (o.numel() == 0) return {empty_out(ctx, 0)};
  Value f = b.convert(ctx.in(0), o.dtype);
  int64_t r = f.rank();
  Type it{DType::I64, f.shape()};
  Value eye = b.convert(b.compare(b.iota(it, r - 2), b.iota(it, r - 1), Cmp::EQ), o.dtype);
  bool upper = ctx.flag(1);
  Value y = tri_solve(b, f, eye, true, !upper, false, upper);
  return {tri_solve(b, f, y, true, !upper, false, !upper)};
}

}  // namespace tpu::lowering
