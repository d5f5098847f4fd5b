// Linear algebra with StableHLO's own ops: triangular solves (stablehlo.triangular_solve)
// and Cholesky factorization (stablehlo.cholesky). Batch dims broadcast as in PyTorch.
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
  if (o.numel() == 0) throw Unsupported("empty solve");
  Shape batch = batch_of(o);
  return {to_batch(ctx.b, ctx.b.convert(ctx.in(i), o.dtype), batch),
          to_batch(ctx.b, ctx.b.convert(ctx.in(j), o.dtype), batch)};
}

// linalg_solve_triangular(A, B, *, upper, left, unitriangular): A X = B or X A = B.
TPU_LOWER(linalg_solve_triangular, "linalg_solve_triangular") {
  auto [a, rhs] = solve_operands(ctx, 0, 1);
  return {tri_solve(ctx.b, a, rhs, ctx.flag(3), !ctx.flag(2), ctx.flag(4), false)};
}

// triangular_solve(b, A, upper, transpose, unitriangular) -> (solution, A's copy).
TPU_LOWER(triangular_solve, "triangular_solve") {
  Builder& b = ctx.b;
  auto [rhs, a] = solve_operands(ctx, 0, 1);
  Value x = tri_solve(b, a, rhs, true, !ctx.flag(2), ctx.flag(4), ctx.flag(3));
  return {x, to_batch(b, a, batch_of(ctx.out(1)))};
}

// Whether each matrix's Cholesky factor l (*, n, n) has positive diagonal: (*).
static Value factor_ok(Builder& b, const Value& l) {
  int64_t r = l.rank();
  Type it{DType::I64, l.shape()};
  Value on = b.compare(b.iota(it, r - 2), b.iota(it, r - 1), Cmp::EQ);
  Value diag = reduce_sum(b, b.select(on, l, full_like(b, l, 0)), {r - 1});
  Value good = b.compare(diag, full_like(b, diag, 0), Cmp::GT);  // NaN is not good
  return b.reduce(good, b.constant(1, DType::Bool), {r - 2}, "stablehlo.and");
}

// (L or U, info). stablehlo.cholesky reads the lower triangle and gives NaN when A
// is not positive-definite, without saying where; info (1 + the order of the first
// leading minor that is not positive-definite, 0 if none) comes from factoring every
// leading minor k, padded with the identity, in one batch. That costs n factorizations,
// so larger matrices take the fallback.
TPU_LOWER(linalg_cholesky_ex, "linalg_cholesky_ex") {
  Builder& b = ctx.b;
  Value a = ctx.in(0);
  check_float(a.dtype());
  int64_t r = a.rank(), n = a.shape().back();
  if (a.type.numel() == 0 || n > 64) throw Unsupported("cholesky of this size");
  bool upper = ctx.flag(1);
  // For upper, U = L^T where L is the factor of A^T (the upper triangle read).
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < r - 2; ++i) perm.push_back(i);
  perm.push_back(r - 1), perm.push_back(r - 2);
  Value src = upper ? b.transpose(a, perm) : a;
  Value l = triangle(b, b.raw("stablehlo.cholesky", {src}, "lower = true", a.type), true);
  // Leading minors: (*, k, n, n) with rows/cols >= k+1 replaced by the identity.
  Shape ks(a.shape().begin(), a.shape().end() - 2);
  ks.push_back(n), ks.push_back(n), ks.push_back(n);
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < r - 2; ++i) dims.push_back(i);
  dims.push_back(r - 1), dims.push_back(r);
  Value big = b.broadcast_in_dim(src, ks, dims);
  Type it{DType::I64, ks};
  Value k = b.iota(it, r - 2), i = b.iota(it, r - 1), j = b.iota(it, r);
  Value inside = b.binary("stablehlo.and", b.compare(i, k, Cmp::LE), b.compare(j, k, Cmp::LE));
  Value eye = b.convert(b.compare(i, j, Cmp::EQ), a.dtype());
  Value minors = b.select(inside, big, eye);
  Value ok = factor_ok(b, b.raw("stablehlo.cholesky", {minors}, "lower = true", minors.type));  // (*, n)
  Shape os = ok.shape();
  Value idx = add(b, b.iota(Type{DType::I64, os}, r - 2), b.constant(1, DType::I64, os));
  Value bad = b.select(ok, b.constant(static_cast<double>(n + 1), DType::I64, os), idx);
  Value first = b.reduce(bad, b.constant(static_cast<double>(n + 1), DType::I64), {r - 2}, "stablehlo.minimum");
  Value info = b.select(b.compare(first, full_like(b, first, static_cast<double>(n + 1)), Cmp::EQ),
                        full_like(b, first, 0), first);
  return {upper ? b.transpose(l, perm) : l, b.convert(info, ctx.out(1).dtype)};
}

// Solves A X = B with A = L L^T (or U^T U) given the factor: two triangular solves.
TPU_LOWER(cholesky_solve_helper, "_cholesky_solve_helper") {
  Builder& b = ctx.b;
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
  if (o.numel() == 0) throw Unsupported("empty cholesky_inverse");
  Value f = b.convert(ctx.in(0), o.dtype);
  int64_t r = f.rank();
  Type it{DType::I64, f.shape()};
  Value eye = b.convert(b.compare(b.iota(it, r - 2), b.iota(it, r - 1), Cmp::EQ), o.dtype);
  bool upper = ctx.flag(1);
  Value y = tri_solve(b, f, eye, true, !upper, false, upper);
  return {tri_solve(b, f, y, true, !upper, false, !upper)};
}

}  // namespace tpu::lowering
