// Fake quantization (torch.ao QAT): values rounded onto an affine integer grid and back,
// with the mask of those that fell inside [quant_min, quant_max], and the learnable
// variants' gradients for scale and zero point. Every step follows CPU's kernels'
// arithmetic, types included, so results match them bit for bit:
//   per tensor:  q = float(zp) + nearbyint(x * (1.0f / scale))   (in x's precision: f32 for
//                f16/bf16, f64 for f64), mask = qmin <= q <= qmax, out = float(clamp(q) - zp) * scale;
//   per channel: the same with int32 zero points, q converted to int64 before the mask; with
//                float zero points q = lrintf(zp + x * inv_scale) and the result in double.
// Conversions that are undefined in C++ (NaN or huge floats to int64) give what x86 gives,
// INT64_MIN. The shapes and argument checks are the Meta kernels' (torch_tpu/_meta.py):
// where they refuse a call, CPU's own error is raised. Checks of values (a zero point
// outside the range) are device checks with CPU's message.
#include <cmath>
#include <cstdint>
#include <limits>

#include "lowering/compensated_sum.h"
#include "lowering/helpers.h"

namespace tpu::lowering {
namespace {

using ir::Cmp;

constexpr double kInt64Min = -9223372036854775808.0;  // -2^63
const char* const kZeroPointRange = "RuntimeError: `zero_point` must be between `quant_min` and `quant_max`.";

Value un(Builder& b, const char* op, const Value& x) { return b.unary(op, x); }
Value kon(Builder& b, double v, DType t, const Shape& s) { return b.constant(v, t, s); }
Value cmp(Builder& b, const Value& x, const Value& y, Cmp c) { return b.compare(x, y, c); }
Value band(Builder& b, const Value& x, const Value& y) { return b.binary("stablehlo.and", x, y); }
Value bnot(Builder& b, const Value& x) { return b.unary("stablehlo.not", x); }
Value maxv(Builder& b, const Value& x, const Value& y) { return b.binary("stablehlo.maximum", x, y); }
Value minv(Builder& b, const Value& x, const Value& y) { return b.binary("stablehlo.minimum", x, y); }
Value round_even(Builder& b, const Value& x) { return un(b, "stablehlo.round_nearest_even", x); }
Value isnan(Builder& b, const Value& x) { return cmp(b, x, x, Cmp::NE); }

// The first element of a tensor as a scalar of dtype t (CPU's `t[0].item<...>()`).
Value first(Builder& b, const Value& t, DType to) {
  Value flat = b.reshape(t, {t.type.numel()});
  return b.convert(b.reshape(b.slice(flat, {0}, {1}, {1}), {}), to);
}

// static_cast<int64_t>(v) of a float value as x86 computes it: truncation, and INT64_MIN
// (the "integer indefinite") for NaN and values outside the int64 range.
Value to_int64(Builder& b, const Value& v) {
  const Shape& s = v.shape();
  Value ok = cmp(b, un(b, "stablehlo.abs", v), kon(b, 9223372036854775808.0, v.dtype(), s), Cmp::LT);
  Value safe = b.select(ok, v, kon(b, 0, v.dtype(), s));
  return b.select(ok, b.convert(safe, DType::I64), kon(b, kInt64Min, DType::I64, s));
}

// min(max(q, qmin), qmax) of int64 q.
Value clamp_int(Builder& b, const Value& q, int64_t qmin, int64_t qmax) {
  const Shape& s = q.shape();
  return minv(b, maxv(b, q, kon(b, double(qmin), DType::I64, s)), kon(b, double(qmax), DType::I64, s));
}

// The math type of CPU's `x * inv_scale` for an input of dtype t: float, or double for double.
DType work_type(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// CPU's per-tensor kernel. x: the input; sc, inv: f32 scalars (scale and 1.0f / scale);
// zp: an i64 scalar; on: a bool scalar (fake quantization enabled), or none.
std::vector<Value> per_tensor(Builder& b, const Value& x, const Value& sc, const Value& inv, const Value& zp,
                              int64_t qmin, int64_t qmax, const Value* on) {
  const Shape& s = x.shape();
  DType w = work_type(x.dtype());
  auto bc = [&](const Value& v, DType t) { return broadcast_to(b, b.convert(v, t), s); };
  Value q = b.binary("stablehlo.add", bc(zp, w), round_even(b, mul(b, b.convert(x, w), bc(inv, w))));
  // The mask compares q with the bounds converted to q's type.
  double lo = w == DType::F32 ? double(float(qmin)) : double(qmin);
  double hi = w == DType::F32 ? double(float(qmax)) : double(qmax);
  Value mask = band(b, cmp(b, kon(b, lo, w, s), q, Cmp::LE), cmp(b, q, kon(b, hi, w, s), Cmp::LE));
  // fmin(fmax(q, qmin), qmax) in double: NaN gives qmin; the bounds hold q in int64 range.
  Value qc = b.select(isnan(b, q), kon(b, lo, w, s), q);
  qc = minv(b, maxv(b, qc, kon(b, lo, w, s)), kon(b, hi, w, s));
  Value qi = clamp_int(b, b.convert(qc, DType::I64), qmin, qmax);
  Value out = mul(b, b.convert(sub(b, qi, bc(zp, DType::I64)), DType::F32), bc(sc, DType::F32));
  out = b.convert(out, x.dtype());
  if (on) {
    Value en = broadcast_to(b, *on, s);
    out = b.select(en, out, x);
    mask = b.select(en, mask, kon(b, 1, DType::Bool, s));
  }
  return {out, mask};
}

// CPU's per-channel kernel; scale and zp are [C] along `axis` of x; zp int32 (or int64,
// as the learnable op's rounded one) or f32/f16.
std::vector<Value> per_channel(Builder& b, const Value& x, const Value& scale, const Value& zp, int64_t axis,
                               int64_t qmin, int64_t qmax) {
  const Shape& s = x.shape();
  DType t = x.dtype(), w = work_type(t);
  auto along = [&](const Value& v, DType to) { return b.broadcast_in_dim(b.convert(v, to), s, {axis}); };
  Value sc = along(scale, DType::F32);
  Value inv = div(b, kon(b, 1, DType::F32, s), sc);
  Value xi = mul(b, b.convert(x, w), b.convert(inv, w));  // self * inv_scale
  bool int_zp = !is_float(zp.dtype());
  Value qi;
  if (int_zp) {
    // static_cast<int64_t>(zero_point + nearbyint(self * inv_scale))
    qi = to_int64(b, add(b, along(zp, w), round_even(b, xi)));
  } else {
    // lrintf(zero_point + self * inv_scale): the sum as float, rounded to even
    Value v = b.convert(add(b, along(zp, w), xi), DType::F32);
    qi = to_int64(b, round_even(b, v));
  }
  Value mask = band(b, cmp(b, kon(b, double(qmin), DType::I64, s), qi, Cmp::LE),
                    cmp(b, qi, kon(b, double(qmax), DType::I64, s), Cmp::LE));
  Value qc = clamp_int(b, qi, qmin, qmax);
  Value out;
  if (int_zp) {
    // (clamped - zero_point) * scale in double: exact differences times an f32 scale,
    // rounded once, as the f32 product is (f64 inputs compute in f64).
    DType m = t == DType::F64 ? DType::F64 : DType::F32;
    out = mul(b, b.convert(sub(b, qc, along(zp, DType::I64)), m), b.convert(sc, m));
  } else {
    // A fractional zero point: the product is rounded to double, then to float.
    Value d = sub(b, b.convert(qc, DType::F64), along(zp, DType::F64));
    out = mul(b, d, b.convert(sc, DType::F64));
    if (t != DType::F64) out = b.convert(out, DType::F32);
  }
  return {b.convert(out, t), mask};
}

// The learnable ops' gradients, elementwise, in f32: CPU's grad kernels. zpf: the zero
// point as added before rounding (f32), zpi: as subtracted after (for the per-tensor
// kernel an int64, for the per-channel one the same f32), ds_small / ds_big: the scale
// gradients' factors below and above the range.
struct LearnGrads {
  Value dx, dscale, dzp;
};
LearnGrads learn_grads(Builder& b, const Value& dy, const Value& x, const Value& sc, const Value& inv,
                       const Value& zpf, const Value& zp_sub, const Value& ds_small, const Value& ds_big,
                       int64_t qmin, int64_t qmax, double grad_factor) {
  const Shape& s = x.shape();
  const DType f = DType::F32;
  Value xqi = to_int64(b, round_even(b, add(b, zpf, mul(b, x, inv))));
  Value below = cmp(b, xqi, kon(b, double(qmin), DType::I64, s), Cmp::LT);
  Value above = cmp(b, xqi, kon(b, double(qmax), DType::I64, s), Cmp::GT);
  Value inside = band(b, bnot(b, below), bnot(b, above));
  Value dx = mul(b, dy, b.convert(inside, f));
  Value qc = clamp_int(b, xqi, qmin, qmax);
  // (clamped - zero_point) * scale: an int64 zero point subtracts exactly, then converts;
  // a float one subtracts from the converted clamp.
  Value diff = is_float(zp_sub.dtype()) ? sub(b, b.convert(qc, f), zp_sub) : b.convert(sub(b, qc, zp_sub), f);
  Value xfq = mul(b, diff, sc);
  Value gf = kon(b, double(float(grad_factor)), f, s);
  Value zero = kon(b, 0, f, s);
  Value dzp_out = mul(b, mul(b, mul(b, dy, kon(b, -1, f, s)), sc), gf);
  Value ds_out = mul(b, b.select(below, mul(b, dy, ds_small), mul(b, dy, ds_big)), gf);
  Value ds_in = mul(b, mul(b, mul(b, dy, sub(b, xfq, x)), inv), gf);
  return {dx, b.select(inside, ds_in, ds_out), b.select(inside, zero, dzp_out)};
}

std::vector<int64_t> all_but(int64_t rank, int64_t axis) {
  std::vector<int64_t> d;
  for (int64_t i = 0; i < rank; ++i)
    if (i != axis) d.push_back(i);
  return d;
}

}  // namespace

// fake_quantize_per_tensor_affine_cachemask(self, float scale, int zero_point, quant_min, quant_max)
TPU_LOWER(fq_per_tensor_cachemask, "fake_quantize_per_tensor_affine_cachemask") {
  Builder& b = ctx.b;
  float sc = static_cast<float>(ctx.f(1));
  float inv = 1.0f / sc;
  Value scv = b.constant(double(sc), DType::F32), invv = b.constant(double(inv), DType::F32);
  Value zp = b.constant(double(ctx.i(2)), DType::I64);
  return per_tensor(b, ctx.in(0), scv, invv, zp, ctx.i(3), ctx.i(4), nullptr);
}

// _fake_quantize_per_tensor_affine_cachemask_tensor_qparams(self, scale, zero_point,
// fake_quant_enabled, quant_min, quant_max): CPU reads scale.item().toFloat(),
// zero_point.item().toInt() (a truncation) and fake_quant_enabled.item().toInt() != 0.
TPU_LOWER(fq_per_tensor_cachemask_tq, "_fake_quantize_per_tensor_affine_cachemask_tensor_qparams") {
  Builder& b = ctx.b;
  Value sc = first(b, ctx.in(1), DType::F32);
  Value inv = div(b, b.constant(1, DType::F32), sc);
  Value zp = first(b, ctx.in(2), DType::I64);
  Value on = cmp(b, first(b, ctx.in(3), DType::I64), b.constant(0, DType::I64), Cmp::NE);
  return per_tensor(b, ctx.in(0), sc, inv, zp, ctx.i(4), ctx.i(5), &on);
}

// fake_quantize_per_channel_affine_cachemask(self, scale, zero_point, axis, quant_min, quant_max)
TPU_LOWER(fq_per_channel_cachemask, "fake_quantize_per_channel_affine_cachemask") {
  Builder& b = ctx.b;
  Value zp = ctx.in(2);
  int64_t qmin = ctx.i(4), qmax = ctx.i(5);
  if (!is_float(zp.dtype()) && zp.type.numel() > 0)  // CPU checks int zero points' values
    ctx.check(all_true(b, band(b, cmp(b, zp, kon(b, double(qmin), zp.dtype(), zp.shape()), Cmp::GE),
                               cmp(b, zp, kon(b, double(qmax), zp.dtype(), zp.shape()), Cmp::LE))),
              kZeroPointRange);
  return per_channel(b, ctx.in(0), ctx.in(1), zp, ctx.i(3), qmin, qmax);
}

// _fake_quantize_learnable_per_tensor_affine(self, scale, zero_point, quant_min, quant_max,
// grad_factor): scale[0] as float; the zero point nearbyint(zero_point[0]) clamped to the
// range, then the per-tensor kernel.
TPU_LOWER(fq_learnable_per_tensor, "_fake_quantize_learnable_per_tensor_affine") {
  Builder& b = ctx.b;
  int64_t qmin = ctx.i(3), qmax = ctx.i(4);
  Value sc = first(b, ctx.in(1), DType::F32);
  Value inv = div(b, b.constant(1, DType::F32), sc);
  Value z = round_even(b, first(b, ctx.in(2), DType::F32));
  ctx.check(bnot(b, isnan(b, z)), kZeroPointRange);
  z = minv(b, maxv(b, z, b.constant(double(float(qmin)), DType::F32)), b.constant(double(float(qmax)), DType::F32));
  Value zp = to_int64(b, z);
  return {per_tensor(b, ctx.in(0), sc, inv, zp, qmin, qmax, nullptr)[0]};
}

// _fake_quantize_learnable_per_tensor_affine_backward(grad, self, scale, zero_point,
// quant_min, quant_max, grad_factor) -> (dX, dScale [1], dZeroPoint [1]). The zero point
// here is trunc(clamp(zero_point[0] + 0.5f)); the gradients of scale and zero point are
// summed over every element.
TPU_LOWER(fq_learnable_per_tensor_backward, "_fake_quantize_learnable_per_tensor_affine_backward") {
  Builder& b = ctx.b;
  Value dy = ctx.in(0), x = ctx.in(1);
  int64_t qmin = ctx.i(4), qmax = ctx.i(5);
  if (x.type.numel() == 0) return {x, ctx.in(2), ctx.in(3)};  // CPU returns its inputs
  const Shape& s = x.shape();
  const DType f = DType::F32;
  Value sc = first(b, ctx.in(2), f);
  Value inv = div(b, b.constant(1, f), sc);
  Value z = add(b, first(b, ctx.in(3), f), b.constant(0.5, f));
  ctx.check(bnot(b, isnan(b, z)), kZeroPointRange);
  z = minv(b, maxv(b, z, b.constant(double(float(qmin)), f)), b.constant(double(float(qmax)), f));
  Value zp = to_int64(b, z);
  Value zpb = broadcast_to(b, zp, s);
  Value ds_small = broadcast_to(b, b.convert(sub(b, b.constant(double(qmin), DType::I64), zp), f), s);
  Value ds_big = broadcast_to(b, b.convert(sub(b, b.constant(double(qmax), DType::I64), zp), f), s);
  LearnGrads g = learn_grads(b, b.convert(dy, f), b.convert(x, f), broadcast_to(b, sc, s), broadcast_to(b, inv, s),
                             b.convert(zpb, f), zpb, ds_small, ds_big, qmin, qmax, ctx.f(6));
  std::vector<int64_t> dims = all_but(x.rank(), -1);
  Value ds = b.reshape(compensated_sum(b, g.dscale, dims), {1});
  Value dz = b.reshape(compensated_sum(b, g.dzp, dims), {1});
  return {g.dx, ds, dz};
}

// torch.round(zero_point).clamp(quant_min, quant_max): NaN stays NaN.
static Value rounded_zero_point(Builder& b, const Value& zp, int64_t qmin, int64_t qmax) {
  if (!is_float(zp.dtype())) return zp;
  Value r = round_even(b, zp);
  const Shape& s = zp.shape();
  Value lo = kon(b, double(qmin), zp.dtype(), s), hi = kon(b, double(qmax), zp.dtype(), s);
  Value c = minv(b, maxv(b, r, lo), hi);
  return b.select(isnan(b, r), r, c);
}

// _fake_quantize_learnable_per_channel_affine(self, scale, zero_point, axis, quant_min,
// quant_max, grad_factor): the zero points rounded, clamped and made int32, then the
// per-channel kernel.
TPU_LOWER(fq_learnable_per_channel, "_fake_quantize_learnable_per_channel_affine") {
  Builder& b = ctx.b;
  int64_t qmin = ctx.i(4), qmax = ctx.i(5);
  Value zr = rounded_zero_point(b, ctx.in(2), qmin, qmax);
  if (zr.type.numel() > 0 && is_float(zr.dtype())) ctx.check(all_true(b, bnot(b, isnan(b, zr))), kZeroPointRange);
  Value zp = b.convert(zr, DType::I32);
  return {per_channel(b, ctx.in(0), ctx.in(1), zp, ctx.i(3), qmin, qmax)[0]};
}

// _fake_quantize_learnable_per_channel_affine_backward(grad, self, scale, zero_point, axis,
// quant_min, quant_max, grad_factor) -> (dX, dScale [C], dZeroPoint [C]), all f32 (bf16
// arguments are converted first); per channel, summed over the other dims.
TPU_LOWER(fq_learnable_per_channel_backward, "_fake_quantize_learnable_per_channel_affine_backward") {
  Builder& b = ctx.b;
  Value dy = ctx.in(0), x = ctx.in(1);
  int64_t axis = ctx.i(4), qmin = ctx.i(5), qmax = ctx.i(6);
  if (x.type.numel() == 0) return {x, ctx.in(2), ctx.in(3)};  // CPU returns its inputs
  const Shape& s = x.shape();
  const DType f = DType::F32;
  Value zr = rounded_zero_point(b, b.convert(ctx.in(3), f), qmin, qmax);
  ctx.check(all_true(b, bnot(b, isnan(b, zr))), kZeroPointRange);
  auto along = [&](const Value& v) { return b.broadcast_in_dim(b.convert(v, f), s, {axis}); };
  Value sc = along(ctx.in(2)), zp = along(zr);
  Value inv = div(b, kon(b, 1, f, s), sc);
  Value ds_small = sub(b, kon(b, double(float(qmin)), f, s), zp);
  Value ds_big = sub(b, kon(b, double(float(qmax)), f, s), zp);
  LearnGrads g = learn_grads(b, b.convert(dy, f), b.convert(x, f), sc, inv, zp, zp, ds_small, ds_big, qmin, qmax,
                             ctx.f(7));
  std::vector<int64_t> dims = all_but(x.rank(), axis);
  return {g.dx, compensated_sum(b, g.dscale, dims), compensated_sum(b, g.dzp, dims)};
}


// ---- the fused moving-average observer and fake quantization (torch.ao's
// FusedMovingAvgObsFakeQuantize): the functional form of _fused_moving_avg_obs_fq_helper,
// whose in-place op (backend/glue_ops.cpp) writes this rule's last four results back.
namespace {

// fbgemm::ChooseQuantizationParams (x86 builds of PyTorch use fbgemm's), elementwise over
// the running minima and maxima (f32): {scale (f32), zero point (i32)}. Every step is
// CPU's arithmetic in CPU's types: float steps in f32; the scale's quotient and the zero
// point, double arithmetic CPU rounds in double, in f64.
std::pair<Value, Value> choose_qparams(Builder& b, Value mn, Value mx, int64_t qmin, int64_t qmax, bool symmetric) {
  const Shape& s = mn.shape();
  const DType f = DType::F32, d = DType::F64;
  auto fk = [&](double v) { return kon(b, v, f, s); };
  auto dk = [&](double v) { return kon(b, v, d, s); };
  auto straddles = [&](const Value& lo, const Value& hi) {  // min < 0 && max > 0
    return band(b, cmp(b, lo, fk(0), Cmp::LT), cmp(b, hi, fk(0), Cmp::GT));
  };
  // XLA turns x / c of a constant c into x * (1 / c), which rounds differently (CPU
  // divides), and removes optimization barriers before its last simplifications: the
  // divisor is made a value, c, or 1 where x is NaN (the quotient NaN either way).
  auto divide_by = [&](const Value& x, double c) {
    DType t = x.dtype();
    return div(b, x, b.select(isnan(b, x), kon(b, 1, t, s), kon(b, c, t, s)));
  };
  const int64_t range = qmax - qmin;  // below 2^24 (the Meta kernel): exact as float
  if (symmetric) {
    // max_scale = max(fabs(min / sym_qmin), fabs(max / sym_qmax)) in float; then
    // float(max_scale * sym_q) in double, an exact product (24 by at most 24 bits), so one
    // f32 rounding of it, as the f32 product is.
    const int64_t sym_qmin = -(range / 2 + 1), sym_qmax = range / 2;
    Value a = un(b, "stablehlo.abs", divide_by(mn, double(sym_qmin)));
    Value c = un(b, "stablehlo.abs", divide_by(mx, double(sym_qmax)));
    Value m = b.select(cmp(b, a, c, Cmp::LT), c, a);  // std::max(a, c)
    Value st = straddles(mn, mx);
    mn = b.select(st, mul(b, m, fk(double(sym_qmin))), mn);
    mx = b.select(st, mul(b, m, fk(double(sym_qmax))), mx);
  }
  // std::min(min, 0.f), std::max(max, 0.f): NaN stays, as their comparisons leave it.
  mn = b.select(cmp(b, fk(0), mn, Cmp::LT), fk(0), mn);
  mx = b.select(cmp(b, mx, fk(0), Cmp::LT), fk(0), mx);
  // float scale = (double(max) - min) / (qmax - qmin): a double quotient rounded to float.
  Value sc = b.convert(divide_by(sub(b, b.convert(mx, d), b.convert(mn, d)), double(range)), f);
  // 0, or so small that 1.0f / scale overflows: 0.1.
  Value inv_inf = cmp(b, un(b, "stablehlo.abs", div(b, fk(1), sc)), fk(std::numeric_limits<double>::infinity()),
                      Cmp::EQ);
  sc = b.select(b.binary("stablehlo.or", cmp(b, sc, fk(0), Cmp::EQ), inv_inf), fk(double(0.1f)), sc);
  // Below SMALL_SCALE_THRESHOLD: the threshold, and min / max widened to it (float math).
  const float small = 6.1e-5f;
  Value cut = cmp(b, sc, fk(double(small)), Cmp::LT);
  Value amp = div(b, fk(double(small)), sc);
  Value mn_zero = cmp(b, mn, fk(0), Cmp::EQ), mx_zero = cmp(b, mx, fk(0), Cmp::EQ);
  const double span = double(small * static_cast<float>(range));
  Value mn_cut = b.select(mn_zero, mn, b.select(mx_zero, fk(-span), mul(b, mn, amp)));
  Value mx_cut = b.select(mn_zero, fk(span), b.select(mx_zero, mx, mul(b, mx, amp)));
  mn = b.select(cut, mn_cut, mn);
  mx = b.select(cut, mx_cut, mx);
  sc = b.select(cut, fk(double(small)), sc);
  // The zero point, in double: from the end whose terms are smaller.
  Value sd = b.convert(sc, d);
  Value q_lo = div(b, b.convert(mn, d), sd), q_hi = div(b, b.convert(mx, d), sd);
  Value from_min = sub(b, dk(double(qmin)), q_lo), from_max = sub(b, dk(double(qmax)), q_hi);
  Value err_min = add(b, dk(double(std::abs(qmin))), un(b, "stablehlo.abs", q_lo));
  Value err_max = add(b, dk(double(std::abs(qmax))), un(b, "stablehlo.abs", q_hi));
  Value z = b.select(cmp(b, err_min, err_max, Cmp::LT), from_min, from_max);
  if (symmetric) z = b.select(straddles(mn, mx), dk(double(qmin + qmax) / 2), z);
  // Nudged onto [qmin, qmax]: nearbyint inside; NaN converts to int32 as x86 does, INT32_MIN.
  Value below = cmp(b, z, dk(double(qmin)), Cmp::LT), above = cmp(b, z, dk(double(qmax)), Cmp::GT);
  Value inside = band(b, bnot(b, below), band(b, bnot(b, above), bnot(b, isnan(b, z))));
  Value zi = b.convert(round_even(b, b.select(inside, z, dk(0))), DType::I32);
  const Shape& zs = zi.shape();
  zi = b.select(inside, zi, b.select(below, kon(b, double(qmin), DType::I32, zs),
                                     b.select(above, kon(b, double(qmax), DType::I32, zs),
                                              kon(b, -2147483648.0, DType::I32, zs))));
  return {sc, zi};
}

// A flag tensor's `.item().toInt() != 0` (an integral or bool tensor of one element).
Value flag_on(Builder& b, const Value& t) { return cmp(b, first(b, t, DType::I64), b.constant(0, DType::I64), Cmp::NE); }

}  // namespace

// _fused_moving_avg_obs_fq_helper_functional(self, observer_on, fake_quant_on, running_min,
// running_max, scale, zero_point, averaging_const, quant_min, quant_max, ch_axis,
// per_row_fake_quant, symmetric_quant) -> (output, mask, running_min, running_max, scale,
// zero_point), CPU's fused_moving_avg_obs_fake_quant_cpu:
//  - observer_on: running stats (f32) move toward the input's min / max (per row of axis
//    0, or of the whole tensor): r + c * (cur - r) in float, or cur where r is infinite;
//  - fake_quant_on: scale and zero point chosen from the running stats (fbgemm's
//    ChooseQuantizationParams), then the per-channel / per-tensor fake quantization with
//    them; off: the input and an all-true mask, scale and zero point as they were.
// The flags are values: both branches are computed and selected. CPU's errors that depend
// on them are device checks: the observer of a non-float input or of a channel axis other
// than 0 (nothing is updated then), and a zero point outside the range (NaN stats).
// Argument checks (dtypes, sizes, ranges) are the Meta kernel's (torch_tpu/_meta.py).
TPU_LOWER(fused_moving_avg_obs_fq, "_fused_moving_avg_obs_fq_helper_functional") {
  Builder& b = ctx.b;
  Value x = ctx.in(0), rmin = ctx.in(3), rmax = ctx.in(4), scale = ctx.in(5), zp = ctx.in(6);
  const float c = static_cast<float>(ctx.f(7));
  int64_t qmin = ctx.i(8), qmax = ctx.i(9), axis = ctx.i(10);
  bool per_row = ctx.flag(11), symmetric = ctx.flag(12);
  const DType f = DType::F32;
  const Shape& rs = rmin.shape();
  Value observe = flag_on(b, ctx.in(1)), quantize = flag_on(b, ctx.in(2));

  // The observer: CPU checks the axis, then reads the minima as float.
  Value observe_ok = b.constant(1, DType::Bool);
  auto refuse_observe = [&](const std::string& message) {
    Value ok = bnot(b, observe);
    ctx.check(ok, message);
    observe_ok = band(b, observe_ok, ok);
  };
  bool can_observe = !per_row || axis == 0;
  if (!can_observe)
    refuse_observe("RuntimeError: Per-channel FakeQuant in fused_moving_avg_obs_fake_quant is only supported on axis == 0");
  if (x.dtype() != f) {
    static const char* names[] = {"Double", "Half", "BFloat16"};
    const char* n = x.dtype() == DType::F64 ? names[0] : x.dtype() == DType::F16 ? names[1] : names[2];
    refuse_observe(std::string("RuntimeError: expected scalar type Float but found ") + n);
    can_observe = false;
  }
  Value new_min = rmin, new_max = rmax;
  if (can_observe) {
    std::vector<int64_t> dims = per_row ? all_but(x.rank(), 0) : all_but(x.rank(), -1);
    Value cur_min = b.reshape(reduce_min(b, x, dims), rs), cur_max = b.reshape(reduce_max(b, x, dims), rs);
    auto average = [&](const Value& r, const Value& cur) {
      // r + c * (cur - r) in float, each step rounded: XLA:CPU contracts a product that
      // feeds a sum into one fused multiply-add (rounded once), so the sum is given a
      // select of the product instead, the difference where that is NaN (as the product
      // then is), which it cannot contract.
      Value diff = sub(b, cur, r);
      Value prod = mul(b, kon(b, double(c), f, rs), diff);
      Value moved = add(b, r, b.select(isnan(b, diff), diff, prod));
      Value inf = cmp(b, un(b, "stablehlo.abs", r), kon(b, std::numeric_limits<double>::infinity(), f, rs), Cmp::EQ);
      return b.select(broadcast_to(b, observe, rs), b.select(inf, cur, moved), r);
    };
    new_min = average(rmin, cur_min);
    new_max = average(rmax, cur_max);
  }
  // An observer CPU refuses updates nothing (its error comes before any write).
  Value keep = bnot(b, observe_ok);
  new_min = b.select(broadcast_to(b, keep, rs), rmin, new_min);
  new_max = b.select(broadcast_to(b, keep, rs), rmax, new_max);

  auto [sc, zi] = choose_qparams(b, new_min, new_max, qmin, qmax, symmetric);
  Value out, mask;
  if (per_row) {
    int64_t n = rmin.type.numel();
    Value sc1 = b.reshape(sc, {n}), zp1 = b.reshape(zi, {n});
    // CPU's per-channel kernel checks the zero points (only NaN stats give one outside).
    ctx.check(b.binary("stablehlo.or", bnot(b, quantize),
                       all_true(b, band(b, cmp(b, zp1, kon(b, double(qmin), DType::I32, {n}), Cmp::GE),
                                        cmp(b, zp1, kon(b, double(qmax), DType::I32, {n}), Cmp::LE)))),
              kZeroPointRange);
    std::vector<Value> r = per_channel(b, x, sc1, zp1, axis, qmin, qmax);
    Value on = broadcast_to(b, quantize, x.shape());
    out = b.select(on, r[0], x);
    mask = b.select(on, r[1], kon(b, 1, DType::Bool, x.shape()));
  } else {
    Value s0 = first(b, sc, f);
    Value inv = div(b, b.constant(1, f), s0);
    std::vector<Value> r = per_tensor(b, x, s0, inv, first(b, zi, DType::I64), qmin, qmax, &quantize);
    out = r[0];
    mask = r[1];
  }
  Value sc_out = b.select(broadcast_to(b, quantize, scale.shape()), b.convert(b.reshape(sc, scale.shape()), scale.dtype()),
                          scale);
  Value zp_out = b.select(broadcast_to(b, quantize, zp.shape()), b.convert(b.reshape(zi, zp.shape()), zp.dtype()), zp);
  // (CPU writes scale and zero point even where their check then fails.)
  sc_out = b.select(broadcast_to(b, keep, scale.shape()), scale, sc_out);
  zp_out = b.select(broadcast_to(b, keep, zp.shape()), zp, zp_out);
  return {out, mask, new_min, new_max, sc_out, zp_out};
}

}  // namespace tpu::lowering
