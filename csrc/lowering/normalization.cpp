// Batch normalization over the channel dim 1 (statistics over every other dim).
// Sums over the batch and spatial dims are compensated (compensated_sum): CPU PyTorch
// accumulates them in double, and a plain float reduce over N*H*W elements rounds an
// order of magnitude worse, which a deep network compounds.
#include <optional>

#include "lowering/compensated_sum.h"
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
static double count(const Shape& s) {
  double n = 1;
  for (size_t i = 0; i < s.size(); ++i)
    if (i != 1) n *= static_cast<double>(s[i]);
  return n;
}
// Per-channel vector c (C) broadcast along dim 1 of `shape`.
static Value chan(Builder& b, const Value& c, DType t, const Shape& shape) {
  return b.broadcast_in_dim(b.convert(c, t), shape, {1});
}
// Optional per-channel parameter as a (C) vector of dtype t.
static Value opt_vec(Ctx& ctx, int idx, DType t, int64_t c, double dflt) {
  return ctx.is_none(idx) ? ctx.b.constant(dflt, t, {c}) : ctx.b.convert(ctx.b.reshape(ctx.in(idx), {c}), t);
}
static Value acc_input(Ctx& ctx) {
  Value x = ctx.b.convert(ctx.in(0), acc_type(ctx.in(0).dtype()));
  if (x.rank() < 2 || x.type.numel() == 0)
    throw Unsupported("batch norm of shape " + x.type.str() + " (needs rank >= 2, non-empty)");
  return x;
}

// Batch statistics, two-pass as CPU: mean, then the sum of squared deviations from it.
struct BatchStats {
  Value mean, dev, sq_dev_sum;  // (C), x - mean, (C)
};
static BatchStats batch_stats(Builder& b, const Value& x) {
  auto dims = stat_dims(x.rank());
  Value sum = compensated_sum(b, x, dims);
  Value mean = div_count(b, sum, count(x.shape()));
  Value dev = sub(b, x, chan(b, mean, x.dtype(), x.shape()));
  return {mean, dev, compensated_sum(b, mul(b, dev, dev), dims)};
}
// sqrt(var + eps): its reciprocal is the saved rstd, and weight / it the per-channel
// scale, each two correctly rounded ops (stablehlo.rsqrt may be approximate, and rstd *
// weight would round three times, an error shared by a whole channel).
static Value std_eps(Builder& b, const Value& var, double eps) {
  return b.unary("stablehlo.sqrt", add(b, var, full_like(b, var, eps)));
}
static Value recip(Builder& b, const Value& v) { return div(b, full_like(b, v, 1), v); }
// (x - mean) * (weight / std) + bias, the per-channel factor formed first (no
// x * alpha - mean * alpha cancellation as in CPU's kernel when |mean| >> std).
static Value normalize(Ctx& ctx, const Value& dev, const Value& std, int w_idx, int b_idx) {
  Builder& b = ctx.b;
  DType t = dev.dtype();
  int64_t c = dev.shape()[1];
  Value scale = div(b, opt_vec(ctx, w_idx, t, c, 1), std);
  Value y = mul(b, dev, chan(b, scale, t, dev.shape()));
  if (!ctx.is_none(b_idx)) y = add(b, y, chan(b, ctx.in(b_idx), t, dev.shape()));
  return y;
}

// (out, batch mean, batch 1/sqrt(var + eps)): input, weight?, bias?, training, momentum, eps.
TPU_LOWER(batch_norm_no_stats, "_native_batch_norm_legit.no_stats") {
  Value x = acc_input(ctx);
  BatchStats st = batch_stats(ctx.b, x);
  Value var = div_count(ctx.b, st.sq_dev_sum, count(x.shape()));
  Value sd = std_eps(ctx.b, var, ctx.f(5));
  return {as_out(ctx, normalize(ctx, st.dev, sd, 1, 2), 0), as_out(ctx, st.mean, 1), as_out(ctx, recip(ctx.b, sd), 2)};
}

// Inference: normalized by the running statistics; the saved stats are empty.
TPU_LOWER(batch_norm_no_training, "_native_batch_norm_legit_no_training") {
  Builder& b = ctx.b;
  Value x = b.convert(ctx.in(0), acc_type(ctx.in(0).dtype()));
  if (x.rank() < 2) throw Unsupported("batch norm of shape " + x.type.str() + " (needs rank >= 2)");
  Value sd = std_eps(b, b.convert(ctx.in(4), x.dtype()), ctx.f(6));
  Value dev = sub(b, x, chan(b, ctx.in(3), x.dtype(), x.shape()));
  return {as_out(ctx, normalize(ctx, dev, sd, 1, 2), 0), b.constant(0, ctx.out(1).dtype, ctx.out(1).shape),
          b.constant(0, ctx.out(2).dtype, ctx.out(2).shape)};
}

// The training forward with its running statistics' new values, as one program:
// input, weight?, bias?, running_mean, running_var, training, momentum, eps ->
// (out, save_mean, save_rstd, new running_mean, new running_var). The running variance
// takes the unbiased variance from the same compensated sum (as CPU, not var * n/(n-1)).
TPU_LOWER(batch_norm_functional, "_native_batch_norm_legit_functional") {
  Builder& b = ctx.b;
  Value x = acc_input(ctx);
  DType t = x.dtype();
  int64_t c = x.shape()[1];
  Value rm = b.convert(ctx.in(3), t), rv = b.convert(ctx.in(4), t);
  if (!ctx.flag(5)) {
    Value sd = std_eps(b, rv, ctx.f(7));
    Value y = normalize(ctx, sub(b, x, chan(b, rm, t, x.shape())), sd, 1, 2);
    auto saved = [&](const Value& v, int j) {  // CPU saves nothing in eval mode
      return ctx.out(j).numel() == c ? as_out(ctx, v, j) : b.constant(0, ctx.out(j).dtype, ctx.out(j).shape);
    };
    return {as_out(ctx, y, 0), saved(rm, 1), saved(recip(b, sd), 2), as_out(ctx, rm, 3), as_out(ctx, rv, 4)};
  }
  BatchStats st = batch_stats(b, x);
  double n = count(x.shape());
  Value sd = std_eps(b, div_count(b, st.sq_dev_sum, n), ctx.f(7));
  Value unbiased = div_count(b, st.sq_dev_sum, n - 1);
  double m = ctx.f(6);
  auto blend = [&](const Value& batch, const Value& running) {
    return add(b, mul(b, full_like(b, batch, m), batch), mul(b, full_like(b, running, 1 - m), running));
  };
  return {as_out(ctx, normalize(ctx, st.dev, sd, 1, 2), 0), as_out(ctx, st.mean, 1), as_out(ctx, recip(b, sd), 2),
          as_out(ctx, blend(st.mean, rm), 3), as_out(ctx, blend(unbiased, rv), 4)};
}

// grad_out, input, weight?, running_mean?, running_var?, save_mean?, save_invstd?,
// train, eps, output_mask. With xhat = (x - mean) * invstd, sg = sum(g), sgx = sum(g * xhat)
// (compensated): training dx = w * invstd * (g - sg/n - xhat * sgx/n), inference
// dx = g * w * invstd; dweight = sgx, dbias = sg. Two reductions serve all three.
TPU_LOWER(native_batch_norm_backward, "native_batch_norm_backward") {
  Builder& b = ctx.b;
  Value g = b.convert(ctx.in(0), acc_type(ctx.in(0).dtype()));
  DType t = g.dtype();
  Value x = b.convert(ctx.in(1), t);
  if (x.rank() < 2 || x.type.numel() == 0)
    throw Unsupported("batch norm backward of shape " + x.type.str() + " (needs rank >= 2, non-empty)");
  const Shape& s = x.shape();
  int64_t c = s[1];
  auto dims = stat_dims(x.rank());
  bool train = ctx.flag(7);
  Value mean, invstd;
  if (train) {
    if (ctx.is_none(5) || ctx.is_none(6)) throw Unsupported("training batch norm backward without saved stats");
    mean = b.convert(ctx.in(5), t), invstd = b.convert(ctx.in(6), t);
  } else {
    if (ctx.is_none(3) || ctx.is_none(4)) throw Unsupported("batch norm backward without running stats");
    mean = b.convert(ctx.in(3), t);
    invstd = recip(b, std_eps(b, b.convert(ctx.in(4), t), ctx.f(8)));
  }
  Value xhat = mul(b, sub(b, x, chan(b, mean, t, s)), chan(b, invstd, t, s));
  bool need_sgx = wanted(ctx, 1) || (train && wanted(ctx, 0));
  bool need_sg = wanted(ctx, 2) || (train && wanted(ctx, 0));
  std::optional<Value> sgx, sg;
  if (need_sgx) sgx = compensated_sum(b, mul(b, g, xhat), dims);
  if (need_sg) sg = compensated_sum(b, g, dims);
  std::vector<Value> outs;
  if (wanted(ctx, 0)) {
    Value scale = chan(b, mul(b, invstd, opt_vec(ctx, 2, t, c, 1)), t, s);
    Value dx = g;
    if (train) {
      double n = count(s);
      Value mg = chan(b, div_count(b, *sg, n), t, s);
      Value mgx = chan(b, div_count(b, *sgx, n), t, s);
      dx = sub(b, sub(b, g, mg), mul(b, xhat, mgx));
    }
    outs.push_back(as_out(ctx, mul(b, dx, scale), 0));
  } else {
    outs.push_back(b.constant(0, DType::F32));
  }
  outs.push_back(wanted(ctx, 1) ? as_out(ctx, *sgx, 1) : b.constant(0, DType::F32));
  outs.push_back(wanted(ctx, 2) ? as_out(ctx, *sg, 2) : b.constant(0, DType::F32));
  return outs;
}

}  // namespace tpu::lowering
