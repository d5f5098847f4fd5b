// Factories that compute their values on the device.
#include "lowering/factory.h"

namespace tpu::lowering {

using ir::Cmp;

// arange: start + i * step. The length comes from PyTorch's meta kernel (the out
// tensor's size); start and step are runtime operands, so ranges share a program.
TPU_LOWER(arange_start_out, "arange.start_out") {
  Type t = ctx.out(0);
  DType compute = is_float(t.dtype) ? (t.dtype == DType::F64 ? DType::F64 : DType::F32) : DType::I64;
  Value start = ctx.scalar(0, compute), step = ctx.scalar(2, compute);
  Value i = ctx.b.iota(Type{compute, t.shape}, 0);
  Value v = add(ctx.b, broadcast_to(ctx.b, start, t.shape), mul(ctx.b, i, broadcast_to(ctx.b, step, t.shape)));
  return {ctx.b.convert(v, t.dtype)};
}

Value linspace_values(Builder& b, const Value& start_in, const Value& end_in, int64_t steps, DType t) {
  bool narrow = t == DType::F16 || t == DType::BF16;
  // Scalar::to<t>: a convert (integers truncate); bf16/f16 through float, kept in f32.
  auto in_t = [&](const Value& v) {
    return narrow ? reduce_precision(b, b.convert(v, DType::F32), t) : b.convert(v, t);
  };
  Value start = in_t(start_in), end = in_t(end_in);
  if (steps == 1) return b.convert(b.reshape(start, {1}), t);
  Shape s{steps};
  Value idx = b.iota(Type{DType::F64, s}, 0);
  Value rev = sub(b, b.constant(double(steps - 1), DType::F64, s), idx);
  Value first_half = b.compare(idx, b.constant(double(steps / 2), DType::F64, s), Cmp::LT);
  if (narrow) {
    // c10::Half/BFloat16 arithmetic: every op in float rounded to the dtype, and
    // `step * idx` rounds idx (and `/ (steps - 1)` the count) to the dtype first.
    auto r = [&](const Value& v) { return reduce_precision(b, v, t); };
    Value step = r(div(b, r(sub(b, end, start)), r(b.number(double(steps - 1), DType::F32))));
    Value st = broadcast_to(b, step, s);
    Value up = r(add(b, broadcast_to(b, start, s), r(mul(b, st, r(b.convert(idx, DType::F32))))));
    Value down = r(sub(b, broadcast_to(b, end, s), r(mul(b, st, r(b.convert(rev, DType::F32))))));
    return b.convert(b.select(first_half, up, down), t);
  }
  // Integers step in double; f32 sums its exact f64 product once rounded.
  DType m = is_integral(t) ? DType::F64 : t, w = t == DType::F32 ? DType::F64 : m;
  Value step = div_count(b, sub(b, b.convert(end, m), b.convert(start, m)), double(steps - 1));
  Value st = broadcast_to(b, b.convert(step, w), s);
  Value up = add(b, broadcast_to(b, b.convert(start, w), s), mul(b, st, b.convert(idx, w)));
  Value down = sub(b, broadcast_to(b, b.convert(end, w), s), mul(b, st, b.convert(rev, w)));
  return b.convert(b.select(first_half, up, down), t);
}

static Value part(Builder& b, const Value& z, bool imag) {
  return b.raw(imag ? "stablehlo.imag" : "stablehlo.real", {z}, "", Type{z.dtype() == DType::C128 ? DType::F64 : DType::F32, z.shape()});
}

// Scalar argument i as CPU reads it for dtype t: an integer Scalar exactly (i64), a
// float one as f64 (f32 where the call has no f64 operand, as every float Scalar).
static Value range_scalar(Ctx& ctx, int i, DType t) {
  if (is_complex(t)) return ctx.scalar(i, t);
  return ctx.scalar(i, ctx.scalar_is_float(i) ? DType::F64 : DType::I64);
}

// linspace.out: CPU's kernel (RangeFactoriesKernel.cpp), start and end runtime operands.
// Complex values are two real ranges (c10::complex divides and scales each part).
TPU_LOWER(linspace_out, "linspace.out") {
  Type o = ctx.out(0);
  int64_t steps = o.numel();
  if (o.dtype == DType::Bool) throw DtypeNotImplemented("linspace_cpu");
  if (steps == 0) return {ctx.b.constant(0, o.dtype, o.shape)};
  Builder& b = ctx.b;
  Value start = range_scalar(ctx, 0, o.dtype), end = range_scalar(ctx, 1, o.dtype);
  if (!is_complex(o.dtype)) return {b.reshape(linspace_values(b, start, end, steps, o.dtype), o.shape)};
  DType pt = o.dtype == DType::C128 ? DType::F64 : DType::F32;
  Value re = linspace_values(b, part(b, start, false), part(b, end, false), steps, pt);
  Value im = linspace_values(b, part(b, start, true), part(b, end, true), steps, pt);
  return {b.reshape(b.raw("stablehlo.complex", {re, im}, "", Type{o.dtype, re.shape()}), o.shape)};
}

// logspace.out (RangeFactories.cpp): base ** (start + step * i) in double, counting down
// from end in the second half, with start and end converted to the dtype first and
// step = double(end - start) / (steps - 1), the difference taken in the dtype. One step
// gives base ** start, start unconverted. Complex values take the host's kernel.
TPU_LOWER(logspace_out, "logspace.out") {
  Type o = ctx.out(0);
  int64_t steps = o.numel();
  if (is_complex(o.dtype)) throw Unsupported("complex logspace");
  if (o.dtype == DType::Bool) throw DtypeNotImplemented("logspace_cpu");
  Builder& b = ctx.b;
  if (steps == 0) return {b.constant(0, o.dtype, o.shape)};
  DType t = o.dtype, f = DType::F64;
  Value base = b.number(ctx.f(3), f);  // a literal base would let XLA rewrite the power
  Value start_in = range_scalar(ctx, 0, t), end_in = range_scalar(ctx, 1, t);
  if (steps == 1) return {b.convert(b.reshape(b.binary("stablehlo.power", base, b.convert(start_in, f)), {1}), t)};
  bool narrow = t == DType::F16 || t == DType::BF16;
  auto in_t = [&](const Value& v) {  // Scalar::to<t>, kept in f32 for bf16/f16
    return narrow ? reduce_precision(b, b.convert(v, DType::F32), t) : b.convert(v, t);
  };
  Value start = in_t(start_in), end = in_t(end_in);
  // end - start in the dtype (C++ promotes small integers to int: no wrap).
  Value diff = is_integral(t) ? sub(b, b.convert(end, DType::I64), b.convert(start, DType::I64)) : sub(b, end, start);
  if (narrow) diff = reduce_precision(b, diff, t);
  Value step = div_count(b, b.convert(diff, f), double(steps - 1));
  Shape s{steps};
  Value idx = b.iota(Type{f, s}, 0);
  Value rev = sub(b, b.constant(double(steps - 1), f, s), idx);
  Value st = broadcast_to(b, step, s);
  // Each product rounded (CPU builds this file without fma contraction).
  Value up = add(b, broadcast_to(b, b.convert(start, f), s), mul_uncontracted(b, st, idx));
  Value down = sub(b, broadcast_to(b, b.convert(end, f), s), mul_uncontracted(b, st, rev));
  Value e = b.select(b.compare(idx, b.constant(double(steps / 2), f, s), Cmp::LT), up, down);
  Value v = b.binary("stablehlo.power", broadcast_to(b, base, s), e);
  if (narrow) v = b.convert(v, DType::F32);  // double -> float -> half, as C++ stores it
  return {b.reshape(b.convert(v, t), o.shape)};
}

}  // namespace tpu::lowering
