// Samplers whose draws are rejection loops: standard gamma (Marsaglia-Tsang), Dirichlet
// (normalized gammas), Poisson (Knuth's product of uniforms, PTRS for large rates) and
// binomial (geometric-gap inversion, BTRS for large means), with CPU's answers for the
// boundary parameters; and the gamma sample's reparameterized gradient.
//
// All elements draw at once, round after round of a stablehlo.while, until each has
// accepted a candidate. A round's bits come from a rng_bit_generator state the loop
// carries, seeded from the op's generator (ctx.random_bits), so the samples follow
// torch.manual_seed, tpu Generators and their states as the other random ops do.
#include <cmath>
#include <functional>
#include <limits>

#include "lowering/random_util.h"
#include "lowering/special_util.h"

namespace tpu::lowering {
namespace {
using namespace sp;

// A guard, far above what any element needs: each round accepts most candidates, and
// the counting loops (Knuth, inversion) take about their small mean's count of rounds.
constexpr int kMaxRounds = 100000;

// Uniforms in [0, 1) of dtype t (f32 or f64) shaped s, from the loop's rng state `key`,
// which advances.
Value draw(Builder& b, Value& key, DType t, const Shape& s) {
  auto [next, bits] = b.rng_bit_generator(key, Type{t == DType::F64 ? DType::U64 : DType::U32, s});
  key = next;
  return rnd::unit_floats(b, bits, t);
}

// One round of a sampler over all elements: draws with `key` and returns which elements
// accepted a candidate. It updates `vals` (the loop's values, invariants included), but
// not an element's result once that element is `done`: its first acceptance stands.
using Round = std::function<Value(Builder&, Value& key, const Value& done, Vs& vals)>;

// Runs `round` until every element is done (those `done` at first never draw); returns
// `vals` as the last round left them.
Vs until_accepted(Ctx& ctx, const Value& done, const Vs& vals, const Round& round) {
  Builder& b = ctx.b;
  Vs init{b.constant(0, DType::I32), ctx.random_bits(Type{DType::U64, {2}}), done};
  init.insert(init.end(), vals.begin(), vals.end());
  Vs out = b.while_loop(
      init,
      [](Builder& c, const Vs& s) {
        Value more = c.compare(s[0], c.constant(kMaxRounds, DType::I32), Cmp::LT);
        return Vs{and_(c, more, any_true(c, not_(c, s[2])))};
      },
      [&](Builder& c, const Vs& s) {
        Value key = s[1];
        Vs v(s.begin() + 3, s.end());
        Value done = or_(c, s[2], round(c, key, s[2], v));
        Vs next{add(c, s[0], c.constant(1, DType::I32)), key, done};
        next.insert(next.end(), v.begin(), v.end());
        return next;
      });
  return Vs(out.begin() + 3, out.end());
}

Value lgamma_(Builder& b, const Value& x) { return b.raw("chlo.lgamma", {x}, "", x.type); }
Value digamma_(Builder& b, const Value& x) { return b.raw("chlo.digamma", {x}, "", x.type); }
Value log1p_(Builder& b, const Value& x) { return op1(b, "log_plus_one", x); }
Value floor_(Builder& b, const Value& x) { return op1(b, "floor", x); }
// x where `keep` holds, else the constant v.
Value or_const(Builder& b, const Value& keep, const Value& x, double v) { return b.select(keep, x, K(b, x, v)); }

double smallest_normal(DType t) {
  return t == DType::F64 ? std::numeric_limits<double>::min() : std::numeric_limits<float>::min();
}
double below_one(DType t) { return t == DType::F64 ? std::nextafter(1.0, 0.0) : std::nextafter(1.0f, 0.0f); }

// CPU's kernels for these ops take float32 and float64 only (poisson also half types).
void require_f32_f64(const Type& o, const char* what) {
  if (o.dtype != DType::F32 && o.dtype != DType::F64) throw DtypeNotImplemented(what);
}

// log of standard gamma samples, one per element of alpha (f32 or f64), drawn as CPU's
// sampler draws them: alpha < 1 is boosted to alpha + 1 and the sample scaled by
// (1 - u)^(1 / alpha); then Marsaglia and Tsang's squeeze and rejection tests on
// d (1 + c x)^3. In logs, so that a tiny alpha's tiny samples survive until a Dirichlet
// normalizes them. alpha = 0 gives -inf; alphas CPU's loop cannot sample (d <= 0 or
// NaN: alpha <= -2/3, NaN) give NaN, which CPU's clamps then replace.
Value log_standard_gamma(Ctx& ctx, const Value& alpha) {
  Builder& b = ctx.b;
  DType t = alpha.dtype();
  Value boost = cmpk(b, alpha, 1, Cmp::LT);
  Value a = b.select(boost, add(b, alpha, K(b, alpha, 1)), alpha);
  Value d = sub(b, a, K(b, a, 1.0 / 3));
  Value c = div(b, K(b, d, 1), sqrt_(b, mul(b, K(b, d, 9), d)));
  Value zero = cmpk(b, alpha, 0, Cmp::EQ);
  Value bad = not_(b, cmpk(b, d, 0, Cmp::GT));
  auto v = until_accepted(ctx, or_(b, zero, bad), {d, c, K(b, d, 1)},
                          [t](Builder& r, Value& key, const Value& done, Vs& v) {
    const Value &d = v[0], &c = v[1];
    const Shape& s = d.shape();
    Value x = rnd::box_muller(r, draw(r, key, t, s), draw(r, key, t, s));
    Value u = sub(r, K(r, d, 1), draw(r, key, t, s));  // in (0, 1]
    Value y = add(r, K(r, c, 1), mul(r, c, x));
    Value cube = mul(r, mul(r, y, y), y), xx = mul(r, x, x);
    Value squeeze = cmp(r, u, sub(r, K(r, xx, 1), mul(r, K(r, xx, 0.0331), mul(r, xx, xx))), Cmp::LT);
    Value bound = add(r, mul(r, K(r, xx, 0.5), xx), mul(r, d, add(r, sub(r, K(r, cube, 1), cube), log_(r, cube))));
    Value ok = and_(r, cmpk(r, y, 0, Cmp::GT), or_(r, squeeze, cmp(r, log_(r, u), bound, Cmp::LT)));
    Value take = and_(r, ok, not_(r, done));
    v[2] = r.select(take, cube, v[2]);
    return ok;
  });
  // The boost's uniform, one per element, outside the loop.
  Value u0 = rnd::unit_floats(b, ctx.random_bits(Type{t == DType::F64 ? DType::U64 : DType::U32, alpha.shape()}), t);
  Value log_scale = or_const(b, boost, div(b, log1p_(b, neg_(b, u0)), alpha), 0);
  Value lg = add(b, add(b, log_(b, d), log_(b, v[2])), log_scale);
  lg = b.select(zero, K(b, lg, -INFINITY), lg);
  return b.select(bad, K(b, lg, NAN), lg);
}

}  // namespace

// Clamped as CPU's: at least the smallest normal (0 and NaN samples become it).
TPU_LOWER(standard_gamma_rule, "_standard_gamma") {
  Type o = ctx.out(0);
  require_f32_f64(o, "gamma_cpu");
  Builder& b = ctx.b;
  Value g = exp_(b, log_standard_gamma(ctx, coerce(b, ctx.in(0), o.dtype, o.shape)));
  Value tiny = K(b, g, smallest_normal(o.dtype));
  return {b.select(cmp(b, g, tiny, Cmp::GT), g, tiny)};
}

// Gammas normalized along the last dim. CPU draws them in double and clamps each at
// double's smallest normal before normalizing (a row of zeros, alpha = 0, gives 1/K
// each); the same clamp on their logs keeps that law in any precision. The result lies
// in [smallest normal, largest below 1] (a NaN ratio becomes the smallest normal).
TPU_LOWER(sample_dirichlet_rule, "_sample_dirichlet") {
  Type o = ctx.out(0);
  require_f32_f64(o, "dirichlet");
  Builder& b = ctx.b;
  Shape s = o.shape.empty() ? Shape{1} : o.shape;
  int64_t last = static_cast<int64_t>(s.size()) - 1;
  std::vector<int64_t> rows(last);
  for (int64_t i = 0; i < last; ++i) rows[i] = i;
  Value lg = log_standard_gamma(ctx, b.reshape(coerce(b, ctx.in(0), o.dtype, o.shape), s));
  Value floor = K(b, lg, std::log(std::numeric_limits<double>::min()));
  lg = b.select(cmp(b, lg, floor, Cmp::GT), lg, floor);
  Value top = b.broadcast_in_dim(reduce_max(b, lg, {last}), s, rows);
  Value e = exp_(b, sub(b, lg, top));
  Value r = div(b, e, b.broadcast_in_dim(reduce_sum(b, e, {last}), s, rows));
  Value lo = K(b, r, smallest_normal(o.dtype)), hi = K(b, r, below_one(o.dtype));
  r = b.select(cmp(b, r, lo, Cmp::GT), r, lo);
  r = b.select(cmp(b, r, hi, Cmp::LT), r, hi);
  return {b.reshape(r, o.shape)};
}

// Poisson counts, in double as CPU's sampler: a rate below 10 multiplies uniforms until
// the product falls to exp(-rate) (Knuth; the count is the factors before that), a larger
// one takes Hormann's transformed rejection with squeeze (PTRS). One loop per method,
// each over the elements of its rates (a loop with none runs no round). A negative or
// NaN rate fails CPU's check; rate 0 gives 0 and an infinite one CPU's int64
// overflow, -2^63.
TPU_LOWER(poisson_rule, "poisson") {
  Type o = ctx.out(0);
  if (o.dtype != DType::F32 && o.dtype != DType::F64 && o.dtype != DType::F16 && o.dtype != DType::BF16)
    throw DtypeNotImplemented("poisson_cpu");
  Builder& b = ctx.b;
  Value lam = coerce(b, ctx.in(0), DType::F64, o.shape);
  ctx.check(all_true(b, cmpk(b, lam, 0, Cmp::GE)),
            "RuntimeError: invalid Poisson rate, expected rate to be non-negative");
  Value fixed = or_(b, not_(b, cmpk(b, lam, 0, Cmp::GT)), isinf_(b, lam));
  Value small = cmpk(b, lam, 10, Cmp::LT);
  Value zero = K(b, lam, 0);
  Value knuth = until_accepted(ctx, or_(b, fixed, not_(b, small)), {exp_(b, neg_(b, lam)), K(b, lam, 1), zero},
                               [](Builder& r, Value& key, const Value& done, Vs& v) {
    const Value &floor = v[0], &prod = v[1], &n = v[2];
    Value p1 = mul(r, prod, draw(r, key, DType::F64, prod.shape()));
    Value more = and_(r, cmp(r, p1, floor, Cmp::GT), not_(r, done));
    v[1] = p1;
    v[2] = r.select(more, add(r, n, K(r, n, 1)), n);
    return not_(r, more);
  })[2];
  // PTRS: k from a transformed uniform, taken in the squeeze box or by the density.
  Value bb = add(b, K(b, lam, 0.931), mul(b, K(b, lam, 2.53), sqrt_(b, lam)));
  Value a = add(b, K(b, bb, -0.059), mul(b, K(b, bb, 0.02483), bb));
  Value log_inv_alpha = log_(b, add(b, K(b, bb, 1.1239), div(b, K(b, bb, 1.1328), sub(b, bb, K(b, bb, 3.4)))));
  Value vr = sub(b, K(b, bb, 0.9277), div(b, K(b, bb, 3.6224), sub(b, bb, K(b, bb, 2))));
  Value ptrs = until_accepted(ctx, or_(b, fixed, small), {lam, log_(b, lam), bb, a, log_inv_alpha, vr, zero},
                              [](Builder& r, Value& key, const Value& done, Vs& v) {
    const Value &lam = v[0], &loglam = v[1], &bb = v[2], &a = v[3], &log_inv_alpha = v[4], &vr = v[5];
    Value u = sub(r, draw(r, key, DType::F64, lam.shape()), K(r, lam, 0.5));
    Value w = draw(r, key, DType::F64, lam.shape());
    Value us = sub(r, K(r, u, 0.5), abs_(r, u));
    Value k = floor_(r, add(r, mul(r, add(r, div(r, mul(r, K(r, a, 2), a), us), bb), u), add(r, lam, K(r, lam, 0.43))));
    Value quick = and_(r, cmpk(r, us, 0.07, Cmp::GE), cmp(r, w, vr, Cmp::LE));
    Value out = or_(r, cmpk(r, k, 0, Cmp::LT), and_(r, cmpk(r, us, 0.013, Cmp::LT), cmp(r, w, us, Cmp::GT)));
    Value lhs = sub(r, add(r, log_(r, w), log_inv_alpha), log_(r, add(r, div(r, a, mul(r, us, us)), bb)));
    Value rhs = sub(r, sub(r, mul(r, k, loglam), lam), lgamma_(r, add(r, k, K(r, k, 1))));
    Value took = or_(r, quick, and_(r, not_(r, out), cmp(r, lhs, rhs, Cmp::LE)));
    v[6] = r.select(and_(r, took, not_(r, done)), k, v[6]);
    return took;
  })[6];
  Value n = or_const(b, cmpk(b, lam, 0, Cmp::GT), b.select(small, knuth, ptrs), 0);
  n = or_const(b, not_(b, isinf_(b, lam)), n, -9223372036854775808.0);
  return {b.convert(n, o.dtype)};
}

// Binomial counts, in double as CPU's sampler, on q = min(p, 1 - p) (the count is
// mirrored for p > 1/2): where n q < 10, inversion (the geometric gaps between successes
// that fit in n trials, one per round), else Hormann's BTRS (transformed rejection with a
// squeeze box), each in a loop of its own. CPU's answers at the edges: 0 for n <= 0 or
// p <= 0, n for p >= 1, NaN for a NaN p (and for a NaN or infinite n, where CPU's loop
// would not end or gives NaN).
TPU_LOWER(binomial_rule, "binomial") {
  Type o = ctx.out(0);
  require_f32_f64(o, "binomial_cpu");
  Builder& b = ctx.b;
  Value n = coerce(b, ctx.in(0), DType::F64, o.shape), p = coerce(b, ctx.in(1), DType::F64, o.shape);
  Value one = K(b, n, 1), zero = K(b, n, 0);
  Value flip = cmpk(b, p, 0.5, Cmp::GT);
  Value q = b.select(flip, sub(b, one, p), p);
  Value none = or_(b, cmpk(b, n, 0, Cmp::LE), cmpk(b, p, 0, Cmp::LE));
  Value all = and_(b, not_(b, none), cmpk(b, p, 1, Cmp::GE));
  Value undefined = and_(b, not_(b, or_(b, none, all)), or_(b, or_(b, isnan_(b, p), isnan_(b, n)), isinf_(b, n)));
  Value fixed = or_(b, or_(b, none, all), undefined);
  Value btrs = cmpk(b, mul(b, n, q), 10, Cmp::GE);
  // Inversion: add the next gap (a geometric count of trials) until the gaps pass n.
  Value inverted = until_accepted(ctx, or_(b, fixed, btrs), {n, log1p_(b, neg_(b, q)), zero, zero},
                                  [](Builder& r, Value& key, const Value& done, Vs& v) {
    const Value &n = v[0], &log_q = v[1], &gaps = v[2], &x = v[3];
    Value gap = op1(r, "ceil", div(r, log_(r, draw(r, key, DType::F64, n.shape())), log_q));
    Value gaps1 = add(r, gaps, gap);
    Value fits = and_(r, not_(r, cmp(r, gaps1, n, Cmp::GT)), not_(r, done));
    v[2] = gaps1;
    v[3] = r.select(fits, add(r, x, K(r, x, 1)), x);
    return not_(r, fits);
  })[3];
  // BTRS, with the mode m's log-probability h as the density's reference.
  Value spq = sqrt_(b, mul(b, mul(b, n, q), sub(b, one, q)));
  Value bb = add(b, K(b, spq, 1.15), mul(b, K(b, spq, 2.53), spq));
  Value a = add(b, add(b, K(b, bb, -0.0873), mul(b, K(b, bb, 0.0248), bb)), mul(b, K(b, q, 0.01), q));
  Value c = add(b, mul(b, n, q), K(b, n, 0.5));
  Value vr = sub(b, K(b, bb, 0.92), div(b, K(b, bb, 4.2), bb));
  Value log_alpha = log_(b, mul(b, add(b, K(b, bb, 2.83), div(b, K(b, bb, 5.1), bb)), spq));
  Value lpq = log_(b, div(b, q, sub(b, one, q)));
  Value m = floor_(b, mul(b, add(b, n, one), q));
  Value h = add(b, lgamma_(b, add(b, m, one)), lgamma_(b, add(b, sub(b, n, m), one)));
  Value rejected = until_accepted(ctx, or_(b, fixed, not_(b, btrs)), {n, bb, a, c, vr, log_alpha, lpq, m, h, zero},
                                  [](Builder& r, Value& key, const Value& done, Vs& v) {
    const Value &n = v[0], &bb = v[1], &a = v[2], &c = v[3], &vr = v[4], &log_alpha = v[5], &lpq = v[6],
                &m = v[7], &h = v[8];
    Value one = K(r, n, 1);
    Value u = sub(r, draw(r, key, DType::F64, n.shape()), K(r, n, 0.5));
    Value w = draw(r, key, DType::F64, n.shape());
    Value us = sub(r, K(r, u, 0.5), abs_(r, u));
    Value k = floor_(r, add(r, mul(r, add(r, div(r, mul(r, K(r, a, 2), a), us), bb), u), c));
    Value inside = and_(r, cmpk(r, k, 0, Cmp::GE), cmp(r, k, n, Cmp::LE));
    Value quick = and_(r, cmpk(r, us, 0.07, Cmp::GE), cmp(r, w, vr, Cmp::LE));
    Value lhs = sub(r, add(r, log_(r, w), log_alpha), log_(r, add(r, div(r, a, mul(r, us, us)), bb)));
    Value rhs = add(r, sub(r, sub(r, h, lgamma_(r, add(r, k, one))), lgamma_(r, add(r, sub(r, n, k), one))),
                    mul(r, sub(r, k, m), lpq));
    Value took = and_(r, inside, or_(r, quick, cmp(r, lhs, rhs, Cmp::LE)));
    v[9] = r.select(and_(r, took, not_(r, done)), k, v[9]);
    return took;
  })[9];
  Value x = b.select(btrs, rejected, inverted);
  x = b.select(flip, sub(b, n, x), x);
  x = b.select(undefined, K(b, x, NAN), x);
  x = b.select(all, n, x);
  x = or_const(b, not_(b, none), x, 0);
  return {b.convert(x, o.dtype)};
}

// d sample / d alpha of a standard gamma sample x (the reparameterized gradient,
// -(d cdf / d alpha) / pdf), in double with CPU's three approximations: a series in x
// for x < 0.8 (0 where it is NaN), Rice's saddle-point expansion for alpha > 8, else a
// bivariate rational fit in log(x / alpha) and log(alpha). CPU's thresholds are float
// constants widened to double.
TPU_LOWER(standard_gamma_grad_rule, "_standard_gamma_grad") {
  Type o = ctx.out(0);
  require_f32_f64(o, "_standard_gamma_grad_cpu");
  Builder& b = ctx.b;
  Value a = coerce(b, ctx.in(0), DType::F64, o.shape), x = coerce(b, ctx.in(1), DType::F64, o.shape);
  Value one = K(b, a, 1);
  auto pow_ = [&](const Value& base, const Value& e) { return op2(b, "power", base, e); };
  // Series: the lower incomplete gamma's terms x^(a+i) (-1)^i / (i! (a+i)) and their
  // derivatives in a.
  Value numer = one, denom = a;
  Value s1 = div(b, one, a), s2 = div(b, one, mul(b, a, a));
  for (int i = 1; i <= 5; ++i) {
    numer = mul(b, numer, div(b, neg_(b, x), K(b, x, i)));
    denom = add(b, denom, one);
    s1 = add(b, s1, div(b, numer, denom));
    s2 = add(b, s2, div(b, numer, mul(b, denom, denom)));
  }
  Value x_a = pow_(x, a);
  Value pdf = mul(b, pow_(x, sub(b, a, one)), exp_(b, neg_(b, x)));
  Value cdf_a = sub(b, mul(b, sub(b, log_(b, x), digamma_(b, a)), mul(b, x_a, s1)), mul(b, x_a, s2));
  Value series = neg_(b, div(b, cdf_a, pdf));
  series = b.select(isnan_(b, series), K(b, series, 0), series);
  // Saddle point, with a closed form next to x = alpha where the expansion is singular.
  Value aa = mul(b, a, a);
  Value near_num1 = add(b, one, mul(b, mul(b, K(b, a, 24), a), add(b, one, mul(b, K(b, a, 12), a))));
  Value near_num2 = add(b, sub(b, add(b, mul(b, K(b, a, 1440), aa),
                                     mul(b, mul(b, K(b, x, 6), x), sub(b, K(b, x, 53), mul(b, K(b, x, 120), x)))),
                               div(b, mul(b, mul(b, K(b, x, 65), x), x), a)),
                        mul(b, a, add(b, K(b, x, 107), mul(b, K(b, x, 3600), x))));
  Value near = div(b, mul(b, near_num1, near_num2), mul(b, K(b, a, 1244160), mul(b, aa, aa)));
  Value root = sqrt_(b, mul(b, K(b, a, 8), a));
  Value t2 = div(b, root, sub(b, a, x));
  Value log_ratio = log_(b, div(b, x, a));
  Value t3 = pow_(sub(b, sub(b, x, a), mul(b, a, log_ratio)), K(b, a, -1.5));
  Value t23 = b.select(cmp(b, x, a, Cmp::LT), sub(b, t2, t3), add(b, t2, t3));
  Value ax = sub(b, a, x);
  Value t1 = sub(b, mul(b, log_ratio, t23),
                 div(b, mul(b, sqrt_(b, div(b, K(b, a, 2), a)), add(b, a, x)), mul(b, ax, ax)));
  Value stirling = add(b, one, mul(b, div(b, one, mul(b, K(b, a, 12), a)), add(b, one, div(b, one, mul(b, K(b, a, 24), a)))));
  Value far = neg_(b, div(b, mul(b, stirling, mul(b, x, t1)), root));
  Value by_mean = and_(b, cmp(b, mul(b, K(b, a, static_cast<double>(0.9f)), a), x, Cmp::LE),
                       cmp(b, x, mul(b, K(b, a, static_cast<double>(1.1f)), a), Cmp::LE));
  Value saddle = b.select(by_mean, near, far);
  // Rational fit: exp(p / q), p and q cubics in log(alpha) whose coefficients are
  // quadratics in log(x / alpha).
  static const double fit[3][8] = {
      {0.16009398, -0.094634809, 0.025146376, -0.0030648343, 1, 0.32668115, 0.10406089, 0.0014179084},
      {0.53487893, 0.1298071, 0.065735949, -0.0015649758, 0.16639465, 0.020070113, -0.0035938915,
       -0.00058392623},
      {0.040121004, -0.0065914022, -0.0026286047, -0.0013441777, 0.017050642, -0.0021309326, 0.00085092367,
       -1.5247877e-07},
  };
  Value la = log_(b, a);
  std::vector<Value> coef;
  for (int i = 0; i < 8; ++i)
    coef.push_back(add(b, K(b, a, fit[0][i]), mul(b, log_ratio, add(b, K(b, a, fit[1][i]), mul(b, log_ratio, K(b, a, fit[2][i]))))));
  auto cubic = [&](int at) {
    return add(b, coef[at], mul(b, la, add(b, coef[at + 1], mul(b, la, add(b, coef[at + 2], mul(b, la, coef[at + 3]))))));
  };
  Value rational = exp_(b, div(b, cubic(0), cubic(4)));
  Value g = b.select(cmpk(b, a, 8, Cmp::GT), saddle, rational);
  g = b.select(cmpk(b, x, static_cast<double>(0.8f), Cmp::LT), series, g);
  return {b.convert(g, o.dtype)};
}

// d x / d alpha for x ~ Beta(alpha, total - alpha), divided by 1 - x: the Dirichlet
// sample's reparameterized gradient, with CPU's four approximations: Taylor series in x
// for x near 0 or near 1 (0 where NaN), Rice's saddle point when alpha and beta are both
// above 6, else a rational correction to x (digamma(total) - digamma(alpha)) / beta.
// CPU chooses among them, runs the series and takes the digammas in the input's dtype
// (float32's cancel in those differences), the rest in double; so does this rule.
TPU_LOWER(dirichlet_grad_rule, "_dirichlet_grad") {
  Type o = ctx.out(0);
  require_f32_f64(o, "_dirichlet_grad_cpu");
  Builder& b = ctx.b;
  Value xs = coerce(b, ctx.in(0), o.dtype, o.shape), alphas = coerce(b, ctx.in(1), o.dtype, o.shape);
  Value totals = coerce(b, ctx.in(2), o.dtype, o.shape);
  Value betas = sub(b, totals, alphas);
  Value ones = K(b, xs, 1);
  Value boundary = mul(b, mul(b, totals, xs), sub(b, ones, xs));
  Value near0 = and_(b, cmpk(b, xs, 0.5, Cmp::LE), cmpk(b, boundary, 2.5, Cmp::LT));
  Value near1 = and_(b, cmpk(b, xs, 0.5, Cmp::GE), cmpk(b, boundary, 0.75, Cmp::LT));
  Value large = and_(b, cmpk(b, alphas, 6, Cmp::GT), cmpk(b, betas, 6, Cmp::GT));
  // digamma of an input-dtype value, rounded to that dtype.
  auto digamma_in = [&](const Value& v) { return b.convert(digamma_(b, b.convert(v, DType::F64)), v.dtype()); };
  auto zero_nan = [&](const Value& v) { return b.select(isnan_(b, v), K(b, v, 0), v); };
  auto pow_ = [&](const Value& base, const Value& e) { return op2(b, "power", base, e); };
  auto sq = [&](const Value& v) { return mul(b, v, v); };
  // Near 0: the series of alpha's derivative of the incomplete beta function.
  Value small_a;
  {
    Value factor = sub(b, sub(b, digamma_in(alphas), digamma_in(add(b, alphas, betas))), log_(b, xs));
    Value numer = ones;
    Value series = mul(b, div(b, numer, alphas), add(b, factor, div(b, ones, alphas)));
    for (int i = 1; i <= 10; ++i) {
      Value fi = K(b, xs, i);
      numer = mul(b, numer, div(b, mul(b, sub(b, fi, betas), xs), fi));
      Value denom = add(b, alphas, fi);
      series = add(b, series, mul(b, div(b, numer, denom), add(b, factor, div(b, ones, denom))));
    }
    small_a = zero_nan(mul(b, mul(b, xs, pow_(sub(b, ones, xs), neg_(b, betas))), series));
  }
  // Near 1: beta's series at 1 - x, with the roles of alpha and beta swapped.
  Value small_b;
  {
    Value y = sub(b, ones, xs);
    Value factor = sub(b, digamma_in(add(b, betas, alphas)), digamma_in(alphas));
    Value numer = ones, prod = ones, dprod = K(b, xs, 0);
    Value series = div(b, factor, betas);
    for (int i = 1; i <= 8; ++i) {
      Value fi = K(b, xs, i);
      numer = mul(b, numer, div(b, neg_(b, y), fi));
      dprod = add(b, mul(b, dprod, sub(b, alphas, fi)), prod);
      prod = mul(b, prod, sub(b, alphas, fi));
      series = add(b, series, mul(b, div(b, numer, add(b, betas, fi)), add(b, dprod, mul(b, factor, prod))));
    }
    small_b = zero_nan(mul(b, pow_(sub(b, ones, y), sub(b, ones, alphas)), series));  // the mirror's sign, twice
  }
  auto wide = [&](const Value& v) { return b.convert(v, DType::F64); };
  Value x = wide(xs), alpha = wide(alphas), total = wide(totals);
  Value beta = sub(b, total, alpha), one = K(b, x, 1);
  // Saddle point, with a closed form within a tenth of a standard deviation of the mean.
  Value mid;
  {
    Value mean = div(b, alpha, total);
    Value sd = div(b, sqrt_(b, div(b, mul(b, alpha, beta), add(b, total, one))), total);
    Value by_mean = and_(b, cmp(b, sub(b, mean, mul(b, K(b, sd, 0.1), sd)), x, Cmp::LE),
                         cmp(b, x, add(b, mean, mul(b, K(b, sd, 0.1), sd)), Cmp::LE));
    Value a = alpha, bt = beta, bb = sq(beta), omx = sub(b, one, x);
    auto k = [&](double v) { return K(b, x, v); };
    Value inner = mul(b, mul(b, k(8), omx), sub(b, mul(b, k(135), bt), k(11)));
    inner = add(b, mul(b, add(b, sub(b, k(453), mul(b, k(455), x)), mul(b, mul(b, k(1620), bt), omx)), bt), mul(b, a, inner));
    inner = add(b, mul(b, mul(b, k(3), sub(b, add(b, k(59), mul(b, k(180), bt)), mul(b, k(90), x))), bb), mul(b, a, inner));
    inner = add(b, mul(b, mul(b, add(b, k(43), mul(b, mul(b, k(20), add(b, k(16), mul(b, k(27), bt))), x)), bb), bt),
                mul(b, a, inner));
    Value poly = add(b, mul(b, mul(b, k(47), x), mul(b, bb, bb)), mul(b, a, inner));
    Value pre_num = div(b, mul(b, add(b, one, mul(b, k(12), a)), add(b, one, mul(b, k(12), bt))), sq(total));
    Value pre_den = mul(b, mul(b, mul(b, mul(b, mul(b, k(12960), a), a), a), bb), add(b, one, mul(b, k(12), total)));
    Value closed = div(b, mul(b, div(b, pre_num, omx), poly), pre_den);
    Value prefactor = div(b, neg_(b, x), sqrt_(b, div(b, mul(b, mul(b, k(2), a), bt), total)));
    auto st = [&](const Value& v) {
      return add(b, add(b, one, div(b, one, mul(b, k(12), v))), div(b, one, mul(b, k(288), sq(v))));
    };
    Value stirling = div(b, mul(b, st(a), st(bt)), st(total));
    Value xm1 = sub(b, x, one);
    Value t1_num = sub(b, add(b, mul(b, mul(b, k(2), sq(a)), xm1), mul(b, mul(b, a, bt), xm1)), mul(b, x, bb));
    Value axbx = add(b, mul(b, a, xm1), mul(b, bt, x));
    Value t1_den = mul(b, mul(b, sqrt_(b, div(b, mul(b, k(2), a), bt)), pow_(total, k(1.5))), sq(axbx));
    Value t2 = mul(b, k(0.5), log_(b, div(b, a, mul(b, total, x))));
    Value t3 = div(b, sqrt_(b, div(b, mul(b, mul(b, k(8), a), bt), total)), add(b, mul(b, bt, x), mul(b, a, xm1)));
    Value t4_base = add(b, mul(b, bt, log_(b, div(b, bt, mul(b, total, omx)))), mul(b, a, log_(b, div(b, a, mul(b, total, x)))));
    Value t4 = pow_(t4_base, k(-1.5));
    Value t4s = b.select(cmp(b, x, mean, Cmp::LT), t4, neg_(b, t4));
    Value t1234 = add(b, div(b, t1_num, t1_den), mul(b, t2, add(b, t3, t4s)));
    mid = b.select(by_mean, closed, mul(b, mul(b, stirling, prefactor), t1234));
  }
  // Rational correction: p / q, each a sum over u^i a^j of cubics in b, with u = log x,
  // a = log(alpha) - u, b = log(total) - a.
  static const double fit[2][3][3][4] = {
      {{{1.003668233, -0.01061107488, -0.0657888334, 0.01201642863},
        {0.6336835991, -0.3557432599, 0.05486251648, -0.001465281033},
        {-0.03276231906, 0.004474107445, 0.002429354597, -0.0001557569013}},
       {{0.221950385, -0.3187676331, 0.01799915743, 0.01074823814},
        {-0.2951249643, 0.06219954479, 0.01535556598, 0.001550077057},
        {0.02155310298, 0.004170831599, 0.001292462449, 6.976601077e-05}},
       {{-0.05980841433, 0.008441916499, 0.01085618172, 0.002319392565},
        {0.02911413504, 0.01400243777, -0.002721828457, 0.000751041181},
        {0.005900514878, -0.001936558688, -9.495446725e-06, 5.385558597e-05}}},
      {{{1, -0.02924021934, -0.04438342661, 0.007285809825},
        {0.6357567472, -0.3473456711, 0.05454656494, -0.002407477521},
        {-0.03301322327, 0.004845219414, 0.00231480583, -0.0002307248149}},
       {{0.5925320577, -0.1757678135, 0.01505928619, 0.000564515273},
        {0.1014815858, -0.06589186703, 0.01272886114, -0.0007316646956},
        {-0.007258481865, 0.001096195486, 0.0003934994223, -4.12701925e-05}},
       {{0.06469649321, -0.0236701437, 0.002902096474, -5.896963079e-05},
        {0.001925008108, -0.002869809258, 0.0008000589141, -6.063713228e-05},
        {-0.0003477407336, 6.959756487e-05, 1.097287507e-05, -1.650964693e-06}}},
  };
  Value u = log_(b, x);
  Value la = sub(b, log_(b, alpha), u);
  Value lb = sub(b, log_(b, total), la);
  Value pow_u[3] = {one, u, sq(u)}, pow_a[3] = {one, la, sq(la)};
  Value pq[2] = {K(b, x, 0), K(b, x, 0)};
  for (int w = 0; w < 2; ++w)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) {
        const double* c = fit[w][i][j];
        Value cubic = add(b, K(b, lb, c[0]), mul(b, lb, add(b, K(b, lb, c[1]), mul(b, lb, add(b, K(b, lb, c[2]), mul(b, lb, K(b, lb, c[3])))))));
        pq[w] = add(b, pq[w], mul(b, mul(b, pow_u[i], pow_a[j]), cubic));
      }
  Value approx = div(b, mul(b, x, wide(sub(b, digamma_in(totals), digamma_in(alphas)))), beta);
  Value g = mul(b, div(b, pq[0], pq[1]), approx);
  g = b.convert(b.select(large, mid, g), o.dtype);
  g = b.select(near1, small_b, g);
  return {b.select(near0, small_a, g)};
}

}  // namespace tpu::lowering
