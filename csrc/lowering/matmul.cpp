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

TPU_LOWER(mm, "mm") {
  return {out_of(ctx, contract(ctx.b, ctx.in(0), ctx.in(1), ctx.out(0).dtype, {}, {}, {1}, {0}))};
}
TPU_LOWER(bmm, "bmm") {
  return {out_of(ctx, contract(ctx.b, ctx.in(0), ctx.in(1), ctx.out(0).dtype, {0}, {0}, {2}, {1}))};
}
TPU_LOWER(dot, "dot") {
  return {out_of(ctx, contract(ctx.b, ctx.in(0), ctx.in(1), ctx.out(0).dtype, {}, {}, {0}, {0}))};
}
TPU_LOWER(mv, "mv") {
  return {out_of(ctx, contract(ctx.b, ctx.in(0), ctx.in(1), ctx.out(0).dtype, {}, {}, {1}, {0}))};
}
TPU_LOWER(addmm, "addmm") {
  Value p = contract(ctx.b, ctx.in(1), ctx.in(2), ctx.out(0).dtype, {}, {}, {1}, {0});
  return {epilogue(ctx, p, 0, 3, 4)};
}
TPU_LOWER(baddbmm, "baddbmm") {
  Value p = contract(ctx.b, ctx.in(1), ctx.in(2), ctx.out(0).dtype, {0}, {0}, {2}, {1});
  return {epilogue(ctx, p, 0, 3, 4)};
}
// Sum over the batch of matrix products: the batch dim is contracted as well.
TPU_LOWER(addbmm, "addbmm") {
  Value p = contract(ctx.b, ctx.in(1), ctx.in(2), ctx.out(0).dtype, {}, {}, {0, 2}, {0, 1});
  return {epilogue(ctx, p, 0, 3, 4)};
}
TPU_LOWER(addmv, "addmv") {
  Value p = contract(ctx.b, ctx.in(1), ctx.in(2), ctx.out(0).dtype, {}, {}, {1}, {0});
  return {epilogue(ctx, p, 0, 3, 4)};
}

}  // namespace tpu::lowering
