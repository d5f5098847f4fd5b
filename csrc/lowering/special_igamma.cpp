// Regularized incomplete gamma functions P(a, x) (igamma) and Q(a, x) (igammac),
// in float64 for every float dtype (CPU's bf16 results match float64's, rounded):
// the power series of P where x < a + 1, else Lentz's continued fraction of Q, both
// run in one while loop until every element has converged; for a >= 3e5, where the
// series near x = a needs more terms than the loop allows, the leading term of Temme's
// uniform asymptotic expansion (as CPU also uses for large a). Edge values (a or x
// negative, zero or infinite) as the CPU kernel gives them.
#include <cmath>

#include "lowering/special_util.h"

namespace tpu::lowering {
namespace {

using namespace sp;

constexpr double kAsymptoticA = 3e5;

// {P, Q} for large a: Q = erfc(eta sqrt(a/2)) / 2 + R and P = erfc(-eta sqrt(a/2)) / 2 - R,
// R = exp(-a eta^2 / 2) / sqrt(2 pi a) * C0(eta), with eta^2 / 2 = mu - log1p(mu),
// mu = (x - a) / a, eta of mu's sign, and C0 = 1/mu - 1/eta (its Taylor series near 0).
// The next term is O(1/a) smaller: below 1e-11 of the result for a >= 3e5.
std::pair<Value, Value> asymptotic_pq(Builder& b, const Value& a, const Value& x) {
  Value mu = div(b, sub(b, x, a), a);
  Value small = cmpk(b, abs_(b, mu), 1e-3, Cmp::LT);
  Value h_series = mul(b, mul(b, mu, mu), horner(b, mu, {1.0 / 6, -0.2, 0.25, -1.0 / 3, 0.5}));
  Value h = b.select(small, h_series, sub(b, mu, log1p(b, mu)));  // eta^2 / 2
  Value eta = mul(b, op1(b, "sign", mu), sqrt_(b, add(b, h, h)));
  Value c0_series = horner(b, eta, {1.0 / 864, -2.0 / 135, 1.0 / 12, -1.0 / 3});
  Value safe_mu = b.select(small, K(b, mu, 1), mu), safe_eta = b.select(small, K(b, eta, 1), eta);
  Value c0 = b.select(small, c0_series, sub(b, div(b, K(b, mu, 1), safe_mu), div(b, K(b, eta, 1), safe_eta)));
  Value r = mul(b, div(b, exp_(b, neg_(b, mul(b, a, h))), sqrt_(b, mul(b, K(b, a, 2 * M_PI), a))), c0);
  Value z = mul(b, eta, sqrt_(b, mul(b, a, K(b, a, 0.5))));
  Value half = K(b, a, 0.5);
  return {sub(b, mul(b, half, erfc(b, neg_(b, z))), r), add(b, mul(b, half, erfc(b, z)), r)};
}

// {P, Q} for a, x > 0 finite.
std::pair<Value, Value> incomplete_gamma(Builder& b, const Value& a, const Value& x) {
  const double eps = 1.1102230246251565e-16, tiny = 1e-300;
  const int kMaxIter = 5000;
  Value use_series = cmp(b, x, add(b, a, K(b, a, 1)), Cmp::LT);
  Value logpre = sub(b, sub(b, mul(b, a, log_(b, x)), x), b.raw("chlo.lgamma", {a}, "", a.type));
  // Series state: ap, del, sum. Fraction state: bb, c, d, h.
  Value del0 = div(b, K(b, a, 1), a);
  Value bb0 = sub(b, add(b, x, K(b, x, 1)), a);
  Value d0 = div(b, K(b, a, 1), bb0);
  Value i0 = b.constant(1, DType::I32);
  Value asym = cmpk(b, a, kAsymptoticA, Cmp::GE);
  Value all_done = asym;  // the loop leaves these to the expansion
  auto st = b.while_loop(
      {i0, b.constant(1, DType::Bool), a, x, use_series, a, del0, del0, bb0, K(b, a, 1 / tiny), d0, d0,
       all_done},
      [](Builder&, const Vs& s) { return Vs{s[1]}; },
      [&](Builder& bb, const Vs& s) {
        const Value &i = s[0], &aa = s[2], &xx = s[3], &ser = s[4], &done = s[12];
        Value ap = s[5], del = s[6], sum = s[7], bv = s[8], c = s[9], d = s[10], h = s[11];
        Value one = K(bb, aa, 1);
        // series step
        Value ap1 = add(bb, ap, one);
        Value del1 = mul(bb, del, div(bb, xx, ap1));
        Value sum1 = add(bb, sum, del1);
        Value ser_done = cmp(bb, abs_(bb, del1), mul(bb, abs_(bb, sum1), K(bb, aa, eps)), Cmp::LT);
        // continued-fraction step
        Value fi = bb.broadcast_in_dim(bb.convert(i, DType::F64), aa.shape(), {});
        Value an = mul(bb, neg_(bb, fi), sub(bb, fi, aa));
        Value bv1 = add(bb, bv, K(bb, aa, 2));
        auto floor_tiny = [&](const Value& v) {
          return bb.select(cmpk(bb, abs_(bb, v), tiny, Cmp::LT), K(bb, v, tiny), v);
        };
        Value d1 = floor_tiny(add(bb, mul(bb, an, d), bv1));
        Value c1 = floor_tiny(add(bb, bv1, div(bb, an, c)));
        d1 = div(bb, one, d1);
        Value dl = mul(bb, d1, c1);
        Value h1 = mul(bb, h, dl);
        Value cf_done = cmpk(bb, abs_(bb, sub(bb, dl, one)), eps, Cmp::LT);
        Value on = not_(bb, done);
        Value on_s = and_(bb, on, ser), on_c = and_(bb, on, not_(bb, ser));
        auto pick = [&](const Value& m, const Value& n, const Value& o) { return bb.select(m, n, o); };
        Value done1 = or_(bb, done, bb.select(ser, ser_done, cf_done));
        Value i1 = add(bb, i, bb.constant(1, DType::I32));
        Value more = and_(bb, any_true(bb, not_(bb, done1)),
                          bb.compare(i1, bb.constant(kMaxIter, DType::I32), Cmp::LE));
        return Vs{i1, more, aa, xx, ser,
                  pick(on_s, ap1, ap), pick(on_s, del1, del), pick(on_s, sum1, sum),
                  pick(on_c, bv1, bv), pick(on_c, c1, c), pick(on_c, d1, d), pick(on_c, h1, h), done1};
      });
  Value pre = exp_(b, logpre);
  Value p_ser = mul(b, st[7], pre), q_cf = mul(b, st[11], pre);
  Value one = K(b, a, 1);
  Value p = b.select(use_series, p_ser, sub(b, one, q_cf));
  Value q = b.select(use_series, sub(b, one, p_ser), q_cf);
  auto big = asymptotic_pq(b, a, x);
  return {b.select(asym, big.first, p), b.select(asym, big.second, q)};
}

// CPU's boundary values, for P (upper = false) or Q.
Value igamma(Builder& b, const Value& a_in, const Value& x_in, bool upper) {
  Value one = K(b, a_in, 1), zero = K(b, a_in, 0), nan = K(b, a_in, NAN);
  Value lo = upper ? one : zero, hi = upper ? zero : one;  // the values at x = 0 and x = inf
  Value bad = or_(b, cmpk(b, x_in, 0, Cmp::LT), cmpk(b, a_in, 0, Cmp::LT));
  Value a0 = cmpk(b, a_in, 0, Cmp::EQ), x0 = cmpk(b, x_in, 0, Cmp::EQ);
  Value ainf = isinf_(b, a_in), xinf = isinf_(b, x_in);
  Value anan = or_(b, isnan_(b, a_in), isnan_(b, x_in));
  Value fixed = or_(b, or_(b, bad, anan), or_(b, or_(b, a0, x0), or_(b, ainf, xinf)));
  Value a = b.select(fixed, one, a_in), x = b.select(fixed, one, x_in);
  auto pq = incomplete_gamma(b, a, x);
  // CPU's order of tests: NaN only reaches the computation past all of them.
  Value r = b.select(anan, nan, upper ? pq.second : pq.first);
  r = b.select(xinf, hi, r);
  r = b.select(ainf, b.select(xinf, nan, lo), r);
  r = b.select(x0, lo, r);
  r = b.select(a0, b.select(cmpk(b, x_in, 0, Cmp::GT), hi, nan), r);
  return b.select(bad, nan, r);
}

std::vector<Value> rule(Ctx& ctx, bool upper) {
  Type o = ctx.out(0);
  if (!is_float(o.dtype)) throw Unsupported("igamma: float dtypes only");
  Value a = operand(ctx, 0, DType::F64, o.shape), x = operand(ctx, 1, DType::F64, o.shape);
  return {ctx.b.convert(igamma(ctx.b, a, x, upper), o.dtype)};
}

TPU_LOWER(igamma_rule, "igamma") { return rule(ctx, false); }
TPU_LOWER(igammac_rule, "igammac") { return rule(ctx, true); }

}  // namespace
}  // namespace tpu::lowering
