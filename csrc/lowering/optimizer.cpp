// Fused optimizer steps (torch.optim's fused=True path: Adam(W), the default of HF
// Trainer's AdamW, SGD and Adagrad): one program updates every parameter and its state.
// The learning rate is a tensor operand (`tensor_lr`), so a schedule never recompiles; the float overload is
// routed here by the backend glue.
#include <cmath>
#include <stdexcept>
#include <string>

#include "lowering/helpers.h"

namespace tpu::lowering {
namespace {

// found_inf (GradScaler's, at argument `arg`): where it is 1 the whole step is skipped,
// every written tensor keeps its value (grads stay scaled), as CPU's fused kernels return
// before touching anything.
std::vector<Value> skip_if_found_inf(Ctx& ctx, int arg, std::vector<Value> out, const std::vector<Value>& old) {
  if (ctx.is_none(arg)) return out;
  Builder& b = ctx.b;
  Value skip = b.compare(b.reshape(b.convert(ctx.in(arg), DType::F32), {}), b.constant(1, DType::F32), ir::Cmp::EQ);
  for (size_t j = 0; j < out.size(); ++j) out[j] = b.select(broadcast_to(b, skip, out[j].shape()), old[j], out[j]);
  return out;
}

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
    // 1 - beta^step, which CPU's and CUDA's kernels take in double: -expm1(step log beta)
    // with log beta from the host (in float, 1 - pow(0.999f, 1) was 100 ulps off 1e-3).
    auto one_minus_pow = [&](double beta) {
      return b.unary("stablehlo.negate", b.unary("stablehlo.exponential_minus_one", mul(b, step, c(std::log(beta)))));
    };
    Value bc1 = one_minus_pow(beta1), bc2 = one_minus_pow(beta2);
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
  return skip_if_found_inf(ctx, 14, out, old);
}


// CPU's fused SGD and Adagrad kernels compute in the parameter's opmath type (f32 for
// f16/bf16). Their vectorized loops take a float hyperparameter as scalar_t(x), rounded
// to the parameter's dtype first (`param`); their scalar loops as opmath_t(x) (`param`
// = `t`). For f32/f64 the two agree.
Value hyper(Builder& b, double v, DType param, DType t, const Shape& s) {
  if (param == DType::F32 || param == DType::BF16 || param == DType::F16) v = static_cast<float>(v);
  return b.convert(b.constant(v, param, s), t);
}

// A 0-dim (or one-element) tensor operand as scalar_t(x) in `t`, broadcast to `s`.
Value tensor_hyper(Builder& b, const Value& x, DType param, DType t, const Shape& s) {
  return broadcast_to(b, b.convert(b.convert(b.reshape(x, {}), param), t), s);
}

// x + y * z in the step's type. (CPU's kernels let the compiler contract it into one
// fused multiply-add, differently in their vector and scalar loops and per instruction
// set; XLA may contract it too: results agree to an ulp, never in float64 emulation,
// which TPUs lack.)
Value madd(Builder& b, const Value& x, const Value& y, const Value& z) { return add(b, x, mul(b, y, z)); }

void require_fused_dtype(DType t, const char* what) {
  if (t != DType::F32 && t != DType::F64 && t != DType::BF16 && t != DType::F16)
    throw Unsupported(std::string(what) + ": unsupported dtype");
}

// self[], grads[], momentum_buffer_list[], weight_decay, momentum, lr, dampening,
// nesterov, maximize, is_first_step, grad_scale?, found_inf? -> new params, grads and
// momentum buffers (none without momentum). On the first step the buffers (fresh
// empty_like tensors) are not read: they become the gradient.
std::vector<Value> sgd_step(Ctx& ctx) {
  Builder& b = ctx.b;
  auto params = ctx.list(0), grads = ctx.list(1), bufs = ctx.list(2);
  double wd = ctx.f(3), momentum = ctx.f(4), dampening = ctx.f(6);
  bool nesterov = ctx.flag(7), maximize = ctx.flag(8), first = ctx.flag(9);
  size_t n = params.size();
  if (grads.size() != n) throw std::invalid_argument("_fused_sgd_: expected as many grads as params");
  if (bufs.size() != (momentum != 0 ? n : 0))
    throw std::invalid_argument(momentum != 0 ? "_fused_sgd_: expected a momentum buffer per param"
                                              : "_fused_sgd_: expected no momentum buffers without momentum");
  std::vector<Value> new_p, new_g, new_buf;
  for (size_t k = 0; k < n; ++k) {
    DType pt = params[k].dtype(), t = acc_type(pt);
    require_fused_dtype(pt, "_fused_sgd_");
    const Shape& s = params[k].shape();
    // (f16/bf16: CPU's vectorized loop never writes the parameters and reads the
    // buffers as float32; its scalar loop, with opmath_t(x) hyperparameters, is followed.)
    auto c = [&](double v) { return hyper(b, v, t, t, s); };
    Value p = b.convert(params[k], t), g = b.convert(grads[k], t);
    if (!ctx.is_none(10)) g = div(b, g, tensor_hyper(b, ctx.in(10), t, t, s));
    new_g.push_back(b.convert(g, grads[k].dtype()));
    if (maximize) g = b.unary("stablehlo.negate", g);
    if (wd != 0) g = madd(b, g, p, c(wd));
    if (momentum != 0) {
      Value buf = first ? g : madd(b, mul(b, b.convert(bufs[k], t), c(momentum)), g, c(1 - dampening));
      new_buf.push_back(b.convert(buf, bufs[k].dtype()));
      g = nesterov ? madd(b, g, buf, c(momentum)) : buf;
    }
    Value neg_lr = b.unary("stablehlo.negate", tensor_hyper(b, ctx.in(5), t, t, s));
    p = madd(b, p, g, neg_lr);
    new_p.push_back(b.convert(p, pt));
  }
  std::vector<Value> out, old;
  for (auto* l : {&new_p, &new_g, &new_buf}) out.insert(out.end(), l->begin(), l->end());
  for (auto* l : {&params, &grads, &bufs}) old.insert(old.end(), l->begin(), l->end());
  return skip_if_found_inf(ctx, 11, out, old);
}

// self[], grads[], state_sums[], state_steps[], lr, lr_decay, weight_decay, eps, maximize,
// grad_scale?, found_inf? -> new params, grads and state sums. The steps were already
// counted by torch.optim; each parameter's rate is lr / (1 + (step - 1) * lr_decay),
// then scalar_t of it.
std::vector<Value> adagrad_step(Ctx& ctx) {
  Builder& b = ctx.b;
  auto params = ctx.list(0), grads = ctx.list(1), sums = ctx.list(2), steps = ctx.list(3);
  double lr_decay = ctx.f(5), wd = ctx.f(6), eps = ctx.f(7);
  bool maximize = ctx.flag(8);
  size_t n = params.size();
  if (grads.size() != n || sums.size() != n || steps.size() != n)
    throw std::invalid_argument("_fused_adagrad_: expected as many grads, state_sums and state_steps as params");
  std::vector<Value> new_p, new_g, new_sum;
  for (size_t k = 0; k < n; ++k) {
    DType pt = params[k].dtype(), t = acc_type(pt);
    require_fused_dtype(pt, "_fused_adagrad_");
    const Shape& s = params[k].shape();
    auto c = [&](double v) { return hyper(b, v, pt, t, s); };
    Value clr = b.reshape(ctx.in(4), {});  // lr / (1 + (step - 1) lr_decay), in the step's type
    if (lr_decay != 0) {
      Value step = b.convert(b.reshape(steps[k], {}), t), one = b.constant(1, t);
      clr = div(b, b.convert(clr, t), add(b, one, mul(b, sub(b, step, one), b.constant(lr_decay, t))));
    }
    clr = tensor_hyper(b, clr, pt, t, s);
    Value p = b.convert(params[k], t), g = b.convert(grads[k], t);
    if (!ctx.is_none(9)) g = div(b, g, tensor_hyper(b, ctx.in(9), pt, t, s));
    new_g.push_back(b.convert(g, grads[k].dtype()));
    if (maximize) g = b.unary("stablehlo.negate", g);
    if (wd != 0) g = madd(b, g, p, c(wd));
    Value sum = madd(b, b.convert(sums[k], t), g, g);
    new_sum.push_back(b.convert(sum, sums[k].dtype()));
    Value std_ = add(b, b.unary("stablehlo.sqrt", sum), c(eps));
    p = sub(b, p, div(b, mul(b, clr, g), std_));
    new_p.push_back(b.convert(p, pt));
  }
  std::vector<Value> out, old;
  for (auto* l : {&new_p, &new_g, &new_sum}) out.insert(out.end(), l->begin(), l->end());
  for (auto* l : {&params, &grads, &sums}) old.insert(old.end(), l->begin(), l->end());
  return skip_if_found_inf(ctx, 10, out, old);
}

}  // namespace

TPU_LOWER(fused_adam, "_fused_adam_.tensor_lr") { return adam_step(ctx, false); }
TPU_LOWER(fused_adamw, "_fused_adamw_.tensor_lr") { return adam_step(ctx, true); }
TPU_LOWER(fused_sgd, "_fused_sgd_.tensor_lr") { return sgd_step(ctx); }
TPU_LOWER(fused_adagrad, "_fused_adagrad_.tensor_lr") { return adagrad_step(ctx); }

}  // namespace tpu::lowering
