// Complex numbers. Ops that only exist for complex values (complex, polar, angle,
// conj_physical), and complex overrides: rules registered as "complex:<op>" that the
// backend uses instead of the op's own rule when a call involves a complex tensor or
// output (the general elementwise rules compute in real math types only).
// StableHLO's arithmetic and transcendental ops accept complex operands; comparisons
// and sign-like ops are spelled out on the real and imaginary parts.
#include <cmath>
#include <functional>
#include <limits>

#include "lowering/elementwise.h"
#include "lowering/helpers.h"

namespace tpu::lowering {
namespace {

using Vs = std::vector<Value>;
using ir::Cmp;

DType part_of(DType c) { return c == DType::C128 ? DType::F64 : DType::F32; }
DType complex_of(DType t) { return t == DType::F64 ? DType::C128 : DType::C64; }

Value re(Builder& b, const Value& z) {
  return b.raw("stablehlo.real", {z}, "", Type{part_of(z.dtype()), z.shape()});
}
Value im(Builder& b, const Value& z) {
  return b.raw("stablehlo.imag", {z}, "", Type{part_of(z.dtype()), z.shape()});
}
Value cplx(Builder& b, const Value& r, const Value& i) {
  return b.raw("stablehlo.complex", {r, i}, "", Type{complex_of(r.dtype()), r.shape()});
}
Value op1(Builder& b, const char* op, const Value& x) { return b.unary(std::string("stablehlo.") + op, x); }
Value op2(Builder& b, const char* op, const Value& x, const Value& y) {
  return b.binary(std::string("stablehlo.") + op, x, y);
}

// Argument i (a Tensor or a Scalar) as dtype t broadcast to `shape`.
Value operand(Ctx& ctx, int i, DType t, const Shape& shape) {
  if (ctx.is_tensor(i)) return coerce(ctx.b, ctx.in(i), t, shape);
  return broadcast_to(ctx.b, ctx.scalar(i, t), shape);
}

// fn over arguments `idx` converted to `t` (complex) and broadcast to the output's shape;
// the result converted to the output dtype.
using Fn = std::function<Value(Builder&, const Vs&)>;
std::vector<Value> cmap(Ctx& ctx, const std::vector<int>& idx, DType t, const Fn& fn) {
  Type o = ctx.out(0);
  Vs xs;
  for (int i : idx) xs.push_back(operand(ctx, i, t, o.shape));
  return {ctx.b.convert(fn(ctx.b, xs), o.dtype)};
}
// Math in the output's (complex) dtype.
std::vector<Value> omap(Ctx& ctx, const std::vector<int>& idx, const Fn& fn) {
  DType t = ctx.out(0).dtype;
  if (!is_complex(t)) throw Unsupported("complex rule with a real output");
  return cmap(ctx, idx, t, fn);
}
// Math in the (complex) dtype of input 0: ops whose output is real (abs, angle).
std::vector<Value> imap(Ctx& ctx, const Fn& fn) {
  DType t = ctx.type_of(0).dtype;
  if (!is_complex(t)) throw Unsupported("complex rule with a real input");
  return cmap(ctx, {0}, t, fn);
}

Value zero_like(Builder& b, const Value& x) { return b.constant(0, x.dtype(), x.shape()); }
Value is_zero(Builder& b, const Value& x) { return b.compare(x, zero_like(b, x), Cmp::EQ); }
Value is_nan(Builder& b, const Value& x) { return b.compare(x, x, Cmp::NE); }

// z == w on both parts (NaN parts compare unequal, as CPU).
Value equal(Builder& b, const Value& z, const Value& w) {
  return op2(b, "and", b.compare(re(b, z), re(b, w), Cmp::EQ), b.compare(im(b, z), im(b, w), Cmp::EQ));
}

// The complex conjugate; a real value is its own.
Value conj(Builder& b, const Value& z) {
  if (!is_complex(z.dtype())) return z;
  return cplx(b, re(b, z), op1(b, "negate", im(b, z)));
}

// PyTorch's angle of a real x: pi for x < 0, else 0, NaN kept.
Value real_angle(Builder& b, const Value& x) {
  Value pi = b.constant(M_PI, x.dtype(), x.shape()), zero = zero_like(b, x);
  Value a = b.select(b.compare(x, zero, Cmp::LT), pi, zero);
  return b.select(b.compare(x, x, Cmp::NE), x, a);
}

}  // namespace

// ---- ops of their own ---------------------------------------------------------------

TPU_LOWER(complex_rule, "complex") {
  DType re = ctx.type_of(0).dtype, im = ctx.type_of(1).dtype;
  if (re != im)  // CPU does not promote the parts
    throw std::invalid_argument("complex: real is " + std::string(mlir_name(re)) + " but imag is " +
                                mlir_name(im) + ": the parts must have one dtype");
  Type o = ctx.out(0);
  DType p = part_of(o.dtype);
  if (p != re)  // out= of another precision: CPU's kernel does not cast into it
    throw std::invalid_argument("complex: out is " + std::string(mlir_name(o.dtype)) + " but the parts are " +
                                mlir_name(re));
  return {cplx(ctx.b, coerce(ctx.b, ctx.in(0), p, o.shape), coerce(ctx.b, ctx.in(1), p, o.shape))};
}

// abs * (cos angle, sin angle), each part one product like CPU's kernel.
TPU_LOWER(polar_rule, "polar") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  DType p = part_of(o.dtype);
  Value r = coerce(b, ctx.in(0), p, o.shape), t = coerce(b, ctx.in(1), p, o.shape);
  return {cplx(b, mul(b, r, op1(b, "cosine", t)), mul(b, r, op1(b, "sine", t)))};
}

TPU_LOWER(angle_rule, "angle") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  Value x = ctx.in(0);
  if (is_complex(x.dtype())) return {b.convert(op2(b, "atan2", im(b, x), re(b, x)), o.dtype)};
  return {real_angle(b, b.convert(x, o.dtype))};  // integers are promoted to float first
}

// The functional op may alias a real input on CPU: only its out= and in-place
// forms (which CPU runs through the kernel directly) are ours.
TPU_LOWER(conj_physical_rule, "conj_physical.out", "conj_physical_") {
  return {ctx.b.convert(conj(ctx.b, ctx.in(0)), ctx.out(0).dtype)};
}

// ---- complex overrides of real rules -------------------------------------------------

TPU_LOWER(c_add, "complex:add.Tensor", "complex:add.Scalar") {
  return omap(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) { return add(b, x[0], mul(b, x[2], x[1])); });
}
TPU_LOWER(c_sub, "complex:sub.Tensor", "complex:sub.Scalar") {
  return omap(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) { return sub(b, x[0], mul(b, x[2], x[1])); });
}
TPU_LOWER(c_rsub, "complex:rsub.Tensor", "complex:rsub.Scalar") {
  return omap(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) { return sub(b, x[1], mul(b, x[2], x[0])); });
}
TPU_LOWER(c_mul, "complex:mul.Tensor", "complex:mul.Scalar") {
  return omap(ctx, {0, 1}, [](Builder& b, const Vs& x) { return mul(b, x[0], x[1]); });
}
// (a + bi) / (c + di) scaled by the larger part of the divisor (Smith's method), as
// c10::complex divides on CUDA and in CPU's scalar loops: special values are theirs (a
// divisor with an infinite part gives NaN where XLA's division gives 0), and 0 / 0 is
// divided part by part.
static Value cdiv(Builder& b, const Value& x, const Value& y) {
  Value a = re(b, x), bi = im(b, x), c = re(b, y), d = im(b, y);
  Value ac = op1(b, "abs", c), ad = op1(b, "abs", d);
  Value c_larger = b.compare(ac, ad, Cmp::GE);
  // c_larger: rat = d/c, scl = 1/(c + d rat), ((a + b rat), (b - a rat)) * scl
  Value rat1 = op2(b, "divide", d, c);
  Value scl1 = op2(b, "divide", b.constant(1, c.dtype(), c.shape()), add(b, c, mul(b, d, rat1)));
  Value re1 = mul(b, add(b, a, mul(b, bi, rat1)), scl1), im1 = mul(b, sub(b, bi, mul(b, a, rat1)), scl1);
  // else: rat = c/d, scl = 1/(d + c rat), ((a rat + b), (b rat - a)) * scl
  Value rat2 = op2(b, "divide", c, d);
  Value scl2 = op2(b, "divide", b.constant(1, c.dtype(), c.shape()), add(b, d, mul(b, c, rat2)));
  Value re2 = mul(b, add(b, mul(b, a, rat2), bi), scl2), im2 = mul(b, sub(b, mul(b, bi, rat2), a), scl2);
  Value zero = op2(b, "and", is_zero(b, c), is_zero(b, d));
  Value real = b.select(zero, op2(b, "divide", a, ac), b.select(c_larger, re1, re2));
  Value imag = b.select(zero, op2(b, "divide", bi, ad), b.select(c_larger, im1, im2));
  return cplx(b, real, imag);
}
static Value one_like(Builder& b, const Value& z) { return b.constant(1, z.dtype(), z.shape()); }
// 1 / y by cdiv's steps with the numerator's parts (1, 0) written out: XLA folds x + 0
// to x, which would drop the zeros' signs that CPU's "+ 0" gives.
static Value crecip(Builder& b, const Value& y) {
  Value c = re(b, y), d = im(b, y), one = b.constant(1, c.dtype(), c.shape()), zero = zero_like(b, c);
  Value plus_zero = b.constant(0, c.dtype(), c.shape());
  auto add0 = [&](const Value& v) { return b.select(is_zero(b, v), plus_zero, v); };  // v + 0
  Value rat1 = op2(b, "divide", d, c), scl1 = op2(b, "divide", one, add(b, c, mul(b, d, rat1)));
  Value re1 = b.select(is_nan(b, rat1), rat1, scl1);                                  // (1 + 0 rat) scl
  Value im1 = mul(b, add0(op1(b, "negate", rat1)), scl1);                             // (0 - rat) scl
  Value rat2 = op2(b, "divide", c, d), scl2 = op2(b, "divide", one, add(b, d, mul(b, c, rat2)));
  Value re2 = mul(b, add0(rat2), scl2);                                               // (rat + 0) scl
  Value im2 = b.select(is_nan(b, rat2), rat2, op1(b, "negate", scl2));                // (0 rat - 1) scl
  Value c_larger = b.compare(op1(b, "abs", c), op1(b, "abs", d), Cmp::GE);
  Value both_zero = op2(b, "and", is_zero(b, c), is_zero(b, d));
  Value real = b.select(both_zero, op2(b, "divide", one, op1(b, "abs", c)), b.select(c_larger, re1, re2));
  Value imag = b.select(both_zero, op2(b, "divide", zero, op1(b, "abs", d)), b.select(c_larger, im1, im2));
  return cplx(b, real, imag);
}

TPU_LOWER(c_div, "complex:div.Tensor", "complex:div.Scalar") {
  return omap(ctx, {0, 1}, [](Builder& b, const Vs& x) { return cdiv(b, x[0], x[1]); });
}
TPU_LOWER(c_neg, "complex:neg") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) { return op1(b, "negate", x[0]); });
}
TPU_LOWER(c_reciprocal, "complex:reciprocal") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) { return crecip(b, x[0]); });
}

// Tests and fixes of special values look at each part (CPU's complex kernels do).
static Value either(Builder& b, const Value& z, const std::function<Value(const Value&)>& test) {
  return op2(b, "or", test(re(b, z)), test(im(b, z)));
}
static Value is_inf(Builder& b, const Value& x) {
  return b.compare(op1(b, "abs", x), b.constant(INFINITY, x.dtype(), x.shape()), Cmp::EQ);
}
static Value sign_bit(Builder& b, const Value& x) {
  DType it = x.dtype() == DType::F64 ? DType::I64 : DType::I32;
  Value bits = b.bitcast(x, it);
  return b.compare(bits, b.constant(0, it, x.shape()), Cmp::LT);
}
static Value is_finite(Builder& b, const Value& x) { return b.compare(op2(b, "subtract", x, x), zero_like(b, x), Cmp::EQ); }
// A zero with the sign of x (copysign(0, x)).
static Value signed_zero(Builder& b, const Value& x) {
  Value z = zero_like(b, x);
  return b.select(sign_bit(b, x), op1(b, "negate", z), z);
}
// One StableHLO op that takes complex operands (and agrees with CPU on special values).
#define TPU_COMPLEX_UNARY(fn, aten, hlo) \
  TPU_LOWER(fn, "complex:" aten) { return omap(ctx, {0}, [](Builder& b, const Vs& x) { return op1(b, hlo, x[0]); }); }
#undef TPU_COMPLEX_UNARY

static Value cabs(Builder& b, const Value& z) { return complex_magnitude(b, z); }

// log: a NaN part makes the real part NaN, or +inf where the other part is infinite,
// as C's clog (XLA kept a finite log of the magnitude beside a NaN).
static Value clog(Builder& b, const Value& z) {
  Value l = op1(b, "log", z), r = re(b, z), i = im(b, z);
  Value nan_part = op2(b, "or", is_nan(b, r), is_nan(b, i));
  Value inf_part = op2(b, "or", is_inf(b, r), is_inf(b, i));
  Value special = b.select(inf_part, b.constant(INFINITY, r.dtype(), r.shape()), b.constant(NAN, r.dtype(), r.shape()));
  return cplx(b, b.select(nan_part, special, re(b, l)), im(b, l));
}
TPU_LOWER(c_log, "complex:log") { return omap(ctx, {0}, [](Builder& b, const Vs& x) { return clog(b, x[0]); }); }
// exp: e^(-inf) times a non-finite direction is 0, as C's cexp (XLA: NaN).
static Value cexp(Builder& b, const Value& z) {
  {
    Value e = op1(b, "exponential", z), r = re(b, z), i = im(b, z);
    Value fin = b.compare(op2(b, "subtract", i, i), zero_like(b, i), Cmp::EQ);
    Value to_zero = op2(b, "and", b.compare(r, b.constant(-INFINITY, r.dtype(), r.shape()), Cmp::EQ),
                        op1(b, "not", fin));
    Value out = b.select(to_zero, cplx(b, zero_like(b, r), signed_zero(b, i)), e);
    // e^r sin(+-0) keeps the zero's sign (XLA: +0), which decides a later sqrt/log's branch.
    out = cplx(b, re(b, out), b.select(is_zero(b, i), i, im(b, out)));
    // e^(+inf) times a non-finite direction: inf + NaN i (C's cexp; XLA: NaN + NaN i).
    Value inf_nan = cplx(b, b.constant(INFINITY, r.dtype(), r.shape()), b.constant(NAN, r.dtype(), r.shape()));
    Value pos_inf = b.compare(r, b.constant(INFINITY, r.dtype(), r.shape()), Cmp::EQ);
    return b.select(op2(b, "and", pos_inf, op1(b, "not", fin)), inf_nan, out);
  }
}
TPU_LOWER(c_exp, "complex:exp") { return omap(ctx, {0}, [](Builder& b, const Vs& x) { return cexp(b, x[0]); }); }
// sqrt on the branch cut follows the sign of a zero imaginary part, and an infinite
// imaginary part gives (inf, it) whatever the real part, as C's csqrt.
static Value csqrt(Builder& b, const Value& z) {
  {
    Value s = op1(b, "sqrt", z), i = im(b, z);
    Value si = im(b, s), ai = op1(b, "abs", si);
    Value im_s = b.select(sign_bit(b, i), op1(b, "negate", ai), ai);
    im_s = b.select(is_nan(b, si), si, im_s);
    Value inf_i = is_inf(b, i), r = re(b, z);
    Value re_s = b.select(inf_i, b.constant(INFINITY, i.dtype(), i.shape()), re(b, s));
    im_s = b.select(inf_i, i, im_s);
    // A NaN part (and no infinite imaginary part): NaN + NaN i, except C's csqrt(+inf +
    // NaN i) = inf + NaN i and csqrt(-inf + NaN i) = NaN + inf i.
    Value nan_part = op2(b, "and", op2(b, "or", is_nan(b, r), is_nan(b, i)), op1(b, "not", inf_i));
    Value nan = b.constant(NAN, i.dtype(), i.shape()), inf = b.constant(INFINITY, i.dtype(), i.shape());
    Value pos_inf_r = b.compare(r, inf, Cmp::EQ), neg_inf_r = b.compare(r, op1(b, "negate", inf), Cmp::EQ);
    re_s = b.select(nan_part, b.select(pos_inf_r, inf, nan), re_s);
    im_s = b.select(nan_part, b.select(neg_inf_r, inf, nan), im_s);
    return cplx(b, re_s, im_s);
  }
}
TPU_LOWER(c_sqrt, "complex:sqrt") { return omap(ctx, {0}, [](Builder& b, const Vs& x) { return csqrt(b, x[0]); }); }
// sin/cos of a purely imaginary z: the part multiplied by sin(0) is 0, also where
// cosh/sinh overflow (XLA: 0 * inf = NaN).
static Value csin(Builder& b, const Value& z) {
  Value s = op1(b, "sine", z), r = re(b, z), i = im(b, z);
  // On the real axis the imaginary part is cos(r) * (+-0), signed as CPU's (XLA: +0).
  Value real_axis = b.select(is_finite(b, r), mul(b, op1(b, "cosine", r), i), i);
  Value out = cplx(b, b.select(is_zero(b, r), r, re(b, s)), b.select(is_zero(b, i), real_axis, im(b, s)));
  // A non-finite r with an infinite i: NaN + inf i, as CPU (C's csin; XLA: NaN + NaN i).
  Value both = op2(b, "and", op1(b, "not", is_finite(b, r)), is_inf(b, i));
  return b.select(both, cplx(b, b.constant(NAN, r.dtype(), r.shape()), b.constant(INFINITY, r.dtype(), r.shape())), out);
}
static Value ccos(Builder& b, const Value& z) {
  Value c = op1(b, "cosine", z), r = re(b, z), i = im(b, z);
  // -sin(r) sinh(i) where r = +-0 (a NaN i keeps r's sign, as CPU) ...
  Value imag_axis = b.select(op2(b, "or", sign_bit(b, i), is_nan(b, i)), r, op1(b, "negate", r));
  // ... and where i = +-0: -sin(r) * (+-0), or +0 for a non-finite r, as CPU.
  Value real_axis = b.select(is_finite(b, r), op1(b, "negate", mul(b, op1(b, "sine", r), i)), zero_like(b, r));
  Value imag = b.select(is_zero(b, i), real_axis, im(b, c));
  Value out = cplx(b, re(b, c), b.select(is_zero(b, r), imag_axis, imag));
  // A non-finite r with an infinite i: inf + NaN i, as C's ccos (XLA: NaN + NaN i).
  Value both = op2(b, "and", op1(b, "not", is_finite(b, r)), is_inf(b, i));
  return b.select(both, cplx(b, b.constant(INFINITY, r.dtype(), r.shape()), b.constant(NAN, r.dtype(), r.shape())), out);
}
// i z and -i z, exactly (a product with i would mix the parts through 0 * inf).
static Value times_i(Builder& b, const Value& z) { return cplx(b, op1(b, "negate", im(b, z)), re(b, z)); }
static Value times_minus_i(Builder& b, const Value& z) { return cplx(b, im(b, z), op1(b, "negate", re(b, z))); }

TPU_LOWER(c_sin, "complex:sin") { return omap(ctx, {0}, [](Builder& b, const Vs& x) { return csin(b, x[0]); }); }
TPU_LOWER(c_cos, "complex:cos") { return omap(ctx, {0}, [](Builder& b, const Vs& x) { return ccos(b, x[0]); }); }
// sinh(z) = -i sin(iz) and cosh(z) = cos(iz) (C99's definitions), so they share sin's and
// cos's special values.
TPU_LOWER(c_sinh, "complex:sinh") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) { return times_minus_i(b, csin(b, times_i(b, x[0]))); });
}
TPU_LOWER(c_cosh, "complex:cosh") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) {
    Value c = ccos(b, times_i(b, x[0])), i = im(b, x[0]);
    // cosh(NaN +- 0i) = NaN +- 0i, as CPU (cos's rule would sign it as the real part).
    return cplx(b, re(b, c), b.select(op2(b, "and", is_nan(b, re(b, x[0])), is_zero(b, i)), i, im(b, c)));
  });
}

// tanh(r +- 0i) = tanh(r) +- 0i and tanh(+-0 + iy) = +-0 + i tan(y), signs kept as
// CPU's (XLA: +0, and NaN for an infinite y); tanh(+-inf + i inf) = +-1 + 0i signed as y.
// (r, i) is the argument and (tr, ti) XLA's result; returns the fixed parts.
static std::pair<Value, Value> tanh_signs(Builder& b, const Value& r, const Value& i, const Value& tr,
                                          const Value& ti) {
  Value imag = b.select(is_zero(b, i), i, ti);
  imag = b.select(op2(b, "and", is_inf(b, r), is_inf(b, i)), signed_zero(b, i), imag);
  Value r0 = is_zero(b, r);
  imag = b.select(op2(b, "and", r0, op1(b, "not", is_finite(b, i))), b.constant(NAN, i.dtype(), i.shape()), imag);
  return {b.select(r0, r, tr), imag};
}
TPU_LOWER(c_tanh, "complex:tanh") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) {
    Value t = op1(b, "tanh", x[0]);
    auto [real, imag] = tanh_signs(b, re(b, x[0]), im(b, x[0]), re(b, t), im(b, t));
    return cplx(b, real, imag);
  });
}
// tan(z) = -i tanh(iz): tanh's sign rules with the parts' roles swapped.
TPU_LOWER(c_tan, "complex:tan") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) {
    Value t = op1(b, "tan", x[0]);
    auto [imag, real] = tanh_signs(b, im(b, x[0]), re(b, x[0]), im(b, t), re(b, t));
    return cplx(b, real, imag);
  });
}

// expm1(x + iy) = (expm1(x) cos y - 2 sin(y/2)^2) + i e^x sin y: CPU's formula, so the
// parts are accurate near 0 and special values (e^inf * sin 0 = NaN) are CPU's.
TPU_LOWER(c_expm1, "complex:expm1") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) {
    Value r = re(b, x[0]), i = im(b, x[0]);
    Value h = op1(b, "sine", mul(b, i, b.constant(0.5, i.dtype(), i.shape())));
    Value real = sub(b, mul(b, op1(b, "exponential_minus_one", r), op1(b, "cosine", i)),
                     mul(b, b.constant(2, i.dtype(), i.shape()), mul(b, h, h)));
    return cplx(b, real, mul(b, op1(b, "exponential", r), op1(b, "sine", i)));
  });
}
// log1p(z) = log|1 + z| + i atan2(y, 1 + x), the magnitude's log taken as
// log1p(x (2 + x) + y^2) / 2 for |z| < 1/2 (accurate near 0; x itself where that
// underflows to 0) and as log(hypot(1 + x, y)) elsewhere, as CPU's kernel.
TPU_LOWER(c_log1p, "complex:log1p") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) {
    Value r = re(b, x[0]), i = im(b, x[0]);
    Value one = b.constant(1, r.dtype(), r.shape()), r1 = add(b, r, one);
    Value theta = op2(b, "atan2", i, r1);
    Value q = add(b, mul(b, r, add(b, r, b.constant(2, r.dtype(), r.shape()))), mul(b, i, i));
    Value near = mul(b, b.constant(0.5, r.dtype(), r.shape()), ew::log1p(b, q));
    near = b.select(is_zero(b, q), r, near);
    Value far = op1(b, "log", complex_magnitude(b, cplx(b, r1, i)));
    Value small = b.compare(complex_magnitude(b, x[0]), b.constant(0.5, r.dtype(), r.shape()), Cmp::LT);
    Value real = b.select(small, near, far);
    // A NaN part makes the real part NaN, as CPU (hypot would make it inf).
    Value nan_part = op2(b, "or", is_nan(b, r), is_nan(b, i));
    return cplx(b, b.select(nan_part, b.constant(NAN, r.dtype(), r.shape()), real), theta);
  });
}
// rsqrt(z) = 1 / sqrt(z) and sigmoid(z) = 1 / (1 + exp(-z)), as CPU computes them.
TPU_LOWER(c_rsqrt, "complex:rsqrt") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) {
    return crecip(b, csqrt(b, x[0]));
  });
}
TPU_LOWER(c_sigmoid, "complex:sigmoid") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) {
    return crecip(b, add(b, one_like(b, x[0]), cexp(b, op1(b, "negate", x[0]))));
  });
}
// log2(z) = log(z) / ln 2 and log10 likewise, exp2(z) = exp(z ln 2): a real factor on
// both parts (complex log and exp keep their special values).
static Value scale_parts(Builder& b, const Value& z, double k) {
  Value r = re(b, z);
  Value f = b.constant(k, r.dtype(), r.shape());
  return cplx(b, mul(b, r, f), mul(b, im(b, z), f));
}
TPU_LOWER(c_log2, "complex:log2") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) { return scale_parts(b, clog(b, x[0]), 1 / M_LN2); });
}
TPU_LOWER(c_log10, "complex:log10") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) { return scale_parts(b, clog(b, x[0]), 1 / M_LN10); });
}
TPU_LOWER(c_exp2, "complex:exp2") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) { return cexp(b, scale_parts(b, x[0], M_LN2)); });
}

TPU_LOWER(c_addcmul, "complex:addcmul") {  // self + value * t1 * t2, in PyTorch's order
  return omap(ctx, {0, 1, 2, 3}, [](Builder& b, const Vs& x) { return add(b, x[0], mul(b, mul(b, x[3], x[1]), x[2])); });
}
TPU_LOWER(c_addcdiv, "complex:addcdiv") {  // self + value * t1 / t2
  return omap(ctx, {0, 1, 2, 3}, [](Builder& b, const Vs& x) { return add(b, x[0], cdiv(b, mul(b, x[3], x[1]), x[2])); });
}
// lerp switches formulas at |w| = 0.5, as for real values.
TPU_LOWER(c_lerp, "complex:lerp.Scalar", "complex:lerp.Tensor") {
  return omap(ctx, {0, 1, 2}, [](Builder& b, const Vs& x) {
    Value d = sub(b, x[1], x[0]);
    Value lo = add(b, x[0], mul(b, x[2], d));
    Value hi = sub(b, x[1], mul(b, d, sub(b, one_like(b, d), x[2])));
    Value w = complex_magnitude(b, x[2]);
    return b.select(b.compare(w, b.constant(0.5, w.dtype(), w.shape()), Cmp::LT), lo, hi);
  });
}

// pow: exp(w log z) (C's cpow); a Scalar exponent of 0, 1, 2, 3, 0.5, -0.5, -1 or -2
// takes the exact path CPU's kernel takes for it (ones, the base, products, sqrt, rsqrt,
// reciprocals). The Scalar is a runtime operand: selects on its value.
TPU_LOWER(c_pow, "complex:pow.Tensor_Tensor", "complex:pow.Tensor_Scalar", "complex:pow.Scalar",
          "complex:pow_.Tensor") {
  bool scalar_exponent = ctx.is_tensor(0) && !ctx.is_tensor(1);
  return omap(ctx, {0, 1}, [scalar_exponent](Builder& b, const Vs& x) {
    Value z = x[0], w = x[1];
    Value p = cexp(b, mul(b, w, clog(b, z)));
    if (!scalar_exponent) return p;
    auto is = [&](double v) { return equal(b, w, b.constant(v, w.dtype(), w.shape())); };
    Value zz = mul(b, z, z);
    std::pair<double, Value> exact[] = {{0, one_like(b, z)}, {1, z}, {2, zz}, {3, mul(b, zz, z)},
                                        {0.5, csqrt(b, z)}, {-0.5, crecip(b, csqrt(b, z))},
                                        {-1, crecip(b, z)}, {-2, crecip(b, zz)}};
    for (auto& [v, r] : exact) p = b.select(is(v), r, p);
    return p;
  });
}

TPU_LOWER(c_abs, "complex:abs") {
  return imap(ctx, [](Builder& b, const Vs& x) { return cabs(b, x[0]); });
}
// sgn(z) = z / |z| with a real divisor (as CUDA and CPU's vector kernel; parts keep their
// zero signs), and 0 at 0. An infinite |z| gives NaN + NaN i, as CPU's scalar loop (the
// same on every instruction set; c10::complex's division there), where a part-by-part
// division would leave 0 / inf = 0 in one part.
TPU_LOWER(c_sgn, "complex:sgn") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) {
    Value z = x[0];
    Value r = cabs(b, z);
    Value q = cplx(b, div(b, re(b, z), r), div(b, im(b, z), r));  // part by part: keeps a zero's sign
    Value inf = b.compare(r, b.constant(std::numeric_limits<double>::infinity(), r.dtype(), r.shape()), Cmp::EQ);
    Value nan = b.constant(std::numeric_limits<double>::quiet_NaN(), r.dtype(), r.shape());
    q = b.select(inf, cplx(b, nan, nan), q);
    return b.select(b.compare(r, zero_like(b, r), Cmp::EQ), zero_like(b, z), q);
  });
}
TPU_LOWER(c_isnan, "complex:isnan") {
  return imap(ctx, [](Builder& b, const Vs& x) { return either(b, x[0], [&](const Value& p) { return is_nan(b, p); }); });
}
TPU_LOWER(c_isinf, "complex:isinf") {
  return imap(ctx, [](Builder& b, const Vs& x) { return either(b, x[0], [&](const Value& p) { return is_inf(b, p); }); });
}
// NaN -> nan, +-inf -> posinf/neginf (default: the part dtype's finite extremes), per part.
TPU_LOWER(c_nan_to_num, "complex:nan_to_num") {
  Builder& b = ctx.b;
  Value z = ctx.in(0);
  if (!is_complex(z.dtype())) throw Unsupported("complex rule with a real input");
  double big = part_of(z.dtype()) == DType::F64 ? 1.7976931348623157e308 : 3.4028234663852886e38;
  double nan = ctx.f_or(1, 0), pinf = ctx.f_or(2, big), ninf = ctx.f_or(3, -big);
  auto fix = [&](Value x) {
    auto k = [&](double v) { return b.constant(v, x.dtype(), x.shape()); };
    x = b.select(is_nan(b, x), k(nan), x);
    x = b.select(b.compare(x, k(INFINITY), Cmp::EQ), k(pinf), x);
    return b.select(b.compare(x, k(-INFINITY), Cmp::EQ), k(ninf), x);
  };
  return {b.convert(cplx(b, fix(re(b, z)), fix(im(b, z))), ctx.out(0).dtype)};
}

// The complex type two operands compare in (PyTorch's result_type, made complex).
static DType compare_type(Ctx& ctx) {
  Vs ts{Value{"", ctx.type_of(0)}};
  if (ctx.is_tensor(1)) ts.push_back(Value{"", ctx.type_of(1)});
  DType t = result_type(ts);
  return is_complex(t) ? t : complex_of(t);
}
TPU_LOWER(c_eq, "complex:eq.Tensor", "complex:eq.Scalar") {
  return cmap(ctx, {0, 1}, compare_type(ctx), [](Builder& b, const Vs& x) { return equal(b, x[0], x[1]); });
}
TPU_LOWER(c_ne, "complex:ne.Tensor", "complex:ne.Scalar") {
  return cmap(ctx, {0, 1}, compare_type(ctx), [](Builder& b, const Vs& x) { return op1(b, "not", equal(b, x[0], x[1])); });
}

// isclose: a == b, or a finite |a - b| <= atol + |rtol b| (equal_nan is refused for
// complex before lowering, as on CPU). rtol b scales each part, as CPU's product with
// (rtol, 0) does for the finite b that can matter.
TPU_LOWER(c_isclose, "complex:isclose") {
  Builder& b = ctx.b;
  DType t = ctx.type_of(0).dtype;
  Shape s = ctx.out(0).shape;
  Value x = coerce(b, ctx.in(0), t, s), y = coerce(b, ctx.in(1), t, s);
  double rtol = ctx.f(2), atol = ctx.f(3);
  Value close = equal(b, x, y);
  if (rtol == 0 && atol == 0) return {close};
  Value yr = re(b, y), yi = im(b, y);
  auto k = [&](double v) { return b.constant(v, yr.dtype(), s); };
  Value scaled = cplx(b, op2(b, "multiply", k(rtol), yr), op2(b, "multiply", k(rtol), yi));
  Value allowed = op2(b, "add", k(atol), cabs(b, scaled));
  Value actual = cabs(b, op2(b, "subtract", x, y));
  Value ok = op2(b, "and", b.compare(actual, k(INFINITY), Cmp::LT), b.compare(actual, allowed, Cmp::LE));
  return {op2(b, "or", close, ok)};
}

// beta * self + alpha * (x . y); beta == 0 ignores self (NaN included), as PyTorch.
static Value c_addmm_like(Ctx& ctx, const std::vector<int64_t>& bx, const std::vector<int64_t>& by,
                          const std::vector<int64_t>& cx, const std::vector<int64_t>& cy) {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  if (!is_complex(o.dtype)) throw Unsupported("complex rule with a real output");
  Value p = b.dot_general(b.convert(ctx.in(1), o.dtype), b.convert(ctx.in(2), o.dtype), bx, by, cx, cy, o.dtype);
  Value self = coerce(b, ctx.in(0), o.dtype, o.shape);
  Value beta = broadcast_to(b, ctx.scalar(3, o.dtype), o.shape);
  Value alpha = broadcast_to(b, ctx.scalar(4, o.dtype), o.shape);
  Value zero = zero_like(b, self);
  Value scaled = b.select(equal(b, beta, zero), zero, mul(b, beta, self));
  return add(b, scaled, mul(b, alpha, p));
}
TPU_LOWER(c_addmm, "complex:addmm") { return {c_addmm_like(ctx, {}, {}, {1}, {0})}; }
TPU_LOWER(c_addmv, "complex:addmv") { return {c_addmm_like(ctx, {}, {}, {1}, {0})}; }
TPU_LOWER(c_baddbmm, "complex:baddbmm") { return {c_addmm_like(ctx, {0}, {0}, {2}, {1})}; }
TPU_LOWER(c_addbmm, "complex:addbmm") { return {c_addmm_like(ctx, {}, {}, {0, 2}, {0, 1})}; }

}  // namespace tpu::lowering
