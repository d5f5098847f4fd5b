// Hurwitz zeta, nextafter and frexp.
#include <cmath>

#include "lowering/special_util.h"

namespace tpu::lowering {
namespace {

using namespace sp;

// zeta(x, q) = sum_k (q + k)^-x like the CPU kernel (in float64, its accumulation type):
// direct terms until q + k > 9 (at least 9 of them, stopping early once a term is
// negligible), then 12 Euler-Maclaurin corrections with Bernoulli-number weights.
Value zeta(Builder& b, const Value& x, const Value& q_in) {
  static constexpr double eps = 1.11022302462515654042E-16;
  static const double A[] = {12.0, -720.0, 30240.0, -1209600.0, 47900160.0,
                             -1.8924375803183791606e9, 7.47242496e10, -2.950130727918164224e12,
                             1.1646782814350067249e14, -4.5979787224074726105e15,
                             1.8152105401943546773e17, -7.1661652561756670113e18};
  Value one = K(b, x, 1);
  Value q_le0 = cmpk(b, q_in, 0, Cmp::LE);
  Value q_int = cmp(b, op1(b, "floor", q_in), q_in, Cmp::EQ);
  Value x_int = cmp(b, op1(b, "floor", x), x, Cmp::EQ);
  Value special = or_(b, cmpk(b, x, 1, Cmp::LE), and_(b, q_le0, or_(b, q_int, not_(b, x_int))));
  Value q = b.select(special, one, q_in);  // keeps the loop short where the answer is fixed
  Value nx = neg_(b, x);
  auto negligible = [](Builder& bb, const Value& t, const Value& s) {
    Value m = mul(bb, s, K(bb, s, eps));
    return and_(bb, cmp(bb, neg_(bb, m), t, Cmp::LT), cmp(bb, t, m, Cmp::LT));
  };
  auto running = [](Builder& bb, const Value& i, const Value& a, const Value& done) {
    Value few = bb.broadcast_in_dim(bb.compare(i, bb.constant(9, DType::I32), Cmp::LT), a.shape(), {});
    return and_(bb, or_(bb, few, cmpk(bb, a, 9, Cmp::LE)), not_(bb, done));
  };
  Value i0 = b.constant(0, DType::I32);
  Value done0 = b.constant(0, DType::Bool, x.shape());
  Value s0 = op2(b, "power", q, nx);
  auto st = b.while_loop(
      {i0, any_true(b, running(b, i0, q, done0)), x, q, K(b, x, 0), s0, done0},
      [](Builder&, const Vs& s) { return Vs{s[1]}; },
      [&](Builder& bb, const Vs& s) {
        const Value &i = s[0], &xx = s[2], &a = s[3], &t = s[4], &sum = s[5], &done = s[6];
        Value on = running(bb, i, a, done);
        Value a1 = add(bb, a, K(bb, a, 1));
        Value t1 = op2(bb, "power", a1, neg_(bb, xx));
        Value s1 = add(bb, sum, t1);
        Value a2 = bb.select(on, a1, a), t2 = bb.select(on, t1, t), sum2 = bb.select(on, s1, sum);
        Value done2 = bb.select(on, negligible(bb, t1, s1), done);
        Value i1 = add(bb, i, bb.constant(1, DType::I32));
        return Vs{i1, any_true(bb, running(bb, i1, a2, done2)), xx, a2, t2, sum2, done2};
      });
  Value w = st[3], t = st[4], s = st[5], done = st[6];
  auto upd = [&](Value& v, const Value& nv) { v = b.select(done, v, nv); };
  upd(s, add(b, s, div(b, mul(b, t, w), sub(b, x, one))));
  upd(s, sub(b, s, mul(b, K(b, x, 0.5), t)));
  Value a = one, k = K(b, x, 0);
  for (int j = 0; j < 12; ++j) {
    a = mul(b, a, add(b, x, k));
    t = div(b, t, w);
    Value term = div(b, mul(b, a, t), K(b, x, A[j]));
    upd(s, add(b, s, term));
    done = or_(b, done, cmpk(b, abs_(b, div(b, term, s)), eps, Cmp::LT));
    k = add(b, k, one);
    a = mul(b, a, add(b, x, k));
    t = div(b, t, w);
    k = add(b, k, one);
  }
  Value r = b.select(and_(b, q_le0, not_(b, x_int)), K(b, x, NAN), s);
  r = b.select(and_(b, q_le0, q_int), K(b, x, INFINITY), r);
  r = b.select(cmpk(b, x, 1, Cmp::LT), K(b, x, NAN), r);
  return b.select(cmpk(b, x, 1, Cmp::EQ), K(b, x, INFINITY), r);
}

TPU_LOWER(zeta_rule, "special_zeta", "special_zeta.self_scalar", "special_zeta.other_scalar") {
  Type o = ctx.out(0);
  if (o.dtype != DType::F32 && o.dtype != DType::F64) throw Unsupported("zeta: float32/float64 only");
  Value x = operand(ctx, 0, DType::F64, o.shape), q = operand(ctx, 1, DType::F64, o.shape);
  return {ctx.b.convert(zeta(ctx.b, x, q), o.dtype)};
}

DType bits_type(DType t) {
  switch (t) {
    case DType::F64: return DType::I64;
    case DType::F32: return DType::I32;
    case DType::BF16: case DType::F16: return DType::I16;
    default: throw Unsupported("float dtypes only");
  }
}

// The next float after x toward y, on integers only (so subnormals are exact even
// where the float unit flushes them): x's bit pattern steps by one, up in magnitude
// when y lies farther from zero on x's side; from a zero it is the smallest
// subnormal with y's sign. Order tests use a signed key (-|bits| for negatives).
TPU_LOWER(nextafter_rule, "nextafter") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  DType it = bits_type(o.dtype);
  Value x = operand(ctx, 0, o.dtype, o.shape), y = operand(ctx, 1, o.dtype, o.shape);
  auto C = [&](double v) { return b.constant(v, it, o.shape); };
  Value mag_mask = op2(b, "shift_right_logical", C(-1), C(1));
  Value sign_mask = op2(b, "xor", C(-1), mag_mask);
  Value bx = b.bitcast(x, it), by = b.bitcast(y, it);
  auto key = [&](const Value& bits) {
    Value mag = op2(b, "and", bits, mag_mask);
    return b.select(b.compare(bits, C(0), Cmp::LT), op1(b, "negate", mag), mag);
  };
  Value kx = key(bx), ky = key(by);
  Value x_pos = b.compare(bx, C(0), Cmp::GE);
  Value away = b.compare(x_pos, b.compare(kx, ky, Cmp::LT), Cmp::EQ);
  Value bits = add(b, bx, b.select(away, C(1), C(-1)));
  Value x_zero = b.compare(op2(b, "and", bx, mag_mask), C(0), Cmp::EQ);
  bits = b.select(x_zero, op2(b, "or", op2(b, "and", by, sign_mask), C(1)), bits);
  Value r = b.select(b.compare(kx, ky, Cmp::EQ), y, b.bitcast(bits, o.dtype));
  Value nan = or_(b, isnan_(b, x), isnan_(b, y));
  return {b.select(nan, add(b, x, y), r)};
}

// frexp: x = m * 2^e with 0.5 <= |m| < 1, from the bit fields (subnormals
// normalized by their leading zeros); zero, inf and NaN give (x, 0) like glibc.
TPU_LOWER(frexp_rule, "frexp.Tensor") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  bool wide = o.dtype == DType::F64;
  if (!wide && o.dtype != DType::F32 && o.dtype != DType::BF16 && o.dtype != DType::F16)
    throw Unsupported("frexp: float dtypes only");
  DType ft = wide ? DType::F64 : DType::F32, it = wide ? DType::I64 : DType::I32;
  int mbits = wide ? 52 : 23, bias = wide ? 1022 : 126, emax = wide ? 2047 : 255;
  const Shape& sh = o.shape;
  auto C = [&](double v) { return b.constant(v, it, sh); };
  Value x = b.convert(ctx.in(0), ft);
  Value bits = b.bitcast(x, it);
  Value frac_mask = sub(b, op2(b, "shift_left", C(1), C(mbits)), C(1));
  Value mag = op2(b, "and", bits, op2(b, "shift_right_logical", C(-1), C(1)));
  Value sign = op2(b, "and", bits, op1(b, "not", op2(b, "shift_right_logical", C(-1), C(1))));
  Value e = op2(b, "shift_right_logical", mag, C(mbits));
  // Subnormals: shift the leading one up to the implicit bit's place.
  Value shift = sub(b, b.unary("stablehlo.count_leading_zeros", mag), C(wide ? 11 : 8));
  Value sub_frac = op2(b, "shift_left", mag, shift);
  Value is_sub = b.compare(e, C(0), Cmp::EQ);
  Value frac = op2(b, "and", b.select(is_sub, sub_frac, bits), frac_mask);
  Value exp = b.select(is_sub, sub(b, C(1 - bias), shift), sub(b, e, C(bias)));
  Value mbits_out = op2(b, "or", op2(b, "or", sign, op2(b, "shift_left", C(bias), C(mbits))), frac);
  Value m = b.bitcast(mbits_out, ft);
  Value plain = or_(b, b.compare(mag, C(0), Cmp::EQ), b.compare(e, C(emax), Cmp::EQ));
  m = b.select(plain, x, m);
  exp = b.select(plain, C(0), exp);
  return {b.convert(m, o.dtype), b.convert(exp, ctx.out(1).dtype)};
}

}  // namespace
}  // namespace tpu::lowering
