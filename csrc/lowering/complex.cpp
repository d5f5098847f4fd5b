// Complex numbers. Ops that only exist for complex values (complex, polar, angle,
// conj_physical), and complex overrides: rules registered as "complex:<op>" that the
// backend uses instead of the op's own rule when a call involves a complex tensor or
// output (the general elementwise rules compute in real math types only).
// StableHLO's arithmetic and transcendental ops accept complex operands; comparisons
// and sign-like ops are spelled out on the real and imaginary parts.
#include <cmath>
#include <functional>

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
  Type o = ctx.out(0);
  DType p = part_of(o.dtype);
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
TPU_LOWER(c_div, "complex:div.Tensor", "complex:div.Scalar") {
  return omap(ctx, {0, 1}, [](Builder& b, const Vs& x) { return div(b, x[0], x[1]); });
}
TPU_LOWER(c_neg, "complex:neg") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) { return op1(b, "negate", x[0]); });
}
TPU_LOWER(c_reciprocal, "complex:reciprocal") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) { return div(b, b.constant(1, x[0].dtype(), x[0].shape()), x[0]); });
}

// One StableHLO op that takes complex operands.
#define TPU_COMPLEX_UNARY(fn, aten, hlo) \
  TPU_LOWER(fn, "complex:" aten) { return omap(ctx, {0}, [](Builder& b, const Vs& x) { return op1(b, hlo, x[0]); }); }
TPU_COMPLEX_UNARY(c_exp, "exp", "exponential")
TPU_COMPLEX_UNARY(c_log, "log", "log")
TPU_COMPLEX_UNARY(c_sqrt, "sqrt", "sqrt")
TPU_COMPLEX_UNARY(c_sin, "sin", "sine")
TPU_COMPLEX_UNARY(c_cos, "cos", "cosine")
TPU_COMPLEX_UNARY(c_tanh, "tanh", "tanh")
#undef TPU_COMPLEX_UNARY

TPU_LOWER(c_abs, "complex:abs") {
  return imap(ctx, [](Builder& b, const Vs& x) { return b.raw("stablehlo.abs", {x[0]}, "", re(b, x[0]).type); });
}
// sgn(z) = z / |z|, and 0 at 0.
TPU_LOWER(c_sgn, "complex:sgn") {
  return omap(ctx, {0}, [](Builder& b, const Vs& x) {
    Value z = x[0];
    Value r = b.raw("stablehlo.abs", {z}, "", re(b, z).type);
    Value q = div(b, z, cplx(b, r, zero_like(b, r)));
    return b.select(b.compare(r, zero_like(b, r), Cmp::EQ), zero_like(b, z), q);
  });
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
