// Bessel functions of the first and second kind (orders 0 and 1), Airy's Ai and the
// spherical j0, evaluated like PyTorch's CPU kernels: Cephes' rational fits below
// x = 5 and its asymptotic (amplitude/phase) fits above, in the op's float type.
#include <cmath>

#include "lowering/special_util.h"

namespace tpu::lowering {
namespace {

using namespace sp;

// Published Cephes coefficients (highest power first).
const std::vector<double> AI_AN = {
    3.46538101525629032477e-01, 1.20075952739645805542e+01, 7.62796053615234516538e+01,
    1.68089224934630576269e+02, 1.59756391350164413639e+02, 7.05360906840444183113e+01,
    1.40264691163389668864e+01, 9.99999999999999995305e-01};
const std::vector<double> AI_AD = {
    5.67594532638770212846e-01, 1.47562562584847203173e+01, 8.45138970141474626562e+01,
    1.77318088145400459522e+02, 1.64234692871529701831e+02, 7.14778400825575695274e+01,
    1.40959135607834029598e+01, 1.00000000000000000470e+00};
const std::vector<double> AI_AFN = {
    -1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01,
    -2.79779981545119124951e-01, -4.91900132609500318020e-02, -4.06265923594885404393e-03,
    -1.59276496239262096340e-04, -2.77649108155232920844e-06, -1.67787698489114633780e-08};
const std::vector<double> AI_AFD = {
    1.33560420706553243746e+01, 3.26825032795224613948e+01, 2.67367040941499554804e+01,
    9.18707402907259625840e+00, 1.47529146771666414581e+00, 1.15687173795188044134e-01,
    4.40291641615211203805e-03, 7.54720348287414296618e-05, 4.51850092970580378464e-07};
const std::vector<double> AI_AGN = {
    1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e+00,
    9.39169229816650230044e-01, 3.51465656105547619242e-01, 6.33888919628925490927e-02,
    5.85804113048388458567e-03, 2.82851600836737019778e-04, 6.98793669997260967291e-06,
    8.11789239554389293311e-08, 3.41551784765923618484e-10};
const std::vector<double> AI_AGD = {
    9.30892908077441974853e+00, 1.98352928718312140417e+01, 1.55646628932864612953e+01,
    5.47686069422975497931e+00, 9.54293611618961883998e-01, 8.64580826352392193095e-02,
    4.12656523824222607191e-03, 1.01259085116509135510e-04, 1.17166733214413521882e-06,
    4.91834570062930015649e-09};
const std::vector<double> J0_PP = {
    7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e+00,
    5.44725003058768775090e+00, 8.74716500199817011941e+00, 5.30324038235394892183e+00,
    9.99999999999999997821e-01};
const std::vector<double> J0_PQ = {
    9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e+00,
    5.47097740330417105182e+00, 8.76190883237069594232e+00, 5.30605288235394617618e+00,
    1.00000000000000000218e+00};
const std::vector<double> J0_QP = {
    -1.13663838898469149931e-02, -1.28252718670509318512e+00, -1.95539544257735972385e+01,
    -9.32060152123768231369e+01, -1.77681167980488050595e+02, -1.47077505154951170175e+02,
    -5.14105326766599330220e+01, -6.05014350600728481186e+00};
const std::vector<double> J0_QQ = {
    6.43178256118178023184e+01, 8.56430025976980587198e+02, 3.88240183605401609683e+03,
    7.24046774195652478189e+03, 5.93072701187316984827e+03, 2.06209331660327847417e+03,
    2.42005740240291393179e+02};
const std::vector<double> J0_RP = {
    -4.79443220978201773821e+09, 1.95617491946556577543e+12, -2.49248344360967716204e+14,
    9.70862251047306323952e+15};
const std::vector<double> J0_RQ = {
    4.99563147152651017219e+02, 1.73785401676374683123e+05, 4.84409658339962045305e+07,
    1.11855537045356834862e+10, 2.11277520115489217587e+12, 3.10518229857422583814e+14,
    3.18121955943204943306e+16, 1.71086294081043136091e+18};
const std::vector<double> J1_PP = {
    7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e+00,
    5.11207951146807644818e+00, 8.42404590141772420927e+00, 5.21451598682361504063e+00,
    1.00000000000000000254e+00};
const std::vector<double> J1_PQ = {
    5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e+00,
    5.07386386128601488557e+00, 8.39985554327604159757e+00, 5.20982848682361821619e+00,
    9.99999999999999997461e-01};
const std::vector<double> J1_QP = {
    5.10862594750176621635e-02, 4.98213872951233449420e+00, 7.58238284132545283818e+01,
    3.66779609360150777800e+02, 7.10856304998926107277e+02, 5.97489612400613639965e+02,
    2.11688757100572135698e+02, 2.52070205858023719784e+01};
const std::vector<double> J1_QQ = {
    7.42373277035675149943e+01, 1.05644886038262816351e+03, 4.98641058337653607651e+03,
    9.56231892404756170795e+03, 7.99704160447350683650e+03, 2.82619278517639096600e+03,
    3.36093607810698293419e+02};
const std::vector<double> J1_RP = {
    -8.99971225705559398224e+08, 4.52228297998194034323e+11, -7.27494245221818276015e+13,
    3.68295732863852883286e+15};
const std::vector<double> J1_RQ = {
    6.20836478118054335476e+02, 2.56987256757748830383e+05, 8.35146791431949253037e+07,
    2.21511595479792499675e+10, 4.74914122079991414898e+12, 7.84369607876235854894e+14,
    8.95222336184627338078e+16, 5.32278620332680085395e+18};
const std::vector<double> Y0_YP = {
    1.55924367855235737965e+04, -1.46639295903971606143e+07, 5.43526477051876500413e+09,
    -9.82136065717911466409e+11, 8.75906394395366999549e+13, -3.46628303384729719441e+15,
    4.42733268572569800351e+16, -1.84950800436986690637e+16};
const std::vector<double> Y0_YQ = {
    1.04128353664259848412e+03, 6.26107330137134956842e+05, 2.68919633393814121987e+08,
    8.64002487103935000337e+10, 2.02979612750105546709e+13, 3.17157752842975028269e+15,
    2.50596256172653059228e+17};
const std::vector<double> Y1_YP = {
    1.26320474790178026440e+09, -6.47355876379160291031e+11, 1.14509511541823727583e+14,
    -8.12770255501325109621e+15, 2.02439475713594898196e+17, -7.78877196265950026825e+17};
const std::vector<double> Y1_YQ = {
    5.94301592346128195359e+02, 2.35564092943068577943e+05, 7.34811944459721705660e+07,
    1.87601316108706159478e+10, 3.88231277496238566008e+12, 6.20557727146953693363e+14,
    6.87141087355300489866e+16, 3.97270608116560655612e+18};

const double kPiOver4 = 0.785398163397448309615660845819875721;
const double k3PiOver4 = 2.356194490192344928846982537459627163;
const double kSqrt2OverPi = 0.797884560802865355879892119868763737;
const double k2OverPi = 0.636619772367581343075535053490057448;

// The asymptotic form for x > 5 (x > 0): (P cos(x - phase) - (5/x) Q sin(x - phase)) for
// the J functions, or (P sin + (5/x) Q cos) for the Y functions, times sqrt(2/(pi x)).
Value asymptotic(Builder& b, const Value& x, const Value& w, bool order1, bool y) {
  const auto& pp = order1 ? J1_PP : J0_PP;
  const auto& pq = order1 ? J1_PQ : J0_PQ;
  const auto& qp = order1 ? J1_QP : J0_QP;
  const auto& qq = order1 ? J1_QQ : J0_QQ;
  Value p = div(b, horner(b, w, pp), horner(b, w, pq));
  Value q = mul(b, div(b, K(b, x, 5), x), div(b, horner(b, w, qp), horner(b, w, qq)));
  Value ph = sub(b, x, K(b, x, order1 ? k3PiOver4 : kPiOver4));
  Value c = op1(b, "cosine", ph), s = op1(b, "sine", ph);
  Value v = y ? add(b, mul(b, p, s), mul(b, q, c)) : sub(b, mul(b, p, c), mul(b, q, s));
  return div(b, mul(b, v, K(b, x, kSqrt2OverPi)), sqrt_(b, x));
}

// 25 / x^2 (order 0) or (5 / x)^2 (order 1), as the CPU kernels spell them.
Value w_of(Builder& b, const Value& x, bool order1) {
  if (!order1) return div(b, K(b, x, 25), mul(b, x, x));
  Value f = div(b, K(b, x, 5), x);
  return mul(b, f, f);
}

Value j0(Builder& b, const Value& x_in) {
  Value x = abs_(b, x_in), z = mul(b, x, x);
  Value tiny = sub(b, K(b, x, 1), div(b, z, K(b, x, 4)));
  Value mid = mul(b, mul(b, sub(b, z, K(b, x, 5.78318596294678452118e+00)),
                         sub(b, z, K(b, x, 3.04712623436620863991e+01))),
                  div(b, horner(b, z, J0_RP), horner(b, z, J0_RQ)));
  Value big = asymptotic(b, x, w_of(b, x, false), false, false);
  Value r = b.select(cmpk(b, x, 1e-5, Cmp::LT), tiny, mid);
  return b.select(cmpk(b, x, 5, Cmp::LE), r, big);
}

Value j1_pos(Builder& b, const Value& x) {  // x >= 0 (or NaN)
  Value z = mul(b, x, x);
  Value mid = mul(b, mul(b, mul(b, div(b, horner(b, z, J1_RP), horner(b, z, J1_RQ)), x),
                         sub(b, z, K(b, x, 1.46819706421238932572e+01))),
                  sub(b, z, K(b, x, 4.92184563216946036703e+01)));
  Value big = asymptotic(b, x, w_of(b, x, true), true, false);
  return b.select(cmpk(b, x, 5, Cmp::LE), mid, big);
}

Value j1(Builder& b, const Value& x) {
  Value neg = cmpk(b, x, 0, Cmp::LT);
  Value r = j1_pos(b, b.select(neg, neg_(b, x), x));
  return b.select(neg, neg_(b, r), r);
}

Value y0(Builder& b, const Value& x) {
  Value z = mul(b, x, x);
  Value mid = add(b, div(b, horner(b, z, Y0_YP), horner(b, z, Y0_YQ)),
                  mul(b, mul(b, K(b, x, k2OverPi), log_exact(b, x)), j0(b, x)));
  Value big = asymptotic(b, x, w_of(b, x, false), false, true);
  Value r = b.select(is_neg(b, x), K(b, x, NAN), mid);
  r = b.select(is_zero(b, x), K(b, x, -INFINITY), r);
  return b.select(cmpk(b, x, 5, Cmp::LE), r, big);
}

Value y1(Builder& b, const Value& x) {
  Value z = mul(b, x, x);
  Value lj = sub(b, mul(b, j1(b, x), log_exact(b, x)), div_exact(b, K(b, x, 1), x));
  Value mid = add(b, mul(b, x, div(b, horner(b, z, Y1_YP), horner(b, z, Y1_YQ))),
                  mul(b, K(b, x, k2OverPi), lj));
  Value big = asymptotic(b, x, w_of(b, x, true), true, true);
  Value r = b.select(is_neg(b, x), K(b, x, NAN), mid);
  r = b.select(is_zero(b, x), K(b, x, -INFINITY), r);
  return b.select(cmpk(b, x, 5, Cmp::LE), r, big);
}

// Ai(x): the oscillating asymptotic form below -2.09, the decaying one from 2.09
// on, and Maclaurin series of its two parts f, g in between, summed until a term
// drops below the float epsilon relative to f (a fixed number of masked steps).
Value airy_ai(Builder& b, const Value& x) {
  const double kInvSqrtPi = 5.64189583547756286948e-01;
  double eps = x.dtype() == DType::F64 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
  Value one = K(b, x, 1);
  // x < -2.09
  Value nx = neg_(b, x);
  Value zeta_n = div(b, mul(b, mul(b, K(b, x, -2), x), sqrt_(b, nx)), K(b, x, 3));
  Value zn = div(b, one, zeta_n), zz = mul(b, zn, zn);
  Value f1 = div(b, mul(b, zz, horner(b, zz, AI_AFN)), horner(b, zz, AI_AFD));
  Value g1 = div(b, mul(b, zn, horner(b, zz, AI_AGN)), horner(b, zz, AI_AGD));
  Value t = add(b, zeta_n, K(b, x, 0.25 * M_PI));
  Value osc = mul(b, div(b, K(b, x, kInvSqrtPi), sqrt_(b, sqrt_(b, nx))),
                  sub(b, mul(b, op1(b, "sine", t), add(b, one, f1)), mul(b, op1(b, "cosine", t), g1)));
  // x >= 2.09
  Value zeta = div(b, mul(b, mul(b, K(b, x, 2), x), sqrt_(b, x)), K(b, x, 3));
  Value iz = div(b, one, zeta);
  Value ratio = div(b, horner(b, iz, AI_AN), horner(b, iz, AI_AD));
  Value decay = div(b, mul(b, K(b, x, kInvSqrtPi), ratio),
                    mul(b, mul(b, K(b, x, 2), sqrt_(b, sqrt_(b, x))), exp_(b, zeta)));
  // series
  Value f = one, g = x, k = one, m = one, n = x, z = mul(b, mul(b, x, x), x);
  Value go = cmpk(b, one, eps, Cmp::GT);  // CPU's first test: t = 1 > eps
  for (int it = 0; it < 40; ++it) {
    auto upd = [&](Value& v, const Value& nv) { v = b.select(go, nv, v); };
    upd(m, mul(b, m, z));
    upd(k, add(b, k, one));
    upd(m, div(b, m, k));
    upd(n, mul(b, n, z));
    upd(k, add(b, k, one));
    upd(n, div(b, n, k));
    upd(m, div(b, m, k));
    upd(f, add(b, f, m));
    upd(k, add(b, k, one));
    upd(n, div(b, n, k));
    upd(g, add(b, g, n));
    go = and_(b, go, cmpk(b, abs_(b, div(b, m, f)), eps, Cmp::GT));
  }
  Value series = sub(b, mul(b, K(b, x, 0.355028053887817239260), f),
                     mul(b, K(b, x, 0.258819403792806798405), g));
  Value r = b.select(cmpk(b, x, 2.09, Cmp::GE), decay, series);
  r = b.select(cmpk(b, x, -2.09, Cmp::LT), osc, r);
  r = b.select(cmpk(b, x, 103.892, Cmp::GT), K(b, x, 0), r);
  return b.select(isinf_(b, x), K(b, x, NAN), r);
}

Value spherical_j0(Builder& b, const Value& x) {
  Value z = mul(b, x, x);
  Value small = horner(b, z, {1.0 / 6227020800.0, -1.0 / 39916800.0, 1.0 / 362880.0, -1.0 / 5040.0,
                              1.0 / 120.0, -1.0 / 6.0, 1.0});
  Value r = b.select(cmpk(b, abs_(b, x), 0.5, Cmp::LT), small, div(b, op1(b, "sine", x), x));
  return b.select(isinf_(b, x), K(b, x, 0), r);
}

// CPU computes these in float32/float64 only.
std::vector<Value> unary(Ctx& ctx, Value (*fn)(Builder&, const Value&)) {
  DType t = ctx.out(0).dtype;
  if (t != DType::F32 && t != DType::F64) throw Unsupported("bessel: float32/float64 only");
  return map(ctx, {0}, [fn](Builder& b, const Vs& v) { return fn(b, v[0]); });
}

TPU_LOWER(bessel_j0_rule, "special_bessel_j0") { return unary(ctx, j0); }
TPU_LOWER(bessel_j1_rule, "special_bessel_j1") { return unary(ctx, j1); }
TPU_LOWER(bessel_y0_rule, "special_bessel_y0") { return unary(ctx, y0); }
TPU_LOWER(bessel_y1_rule, "special_bessel_y1") { return unary(ctx, y1); }
TPU_LOWER(airy_ai_rule, "special_airy_ai") { return unary(ctx, airy_ai); }
TPU_LOWER(spherical_j0_rule, "special_spherical_bessel_j0") { return unary(ctx, spherical_j0); }

}  // namespace
}  // namespace tpu::lowering
