// Error-function relatives: erfcx (scaled complementary error function), log_ndtr
// (log of the normal CDF) and ndtri (its inverse). erfcx and log_ndtr run in float64
// on erfc (elementwise.cpp; the CPU uses Faddeeva's Chebyshev table); ndtri uses
// Cephes' rational fits like the CPU kernel.
#include <cmath>

#include "lowering/special_util.h"

namespace tpu::lowering {
namespace {

using namespace sp;

// exp(x^2) erfc(x): directly while erfc(x) stays a normal float64 (x <= 25), then
// Laplace's continued fraction 1/sqrt(pi) / (x + (1/2) / (x + 1 / (x + (3/2) / ...)))
// (CPU uses it past 50), 8 levels deep: 1e-16 from 25 on (the 2-level rational form
// used before was 4e-14 off at 25); for x < 0 the reflection 2 exp(x^2) - erfcx(-x).
// exp(x^2) is exp(z) (1 + z_lo) with x^2 = z + z_lo exactly: exp(z) alone is off by
// x^2 2^-53 relative.
Value erfcx(Builder& b, const Value& x) {
  const double ispi = 0.56418958354775628694807945156;
  Value ax = abs_(b, x);
  auto [z, z_lo] = two_product(b, ax, ax);
  Value ez = mul(b, exp_(b, z), add(b, K(b, x, 1), z_lo));
  Value direct = mul(b, ez, erfc(b, ax));
  Value den = ax;
  for (int k = 8; k >= 1; --k) den = add(b, ax, div(b, K(b, x, k / 2.0), den));
  Value cf = div(b, K(b, x, ispi), den);
  Value pos = b.select(cmpk(b, ax, 25, Cmp::GT), cf, direct);
  Value two_e = mul(b, K(b, x, 2), ez);
  Value negv = b.select(cmpk(b, x, -6.1, Cmp::LT), two_e, sub(b, two_e, pos));
  negv = b.select(cmpk(b, x, -26.7, Cmp::LT), K(b, x, INFINITY), negv);
  Value r = b.select(cmpk(b, x, 0, Cmp::LT), negv, pos);
  return b.select(isnan_(b, x), x, r);
}

// log Phi(x) = log(erfcx(-t) / 2) - t^2 below x = -1, else log1p(-erfc(t) / 2),
// with t = x / sqrt(2).
Value log_ndtr(Builder& b, const Value& x) {
  Value t = mul(b, x, K(b, x, M_SQRT1_2));
  Value lo = sub(b, log_(b, div(b, erfcx(b, neg_(b, t)), K(b, x, 2))), mul(b, t, t));
  Value hi = log1p(b, neg_(b, div(b, erfc(b, t), K(b, x, 2))));
  return b.select(cmpk(b, x, -1, Cmp::LT), lo, hi);
}

// Published Cephes coefficients of ndtri (highest power first).
const std::vector<double> ND_P0 = {
    -5.99633501014107895267E1, 9.80010754185999661536E1, -5.66762857469070293439E1,
    1.39312609387279679503E1, -1.23916583867381258016E0};
const std::vector<double> ND_Q0 = {
    1.00000000000000000000E0, 1.95448858338141759834E0, 4.67627912898881538453E0,
    8.63602421390890590575E1, -2.25462687854119370527E2, 2.00260212380060660359E2,
    -8.20372256168333339912E1, 1.59056225126211695515E1, -1.18331621121330003142E0};
const std::vector<double> ND_P1 = {
    4.05544892305962419923E0, 3.15251094599893866154E1, 5.71628192246421288162E1,
    4.40805073893200834700E1, 1.46849561928858024014E1, 2.18663306850790267539E0,
    -1.40256079171354495875E-1, -3.50424626827848203418E-2, -8.57456785154685413611E-4};
const std::vector<double> ND_Q1 = {
    1.00000000000000000000E0, 1.57799883256466749731E1, 4.53907635128879210584E1,
    4.13172038254672030440E1, 1.50425385692907503408E1, 2.50464946208309415979E0,
    -1.42182922854787788574E-1, -3.80806407691578277194E-2, -9.33259480895457427372E-4};
const std::vector<double> ND_P2 = {
    3.23774891776946035970E0, 6.91522889068984211695E0, 3.93881025292474443415E0,
    1.33303460815807542389E0, 2.01485389549179081538E-1, 1.23716634817820021358E-2,
    3.01581553508235416007E-4, 2.65806974686737550832E-6, 6.23974539184983293730E-9};
const std::vector<double> ND_Q2 = {
    1.00000000000000000000E0, 6.02427039364742014255E0, 3.67983563856160859403E0,
    1.37702099489081330271E0, 2.16236993594496635890E-1, 1.34204006088543189037E-2,
    3.28014464682127739104E-4, 2.89247864745380683936E-6, 6.79019408009981274425E-9};

// The inverse of the normal CDF: a rational fit in y - 1/2 around the centre, and in
// 1/sqrt(-2 log y) in the tails (folded onto y < exp(-2)).
Value ndtri(Builder& b, const Value& y0) {
  const double s2pi = 2.50662827463100050242E0, e2 = 0.13533528323661269189;
  Value one = K(b, y0, 1);
  Value upper = cmpk(b, y0, 1 - e2, Cmp::GT);
  Value y = b.select(upper, sub(b, one, y0), y0);
  Value c = sub(b, y0, K(b, y0, 0.5)), c2 = mul(b, c, c);
  Value central = mul(b, add(b, c, mul(b, c, div(b, mul(b, c2, horner(b, c2, ND_P0)), horner(b, c2, ND_Q0)))),
                      K(b, y0, s2pi));
  Value x = sqrt_(b, mul(b, K(b, y0, -2), log_exact(b, y)));
  Value x0 = sub(b, x, div(b, log_(b, x), x));
  Value z = div(b, one, x);
  Value near = div(b, mul(b, z, horner(b, z, ND_P1)), horner(b, z, ND_Q1));
  Value far = div(b, mul(b, z, horner(b, z, ND_P2)), horner(b, z, ND_Q2));
  Value tail = sub(b, x0, b.select(cmpk(b, x, 8, Cmp::LT), near, far));
  tail = b.select(upper, tail, neg_(b, tail));
  Value r = b.select(cmpk(b, y, e2, Cmp::GT), central, tail);
  r = b.select(or_(b, is_neg(b, y0), cmpk(b, y0, 1, Cmp::GT)), K(b, y0, NAN), r);
  r = b.select(cmpk(b, y0, 1, Cmp::EQ), K(b, y0, INFINITY), r);
  return b.select(is_zero(b, y0), K(b, y0, -INFINITY), r);
}

// fn on float32/float64 (float64 math when `wide`); bf16/f16 only where CPU has them.
std::vector<Value> unary(Ctx& ctx, Value (*fn)(Builder&, const Value&), bool wide, bool low) {
  Type o = ctx.out(0);
  bool ok = o.dtype == DType::F32 || o.dtype == DType::F64 ||
            (low && (o.dtype == DType::BF16 || o.dtype == DType::F16));
  if (!ok) throw Unsupported("special: unsupported dtype");
  DType t = wide ? DType::F64 : math_type(o.dtype);
  Value x = coerce(ctx.b, ctx.in(0), t, o.shape);
  return {ctx.b.convert(fn(ctx.b, x), o.dtype)};
}

TPU_LOWER(erfcx_rule, "special_erfcx") { return unary(ctx, erfcx, true, false); }
TPU_LOWER(log_ndtr_rule, "special_log_ndtr") { return unary(ctx, log_ndtr, true, false); }
TPU_LOWER(ndtri_rule, "special_ndtri") { return unary(ctx, ndtri, false, false); }

}  // namespace
}  // namespace tpu::lowering
