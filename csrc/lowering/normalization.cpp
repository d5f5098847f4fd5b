// Batch normalization over the channel dim 1 (statistics over every other dim). The
// training forward that updates running statistics in place stays a decomposition
// (it mutates arguments and returns new tensors); these rules are the pure parts.
#include "lowering/helpers.h"

namespace tpu::lowering {

static Value as_out(Ctx& ctx, const Value& v, int j) {
  return ctx.b.reshape(ctx.b.convert(v, ctx.out(j).dtype), ctx.out(j).shape);
}
static bool wanted(Ctx& ctx, int j) { return ctx.out(j).dtype != DType::Invalid; }

static std::vector<int64_t> stat_dims(int64_t rank) {
  std::vector<int64_t> d;
  for (int64_t i = 0; i < rank; ++i)
    if (i != 1) d.push_back(i);
  return d;
}
// Per-channel vector c (C) broadcast along dim 1 of `shape`.
static Value chan(Builder& b, const Value& c, DType t, const Shape& shape) {
  return b.broadcast_in_dim(b.convert(c, t), shape, {1});
}
static Value opt_chan(Ctx& ctx, int idx, DType t, const Shape& shape, double dflt) {
  return ctx.is_none(idx) ? ctx.b.constant(dflt, t, shape) : chan(ctx.b, ctx.in(idx), t, shape);
}
static Value mean_of(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  double n = 1;
  for (int64_t d : dims) n *= static_cast<double>(x.shape()[d]);
  Value s = reduce_sum(b, x, dims);
  return div(b, s, full_like(b, s, n));
}
static Value rsqrt_eps(Builder& b, const Value& var, double eps) {
  return b.unary("stablehlo.rsqrt", add(b, var, full_like(b, var, eps)));
}

// (out, batch mean, batch 1/sqrt(var + eps)): input, weight?, bias?, training, momentum, eps.
TPU_LOWER(batch_norm_no_stats, "_native_batch_norm_legit.no_stats") {
  Builder& b = ctx.b;
  Value x = b.convert(ctx.in(0), acc_type(ctx.in(0).dtype()));
  if (x.rank() < 2 || x.type.numel() == 0) throw Unsupported("batch norm of this shape");
  const Shape& s = x.shape();
  auto dims = stat_dims(x.rank());
  Value mean = mean_of(b, x, dims);
  Value d = sub(b, x, chan(b, mean, x.dtype(), s));
  Value rstd = rsqrt_eps(b, mean_of(b, mul(b, d, d), dims), ctx.f(5));
  Value y = mul(b, d, chan(b, rstd, x.dtype(), s));
  y = add(b, mul(b, y, opt_chan(ctx, 1, x.dtype(), s, 1)), opt_chan(ctx, 2, x.dtype(), s, 0));
  return {as_out(ctx, y, 0), as_out(ctx, mean, 1), as_out(ctx, rstd, 2)};
}

// Inference: normalized by the running statistics; the saved stats are empty.
TPU_LOWER(batch_norm_no_training, "_native_batch_norm_legit_no_training") {
  Builder& b = ctx.b;
  Value x = b.convert(ctx.in(0), acc_type(ctx.in(0).dtype()));
  if (x.rank() < 2) throw Unsupported("batch norm of this shape");
  const Shape& s = x.shape();
  Value rstd = rsqrt_eps(b, b.convert(ctx.in(4), x.dtype()), ctx.f(6));
  Value y = mul(b, sub(b, x, chan(b, ctx.in(3), x.dtype(), s)), chan(b, rstd, x.dtype(), s));
  y = add(b, mul(b, y, opt_chan(ctx, 1, x.dtype(), s, 1)), opt_chan(ctx, 2, x.dtype(), s, 0));
  return {as_out(ctx, y, 0), b.constant(0, ctx.out(1).dtype, ctx.out(1).shape),
          b.constant(0, ctx.out(2).dtype, ctx.out(2).shape)};
}

// grad_out, input, weight?, running_mean?, running_var?, save_mean?, save_invstd?,
// train, eps, output_mask. Training: xhat from the saved batch stats and
// dx = invstd * (g*w - mean(g*w) - xhat * mean(g*w * xhat)); inference: dx = g*w*invstd.
TPU_LOWER(native_batch_norm_backward, "native_batch_norm_backward") {
  Builder& b = ctx.b;
  Value g = b.convert(ctx.in(0), acc_type(ctx.in(0).dtype()));
  DType t = g.dtype();
  Value x = b.convert(ctx.in(1), t);
  if (x.rank() < 2 || x.type.numel() == 0) throw Unsupported("batch norm of this shape");
  const Shape& s = x.shape();
  auto dims = stat_dims(x.rank());
  bool train = ctx.flag(7);
  Value mean, invstd;
  if (train) {
    if (ctx.is_none(5) || ctx.is_none(6)) throw Unsupported("training batch norm backward without saved stats");
    mean = chan(b, ctx.in(5), t, s), invstd = chan(b, ctx.in(6), t, s);
  } else {
    if (ctx.is_none(3) || ctx.is_none(4)) throw Unsupported("batch norm backward without running stats");
    mean = chan(b, ctx.in(3), t, s);
    invstd = chan(b, rsqrt_eps(b, b.convert(ctx.in(4), t), ctx.f(8)), t, s);
  }
  Value xhat = mul(b, sub(b, x, mean), invstd);
  Value w = opt_chan(ctx, 2, t, s, 1);
  std::vector<Value> outs;
  if (wanted(ctx, 0)) {
    Value gw = mul(b, g, w);
    Value dx;
    if (train) {
      Value m1 = chan(b, mean_of(b, gw, dims), t, s);
      Value m2 = chan(b, mean_of(b, mul(b, gw, xhat), dims), t, s);
      dx = mul(b, invstd, sub(b, sub(b, gw, m1), mul(b, xhat, m2)));
    } else {
      dx = mul(b, gw, invstd);
    }
    outs.push_back(as_out(ctx, dx, 0));
  } else {
    outs.push_back(b.constant(0, DType::F32));
  }
  outs.push_back(wanted(ctx, 1) ? as_out(ctx, reduce_sum(b, mul(b, g, xhat), dims), 1)
                                : b.constant(0, DType::F32));
  outs.push_back(wanted(ctx, 2) ? as_out(ctx, reduce_sum(b, g, dims), 2) : b.constant(0, DType::F32));
  return outs;
}

}  // namespace tpu::lowering
