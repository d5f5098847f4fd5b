// Modified Bessel functions I0, I1, K0, K1 (also exponentially scaled), i0 and
// special.i0e, evaluated like PyTorch's CPU kernels: Cephes' Chebyshev expansions
// on [0, 8] / (8, inf) for I and [0, 2] / (2, inf) for K, in the op's float type.
#include <cmath>

#include "lowering/special_util.h"

namespace tpu::lowering {
namespace {

using namespace sp;

// Published Cephes Chebyshev coefficients (highest order first).
const std::vector<double> I0_A = {
    -4.41534164647933937950e-18, 3.33079451882223809783e-17, -2.43127984654795469359e-16,
    1.71539128555513303061e-15, -1.16853328779934516808e-14, 7.67618549860493561688e-14,
    -4.85644678311192946090e-13, 2.95505266312963983461e-12, -1.72682629144155570723e-11,
    9.67580903537323691224e-11, -5.18979560163526290666e-10, 2.65982372468238665035e-09,
    -1.30002500998624804212e-08, 6.04699502254191894932e-08, -2.67079385394061173391e-07,
    1.11738753912010371815e-06, -4.41673835845875056359e-06, 1.64484480707288970893e-05,
    -5.75419501008210370398e-05, 1.88502885095841655729e-04, -5.76375574538582365885e-04,
    1.63947561694133579842e-03, -4.32430999505057594430e-03, 1.05464603945949983183e-02,
    -2.37374148058994688156e-02, 4.93052842396707084878e-02, -9.49010970480476444210e-02,
    1.71620901522208775349e-01, -3.04682672343198398683e-01, 6.76795274409476084995e-01};
const std::vector<double> I0_B = {
    -7.23318048787475395456e-18, -4.83050448594418207126e-18, 4.46562142029675999901e-17,
    3.46122286769746109310e-17, -2.82762398051658348494e-16, -3.42548561967721913462e-16,
    1.77256013305652638360e-15, 3.81168066935262242075e-15, -9.55484669882830764870e-15,
    -4.15056934728722208663e-14, 1.54008621752140982691e-14, 3.85277838274214270114e-13,
    7.18012445138366623367e-13, -1.79417853150680611778e-12, -1.32158118404477131188e-11,
    -3.14991652796324136454e-11, 1.18891471078464383424e-11, 4.94060238822496958910e-10,
    3.39623202570838634515e-09, 2.26666899049817806459e-08, 2.04891858946906374183e-07,
    2.89137052083475648297e-06, 6.88975834691682398426e-05, 3.36911647825569408990e-03,
    8.04490411014108831608e-01};
const std::vector<double> I1_A = {
    2.77791411276104639959e-18, -2.11142121435816608115e-17, 1.55363195773620046921e-16,
    -1.10559694773538630805e-15, 7.60068429473540693410e-15, -5.04218550472791168711e-14,
    3.22379336594557470981e-13, -1.98397439776494371520e-12, 1.17361862988909016308e-11,
    -6.66348972350202774223e-11, 3.62559028155211703701e-10, -1.88724975172282928790e-09,
    9.38153738649577178388e-09, -4.44505912879632808065e-08, 2.00329475355213526229e-07,
    -8.56872026469545474066e-07, 3.47025130813767847674e-06, -1.32731636560394358279e-05,
    4.78156510755005422638e-05, -1.61760815825896745588e-04, 5.12285956168575772895e-04,
    -1.51357245063125314899e-03, 4.15642294431288815669e-03, -1.05640848946261981558e-02,
    2.47264490306265168283e-02, -5.29459812080949914269e-02, 1.02643658689847095384e-01,
    -1.76416518357834055153e-01, 2.52587186443633654823e-01};
const std::vector<double> I1_B = {
    7.51729631084210481353e-18, 4.41434832307170791151e-18, -4.65030536848935832153e-17,
    -3.20952592199342395980e-17, 2.96262899764595013876e-16, 3.30820231092092828324e-16,
    -1.88035477551078244854e-15, -3.81440307243700780478e-15, 1.04202769841288027642e-14,
    4.27244001671195135429e-14, -2.10154184277266431302e-14, -4.08355111109219731823e-13,
    -7.19855177624590851209e-13, 2.03562854414708950722e-12, 1.41258074366137813316e-11,
    3.25260358301548823856e-11, -1.89749581235054123450e-11, -5.58974346219658380687e-10,
    -3.83538038596423702205e-09, -2.63146884688951950684e-08, -2.51223623787020892529e-07,
    -3.88256480887769039346e-06, -1.10588938762623716291e-04, -9.76109749136146840777e-03,
    7.78576235018280120474e-01};
const std::vector<double> K0_A = {
    1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11,
    1.90451637722020886025e-09, 2.53479107902614945675e-07, 2.28621210311945178607e-05,
    1.26461541144692592338e-03, 3.59799365153615016266e-02, 3.44289899924628486886e-01,
    -5.35327393233902768720e-01};
const std::vector<double> K0_B = {
    5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17,
    -1.67823109680541210385e-16, 5.51205597852431940784e-16, -1.84859337734377901440e-15,
    6.34007647740507060557e-15, -2.22751332699166985548e-14, 8.03289077536357521100e-14,
    -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
    1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10,
    -1.69753450938905987466e-09, 8.57403401741422608519e-09, -4.66048989768794782956e-08,
    2.76681363944501510342e-07, -1.83175552271911948767e-06, 1.39498137188764993662e-05,
    -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
    2.44030308206595545468e+00};
const std::vector<double> K1_A = {
    -7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
    -1.41148839263352776110e-10, -2.21338763073472585583e-08, -2.43340614156596823496e-06,
    -1.73028895751305206302e-04, -6.97572385963986435018e-03, -1.22611180822657148235e-01,
    -3.53155960776544875667e-01, 1.52530022733894777053e+00};
const std::vector<double> K1_B = {
    -5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17,
    1.83809354436663880070e-16, -6.05704724837331885336e-16, 2.03870316562433424052e-15,
    -7.01983709041831346144e-15, 2.47715442448130437068e-14, -8.97670518232499435011e-14,
    3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
    -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10,
    2.01504975519703286596e-09, -1.03457624656780970260e-08, 5.74108412545004946722e-08,
    -3.50196060308781257119e-07, 2.40648494783721712015e-06, -1.93619797416608296024e-05,
    1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
    2.72062619048444266945e+00};

// exp(-|x|) I0(x) (scaled) or I0(x) itself; the same expansions as CPU, with the
// scale factors applied in its order (so I0(inf) is NaN there as here).
Value i0_impl(Builder& b, const Value& x_in, bool scaled) {
  Value x = abs_(b, x_in);
  Value lo = chebyshev(b, sub(b, div(b, x, K(b, x, 2)), K(b, x, 2)), I0_A);
  Value hi = chebyshev(b, sub(b, div(b, K(b, x, 32), x), K(b, x, 2)), I0_B);
  if (!scaled) {
    Value e = exp_(b, x);
    lo = mul(b, e, lo);
    hi = mul(b, e, hi);
  }
  hi = div(b, hi, sqrt_(b, x));
  return b.select(cmpk(b, x, 8, Cmp::LE), lo, hi);
}
Value i0(Builder& b, const Value& x) { return i0_impl(b, x, false); }
Value i0e(Builder& b, const Value& x) { return i0_impl(b, x, true); }

Value i1(Builder& b, const Value& x_in) {
  Value x = abs_(b, x_in), e = exp_(b, x);
  Value lo = chebyshev(b, sub(b, div(b, x, K(b, x, 2)), K(b, x, 2)), I1_A);
  lo = mul(b, mul(b, lo, x), e);
  Value hi = chebyshev(b, sub(b, div(b, K(b, x, 32), x), K(b, x, 2)), I1_B);
  hi = div(b, mul(b, e, hi), sqrt_(b, x));
  Value r = b.select(cmpk(b, x, 8, Cmp::LE), lo, hi);
  return b.select(cmpk(b, x_in, 0, Cmp::LT), neg_(b, r), r);
}

// K0 / K1, scaled by exp(x) when asked: NaN below 0, inf at 0.
Value k_impl(Builder& b, const Value& x, bool order1, bool scaled) {
  Value y = sub(b, mul(b, x, x), K(b, x, 2));
  Value a = chebyshev(b, y, order1 ? K1_A : K0_A);
  Value l = b.select(is_subnormal(b, x), add(b, log_exact(b, x), K(b, x, -M_LN2)),
                     log_(b, mul(b, K(b, x, 0.5), x)));
  Value lo = order1 ? add(b, mul(b, l, i1(b, x)), div_exact(b, a, x)) : sub(b, a, mul(b, l, i0(b, x)));
  Value hi = chebyshev(b, sub(b, div(b, K(b, x, 8), x), K(b, x, 2)), order1 ? K1_B : K0_B);
  if (scaled) {
    lo = mul(b, lo, exp_(b, x));
  } else {
    hi = mul(b, exp_(b, neg_(b, x)), hi);
  }
  hi = div(b, hi, sqrt_(b, x));
  Value r = b.select(cmpk(b, x, 2, Cmp::LE), lo, hi);
  r = b.select(is_neg(b, x), K(b, x, NAN), r);
  return b.select(is_zero(b, x), K(b, x, INFINITY), r);
}
Value k0(Builder& b, const Value& x) { return k_impl(b, x, false, false); }
Value k1(Builder& b, const Value& x) { return k_impl(b, x, true, false); }
Value k0e(Builder& b, const Value& x) { return k_impl(b, x, false, true); }
Value k1e(Builder& b, const Value& x) { return k_impl(b, x, true, true); }

// `low_precision`: CPU also has f16/bf16 kernels that compute in float32.
std::vector<Value> unary(Ctx& ctx, Value (*fn)(Builder&, const Value&), bool low_precision) {
  DType t = ctx.out(0).dtype;
  bool ok = t == DType::F32 || t == DType::F64 ||
            (low_precision && (t == DType::BF16 || t == DType::F16));
  if (!ok) throw Unsupported("modified bessel: unsupported dtype");
  return map(ctx, {0}, [fn](Builder& b, const Vs& v) { return fn(b, v[0]); });
}

// kaiser_window(window_length, periodic, beta) as CPU's kernel computes it: over
// arange(N) in the window's dtype (N = window_length + 1 when periodic, the last value
// then dropped), i0(beta * sqrt(|1 - ((a - alpha) / alpha)^2|)) / i0(beta) with
// alpha = (N - 1) / 2, in float32 for f16/bf16/f32 (its opmath type) and float64 for f64.
// A length-1 window is [1] (periodic too), as CPU's composite returns.
TPU_LOWER(kaiser_window_rule, "kaiser_window.beta_out") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  DType t = o.dtype;
  if (t != DType::F32 && t != DType::F64 && t != DType::BF16 && t != DType::F16)
    throw Unsupported("kaiser_window: unsupported dtype");
  int64_t len = ctx.i(0);
  if (o.shape.size() != 1 || o.shape[0] != len) throw Unsupported("kaiser_window: out shape");
  if (len <= 1) return {b.constant(1, t, o.shape)};
  int64_t n = len + (ctx.flag(1) ? 1 : 0);
  DType m = t == DType::F64 ? DType::F64 : DType::F32;
  Value a = b.iota(Type{m, o.shape}, 0);
  if (t != m) a = b.convert(b.convert(a, t), m);  // arange's values rounded to the dtype
  // alpha and beta are rounded to the opmath type first, as CPU's kernel does.
  Value alpha = K(b, a, static_cast<double>(m == DType::F64 ? (n - 1) / 2.0 : static_cast<float>((n - 1) / 2.0)));
  double beta_d = ctx.f(2);
  Value beta = K(b, a, m == DType::F64 ? beta_d : static_cast<double>(static_cast<float>(beta_d)));
  Value x = div(b, sub(b, a, alpha), alpha);
  Value r = mul(b, beta, sqrt_(b, abs_(b, sub(b, K(b, a, 1), mul(b, x, x)))));
  return {b.convert(div(b, i0(b, r), i0(b, beta)), t)};
}

TPU_LOWER(i0_rule, "i0") { return unary(ctx, i0, true); }
TPU_LOWER(i0e_rule, "special_i0e") { return unary(ctx, i0e, true); }
TPU_LOWER(mod_i0_rule, "special_modified_bessel_i0") { return unary(ctx, i0, false); }
TPU_LOWER(mod_i1_rule, "special_modified_bessel_i1") { return unary(ctx, i1, false); }
TPU_LOWER(mod_k0_rule, "special_modified_bessel_k0") { return unary(ctx, k0, false); }
TPU_LOWER(mod_k1_rule, "special_modified_bessel_k1") { return unary(ctx, k1, false); }
TPU_LOWER(scaled_k0_rule, "special_scaled_modified_bessel_k0") { return unary(ctx, k0e, false); }
TPU_LOWER(scaled_k1_rule, "special_scaled_modified_bessel_k1") { return unary(ctx, k1e, false); }

}  // namespace
}  // namespace tpu::lowering
