// The two ops behind torch.amp.GradScaler: unscaling gradients while looking for
// inf/NaN, and updating the loss scale. Both run on the device, so a training step
// with a scaler needs no host round trip until the scaler reads found_inf.
#include "lowering/helpers.h"

namespace tpu::lowering {
namespace {

// True (bool scalar) when every element of `x` is finite.
Value all_finite(Builder& b, const Value& x) {
  Value flat = b.reshape(x, {x.type.numel()});
  Value fin = b.raw("stablehlo.is_finite", {flat}, "", Type{DType::Bool, flat.shape()});
  return b.reduce(fin, b.constant(1, DType::Bool), {0}, "stablehlo.and");
}

}  // namespace

// (grads, found_inf, inv_scale): every grad times inv_scale (computed in float32 for
// half types, as CPU/CUDA do); found_inf becomes 1 when any grad holds an inf or NaN,
// and keeps its value otherwise.
TPU_LOWER(amp_unscale, "_amp_foreach_non_finite_check_and_unscale") {
  Builder& b = ctx.b;
  std::vector<Value> grads = ctx.list(0);
  Value found = ctx.in(1);
  Value inv = b.reshape(ctx.in(2), {});
  Value bad = b.constant(0, DType::Bool);
  std::vector<Value> outs;
  for (const Value& g : grads) {
    bad = b.binary("stablehlo.or", bad, b.unary("stablehlo.not", all_finite(b, g)));
    DType acc = acc_type(g.dtype());
    Value scaled = mul(b, b.convert(g, acc), broadcast_to(b, b.convert(inv, acc), g.shape()));
    outs.push_back(b.convert(scaled, g.dtype()));
  }
  Value one = full_like(b, found, 1);
  outs.push_back(b.select(b.broadcast_in_dim(bad, found.shape(), {}), one, found));
  return outs;
}

// (scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
// after an overflow the scale backs off and the tracker restarts; otherwise the
// tracker counts successful steps and every growth_interval-th one grows the scale
// (unless the grown scale would be infinite).
TPU_LOWER(amp_update_scale, "_amp_update_scale") {
  Builder& b = ctx.b;
  // One-element tensors, handled as scalars (the kernel reshapes the results back).
  Value scale = b.reshape(ctx.in(0), {}), tracker = b.reshape(ctx.in(1), {});
  Value found = b.reshape(ctx.in(2), {});
  Value overflow = b.compare(found, full_like(b, found, 0), ir::Cmp::NE);
  Value grown = mul(b, scale, full_like(b, scale, ctx.f(3)));
  Value backed = mul(b, scale, full_like(b, scale, ctx.f(4)));
  Value zero = full_like(b, tracker, 0);
  Value next = add(b, tracker, full_like(b, tracker, 1));
  Value grow = b.compare(next, full_like(b, next, static_cast<double>(ctx.i(5))), ir::Cmp::EQ);
  Value grown_ok = b.raw("stablehlo.is_finite", {grown}, "", Type{DType::Bool, {}});
  Value kept = b.select(b.binary("stablehlo.and", grow, grown_ok), grown, scale);
  return {b.select(overflow, backed, kept), b.select(overflow, zero, b.select(grow, zero, next))};
}

}  // namespace tpu::lowering
