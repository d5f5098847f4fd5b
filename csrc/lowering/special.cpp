// Log-gamma (spelled out here), and special functions XLA provides as CHLO ops (lowered
// to StableHLO by the plugin's compiler): digamma, polygamma, the inverse error function
// and the scaled modified Bessel function of order one.
#include <cmath>

#include "lowering/special_util.h"

namespace tpu::lowering {

using namespace ew;

static Value chlo(Builder& b, const char* op, const Vs& args) { return b.raw(op, args, "", args[0].type); }

namespace {
using ir::Cmp;

// zeta(k) - 1 for k = 2, 3, ..., 40.
const double kZetaMinus1[] = {
    0.64493406684822641,    0.20205690315959429,    0.082323233711138186,   0.036927755143369927,
    0.01734306198444914,    0.0083492773819228271,  0.0040773561979443396,  0.0020083928260822143,
    0.00099457512781808526, 0.00049418860411946453, 0.00024608655330804832, 0.00012271334757848915,
    6.1248135058704828e-05, 3.0588236307020493e-05, 1.5282259408651871e-05, 7.6371976378997626e-06,
    3.8172932649998402e-06, 1.908212716553939e-06,  9.5396203387279621e-07, 4.7693298678780645e-07,
    2.38450502727733e-07,   1.1921992596531106e-07, 5.960818905125948e-08,  2.9803503514652279e-08,
    1.4901554828365043e-08, 7.4507117898354301e-09, 3.7253340247884573e-09, 1.8626597235130491e-09,
    9.3132743241966817e-10, 4.6566290650337837e-10, 2.3283118336765053e-10, 1.1641550172700519e-10,
    5.8207720879027015e-11, 2.9103850444971e-11,    1.4551921891041985e-11, 7.2759598350574818e-12,
    3.6379795473786509e-12, 1.8189896503070661e-12, 9.0949478402638884e-13};

// lgamma(2 + z) for -3/4 <= z <= 1/4 from its Taylor series about 2,
// (1 - euler_gamma) z + sum_{k>=2} (-1)^k (zeta(k) - 1) / k z^k, whose terms fall like
// (3/8)^k / k: 22 terms reach float32's precision, 40 float64's. z times a polynomial, so
// relative accuracy holds down to z = 0 (lgamma(2) is exactly 0).
Value lgamma_near2(Builder& b, const Value& z) {
  int terms = z.dtype() == DType::F64 ? 40 : 22;
  auto coef = [](int k) { return (k % 2 ? -1 : 1) * kZetaMinus1[k - 2] / k; };
  Value p = cst(b, z, coef(terms));
  for (int k = terms - 1; k >= 2; --k) p = add(b, cst(b, z, coef(k)), mul(b, z, p));
  p = add(b, cst(b, z, 0.42278433509846713), mul(b, z, p));  // 1 - euler_gamma
  return mul(b, z, p);
}

// Stirling's series for x >= 8: (x - 1/2)(log x - 1) + (log(2 pi) - 1) / 2 plus
// sum_m B_2m / (2m (2m - 1) x^(2m-1)), 4 terms for float32, 10 for float64.
Value lgamma_stirling(Builder& b, const Value& x) {
  static const double kB[] = {1.0 / 12, -1.0 / 360, 1.0 / 1260, -1.0 / 1680, 1.0 / 1188, -691.0 / 360360,
                              1.0 / 156, -3617.0 / 122400, 43867.0 / 244188, -174611.0 / 125400};
  int terms = x.dtype() == DType::F64 ? 10 : 4;
  Value q = div(b, cst(b, x, 1), x), q2 = mul(b, q, q);
  Value s = cst(b, x, kB[terms - 1]);
  for (int m = terms - 2; m >= 0; --m) s = add(b, cst(b, x, kB[m]), mul(b, q2, s));
  Value lead = mul(b, sub(b, x, cst(b, x, 0.5)), sub(b, op1(b, "log", x), cst(b, x, 1)));
  return add(b, lead, add(b, cst(b, x, 0.5 * std::log(2 * M_PI) - 0.5), mul(b, q, s)));
}

// log|Gamma(x)| with relative accuracy near its zeros at 1 and 2 (CHLO's lgamma, a
// Lanczos sum, is off by about 5e-7 absolute there in float32: lgamma(1) came out 4.8e-7;
// 9e-13 relative in float64), in float32 or float64 math:
//   x >= 8: Stirling's series;
//   -10 <= x < 8: the recurrence onto 2 + z, z = x - ceil(x - 1/4) in (-3/4, 1/4] (exact),
//     lgamma(x) = lgamma(2 + z) - log|x (x + 1) ...| or + log((x - 1) (x - 2) ...), the
//     product of the (exact) shifted values kept exactly as hi + lo so that a pole's factor
//     or a product near 1 (x near a zero of lgamma) loses nothing before the log;
//   x < -10: the reflection lgamma(x) = log(pi / |x sin(pi x)|) - lgamma(-x), sin(pi x)
//     taken on the (exact) distance of x from the nearest integer;
//   +inf at 0 and the negative integers (-inf included), as CPU gives.
Value lgamma(Builder& b, const Value& x) {
  const double kStirlingFrom = 8, kReflectBelow = -10;
  const int kMaxFactors = 12;  // x in [-10, 8): up to 12 factors up, or 6 down
  Value reflect = cmpk(b, x, kReflectBelow, Cmp::LT);
  Value t = b.select(reflect, op1(b, "negate", x), x);
  Value r = op1(b, "ceil", sub(b, t, cst(b, t, 0.25)));
  Value z = sub(b, t, r);
  // up > 0: factors t, t + 1, ..., t + up - 1; up < 0: t - 1, t - 2, ..., t + up.
  Value up = sub(b, cst(b, r, 2), r);
  Value hi = cst(b, t, 1), lo = cst(b, t, 0);
  for (int j = 0; j < kMaxFactors; ++j) {
    Value f = b.select(cmpk(b, up, j, Cmp::GT), add(b, t, cst(b, t, j)),
                       b.select(cmpk(b, up, -j, Cmp::LT), sub(b, t, cst(b, t, j + 1)), cst(b, t, 1)));
    f = op1(b, "abs", f);
    auto [p, e] = sp::two_product(b, hi, f);
    lo = add(b, mul(b, lo, f), e);
    hi = p;
  }
  // log(hi + lo), with log1p(hi - 1) (hi - 1 exact) next to 1: an ulp closer there in float32.
  // (Not below 0.75: XLA's float64 log1p is off by 3e-14 around -0.41.)
  Value near1 = op2(b, "and", cmpk(b, hi, 0.75, Cmp::GE), cmpk(b, hi, 1.5, Cmp::LE));
  Value log_hi = b.select(near1, op1(b, "log_plus_one", sub(b, hi, cst(b, hi, 1))), op1(b, "log", hi));
  Value log_p = add(b, log_hi, div(b, lo, hi));
  Value shifted = add(b, lgamma_near2(b, z), b.select(cmpk(b, up, 0, Cmp::GT), op1(b, "negate", log_p), log_p));
  Value core = b.select(cmpk(b, t, kStirlingFrom, Cmp::GE), lgamma_stirling(b, t), shifted);
  Value frac = sub(b, x, b.unary("stablehlo.round_nearest_even", x));
  Value sin_pi = op1(b, "abs", op1(b, "sine", mul(b, cst(b, x, M_PI), frac)));
  Value refl = sub(b, op1(b, "log", div(b, cst(b, x, M_PI), mul(b, t, sin_pi))), core);
  Value res = b.select(reflect, refl, core);
  Value pole = op2(b, "and", cmpk(b, x, 0, Cmp::LE), cmp(b, op1(b, "floor", x), x, Cmp::EQ));
  return b.select(pole, cst(b, x, INFINITY), res);
}
}  // namespace

TPU_LOWER(lgamma_rule, "lgamma") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return lgamma(b, x[0]); });
}

// digamma like PyTorch: -inf at +0 (+inf at -0), NaN at negative integers, and for other negative x
// the reflection psi(x) = psi(1 - x) - pi / tan(pi * frac(x)), whose tangent of the
// fractional part stays accurate far from zero.
static Value digamma(Builder& b, const Value& x) {
  Value neg = cmpk(b, x, 0, ir::Cmp::LT);
  Value xr = b.select(neg, op2(b, "subtract", cst(b, x, 1), x), x);
  Value r = chlo(b, "chlo.digamma", {xr});
  Value frac = op2(b, "subtract", x, b.unary("stablehlo.round_nearest_afz", x));
  Value refl = op2(b, "divide", cst(b, x, M_PI), op1(b, "tan", op2(b, "multiply", cst(b, x, M_PI), frac)));
  r = b.select(neg, op2(b, "subtract", r, refl), r);
  Value integer = cmp(b, op1(b, "floor", x), x, ir::Cmp::EQ);
  r = b.select(b.binary("stablehlo.and", neg, integer), cst(b, x, NAN), r);
  // At zero -1/x: -inf at +0 and +inf at -0, as CPU's copysign(inf, -x).
  Value pole = op1(b, "negate", op2(b, "divide", cst(b, x, 1), x));
  return b.select(cmpk(b, x, 0, ir::Cmp::EQ), pole, r);
}

TPU_LOWER(digamma_rule, "digamma") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return digamma(b, x[0]); });
}

// polygamma(n, x): n is a plain int; n == 0 is digamma.
TPU_LOWER(polygamma_rule, "polygamma") {
  int64_t n = ctx.i(0);
  return map(ctx, {1}, [n](Builder& b, const Vs& x) {
    if (n == 0) return digamma(b, x[0]);
    // At +inf the derivatives vanish; at the poles (0, -1, -2, ...) they are +inf for
    // odd n and -inf for even n, as PyTorch gives.
    // XLA's polygamma loses accuracy for negative x: shift by K with the recurrence
    // psi_n(x) = psi_n(x + K) + (-1)^(n+1) n! sum_{j<K} (x + j)^-(n+1).
    constexpr int K = 24;
    Value neg = cmpk(b, x[0], 0, ir::Cmp::LT);
    Value far = cmpk(b, x[0], -K, ir::Cmp::LT);
    Value shifted = b.select(neg, op2(b, "add", x[0], cst(b, x[0], K)), x[0]);
    Value r = chlo(b, "chlo.polygamma", {cst(b, x[0], static_cast<double>(n)), shifted});
    Value sum = cst(b, x[0], 0);
    for (int j = 0; j < K; ++j)
      sum = op2(b, "add", sum, op2(b, "power", op2(b, "add", x[0], cst(b, x[0], j)), cst(b, x[0], -(n + 1.0))));
    double fact = 1;
    for (int64_t k = 2; k <= n; ++k) fact *= static_cast<double>(k);
    Value corr = op2(b, "multiply", sum, cst(b, x[0], (n % 2 ? 1.0 : -1.0) * fact));
    r = b.select(neg, op2(b, "add", r, corr), r);
    // Past -K the shift stays negative: the reflection
    // psi_n(x) = (-1)^n psi_n(1 - x) - pi d^n/dx^n cot(pi x), the derivative a polynomial
    // in c = cot(pi x) (d/dx c = -pi (1 + c^2)), with pi x reduced to its fractional part.
    std::vector<double> poly = {0, 1};  // coefficients of c^0, c^1, ...
    for (int64_t k = 0; k < n; ++k) {
      std::vector<double> next(poly.size() + 2, 0.0);
      for (size_t i = 1; i < poly.size(); ++i) {  // d/dc c^i = i c^(i-1), times -pi (1 + c^2)
        next[i - 1] += -M_PI * i * poly[i];
        next[i + 1] += -M_PI * i * poly[i];
      }
      poly = next;
    }
    Value frac = op2(b, "subtract", x[0], b.unary("stablehlo.round_nearest_afz", x[0]));
    // cot(pi f) = 1 / tan(pi |f|) near 0, tan(pi (1/2 - |f|)) near 1/2 (exactly 0 at half
    // integers, where an even n's term vanishes), signed as f.
    Value af = op1(b, "abs", frac);
    Value near0 = op2(b, "divide", cst(b, x[0], 1), op1(b, "tan", op2(b, "multiply", cst(b, x[0], M_PI), af)));
    Value near_half = op1(b, "tan", op2(b, "multiply", cst(b, x[0], M_PI), op2(b, "subtract", cst(b, x[0], 0.5), af)));
    Value c = b.select(cmpk(b, af, 0.25, ir::Cmp::LT), near0, near_half);
    c = b.select(cmpk(b, frac, 0, ir::Cmp::LT), op1(b, "negate", c), c);
    Value d = cst(b, x[0], poly.back());
    for (size_t i = poly.size() - 1; i-- > 0;) d = op2(b, "add", op2(b, "multiply", d, c), cst(b, x[0], poly[i]));
    Value mirror = chlo(b, "chlo.polygamma", {cst(b, x[0], static_cast<double>(n)),
                                              op2(b, "subtract", cst(b, x[0], 1), x[0])});
    Value refl = op2(b, "subtract", op2(b, "multiply", mirror, cst(b, x[0], n % 2 ? -1.0 : 1.0)),
                     op2(b, "multiply", d, cst(b, x[0], M_PI)));
    r = b.select(far, refl, r);
    Value pole = b.binary("stablehlo.and", cmpk(b, x[0], 0, ir::Cmp::LE),
                          cmp(b, op1(b, "floor", x[0]), x[0], ir::Cmp::EQ));
    r = b.select(pole, cst(b, x[0], n % 2 ? INFINITY : -INFINITY), r);
    return b.select(cmpk(b, x[0], INFINITY, ir::Cmp::EQ), cst(b, x[0], 0), r);
  });
}

// CHLO's erf_inv; in float32 math refined by one Newton step on erf(y) = |x| (CHLO's float32
// fit was up to 60 ulp off near +-1). The residual is (1 - |x|) - erfc(y) from |x| = 1/2 on
// (1 - |x| is exact there and erfc keeps its relative accuracy, where erf(y) would be
// rounded next to 1), erf(y) - |x| below.
static Value erfinv(Builder& b, const Value& x) {
  Value y = chlo(b, "chlo.erf_inv", {x});
  if (x.dtype() == DType::F64) return y;
  Value a = op1(b, "abs", x), ya = op1(b, "abs", y);
  Value res = b.select(cmpk(b, a, 0.5, ir::Cmp::LT), op2(b, "subtract", erf(b, ya), a),
                       op2(b, "subtract", op2(b, "subtract", cst(b, a, 1), a), erfc(b, ya)));
  Value slope = op2(b, "multiply", cst(b, x, M_2_SQRTPI), op1(b, "exponential", op1(b, "negate", op2(b, "multiply", ya, ya))));
  Value refined = op2(b, "subtract", ya, op2(b, "divide", res, slope));
  refined = b.select(cmpk(b, a, 1, ir::Cmp::LT), refined, ya);  // +-1 (inf), beyond (NaN)
  refined = b.select(cmpk(b, x, 0, ir::Cmp::LT), op1(b, "negate", refined), refined);
  return b.select(cmpk(b, x, 0, ir::Cmp::EQ), x, refined);  // keeps -0
}

TPU_LOWER(erfinv_rule, "erfinv") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return erfinv(b, x[0]); });
}

TPU_LOWER(i1e_rule, "special_i1e") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return chlo(b, "chlo.bessel_i1e", {x[0]}); });
}

TPU_LOWER(i1_rule, "special_i1") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) {
    return b.binary("stablehlo.multiply", chlo(b, "chlo.bessel_i1e", {x[0]}), op1(b, "exponential", op1(b, "abs", x[0])));
  });
}

}  // namespace tpu::lowering
