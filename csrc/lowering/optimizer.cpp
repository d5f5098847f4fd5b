// Fused optimizer steps (torch.optim's fused=True path, the default of HF Trainer's
// AdamW): one program updates every parameter and its state. The learning rate is a
// tensor operand (`tensor_lr`), so a schedule never recompiles; the float overload is
// routed here by the backend glue.
#include "lowering/helpers.h"

namespace tpu::lowering {
namespace {

// self[], grads[], exp_avgs[], exp_avg_sqs[], max_exp_avg_sqs[], state_steps[], lr, beta1,
// beta2, weight_decay, eps, amsgrad, maximize, grad_scale?, found_inf? -> new values of
// the five mutated lists, in that order (max_exp_avg_sqs is empty without amsgrad).
std::vector<Value> adam_step(Ctx& ctx, bool decoupled) {
  Builder& b = ctx.b;
  auto params = ctx.list(0), grads = ctx.list(1), avgs = ctx.list(2), sqs = ctx.list(3);
  auto maxs = ctx.list(4), steps = ctx.list(5);
  double beta1 = ctx.f(7), beta2 = ctx.f(8), wd = ctx.f(9), eps = ctx.f(10);
  bool amsgrad = ctx.flag(11), maximize = ctx.flag(12);
  size_t n = params.size();
  if (amsgrad && maxs.size() != n) throw Unsupported("amsgrad without max_exp_avg_sqs");
  std::vector<Value> new_p, new_g, new_m, new_v, new_vmax;
  for (size_t k = 0; k < n; ++k) {
    DType t = acc_type(params[k].dtype());
    const Shape& s = params[k].shape();
    auto scalar = [&](const Value& x) { return broadcast_to(b, b.reshape(b.convert(x, t), {}), s); };
    auto c = [&](double v) { return b.constant(v, t, s); };
    Value p = b.convert(params[k], t), g = b.convert(grads[k], t);
    Value m = b.convert(avgs[k], t), v = b.convert(sqs[k], t);
    if (!ctx.is_none(13)) g = div(b, g, scalar(ctx.in(13)));  // unscaled in place, as CUDA/CPU do
    new_g.push_back(b.convert(g, grads[k].dtype()));
    if (maximize) g = b.unary("stablehlo.negate", g);
    Value lr = scalar(ctx.in(6));
    if (wd != 0) {
      if (decoupled) p = sub(b, p, mul(b, mul(b, lr, c(wd)), p));
      else g = add(b, g, mul(b, p, c(wd)));
    }
    m = add(b, m, mul(b, c(1 - beta1), sub(b, g, m)));
    v = add(b, mul(b, v, c(beta2)), mul(b, c(1 - beta2), mul(b, g, g)));
    Value step = scalar(steps[k]);
    Value bc1 = sub(b, c(1), b.binary("stablehlo.power", c(beta1), step));
    Value bc2 = sub(b, c(1), b.binary("stablehlo.power", c(beta2), step));
    Value vmax = v;
    if (amsgrad) {
      vmax = b.binary("stablehlo.maximum", b.convert(maxs[k], t), v);
      new_vmax.push_back(b.convert(vmax, maxs[k].dtype()));
    }
    Value denom = add(b, div(b, b.unary("stablehlo.sqrt", vmax), b.unary("stablehlo.sqrt", bc2)), c(eps));
    p = sub(b, p, div(b, mul(b, div(b, lr, bc1), m), denom));
    new_p.push_back(b.convert(p, params[k].dtype()));
    new_m.push_back(b.convert(m, avgs[k].dtype()));
    new_v.push_back(b.convert(v, sqs[k].dtype()));
  }
  std::vector<Value> out;
  for (auto* l : {&new_p, &new_g, &new_m, &new_v, &new_vmax}) out.insert(out.end(), l->begin(), l->end());
  std::vector<Value> old;
  for (auto* l : {&params, &grads, &avgs, &sqs}) old.insert(old.end(), l->begin(), l->end());
  if (amsgrad) old.insert(old.end(), maxs.begin(), maxs.end());
  if (!ctx.is_none(14)) {  // found_inf (GradScaler): the whole step is skipped, grads stay scaled
    Value skip = b.compare(b.reshape(b.convert(ctx.in(14), DType::F32), {}), b.constant(1, DType::F32), ir::Cmp::EQ);
    for (size_t j = 0; j < out.size(); ++j)
      out[j] = b.select(broadcast_to(b, skip, out[j].shape()), old[j], out[j]);
  }
  return out;
}

}  // namespace

TPU_LOWER(fused_adam, "_fused_adam_.tensor_lr") { return adam_step(ctx, false); }
TPU_LOWER(fused_adamw, "_fused_adamw_.tensor_lr") { return adam_step(ctx, true); }

}  // namespace tpu::lowering
