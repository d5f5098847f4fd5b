// Special functions XLA provides as CHLO ops (lowered to StableHLO by the plugin's
// compiler): log-gamma, digamma, polygamma, the inverse error function and the
// scaled modified Bessel function of order one.
#include <cmath>

#include "lowering/elementwise.h"

namespace tpu::lowering {

using namespace ew;

static Value chlo(Builder& b, const char* op, const Vs& args) { return b.raw(op, args, "", args[0].type); }

TPU_LOWER(lgamma_rule, "lgamma") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return chlo(b, "chlo.lgamma", {x[0]}); });
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

TPU_LOWER(erfinv_rule, "erfinv") {
  return map(ctx, {0}, [](Builder& b, const Vs& x) { return chlo(b, "chlo.erf_inv", {x[0]}); });
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
