// Elementwise ops: arithmetic, math functions, comparisons, logic, casts and fills.
// Operands are converted to the math dtype of the output PyTorch computed (f32 for
// f16/bf16, like PyTorch's opmath) and broadcast to its shape; results are cast back.
#include <cmath>
#include <functional>
#include <string>

#include "lowering/elementwise.h"

namespace tpu::lowering {
using ir::Cmp;

namespace ew {

Value cst(Builder& b, const Value& like, double v) { return full_like(b, like, v); }
Value op1(Builder& b, const char* op, const Value& x) { return b.unary(std::string("stablehlo.") + op, x); }
Value op2(Builder& b, const char* op, const Value& x, const Value& y) {
  return b.binary(std::string("stablehlo.") + op, x, y);
}
Value cmp(Builder& b, const Value& x, const Value& y, Cmp c) { return b.compare(x, y, c); }
Value cmpk(Builder& b, const Value& x, double k, Cmp c) { return b.compare(x, cst(b, x, k), c); }
Value nan_minmax(Builder& b, const Value& x, const Value& y, const char* op) {
  Value r = op2(b, op, x, y);
  if (!is_float(r.dtype())) return r;
  r = b.select(b.compare(y, y, Cmp::NE), y, r);
  return b.select(b.compare(x, x, Cmp::NE), x, r);
}

// f16/bf16 do their math in f32; bool arithmetic runs on integers and is narrowed
// back to bool (nonzero) by the final convert.
DType math_type(DType t) {
  if (is_complex(t)) throw Unsupported("complex dtypes");
  if (t == DType::Bool) return DType::I32;
  return acc_type(t);
}

// Argument i, a Tensor or a Scalar, as dtype t broadcast to `shape`.
Value operand(Ctx& ctx, int i, DType t, const Shape& shape) {
  if (ctx.is_tensor(i)) return coerce(ctx.b, ctx.in(i), t, shape);
  return broadcast_to(ctx.b, ctx.scalar(i, t), shape);
}

// fn over arguments `idx` in the output's math dtype, cast to the output dtype.
std::vector<Value> map(Ctx& ctx, const std::vector<int>& idx, const MapFn& fn) {
  Type o = ctx.out(0);
  DType t = math_type(o.dtype);
  Vs xs;
  for (int i : idx) xs.push_back(operand(ctx, i, t, o.shape));
  return {convert_any(ctx.b, fn(ctx.b, xs), o.dtype)};  // (fp8 results as c10 rounds them)
}

// map, with each operand first cast to the output's dtype, as TensorIterator casts to
// the common dtype before the kernel computes in the math dtype: a Scalar (alpha too) or
// a 0-dim float32 tensor beside a bf16/f16 tensor is rounded to bf16/f16 first. CPU's
// mul and div read the original Scalar instead, so they keep `map`.
std::vector<Value> map_cast(Ctx& ctx, const std::vector<int>& idx, const MapFn& fn) {
  Type o = ctx.out(0);
  DType t = math_type(o.dtype);
  bool narrow = o.dtype == DType::BF16 || o.dtype == DType::F16;
  Vs xs;
  for (int i : idx) {
    Value v = operand(ctx, i, t, o.shape);
    if (narrow && !(ctx.is_tensor(i) && ctx.type_of(i).dtype == o.dtype)) v = ctx.b.convert(ctx.b.convert(v, o.dtype), t);
    xs.push_back(v);
  }
  return {convert_any(ctx.b, fn(ctx.b, xs), o.dtype)};
}

// float32 math: erf(x) for |x| < 1 from its Taylor series (alternating, 12 terms: < 2e-7
// relative); erfc(x) for |x| >= 1 from the Chebyshev fit of Numerical Recipes' erfcc
// (1.2e-7 relative). float64 takes CHLO's erf and erfc (Cephes' float64 fits, expanded by
// the plugin's compiler; erfc64 below): the float32 series and fit kept only 7 digits there.
static Value erf_small(Builder& b, const Value& x) {
  Value s = op2(b, "multiply", x, x);
  double c[12];
  double fact = 1;
  for (int n = 0; n < 12; ++n) {
    if (n) fact *= n;
    c[n] = 2 / std::sqrt(M_PI) * (n % 2 ? -1 : 1) / (fact * (2 * n + 1));
  }
  Value p = cst(b, x, c[11]);
  for (int n = 10; n >= 0; --n) p = op2(b, "add", cst(b, x, c[n]), op2(b, "multiply", s, p));
  return op2(b, "multiply", x, p);
}

// t e^(p(t) - x^2), t = 1 / (1 + x/2), for float32 x >= 0. x^2 is taken exactly: x = hi + lo
// with hi the top 12 significand bits, so hi^2 is exact and x^2 = hi^2 + (x - hi)(x + hi).
// Rounding x^2 itself (about 75 at x = 8.7, so an error up to 4e-6 in the exponent) put
// 120 ulp into erfc's tail. x is capped at 10, where erfc is 0 in float32 (inf - hi is NaN).
static Value erfc_large(Builder& b, const Value& x_in) {
  Value x = b.select(cmpk(b, x_in, 10, Cmp::GT), cst(b, x_in, 10), x_in);
  static const double k[] = {-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                             0.27886807,  -1.13520398, 1.48851587, -0.82215223, 0.17087277};
  Value t = op2(b, "divide", cst(b, x, 1), op2(b, "add", cst(b, x, 1), op2(b, "multiply", cst(b, x, 0.5), x)));
  Value p = cst(b, x, k[9]);
  for (int n = 8; n >= 0; --n) p = op2(b, "add", cst(b, x, k[n]), op2(b, "multiply", t, p));
  Value hi = b.bitcast(op2(b, "and", b.bitcast(x, DType::I32), b.constant(-4096, DType::I32, x.shape())), x.dtype());
  Value lo_sq = op2(b, "multiply", op2(b, "subtract", x, hi), op2(b, "add", x, hi));
  Value e_hi = op1(b, "exponential", op1(b, "negate", op2(b, "multiply", hi, hi)));
  Value e_rest = op1(b, "exponential", op2(b, "subtract", p, lo_sq));
  return op2(b, "multiply", op2(b, "multiply", t, e_hi), e_rest);
}

// erf of f32 math as one rational function, x P(x^2) / Q(x^2) on x clamped to [-4, 4]
// (beyond it erf is +-1 in f32): within 7e-8 of erf in exact arithmetic, a few f32 ulp
// evaluated. One division and no exp, each read once, so a consumer fuses into one loop;
// the series/erfc split above materializes its divide and exp (each has several readers).
// Coefficients: the minimax fit Eigen's fast float erf uses (public numbers).
Value erf_rational(Builder& b, const Value& x) {
  static const double num[] = {-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04,
                               -5.69250639462346e-05, -2.10102402082508e-06, 2.77068142495902e-08,
                               -2.72614225801306e-10};  // x^1, x^3, ..., x^13
  static const double den[] = {-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03,
                               -2.13374055278905e-04, -1.45660718464996e-05};  // x^0, x^2, ..., x^8
  Value c = b.clamp(cst(b, x, -4), x, cst(b, x, 4));
  Value s = op2(b, "multiply", c, c);
  Value p = cst(b, x, num[6]);
  for (int n = 5; n >= 0; --n) p = op2(b, "add", cst(b, x, num[n]), op2(b, "multiply", s, p));
  Value q = cst(b, x, den[4]);
  for (int n = 3; n >= 0; --n) q = op2(b, "add", cst(b, x, den[n]), op2(b, "multiply", s, q));
  // The fit overshoots +-1 by an ulp near the clamp: gelu's 1 + erf went negative there.
  return b.clamp(cst(b, x, -1), op2(b, "divide", op2(b, "multiply", c, p), q), cst(b, x, 1));
}

// float64 erfc. CHLO's (Cephes' fit times e^(-x^2)) rounds x^2 itself, a relative error of
// up to x^2 2^-53 (6e-14 at x = 24). For 1 < x it is taken at xh, x with its low 27
// significand bits cleared (so xh^2 is exact), and carried to x by
// erfc(x) = erfc(xh) e^(-(x - xh)(x + xh)) erfcx(x) / erfcx(xh), the erfcx ratio to first
// order in d = x - xh (<= 2^-26 x; the next term is of order d^2 / x^2):
// 1 + d (2 xh - 2/sqrt(pi) e^(-xh^2) / erfc(xh)). Where erfc(xh) underflows (x > 26.5)
// the result is 0 in any case.
static Value erfc64(Builder& b, const Value& x) {
  Value hi = b.bitcast(op2(b, "and", b.bitcast(x, DType::I64), b.constant(-134217728.0, DType::I64, x.shape())), x.dtype());
  Value tail = cmpk(b, x, 1, Cmp::GT);
  Value e = b.raw("chlo.erfc", {b.select(tail, hi, x)}, "", x.type);
  Value d = op2(b, "subtract", x, hi);
  Value e_hi2 = op1(b, "exponential", op1(b, "negate", op2(b, "multiply", hi, hi)));
  Value slope = op2(b, "subtract", op2(b, "multiply", cst(b, x, 2), hi),
                    op2(b, "divide", op2(b, "multiply", cst(b, x, M_2_SQRTPI), e_hi2), e));
  Value ratio = op2(b, "multiply", op1(b, "exponential", op1(b, "negate", op2(b, "multiply", d, op2(b, "add", x, hi)))),
                    op2(b, "add", cst(b, x, 1), op2(b, "multiply", d, slope)));
  tail = op2(b, "and", tail, cmpk(b, e, 0, Cmp::GT));
  return b.select(tail, op2(b, "multiply", e, ratio), e);
}

Value erf(Builder& b, const Value& x) {
  if (x.dtype() == DType::F64) return b.raw("chlo.erf", {x}, "", x.type);
  Value a = op1(b, "abs", x);
  Value big = op2(b, "subtract", cst(b, x, 1), erfc_large(b, a));
  big = b.select(cmpk(b, x, 0, Cmp::LT), op1(b, "negate", big), big);
  return b.select(cmpk(b, a, 1, Cmp::LT), erf_small(b, x), big);
}

// float32 erfc(x) for 1/2 <= x <= 5/4 from its Taylor series about 1, erfc(1) minus
// s Q(s) with s = x - 1 (exact), 14 terms: within 2 ulp, where 1 - erf(x) lost up to 8 ulp
// to the cancellation and the tail's fit was no better. The coefficients are
// erf^(n)(1) / n! = 2/sqrt(pi) e^-1 (-1)^(n-1) H_(n-1)(1) / n! (Hermite polynomials).
static Value erfc_near1(Builder& b, const Value& x) {
  constexpr int kTerms = 14;
  double h[kTerms + 1] = {1, 2}, c[kTerms + 1], fact = 1;
  for (int n = 1; n < kTerms; ++n) h[n + 1] = 2 * h[n] - 2 * n * h[n - 1];
  for (int n = 1; n <= kTerms; ++n) {
    fact *= n;
    c[n] = M_2_SQRTPI * std::exp(-1.0) * (n % 2 ? 1 : -1) * h[n - 1] / fact;
  }
  Value s = op2(b, "subtract", x, cst(b, x, 1));
  Value q = cst(b, x, c[kTerms]);
  for (int n = kTerms - 1; n >= 1; --n) q = op2(b, "add", cst(b, x, c[n]), op2(b, "multiply", s, q));
  return op2(b, "subtract", cst(b, x, 0.15729920705028513066), op2(b, "multiply", s, q));  // erfc(1)
}

Value erfc(Builder& b, const Value& x) {
  if (x.dtype() == DType::F64) return erfc64(b, x);
  Value tail = erfc_large(b, op1(b, "abs", x));
  tail = b.select(cmpk(b, x, 0, Cmp::LT), op2(b, "subtract", cst(b, x, 2), tail), tail);
  Value near = op2(b, "subtract", cst(b, x, 1), erf_small(b, x));
  Value r = b.select(cmpk(b, op1(b, "abs", x), 1, Cmp::LT), near, tail);
  Value mid = op2(b, "and", cmpk(b, x, 0.5, Cmp::GE), cmpk(b, x, 1.25, Cmp::LE));
  return b.select(mid, erfc_near1(b, x), r);
}
// XLA's float64 log1p is off by up to 2.7e-14 relative on [1 - sqrt 2, -0.366]. There it is
// log(u) + (x - (u - 1)) / u with u = 1 + x rounded: u - 1 is exact, so the quotient puts
// back what rounding u lost.
Value log1p(Builder& b, const Value& x) {
  Value r = op1(b, "log_plus_one", x);
  if (x.dtype() != DType::F64) return r;
  Value u = op2(b, "add", cst(b, x, 1), x);
  Value lost = op2(b, "subtract", x, op2(b, "subtract", u, cst(b, u, 1)));
  Value fixed = op2(b, "add", op1(b, "log", u), op2(b, "divide", lost, u));
  Value window = op2(b, "and", cmpk(b, x, -0.45, Cmp::GE), cmpk(b, x, -0.3, Cmp::LE));
  return b.select(window, fixed, r);
}
// expm1. XLA's float32 expm1 is up to 5 ulp off for |x| < 1/2 (1.3 beyond); there it is
// its Taylor series x (1 + x/2 (1 + x/3 (...))), 10 terms (within float32's precision at
// 1/2). Float64's is within 3 ulp.
Value expm1(Builder& b, const Value& x) {
  Value r = op1(b, "exponential_minus_one", x);
  if (x.dtype() == DType::F64) return r;
  Value p = cst(b, x, 1);
  for (int n = 10; n >= 2; --n) p = op2(b, "add", cst(b, x, 1), op2(b, "multiply", op2(b, "multiply", x, cst(b, x, 1.0 / n)), p));
  return b.select(cmpk(b, op1(b, "abs", x), 0.5, Cmp::LT), op2(b, "multiply", x, p), r);
}
}  // namespace ew

using namespace ew;

namespace {
Value and_(Builder& b, const Value& x, const Value& y) { return op2(b, "and", x, y); }
Value or_(Builder& b, const Value& x, const Value& y) { return op2(b, "or", x, y); }
Value not_(Builder& b, const Value& x) { return op1(b, "not", x); }
Value isnan_(Builder& b, const Value& x) { return cmp(b, x, x, Cmp::NE); }
bool flt(const Value& x) { return is_float(x.dtype()); }

// Dtype PyTorch compares/combines arguments `idx` in: result_type of the tensors,
// raised by Scalars of a higher category (float -> default f32, int -> i64).
DType common_type(Ctx& ctx, const std::vector<int>& idx) {
  Vs ts;
  bool fscalar = false, iscalar = false;
  for (int i : idx) {
    if (ctx.is_tensor(i)) ts.push_back(Value{"", ctx.type_of(i)});
    else (ctx.scalar_is_float(i) ? fscalar : iscalar) = true;
  }
  DType t = result_type(ts);
  if (fscalar && !is_float(t)) return DType::F32;
  if (iscalar && t == DType::Bool) return DType::I64;
  return t;
}

// Python's modulo: C's fmod, moved into the divisor's sign (a zero keeps fmod's
// sign, as CPU's kernel). Integer x % 0 is x (XLA's remainder; CPU raises).
Value py_mod(Builder& b, const Value& a, const Value& d) {
  Value r = op2(b, "remainder", a, d);
  Value fix = and_(b, cmpk(b, r, 0, Cmp::NE), cmp(b, cmpk(b, r, 0, Cmp::LT), cmpk(b, d, 0, Cmp::LT), Cmp::NE));
  return b.select(fix, add(b, r, d), r);
}

// Rounds a value of the f32 math type to the storage dtype `t` and back: how CPU's
// bf16/f16 kernels round after each step of a multi-step formula. No-op otherwise.
Value round_to(Builder& b, const Value& x, DType t) {
  if (t == x.dtype() || !flt(x)) return x;
  return b.convert(b.convert(x, t), x.dtype());
}

// Floor division. Floats follow PyTorch's div_floor_floating: go through fmod so
// that a == q * d + a % d holds, then round the quotient to the nearest integer;
// each step is rounded to `t` (CPU computes bf16/f16 step by step). Integer x // 0
// is -1, as XLA's integer divide (CPU raises ZeroDivisionError); INT_MIN // -1 wraps.
Value floor_div(Builder& b, const Value& a, const Value& d, DType t) {
  auto R = [&](const Value& v) { return round_to(b, v, t); };
  Value mod = op2(b, "remainder", a, d);
  Value fix = and_(b, cmpk(b, mod, 0, Cmp::NE), cmp(b, cmpk(b, mod, 0, Cmp::LT), cmpk(b, d, 0, Cmp::LT), Cmp::NE));
  if (!flt(a)) {
    Value q = div(b, a, d);  // truncates
    fix = and_(b, fix, cmpk(b, d, 0, Cmp::NE));
    return b.select(fix, sub(b, q, cst(b, q, 1)), q);
  }
  Value q = R(div(b, R(sub(b, a, mod)), d));
  q = b.select(fix, R(sub(b, q, cst(b, q, 1))), q);
  Value fq = op1(b, "floor", q);
  fq = b.select(cmpk(b, R(sub(b, q, fq)), 0.5, Cmp::GT), R(add(b, fq, cst(b, fq, 1))), fq);
  Value exact = R(div(b, a, d));
  Value res = b.select(cmpk(b, q, 0, Cmp::NE), fq, mul(b, exact, cst(b, exact, 0)));  // signed zero
  return b.select(cmpk(b, d, 0, Cmp::EQ), exact, res);
}

// max/min that propagate NaN from either side (XLA:CPU's maximum/minimum drop it),
// as PyTorch's maximum, minimum and clamp.
Value trunc_(Builder& b, const Value& x) {
  if (!flt(x)) return x;
  return b.select(cmpk(b, x, 0, Cmp::LT), op1(b, "ceil", x), op1(b, "floor", x));
}

// Sign bit of floats (sees -0.0 and negative NaNs), through the integer bit pattern of
// the same width (a narrower one would change the shape). The fnuz float8 formats spend
// the pattern of -0 on their one NaN, which has no sign (it widens to +NaN).
Value signbit_(Builder& b, const Value& x) {
  if (!flt(x)) return cmpk(b, x, 0, Cmp::LT);
  int64_t n = itemsize(x.dtype());
  DType it = n == 8 ? DType::I64 : n == 4 ? DType::I32 : n == 2 ? DType::I16 : DType::I8;
  Value bits = b.bitcast(x, it);
  Value neg = cmpk(b, bits, 0, Cmp::LT);
  if (x.dtype() != DType::F8E4M3FNUZ && x.dtype() != DType::F8E5M2FNUZ) return neg;
  return op2(b, "and", neg, cmpk(b, bits, -128, Cmp::NE));
}

std::vector<Value> compare_rule(Ctx& ctx, Cmp c) {
  DType t = common_type(ctx, {0, 1});
  Shape s = ctx.out(0).shape;
  return {ctx.b.compare(operand(ctx, 0, t, s), operand(ctx, 1, t, s), c)};
}

std::vector<Value> logical_rule(Ctx& ctx, const char* op) {
  Shape s = ctx.out(0).shape;
  return {op2(ctx.b, op, operand(ctx, 0, DType::Bool, s), operand(ctx, 1, DType::Bool, s))};
}

// Unary test on floats that is constant for integers (isnan, isinf, ...).
std::vector<Value> float_test(Ctx& ctx, bool for_ints, Value (*fn)(Builder&, const Value&)) {
  Value x = ctx.in(0);
  if (!flt(x)) return {ctx.b.constant(for_ints, DType::Bool, x.shape())};
  return {fn(ctx.b, x)};
}
}  // namespace

// A unary op that is one StableHLO op in the float math dtype.
#define TPU_UNARY(fn, aten, hlo) \
  TPU_LOWER(fn, aten) { return map(ctx, {0}, [](Builder& b, const Vs& x) { return op1(b, hlo, x[0]); }); }

// ---- Arithmetic ---------------------------------------------------------------

// alpha: a runtime operand, except the usual 1, which multiplies nothing (a real 1 times a
// real value is that value exactly): the program takes one operand less.
TPU_LOWER(add_rule, "add.Tensor", "add.Scalar") {
  if (ctx.alpha_is_one(2)) return map_cast(ctx, {0, 1}, [](Builder& b, const Vs& x) { return add(b, x[0], x[1]); });
  return map_cast(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) { return add(b, x[0], mul(b, x[2], x[1])); });
}
TPU_LOWER(sub_rule, "sub.Tensor", "sub.Scalar") {
  if (ctx.alpha_is_one(2)) return map_cast(ctx, {0, 1}, [](Builder& b, const Vs& x) { return sub(b, x[0], x[1]); });
  return map_cast(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) { return sub(b, x[0], mul(b, x[2], x[1])); });
}
TPU_LOWER(rsub_rule, "rsub.Tensor", "rsub.Scalar") {
  if (ctx.alpha_is_one(2)) return map_cast(ctx, {0, 1}, [](Builder& b, const Vs& x) { return sub(b, x[1], x[0]); });
  return map_cast(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) { return sub(b, x[1], mul(b, x[2], x[0])); });
}
TPU_LOWER(mul_rule, "mul.Tensor", "mul.Scalar") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) { return mul(b, x[0], x[1]); });
}

// The dtype each step of a rounded division is rounded to. CPU's bf16/f16 kernels
// round every step to the tensor's dtype, except when the divisor is a single value
// (a Scalar, or a tensor of one element broadcast): then the whole formula runs in
// f32 with one rounding at the end.
static DType div_step_type(Ctx& ctx) {
  bool scalar_divisor = !ctx.is_tensor(1) || ctx.type_of(1).numel() == 1;
  return scalar_divisor ? math_type(ctx.out(0).dtype) : ctx.out(0).dtype;
}

// True division, or rounded by rounding_mode ("trunc", "floor"). Integer outputs
// only arise with a rounding mode; StableHLO's integer divide truncates (x / 0 is -1).
// Integer division (or remainder) by zero raises on CPU: checked on the device.
static void check_int_divisor(Ctx& ctx) {
  if (!is_integral(ctx.out(0).dtype) && ctx.out(0).dtype != DType::Bool) return;
  Value d = ctx.scalar(1, DType::I64);
  ctx.check(all_true(ctx.b, cmpk(ctx.b, d, 0, Cmp::NE)), "RuntimeError: " + ctx.op() + ": ZeroDivisionError");
}

// An integer divisor goes through an optimization barrier: inside a fused graph XLA's
// simplifier rewrites a / pow(m, e) as a * pow(m, -e), exact for floats only (integers
// got 0: `a // m**2` in DeferAndFuse, found by the model pipeline on VideoLLaMA 3).
static Vs int_divisor(Builder& b, Vs x) {
  if (!flt(x[1])) x[1] = b.optimization_barrier({x[1]})[0];
  return x;
}

TPU_LOWER(div_rule, "div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode") {
  // div.out's third argument is `out` itself, not a mode.
  std::string mode = ctx.num_args() > 2 && !ctx.is_none(2) && !ctx.is_tensor(2) ? ctx.str(2) : "";
  check_int_divisor(ctx);
  if (mode.empty()) return map(ctx, {0, 1}, [](Builder& b, const Vs& x) { return div(b, x[0], x[1]); });
  DType t = div_step_type(ctx);
  if (mode == "trunc")
    return map(ctx, {0, 1}, [t](Builder& b, const Vs& v) {
      Vs x = int_divisor(b, v);
      return trunc_(b, round_to(b, div(b, x[0], x[1]), t));
    });
  if (mode == "floor")
    return map(ctx, {0, 1}, [t](Builder& b, const Vs& v) { Vs x = int_divisor(b, v); return floor_div(b, x[0], x[1], t); });
  throw Unsupported("div rounding_mode " + mode);
}
TPU_LOWER(floor_divide_rule, "floor_divide", "floor_divide.Scalar", "floor_divide_.Tensor") {
  check_int_divisor(ctx);
  DType t = div_step_type(ctx);
  return map(ctx, {0, 1}, [t](Builder& b, const Vs& v) { Vs x = int_divisor(b, v); return floor_div(b, x[0], x[1], t); });
}
TPU_LOWER(remainder_rule, "remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor") {
  check_int_divisor(ctx);
  return map_cast(ctx, {0, 1}, [](Builder& b, const Vs& x) { return py_mod(b, x[0], x[1]); });
}
TPU_LOWER(fmod_rule, "fmod.Tensor", "fmod.Scalar") {
  check_int_divisor(ctx);
  return map_cast(ctx, {0, 1}, [](Builder& b, const Vs& x) { return op2(b, "remainder", x[0], x[1]); });
}
namespace {
// Integer power as CPU computes it: by squaring over every bit of the exponent, wrapping
// on overflow (XLA's integer power squares only a few times, so 1113^1113 came out
// wrong), and for a negative exponent 1 from base 1, +-1 from base -1, else 0 (XLA gave
// 0 for (-1)^-n).
Value int_pow(Builder& b, const Value& base, const Value& e) {
  DType t = base.dtype();
  int bits = static_cast<int>(8 * itemsize(t));
  if (is_signed_int(t)) bits -= 1;  // a negative exponent takes the select below
  Value one = cst(b, base, 1);
  Value acc = one, square = base;
  for (int i = 0; i < bits; ++i) {
    Value bit = op2(b, "and", op2(b, "shift_right_logical", e, cst(b, e, i)), one);
    acc = b.select(cmpk(b, bit, 1, Cmp::EQ), mul(b, acc, square), acc);
    if (i + 1 < bits) square = mul(b, square, square);
  }
  if (!is_signed_int(t)) return acc;
  Value odd = cmpk(b, op2(b, "and", e, one), 1, Cmp::EQ);
  Value minus_one_to_e = b.select(odd, cst(b, base, -1), one);
  Value negative = b.select(cmpk(b, base, 1, Cmp::EQ), one,
                            b.select(cmpk(b, base, -1, Cmp::EQ), minus_one_to_e, cst(b, base, 0)));
  return b.select(cmpk(b, e, 0, Cmp::LT), negative, acc);
}
}  // namespace

// pow_.Tensor is the in-place Tensor_Tensor (its overload name differs).
TPU_LOWER(pow_rule, "pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar", "pow_.Tensor") {
  // An integer tensor to a negative integer Scalar is refused on the host at each call
  // (backend/kernel_checks.cpp): the Scalar is a runtime operand.
  bool scalar_exponent = ctx.is_tensor(0) && !ctx.is_tensor(1);
  DType o = ctx.out(0).dtype;
  // CPU rounds a Scalar base to the tensor's dtype; a Scalar exponent it reads as is.
  auto mapper = ctx.is_tensor(0) ? map : map_cast;
  return mapper(ctx, {0, 1}, [scalar_exponent, o](Builder& b, const Vs& x) {
    if (is_integral(x[0].dtype())) return int_pow(b, x[0], x[1]);
    if (!scalar_exponent) return op2(b, "power", x[0], x[1]);
    // A Scalar exponent, as CPU's pow_tensor_scalar_kernel (and CUDA's): float16 takes
    // pow(x, half(e)) for every e; otherwise sqrt for 0.5, 1 / sqrt for -0.5 and 1 / x
    // for -1 (which part from pow at -0 and -inf), and for an exponent that is 2, 3 or -2
    // in the dtype (bf16 rounds it) the products x * x, x * x * x and 1 / (x * x), each
    // step rounded to the dtype (not pow, which is a different rounding of the same value).
    bool narrow = o == DType::F16 || o == DType::BF16;
    Value e = narrow ? reduce_precision(b, x[1], o) : x[1];
    Value p = op2(b, "power", x[0], e);
    if (o == DType::F16) return p;
    auto rnd = [&](const Value& v) { return narrow ? reduce_precision(b, v, o) : v; };
    Value sq = rnd(mul(b, x[0], x[0]));
    p = b.select(cmpk(b, e, 2, Cmp::EQ), sq, p);
    p = b.select(cmpk(b, e, 3, Cmp::EQ), mul(b, sq, x[0]), p);
    p = b.select(cmpk(b, e, -2, Cmp::EQ), div(b, cst(b, sq, 1), sq), p);
    p = b.select(cmpk(b, x[1], -1, Cmp::EQ), div(b, cst(b, x[0], 1), x[0]), p);
    Value root = op1(b, "sqrt", x[0]);
    p = b.select(cmpk(b, x[1], 0.5, Cmp::EQ), root, p);
    return b.select(cmpk(b, x[1], -0.5, Cmp::EQ), op2(b, "divide", cst(b, root, 1), root), p);
  });
}
TPU_LOWER(neg_rule, "neg") { return map(ctx, {0}, [](Builder& b, const Vs& x) { return op1(b, "negate", x[0]); }); }
TPU_LOWER(abs_rule, "abs") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) {
    return is_unsigned_int(x[0].dtype()) ? x[0] : op1(b, "abs", x[0]);
  });
}
// PyTorch's sign is (x > 0) - (x < 0): NaN gives 0, unlike stablehlo.sign.
TPU_LOWER(sign_rule, "sign", "sgn") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) {
    DType t = x[0].dtype();
    return sub(b, b.convert(cmpk(b, x[0], 0, Cmp::GT), t), b.convert(cmpk(b, x[0], 0, Cmp::LT), t));
  });
}
TPU_LOWER(reciprocal_rule, "reciprocal") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return div(b, cst(b, x[0], 1), x[0]); });
}
TPU_LOWER(addcmul_rule, "addcmul") {  // self + value * t1 * t2, in PyTorch's order
  return map(ctx, {0, 1, 2, 3}, [](Builder& b, const Vs& x) { return add(b, x[0], mul(b, mul(b, x[3], x[1]), x[2])); });
}
TPU_LOWER(addcdiv_rule, "addcdiv") {  // self + value * t1 / t2
  return map(ctx, {0, 1, 2, 3}, [](Builder& b, const Vs& x) { return add(b, x[0], div(b, mul(b, x[3], x[1]), x[2])); });
}
// PyTorch's lerp switches formulas at |w| = 0.5 so both ends are exact.
TPU_LOWER(lerp_rule, "lerp.Scalar", "lerp.Tensor") {
  if (!is_float(ctx.out(0).dtype) && !is_complex(ctx.out(0).dtype))
    throw DtypeNotImplemented("lerp");
  return map(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) {
    Value d = sub(b, x[1], x[0]);
    Value lo = add(b, x[0], mul(b, x[2], d));
    Value hi = sub(b, x[1], mul(b, d, sub(b, cst(b, d, 1), x[2])));
    return b.select(cmpk(b, op1(b, "abs", x[2]), 0.5, Cmp::LT), lo, hi);
  });
}

// ---- Exponentials, logarithms, powers ----------------------------------------

TPU_UNARY(exp_rule, "exp", "exponential")
TPU_LOWER(expm1_rule, "expm1") { return map(ctx, {0}, [](Builder& b, const Vs& x) { return expm1(b, x[0]); }); }
TPU_UNARY(log_rule, "log", "log")
TPU_LOWER(log1p_rule, "log1p") { return map(ctx, {0}, [](Builder& b, const Vs& x) { return log1p(b, x[0]); }); }
TPU_UNARY(sqrt_rule, "sqrt", "sqrt")
TPU_UNARY(rsqrt_rule, "rsqrt", "rsqrt")
TPU_UNARY(sigmoid_rule, "sigmoid", "logistic")
TPU_LOWER(exp2_rule, "exp2") {  // pow(2, x) keeps full precision, unlike exp(x ln 2)
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return op2(b, "power", cst(b, x[0], 2), x[0]); });
}
TPU_LOWER(log2_rule, "log2") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return div(b, op1(b, "log", x[0]), cst(b, x[0], M_LN2)); });
}
TPU_LOWER(log10_rule, "log10") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return div(b, op1(b, "log", x[0]), cst(b, x[0], M_LN10)); });
}
// Scaled so that a*a + b*b does not overflow or underflow.
TPU_LOWER(hypot_rule, "hypot") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) {
    Value a = op1(b, "abs", x[0]), c = op1(b, "abs", x[1]);
    Value hi = nan_minmax(b, a, c, "maximum"), lo = nan_minmax(b, a, c, "minimum");
    Value r = div(b, lo, hi);
    Value h = mul(b, hi, op1(b, "sqrt", add(b, cst(b, r, 1), mul(b, r, r))));
    h = b.select(cmpk(b, hi, 0, Cmp::EQ), hi, h);
    Value inf = or_(b, cmpk(b, a, INFINITY, Cmp::EQ), cmpk(b, c, INFINITY, Cmp::EQ));
    return b.select(inf, cst(b, h, INFINITY), h);
  });
}
// max + log1p(exp(-|a - b|)); equal infinities would make NaN, so they pass through.
static Value logaddexp_(Builder& b, const Value& x, const Value& y, bool base2) {
  Value m = op2(b, "maximum", x, y);
  Value d = op1(b, "negate", op1(b, "abs", sub(b, x, y)));
  Value r = base2 ? div(b, op1(b, "log_plus_one", op2(b, "power", cst(b, d, 2), d)), cst(b, d, M_LN2))
                  : op1(b, "log_plus_one", op1(b, "exponential", d));
  Value same_inf = and_(b, cmp(b, x, y, Cmp::EQ), cmpk(b, op1(b, "abs", x), INFINITY, Cmp::EQ));
  return b.select(same_inf, x, add(b, m, r));
}
TPU_LOWER(logaddexp_rule, "logaddexp") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) { return logaddexp_(b, x[0], x[1], false); });
}
TPU_LOWER(logaddexp2_rule, "logaddexp2") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) { return logaddexp_(b, x[0], x[1], true); });
}
// x * log(y) (log1p for xlog1py), defined as 0 where x == 0 unless y is NaN. CPU's
// bf16/f16 kernels round log(y) to the dtype before the product.
static std::vector<Value> x_log_y(Ctx& ctx, Value (*log)(Builder&, const Value&)) {
  DType ot = ctx.out(0).dtype;
  return map_cast(ctx, {0, 1}, [log, ot](Builder& b, const Vs& x) {
    Value r = mul(b, x[0], round_to(b, log(b, x[1]), ot));
    r = b.select(cmpk(b, x[0], 0, Cmp::EQ), cst(b, r, 0), r);
    return b.select(isnan_(b, x[1]), x[1], r);
  });
}
TPU_LOWER(xlogy_rule, "xlogy.Tensor", "xlogy.Scalar_Self", "xlogy.Scalar_Other") {
  return x_log_y(ctx, [](Builder& b, const Value& y) { return op1(b, "log", y); });
}
TPU_LOWER(xlog1py_rule, "special_xlog1py", "special_xlog1py.self_scalar", "special_xlog1py.other_scalar") {
  return x_log_y(ctx, log1p);
}
// -x log x for x > 0, 0 at 0, -inf below (NaN stays), log rounded as in xlogy.
TPU_LOWER(entr_rule, "special_entr") {
  DType ot = ctx.out(0).dtype;
  return map(ctx, {0}, [ot](Builder& b, const Vs& x) {
    Value z = x[0];
    Value r = mul(b, op1(b, "negate", z), round_to(b, op1(b, "log", z), ot));
    r = b.select(cmpk(b, z, 0, Cmp::EQ), cst(b, z, 0), r);
    r = b.select(cmpk(b, z, 0, Cmp::LT), cst(b, z, -INFINITY), r);
    return b.select(isnan_(b, z), z, r);
  });
}
// With eps, x is clamped to [eps, 1 - eps] first, bounds in the tensor's dtype as in
// PyTorch (in bf16, 1 - 1e-3 is 1 and logit gives inf).
TPU_LOWER(logit_rule, "logit") {
  double eps = ctx.f_or(1, -1);
  DType ot = ctx.out(0).dtype;
  return map(ctx, {0}, [eps, ot](Builder& b, const Vs& x) {
    Value z = x[0];
    auto bound = [&](double v) { return b.convert(b.convert(cst(b, z, v), ot), z.dtype()); };
    if (eps >= 0) z = nan_minmax(b, nan_minmax(b, z, bound(eps), "maximum"), bound(1 - eps), "minimum");
    // CPU's bf16/f16 kernel rounds 1 - x and the quotient to the dtype.
    return op1(b, "log", round_to(b, div(b, z, round_to(b, sub(b, cst(b, z, 1), z), ot)), ot));
  });
}
TPU_LOWER(erf_rule, "erf") { return map(ctx, {0}, [](Builder& b, const Vs& x) { return erf(b, x[0]); }); }
TPU_LOWER(erfc_rule, "erfc") { return map(ctx, {0}, [](Builder& b, const Vs& x) { return erfc(b, x[0]); }); }

// ---- Trigonometric and hyperbolic ------------------------------------------------

TPU_UNARY(sin_rule, "sin", "sine")
TPU_UNARY(cos_rule, "cos", "cosine")
TPU_UNARY(tan_rule, "tan", "tan")
TPU_UNARY(tanh_rule, "tanh", "tanh")
TPU_LOWER(atan2_rule, "atan2") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) { return op2(b, "atan2", x[0], x[1]); });
}
// sqrt(1 - x^2) as sqrt((1 - x)(1 + x)): no cancellation near |x| = 1; NaN beyond.
static Value cos_of_asin(Builder& b, const Value& x) {
  Value one = cst(b, x, 1);
  return op1(b, "sqrt", mul(b, sub(b, one, x), add(b, one, x)));
}
TPU_LOWER(asin_rule, "asin") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return op2(b, "atan2", x[0], cos_of_asin(b, x[0])); });
}
TPU_LOWER(acos_rule, "acos") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return op2(b, "atan2", cos_of_asin(b, x[0]), x[0]); });
}
TPU_LOWER(atan_rule, "atan") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return op2(b, "atan2", x[0], cst(b, x[0], 1)); });
}
// sinh |x| = (E + E / (E + 1)) / 2 with E = expm1|x| is exact near 0; past 20 it is
// e^|x| / 2, taken as (e^(|x|/2) / 2) * e^(|x|/2) so it overflows only where sinh does.
TPU_LOWER(sinh_rule, "sinh") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) {
    Value a = op1(b, "abs", x[0]), half = cst(b, a, 0.5);
    Value e = expm1(b, a);
    Value small = mul(b, half, add(b, e, div(b, e, add(b, e, cst(b, e, 1)))));
    Value h = op1(b, "exponential", mul(b, half, a));
    Value s = b.select(cmpk(b, a, 20, Cmp::LT), small, mul(b, mul(b, half, h), h));
    return b.select(signbit_(b, x[0]), op1(b, "negate", s), s);
  });
}
TPU_LOWER(cosh_rule, "cosh") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) {
    Value a = op1(b, "abs", x[0]), half = cst(b, a, 0.5);
    Value e = op1(b, "exponential", a);
    Value small = mul(b, half, add(b, e, div(b, cst(b, e, 1), e)));
    Value h = op1(b, "exponential", mul(b, half, a));
    return b.select(cmpk(b, a, 20, Cmp::LT), small, mul(b, mul(b, half, h), h));
  });
}
// Where asinh and acosh of a become log(2a): the dropped term, +-1/(4a^2), is below half
// an ulp of log(2a) past 1e4 in float32 but only past about 1e8 in float64 (at 1e4 it
// was a 2.5e-10 relative error there), and a^2 stays finite up to either.
static double log2a_from(const Value& a) { return a.dtype() == DType::F64 ? 1e8 : 1e4; }
// asinh |x| = log1p(a + a^2 / (1 + sqrt(1 + a^2))); log(2a) once a^2 could overflow.
TPU_LOWER(asinh_rule, "asinh") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) {
    Value a = op1(b, "abs", x[0]), one = cst(b, a, 1);
    Value a2 = mul(b, a, a);
    Value mid = op1(b, "log_plus_one", add(b, a, div(b, a2, add(b, one, op1(b, "sqrt", add(b, one, a2))))));
    Value big = add(b, op1(b, "log", a), cst(b, a, M_LN2));
    Value r = b.select(cmpk(b, a, log2a_from(a), Cmp::GT), big, mid);
    return b.select(signbit_(b, x[0]), op1(b, "negate", r), r);
  });
}
// acosh x = log1p(t + sqrt(2t + t^2)) with t = x - 1 (exact near 1); NaN below 1.
TPU_LOWER(acosh_rule, "acosh") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) {
    Value t = sub(b, x[0], cst(b, x[0], 1));
    Value mid = op1(b, "log_plus_one", add(b, t, op1(b, "sqrt", mul(b, t, add(b, t, cst(b, t, 2))))));
    Value big = add(b, op1(b, "log", x[0]), cst(b, t, M_LN2));
    Value r = b.select(cmpk(b, x[0], log2a_from(t), Cmp::GT), big, mid);
    return b.select(cmpk(b, x[0], 1, Cmp::LT), cst(b, r, NAN), r);  // t (t + 2) overflows below -1e19
  });
}
// atanh |x| = log1p(2a / (1 - a)) / 2: on |x| so log1p's argument stays >= 0 (well
// conditioned); the sign is put back after.
TPU_LOWER(atanh_rule, "atanh") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) {
    Value a = op1(b, "abs", x[0]);
    Value q = div(b, mul(b, cst(b, a, 2), a), sub(b, cst(b, a, 1), a));
    Value r = mul(b, cst(b, q, 0.5), op1(b, "log_plus_one", q));
    return b.select(signbit_(b, x[0]), op1(b, "negate", r), r);
  });
}
TPU_LOWER(deg2rad_rule, "deg2rad") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return mul(b, x[0], cst(b, x[0], M_PI / 180)); });
}
TPU_LOWER(rad2deg_rule, "rad2deg") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return mul(b, x[0], cst(b, x[0], 180 / M_PI)); });
}

// ---- Rounding ------------------------------------------------------------------

#define TPU_ROUNDING(fn, aten, hlo) \
  TPU_LOWER(fn, aten) { return map(ctx, {0}, [](Builder& b, const Vs& x) { return flt(x[0]) ? op1(b, hlo, x[0]) : x[0]; }); }
TPU_ROUNDING(floor_rule, "floor", "floor")
TPU_ROUNDING(ceil_rule, "ceil", "ceil")
TPU_ROUNDING(round_rule, "round", "round_nearest_even")
TPU_LOWER(round_decimals_rule, "round.decimals") {
  int64_t d = ctx.i(1);
  return map(ctx, {0}, [d](Builder& b, const Vs& x) {
    if (!flt(x[0]) || d == 0) return flt(x[0]) ? op1(b, "round_nearest_even", x[0]) : x[0];
    Value p = cst(b, x[0], std::pow(10.0, static_cast<double>(d > 0 ? d : -d)));
    if (d > 0) return div(b, op1(b, "round_nearest_even", mul(b, x[0], p)), p);
    return mul(b, op1(b, "round_nearest_even", div(b, x[0], p)), p);
  });
}
TPU_LOWER(trunc_rule, "trunc") { return map(ctx, {0}, [](Builder& b, const Vs& x) { return trunc_(b, x[0]); }); }
TPU_LOWER(frac_rule, "frac") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return sub(b, x[0], trunc_(b, x[0])); });
}

// ---- Min / max / clamp ---------------------------------------------------------

TPU_LOWER(maximum_rule, "maximum") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) { return nan_minmax(b, x[0], x[1], "maximum"); });
}
TPU_LOWER(minimum_rule, "minimum") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) { return nan_minmax(b, x[0], x[1], "minimum"); });
}
// fmax/fmin ignore a NaN operand (maximum/minimum propagate it).
static Value fminmax(Builder& b, const Vs& x, const char* op) {
  Value r = op2(b, op, x[0], x[1]);
  if (!flt(r)) return r;
  r = b.select(isnan_(b, x[1]), x[0], r);
  return b.select(isnan_(b, x[0]), x[1], r);
}
TPU_LOWER(fmax_rule, "fmax") { return map(ctx, {0, 1}, [](Builder& b, const Vs& x) { return fminmax(b, x, "maximum"); }); }
TPU_LOWER(fmin_rule, "fmin") { return map(ctx, {0, 1}, [](Builder& b, const Vs& x) { return fminmax(b, x, "minimum"); }); }

// min(max(x, lo), hi) as PyTorch: NaN in x or in a bound propagates, and hi wins
// when lo > hi.
TPU_LOWER(clamp_rule, "clamp", "clamp.Tensor") {
  Type o = ctx.out(0);
  Builder& b = ctx.b;
  DType t = math_type(o.dtype);
  Value x = operand(ctx, 0, t, o.shape);
  if (!ctx.is_none(1)) x = nan_minmax(b, x, operand(ctx, 1, t, o.shape), "maximum");
  if (!ctx.is_none(2)) x = nan_minmax(b, x, operand(ctx, 2, t, o.shape), "minimum");
  return {b.convert(x, o.dtype)};
}
TPU_LOWER(clamp_min_rule, "clamp_min", "clamp_min.Tensor") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) { return nan_minmax(b, x[0], x[1], "maximum"); });
}
TPU_LOWER(clamp_max_rule, "clamp_max", "clamp_max.Tensor") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) { return nan_minmax(b, x[0], x[1], "minimum"); });
}

// ---- Comparisons, logic, bits -------------------------------------------------

TPU_LOWER(eq_rule, "eq.Tensor", "eq.Scalar") { return compare_rule(ctx, Cmp::EQ); }
TPU_LOWER(ne_rule, "ne.Tensor", "ne.Scalar") { return compare_rule(ctx, Cmp::NE); }
TPU_LOWER(lt_rule, "lt.Tensor", "lt.Scalar") { return compare_rule(ctx, Cmp::LT); }
TPU_LOWER(le_rule, "le.Tensor", "le.Scalar") { return compare_rule(ctx, Cmp::LE); }
TPU_LOWER(gt_rule, "gt.Tensor", "gt.Scalar") { return compare_rule(ctx, Cmp::GT); }
TPU_LOWER(ge_rule, "ge.Tensor", "ge.Scalar") { return compare_rule(ctx, Cmp::GE); }

// isclose in one program (PyTorch's composite is ~10 ops, each its own Strict program):
// a == b, or both NaN with equal_nan, or a finite |a - b| <= atol + |rtol b|, in the
// composite's dtypes and steps: reduced floats round each step; integers and bool
// compute in the default float dtype, taken as float32 (a program does not see
// torch.get_default_dtype()).
TPU_LOWER(isclose_rule, "isclose") {
  Builder& b = ctx.b;
  Shape s = ctx.out(0).shape;
  DType t = ctx.type_of(0).dtype;
  double rtol = ctx.f(2), atol = ctx.f(3);
  Value x = coerce(b, ctx.in(0), t, s), y = coerce(b, ctx.in(1), t, s);
  Value close = cmp(b, x, y, Cmp::EQ);
  if (ctx.flag(4) && flt(x)) close = or_(b, close, and_(b, isnan_(b, x), isnan_(b, y)));
  if (rtol == 0 && atol == 0) return {close};
  DType ft = is_float(t) ? t : DType::F32;  // the errors' dtype
  auto R = [&](const Value& v) { return round_to(b, v, ft); };
  Value xf = b.convert(x, acc_type(ft)), yf = b.convert(y, acc_type(ft));
  Value allowed = R(add(b, cst(b, yf, atol), op1(b, "abs", R(mul(b, cst(b, yf, rtol), yf)))));
  Value actual = op1(b, "abs", R(sub(b, xf, yf)));
  Value finite = cmpk(b, actual, INFINITY, Cmp::LT);  // false for NaN
  return {or_(b, close, and_(b, finite, cmp(b, actual, allowed, Cmp::LE)))};
}

TPU_LOWER(logical_and_rule, "logical_and") { return logical_rule(ctx, "and"); }
TPU_LOWER(logical_or_rule, "logical_or") { return logical_rule(ctx, "or"); }
TPU_LOWER(logical_xor_rule, "logical_xor") { return logical_rule(ctx, "xor"); }
TPU_LOWER(logical_not_rule, "logical_not") { return {not_(ctx.b, ctx.b.convert(ctx.in(0), DType::Bool))}; }

// Bitwise ops run in the (integer or bool) output dtype, never widened.
static std::vector<Value> bitwise(Ctx& ctx, const char* op) {
  Type o = ctx.out(0);
  if (is_float(o.dtype)) throw Unsupported("bitwise op on floats");
  return {op2(ctx.b, op, operand(ctx, 0, o.dtype, o.shape), operand(ctx, 1, o.dtype, o.shape))};
}
TPU_LOWER(bitwise_and_rule, "bitwise_and.Tensor", "bitwise_and.Scalar", "bitwise_and.Scalar_Tensor") {
  return bitwise(ctx, "and");
}
TPU_LOWER(bitwise_or_rule, "bitwise_or.Tensor", "bitwise_or.Scalar", "bitwise_or.Scalar_Tensor") {
  return bitwise(ctx, "or");
}
TPU_LOWER(bitwise_xor_rule, "bitwise_xor.Tensor", "bitwise_xor.Scalar", "bitwise_xor.Scalar_Tensor") {
  return bitwise(ctx, "xor");
}
TPU_LOWER(bitwise_not_rule, "bitwise_not") { return {not_(ctx.b, ctx.in(0))}; }
// Shifts past the bit width give 0 (left) or the sign fill (right), in StableHLO as in PyTorch.
TPU_LOWER(lshift_rule, "bitwise_left_shift.Tensor", "bitwise_left_shift.Tensor_Scalar",
          "bitwise_left_shift.Scalar_Tensor", "__lshift__.Tensor", "__lshift__.Scalar") {
  return bitwise(ctx, "shift_left");
}
TPU_LOWER(rshift_rule, "bitwise_right_shift.Tensor", "bitwise_right_shift.Tensor_Scalar",
          "bitwise_right_shift.Scalar_Tensor", "__rshift__.Tensor", "__rshift__.Scalar") {
  return bitwise(ctx, is_unsigned_int(ctx.out(0).dtype) ? "shift_right_logical" : "shift_right_arithmetic");
}

TPU_LOWER(isnan_rule, "isnan") { return float_test(ctx, false, isnan_); }
TPU_LOWER(isinf_rule, "isinf") {
  return float_test(ctx, false, [](Builder& b, const Value& x) { return cmpk(b, op1(b, "abs", x), INFINITY, Cmp::EQ); });
}
TPU_LOWER(isposinf_rule, "isposinf") {
  return float_test(ctx, false, [](Builder& b, const Value& x) { return cmpk(b, x, INFINITY, Cmp::EQ); });
}
TPU_LOWER(isneginf_rule, "isneginf") {
  return float_test(ctx, false, [](Builder& b, const Value& x) { return cmpk(b, x, -INFINITY, Cmp::EQ); });
}
TPU_LOWER(signbit_rule, "signbit") { return {signbit_(ctx.b, ctx.in(0))}; }
TPU_LOWER(copysign_rule, "copysign.Tensor", "copysign.Scalar") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) {
    Value a = op1(b, "abs", x[0]);
    return b.select(signbit_(b, x[1]), op1(b, "negate", a), a);
  });
}
TPU_LOWER(heaviside_rule, "heaviside") {
  return map(ctx, {0, 1}, [](Builder& b, const Vs& x) {
    Value step = b.convert(cmpk(b, x[0], 0, Cmp::GT), x[0].dtype());
    return b.select(cmpk(b, x[0], 0, Cmp::EQ), x[1], step);
  });
}

// ---- Selection and fills -------------------------------------------------------

TPU_LOWER(where_rule, "where.self") {
  Type o = ctx.out(0);
  Value c = coerce(ctx.b, ctx.in(0), DType::Bool, o.shape);
  return {ctx.b.select(c, operand(ctx, 1, o.dtype, o.shape), operand(ctx, 2, o.dtype, o.shape))};
}
TPU_LOWER(masked_fill_rule, "masked_fill.Scalar", "masked_fill.Tensor") {
  Type o = ctx.out(0);
  Value m = coerce(ctx.b, ctx.in(1), DType::Bool, o.shape);
  return {ctx.b.select(m, operand(ctx, 2, o.dtype, o.shape), operand(ctx, 0, o.dtype, o.shape))};
}
// NaN -> nan (0), +-inf -> posinf/neginf (default: the dtype's finite extremes).
TPU_LOWER(nan_to_num_rule, "nan_to_num") {
  Type o = ctx.out(0);
  Value x = ctx.in(0);
  if (!is_float(o.dtype)) return {x};
  double big = o.dtype == DType::F64 ? 1.7976931348623157e308
               : o.dtype == DType::F32 ? 3.4028234663852886e38
               : o.dtype == DType::BF16 ? 3.3895313892515355e38 : 65504.0;
  Builder& b = ctx.b;
  x = b.select(isnan_(b, x), cst(b, x, ctx.f_or(1, 0)), x);
  x = b.select(cmpk(b, x, INFINITY, Cmp::EQ), cst(b, x, ctx.f_or(2, big)), x);
  return {b.select(cmpk(b, x, -INFINITY, Cmp::EQ), cst(b, x, ctx.f_or(3, -big)), x)};
}
TPU_LOWER(to_copy_rule, "_to_copy") { return {convert_any(ctx.b, ctx.in(0), ctx.out(0).dtype)}; }
TPU_LOWER(clone_rule, "clone") { return {ctx.in(0)}; }
TPU_LOWER(copy_rule, "copy") { return {coerce(ctx.b, ctx.in(1), ctx.out(0).dtype, ctx.out(0).shape)}; }
TPU_LOWER(fill_rule, "fill.Scalar", "fill.Tensor", "fill_.Scalar", "fill_.Tensor") {
  DType t = ctx.out(0).dtype;
  if (is_fp8(t) && !ctx.is_tensor(1)) {  // through f32, as c10 converts a Scalar to fp8
    // CPU's refusal of a value past the type's range is kernel_checks.cpp's (on the host,
    // and not for a one-element tensor: where's Python number saturates as .to() does).
    Builder& b = ctx.b;
    return {broadcast_to(b, convert_any(b, ctx.scalar(1, DType::F32), t), ctx.out(0).shape)};
  }
  return {operand(ctx, 1, t, ctx.out(0).shape)};
}
TPU_LOWER(zero_rule, "zero", "zero_") { return {constant_any(ctx.b, 0, ctx.out(0).dtype, ctx.out(0).shape)}; }

}  // namespace tpu::lowering
