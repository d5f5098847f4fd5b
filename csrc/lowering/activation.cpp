// Activation functions and their backward ops. Same pattern as elementwise.cpp:
// math in the output's math dtype (f32 for f16/bf16), operands broadcast to the output.
#include <cmath>
#include <functional>

#include "lowering/elementwise.h"

namespace tpu::lowering {
using ir::Cmp;

using namespace ew;

namespace {
Value sigmoid(Builder& b, const Value& x) { return op1(b, "logistic", x); }
Value zero(Builder& b, const Value& like) { return cst(b, like, 0); }
// Selects a where x `c` k, else bb.
Value when(Builder& b, const Value& x, Cmp c, double k, const Value& a, const Value& bb) {
  return b.select(cmpk(b, x, k, c), a, bb);
}
Value when(Builder& b, const Value& x, Cmp c, const Value& k, const Value& a, const Value& bb) {
  return b.select(b.compare(x, k, c), a, bb);
}
// Like ew::map, but each operand passes through the output dtype first: PyTorch tests
// against thresholds (lambda, min_val, ...) in the tensor's own type, so a bf16 0.4
// equals a lambda of 0.4.
std::vector<Value> map_exact(Ctx& ctx, const std::vector<int>& idx, const MapFn& fn) {
  Type o = ctx.out(0);
  Vs xs;
  for (int i : idx) xs.push_back(ctx.b.convert(operand(ctx, i, o.dtype, o.shape), math_type(o.dtype)));
  return {ctx.b.convert(fn(ctx.b, xs), o.dtype)};
}
}  // namespace

// ---- ReLU family ---------------------------------------------------------------

TPU_LOWER(relu_rule, "relu") {
  if (ctx.type_of(0).dtype == DType::Bool) throw std::invalid_argument("Boolean inputs not supported for relu");
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return nan_minmax(b, x[0], zero(b, x[0]), "maximum"); });
}
TPU_LOWER(threshold_rule, "threshold") {  // x <= threshold ? value : x
  return map_exact(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) { return when(b, x[0], Cmp::LE, x[1], x[2], x[0]); });
}
TPU_LOWER(threshold_backward_rule, "threshold_backward") {
  return map_exact(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) { return when(b, x[1], Cmp::LE, x[2], zero(b, x[0]), x[0]); });
}
TPU_LOWER(leaky_relu_rule, "leaky_relu") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) { return when(b, x[0], Cmp::GT, 0, x[0], mul(b, x[0], x[1])); });
}
TPU_LOWER(leaky_relu_backward_rule, "leaky_relu_backward") {  // self_is_result: same sign test
  return map(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) { return when(b, x[1], Cmp::GT, 0, x[0], mul(b, x[0], x[2])); });
}
TPU_LOWER(prelu_rule, "_prelu_kernel") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) { return when(b, x[0], Cmp::GT, 0, x[0], mul(b, x[1], x[0])); });
}
// Both gradients at the broadcast shape; autograd sums grad_weight down to weight.
TPU_LOWER(prelu_backward_rule, "_prelu_kernel_backward") {
  Builder& b = ctx.b;
  std::vector<Value> out;
  for (int j = 0; j < 2; ++j) {
    Type o = ctx.out(j);
    DType t = math_type(o.dtype);
    Value g = operand(ctx, 0, t, o.shape), x = operand(ctx, 1, t, o.shape), w = operand(ctx, 2, t, o.shape);
    Value r = j == 0 ? when(b, x, Cmp::GT, 0, g, mul(b, w, g)) : when(b, x, Cmp::GT, 0, zero(b, x), mul(b, x, g));
    out.push_back(b.convert(r, o.dtype));
  }
  return out;
}
TPU_LOWER(hardtanh_rule, "hardtanh") {
  return map_exact(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) {
    return nan_minmax(b, nan_minmax(b, x[0], x[1], "maximum"), x[2], "minimum");
  });
}
TPU_LOWER(hardtanh_backward_rule, "hardtanh_backward") {  // zero at and beyond the bounds
  return map_exact(ctx, {0, 1, 2, 3}, [](Builder& b, const Vs& x) {
    Value g = when(b, x[1], Cmp::LE, x[2], zero(b, x[0]), x[0]);
    return when(b, x[1], Cmp::GE, x[3], zero(b, x[0]), g);
  });
}

// ---- Exponential family ----------------------------------------------------------

// elu: x > 0 ? scale * x : scale * alpha * expm1(input_scale * x)
TPU_LOWER(elu_rule, "elu") {
  require_float(ctx, 0, "elu");
  return map(ctx, {0, 1, 2, 3}, [](Builder& b, const Vs& x) {
    Value neg = mul(b, mul(b, x[2], x[1]), expm1(b, mul(b, x[0], x[3])));
    return when(b, x[0], Cmp::GT, 0, mul(b, x[0], x[2]), neg);
  });
}
// Args: grad, alpha, scale, input_scale, is_result, self_or_result. From the result
// y (is_result) the negative side's derivative is input_scale * (y + alpha * scale).
TPU_LOWER(elu_backward_rule, "elu_backward") {
  bool is_result = ctx.flag(4);
  return map(ctx, {0, 1, 2, 3, 5}, [is_result](Builder& b, const Vs& x) {
    Value g = x[0], negcoef = mul(b, x[1], x[2]), y = x[4];
    Value neg = is_result ? mul(b, mul(b, g, x[3]), add(b, y, negcoef))
                          : mul(b, mul(b, mul(b, g, x[3]), negcoef), op1(b, "exponential", mul(b, y, x[3])));
    return when(b, y, Cmp::LE, 0, neg, mul(b, g, x[2]));
  });
}
TPU_LOWER(celu_rule, "celu") {  // x > 0 ? x : alpha * expm1(x / alpha)
  require_float(ctx, 0, "celu");
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) {
    return when(b, x[0], Cmp::GT, 0, x[0], mul(b, x[1], expm1(b, div(b, x[0], x[1]))));
  });
}
// softplus: log1p(exp(beta x)) / beta, linear once beta x exceeds threshold.
TPU_LOWER(softplus_rule, "softplus") {
  require_float(ctx, 0, "softplus");
  return map(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) {
    Value bx = mul(b, x[0], x[1]);
    Value soft = div(b, op1(b, "log_plus_one", op1(b, "exponential", bx)), x[1]);
    return when(b, bx, Cmp::GT, x[2], x[0], soft);
  });
}
TPU_LOWER(softplus_backward_rule, "softplus_backward") {  // grad * sigmoid(beta x)
  return map(ctx, {0, 1, 2, 3}, [](Builder& b, const Vs& x) {
    Value bx = mul(b, x[1], x[2]);
    Value z = op1(b, "exponential", bx);
    return when(b, bx, Cmp::GT, x[3], x[0], div(b, mul(b, x[0], z), add(b, z, cst(b, z, 1))));
  });
}
// log_sigmoid = min(x, 0) - log1p(exp(-|x|)); the buffer is exp(-|x|) like PyTorch's CPU
// kernel (or empty, if the meta says so). The backward recomputes it from self.
TPU_LOWER(log_sigmoid_forward_rule, "log_sigmoid_forward") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  Value x = operand(ctx, 0, math_type(o.dtype), o.shape);
  Value z = op1(b, "exponential", op1(b, "negate", op1(b, "abs", x)));
  Value y = sub(b, op2(b, "minimum", x, zero(b, x)), op1(b, "log_plus_one", z));
  Type bt = ctx.out(1);
  Value buf = bt.shape == o.shape ? b.convert(z, bt.dtype) : b.constant(0, bt.dtype, bt.shape);
  return {b.convert(y, o.dtype), buf};
}
TPU_LOWER(log_sigmoid_backward_rule, "log_sigmoid_backward") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) {
    Value z = op1(b, "exponential", op1(b, "negate", op1(b, "abs", x[1])));
    Value s = div(b, z, add(b, z, cst(b, z, 1)));  // sigmoid(-|x|)
    Value d = when(b, x[1], Cmp::LT, 0, sub(b, cst(b, s, 1), s), s);
    return mul(b, x[0], d);
  });
}

// ---- Sigmoid-gated -----------------------------------------------------------------

TPU_LOWER(silu_rule, "silu") {
  require_float(ctx, 0, "silu");
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return mul(b, x[0], sigmoid(b, x[0])); });
}
TPU_LOWER(sigmoid_backward_rule, "sigmoid_backward") {  // grad * (1 - y) * y
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) {
    return mul(b, mul(b, x[0], sub(b, cst(b, x[1], 1), x[1])), x[1]);
  });
}
TPU_LOWER(tanh_backward_rule, "tanh_backward") {  // grad * (1 - y^2)
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) {
    return mul(b, x[0], sub(b, cst(b, x[1], 1), mul(b, x[1], x[1])));
  });
}
static Value tanh_softplus(Builder& b, const Value& x) {
  return op1(b, "tanh", op1(b, "log_plus_one", op1(b, "exponential", x)));
}
TPU_LOWER(mish_rule, "mish") {
  require_float(ctx, 0, "mish");
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return mul(b, x[0], tanh_softplus(b, x[0])); });
}
TPU_LOWER(hardsigmoid_rule, "hardsigmoid") {  // clamp(x + 3, 0, 6) / 6
  return map(ctx, {0}, [](Builder& b, const Vs& x) {
    Value r = nan_minmax(b, add(b, x[0], cst(b, x[0], 3)), zero(b, x[0]), "maximum");
    return div(b, nan_minmax(b, r, cst(b, r, 6), "minimum"), cst(b, r, 6));
  });
}
TPU_LOWER(hardsigmoid_backward_rule, "hardsigmoid_backward") {  // grad / 6 inside (-3, 3)
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) {
    Value g = mul(b, x[0], cst(b, x[0], 1.0 / 6));
    Value inside = op2(b, "and", cmpk(b, x[1], -3, Cmp::GT), cmpk(b, x[1], 3, Cmp::LT));
    return b.select(inside, g, zero(b, g));
  });
}
TPU_LOWER(hardswish_rule, "hardswish") {  // x * clamp(x + 3, 0, 6) / 6
  require_float(ctx, 0, "hardswish");
  return map(ctx, {0}, [](Builder& b, const Vs& x) {
    Value r = nan_minmax(b, add(b, x[0], cst(b, x[0], 3)), zero(b, x[0]), "maximum");
    return div(b, mul(b, x[0], nan_minmax(b, r, cst(b, r, 6), "minimum")), cst(b, r, 6));
  });
}
TPU_LOWER(hardswish_backward_rule, "hardswish_backward") {  // 0 up to -3, x/3 + 1/2 below 3
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) {
    Value mid = mul(b, x[0], add(b, div(b, x[1], cst(b, x[1], 3)), cst(b, x[1], 0.5)));
    return when(b, x[1], Cmp::LE, -3, zero(b, x[0]), when(b, x[1], Cmp::LT, 3, mid, x[0]));
  });
}

// ---- Shrinkage ---------------------------------------------------------------------

TPU_LOWER(hardshrink_rule, "hardshrink") {  // |x| <= lambda -> 0
  return map_exact(ctx, {0, 1}, [](Builder& b, const Vs& x) {
    return when(b, op1(b, "abs", x[0]), Cmp::LE, x[1], zero(b, x[0]), x[0]);
  });
}
TPU_LOWER(hardshrink_backward_rule, "hardshrink_backward") {
  return map_exact(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) {
    return when(b, op1(b, "abs", x[1]), Cmp::LE, x[2], zero(b, x[0]), x[0]);
  });
}
TPU_LOWER(softshrink_rule, "softshrink") {  // move toward 0 by lambda, 0 inside
  return map_exact(ctx, {0, 1}, [](Builder& b, const Vs& x) {
    Value r = when(b, x[0], Cmp::GT, x[1], sub(b, x[0], x[1]), add(b, x[0], x[1]));
    return when(b, op1(b, "abs", x[0]), Cmp::LE, x[1], zero(b, x[0]), r);
  });
}
TPU_LOWER(softshrink_backward_rule, "softshrink_backward") {
  return map_exact(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) {
    return when(b, op1(b, "abs", x[1]), Cmp::LE, x[2], zero(b, x[0]), x[0]);
  });
}

// ---- GELU --------------------------------------------------------------------------

static const double kSqrt1_2 = 0.70710678118654752440;
static const double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
static const double kBeta = 0.79788456080286535588;        // sqrt(2 / pi)
static const double kKappa = 0.044715;

static bool tanh_approx(Ctx& ctx, int idx) {
  std::string a = ctx.is_none(idx) ? "none" : ctx.str(idx);
  if (a != "none" && a != "tanh") throw Unsupported("gelu approximate=" + a);
  return a == "tanh";
}
static Value gelu_inner(Builder& b, const Value& x) {  // sqrt(2/pi) (x + kappa x^3)
  Value x3 = mul(b, mul(b, x, x), x);
  return mul(b, cst(b, x, kBeta), add(b, x, mul(b, cst(b, x, kKappa), x3)));
}

// Exact: x * Phi(x). f64: Phi(x) = erfc(-x / sqrt 2) / 2 (accurate in the left tail).
// f32 math (and bf16/f16, which compute in f32): Phi(x) = (1 + erf(x / sqrt 2)) / 2 with
// the rational erf, CPU's own formula (within its error of the exact value), and one loop
// after fusion where the erfc form leaves three passes over the activation.
static Value phi(Builder& b, const Value& x) {
  Value half = cst(b, x, 0.5);
  if (x.dtype() == DType::F32)
    return mul(b, half, add(b, cst(b, x, 1), erf_rational(b, mul(b, x, cst(b, x, kSqrt1_2)))));
  return mul(b, half, erfc(b, mul(b, x, cst(b, x, -kSqrt1_2))));
}

TPU_LOWER(gelu_rule, "gelu") {
  require_float(ctx, 0, "gelu");
  bool approx = tanh_approx(ctx, 1);
  return map(ctx, {0}, [approx](Builder& b, const Vs& x) {
    if (!approx) return mul(b, x[0], phi(b, x[0]));
    Value half_x = mul(b, cst(b, x[0], 0.5), x[0]);
    return mul(b, half_x, add(b, cst(b, x[0], 1), op1(b, "tanh", gelu_inner(b, x[0]))));
  });
}
TPU_LOWER(gelu_backward_rule, "gelu_backward") {
  bool approx = tanh_approx(ctx, 2);
  return map(ctx, {0, 1}, [approx](Builder& b, const Vs& v) {
    // x read through a dependence on the gradient: XLA would otherwise merge this Phi(x)
    // with the forward's and keep it (a full-size buffer) from forward to backward, where
    // recomputing it from x, live anyway, costs a few flops.
    const Value& g = v[0];
    const Value x = b.after(v[1], g);
    Value one = cst(b, x, 1), half = cst(b, x, 0.5);
    if (approx) {
      Value t = op1(b, "tanh", gelu_inner(b, x));
      Value dinner = mul(b, cst(b, x, kBeta), add(b, one, mul(b, cst(b, x, 3 * kKappa), mul(b, x, x))));
      Value d = add(b, mul(b, half, add(b, one, t)),
                     mul(b, mul(b, mul(b, half, x), sub(b, one, mul(b, t, t))), dinner));
      return mul(b, g, d);
    }
    Value cdf = phi(b, x);
    Value pdf = mul(b, cst(b, x, kInvSqrt2Pi), op1(b, "exponential", mul(b, cst(b, x, -0.5), mul(b, x, x))));
    return mul(b, g, add(b, cdf, mul(b, x, pdf)));
  });
}

// ---- GLU ---------------------------------------------------------------------------

// The halves of `x` along `dim`.
static std::pair<Value, Value> halves(Builder& b, const Value& x, int64_t dim) {
  Shape start(x.rank(), 0), mid = x.shape(), lim = x.shape(), ones(x.rank(), 1);
  mid[dim] /= 2;
  Shape start2 = start;
  start2[dim] = mid[dim];
  return {b.slice(x, start, mid, ones), b.slice(x, start2, lim, ones)};
}
TPU_LOWER(glu_rule, "glu") {  // a * sigmoid(b) over the halves of dim
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  Value x = b.convert(ctx.in(0), math_type(o.dtype));
  auto [lo, hi] = halves(b, x, wrap_dim(ctx.i(1), x.rank()));
  return {b.convert(mul(b, lo, sigmoid(b, hi)), o.dtype)};
}
TPU_LOWER(glu_backward_rule, "glu_backward") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  DType t = math_type(o.dtype);
  Value g = b.convert(ctx.in(0), t), x = b.convert(ctx.in(1), t);
  int64_t dim = wrap_dim(ctx.i(2), x.rank());
  auto [lo, hi] = halves(b, x, dim);
  Value s = sigmoid(b, hi);
  Value glo = mul(b, g, s);
  Value ghi = mul(b, mul(b, glo, lo), sub(b, cst(b, s, 1), s));
  return {b.convert(b.concatenate({glo, ghi}, dim), o.dtype)};
}

// ---- logit backward ----------------------------------------------------------------

// grad / (x (1 - x)); outside [eps, 1 - eps] zero, or without eps NaN outside [0, 1].
// The bounds are taken in the tensor's dtype, as in logit's forward.
TPU_LOWER(logit_backward_rule, "logit_backward") {
  double eps = ctx.f_or(2, -1);
  DType ot = ctx.out(0).dtype;
  return map(ctx, {0, 1}, [eps, ot](Builder& b, const Vs& v) {
    const Value& x = v[1];
    auto bound = [&](double k) { return b.convert(b.convert(cst(b, x, k), ot), x.dtype()); };
    Value d = div(b, v[0], mul(b, x, sub(b, cst(b, x, 1), x)));
    Value lo = bound(eps < 0 ? 0 : eps), hi = bound(eps < 0 ? 1 : 1 - eps);
    Value out = op2(b, "or", b.compare(x, lo, Cmp::LT), b.compare(x, hi, Cmp::GT));
    return b.select(out, cst(b, d, eps < 0 ? NAN : 0), d);
  });
}

}  // namespace tpu::lowering
