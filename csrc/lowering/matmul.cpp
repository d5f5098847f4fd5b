// Matrix products as dot_general. Low-precision inputs accumulate in f32 and the
// add* epilogues run in f32 too, with one rounding at the end (as cuBLAS does).
#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

// a . b contracting dims ca/cb, batched over ba/bb, in the accumulation type of `out`.
static Value contract(Builder& b, const Value& x, const Value& y, DType out,
                      const std::vector<int64_t>& ba, const std::vector<int64_t>& bb,
                      const std::vector<int64_t>& ca, const std::vector<int64_t>& cb) {
  return b.dot_general(b.convert(x, out), b.convert(y, out), ba, bb, ca, cb, acc_type(out));
}

// beta * self + alpha * prod, where beta == 0 ignores self and alpha == 0 the product
// (NaN/inf included), as BLAS and PyTorch. The scalars are runtime operands, so those
// tests are selects.
static Value epilogue(Ctx& ctx, const Value& prod, int self_i, int beta_i, int alpha_i) {
  Builder& b = ctx.b;
  DType t = prod.dtype();
  const Shape& s = prod.shape();
  Value self = coerce(b, ctx.in(self_i), t, s);
  Value beta = broadcast_to(b, ctx.scalar(beta_i, t), s);
  Value alpha = broadcast_to(b, ctx.scalar(alpha_i, t), s);
  Value zero = b.constant(0, t, s);
  Value scaled = b.select(b.compare(beta, zero, Cmp::EQ), zero, mul(b, beta, self));
  Value product = b.select(b.compare(alpha, zero, Cmp::EQ), zero, mul(b, alpha, prod));
  return convert_any(b, add(b, scaled, product), ctx.out(0).dtype);
}

// (convert_any: an fp8 e4m3fn result saturates to +-448 as on CPU, where XLA gives NaN.)
static Value out_of(Ctx& ctx, const Value& v) { return convert_any(ctx.b, v, ctx.out(0).dtype); }

// A product with at most this many outputs per batch (a vector dot, a matrix-vector or
// matrix product of a few rows and columns) is its products summed by a reduce: XLA:CPU
// runs such a dot_general as one sequential chain of adds per output (torch.dot over 2e5
// float32 values with a +1e3 offset was 3.7e-4 off, 1000x CPU's error), while its reduce
// keeps several partial sums, as CPU's BLAS does.
constexpr int64_t kSummedOutputs = 8;

// x [.., M, K] . y [.., K, N] (matching leading batch dims) in the accumulation type of
// `out`, summed as above when M * N is small.
static Value matrix_product(Builder& b, const Value& x, const Value& y, DType out) {
  int64_t r = x.rank(), m = x.shape()[r - 2], n = y.shape()[r - 1];
  std::vector<int64_t> batch(r - 2);
  for (int64_t i = 0; i < r - 2; ++i) batch[i] = i;
  if (m * n > kSummedOutputs) return contract(b, x, y, out, batch, batch, {r - 1}, {r - 2});
  DType t = acc_type(out);
  Shape s = x.shape();
  s.insert(s.end() - 1, n);  // [.., M, N, K]
  std::vector<int64_t> xd = batch, perm = batch, yd = batch;
  xd.insert(xd.end(), {r - 2, r});
  perm.insert(perm.end(), {r - 1, r - 2});  // y as [.., N, K]
  yd.insert(yd.end(), {r - 1, r});
  Value xs = b.broadcast_in_dim(b.convert(x, t), s, xd);
  Value ys = b.broadcast_in_dim(b.transpose(b.convert(y, t), perm), s, yd);
  return reduce_sum(b, mul(b, xs, ys), {r});
}
// x [M, K] . y [K] as a matrix product with one column.
static Value matrix_vector(Builder& b, const Value& x, const Value& y, DType out) {
  Value p = matrix_product(b, x, b.reshape(y, {y.shape()[0], 1}), out);
  return b.reshape(p, {x.shape()[0]});
}

TPU_LOWER(mm, "mm") { return {out_of(ctx, matrix_product(ctx.b, ctx.in(0), ctx.in(1), ctx.out(0).dtype))}; }
TPU_LOWER(bmm, "bmm") { return {out_of(ctx, matrix_product(ctx.b, ctx.in(0), ctx.in(1), ctx.out(0).dtype))}; }
TPU_LOWER(dot, "dot") {
  Value x = ctx.in(0);
  Value p = matrix_vector(ctx.b, ctx.b.reshape(x, {1, x.shape()[0]}), ctx.in(1), ctx.out(0).dtype);
  return {out_of(ctx, ctx.b.reshape(p, {}))};
}
TPU_LOWER(mv, "mv") { return {out_of(ctx, matrix_vector(ctx.b, ctx.in(0), ctx.in(1), ctx.out(0).dtype))}; }
TPU_LOWER(addmm, "addmm") {
  Value p = matrix_product(ctx.b, ctx.in(1), ctx.in(2), ctx.out(0).dtype);
  return {epilogue(ctx, p, 0, 3, 4)};
}
TPU_LOWER(baddbmm, "baddbmm") {
  Value p = matrix_product(ctx.b, ctx.in(1), ctx.in(2), ctx.out(0).dtype);
  return {epilogue(ctx, p, 0, 3, 4)};
}
// Sum over the batch of matrix products: the batch dim is contracted as well.
TPU_LOWER(addbmm, "addbmm") {
  Value p = contract(ctx.b, ctx.in(1), ctx.in(2), ctx.out(0).dtype, {}, {}, {0, 2}, {0, 1});
  return {epilogue(ctx, p, 0, 3, 4)};
}
TPU_LOWER(addmv, "addmv") {
  Value p = matrix_vector(ctx.b, ctx.in(1), ctx.in(2), ctx.out(0).dtype);
  return {epilogue(ctx, p, 0, 3, 4)};
}

}  // namespace tpu::lowering
