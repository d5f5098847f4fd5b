// Orthogonal polynomials of a tensor degree n (elementwise over x and n), as
// PyTorch's CPU kernels give them: n is truncated to an integer (NaN, inf and values
// past int64 act as a negative degree: 0), closed forms at the interval ends and,
// for high degrees inside the interval, trigonometric forms; otherwise the
// three-term recurrence, run in a while loop up to the largest degree that needs it
// and stopping early for an element whose value turned NaN.
#include <cmath>
#include <functional>

#include "lowering/special_util.h"

namespace tpu::lowering {
namespace {

using namespace sp;

// Next term r from the previous two (q, p), the loop index k (as a float) and x.
using Step = std::function<Value(Builder&, const Value& x, const Value& q, const Value& p, const Value& k)>;

struct Recurrence {
  int64_t k0;      // first index
  int64_t stride;  // index step
  bool inclusive;  // runs while k <= n (else k < n)
  bool twice_n;    // runs while k < 2n (Hermite's even indices)
  Step step;
};

// q after the recurrence has run for each element from q0/p0, where `n` (int64) is
// the degree; an element with a degree below the first index keeps q0.
Value recur(Builder& b, const Value& x, const Value& n, const Value& p0, const Value& q0,
            const Recurrence& rec) {
  auto active = [&](Builder& bb, const Value& k, const Value& nn, const Value& q) {
    Value kk = bb.broadcast_in_dim(k, nn.shape(), {});
    Value lim = rec.twice_n ? add(bb, nn, nn) : nn;
    Value in = bb.compare(kk, lim, rec.inclusive ? Cmp::LE : Cmp::LT);
    return and_(bb, in, not_(bb, isnan_(bb, q)));
  };
  Value k0 = b.constant(static_cast<double>(rec.k0), DType::I64);
  Value go = any_true(b, active(b, k0, n, q0));
  auto out = b.while_loop(
      {k0, go, x, n, p0, q0},
      [](Builder&, const Vs& s) { return Vs{s[1]}; },
      [&](Builder& bb, const Vs& s) {
        const Value &k = s[0], &xx = s[2], &nn = s[3], &p = s[4], &q = s[5];
        Value on = active(bb, k, nn, q);
        Value kf = bb.broadcast_in_dim(bb.convert(k, xx.dtype()), xx.shape(), {});
        Value r = rec.step(bb, xx, q, p, kf);
        Value p1 = bb.select(on, q, p), q1 = bb.select(on, r, q);
        Value k1 = add(bb, k, bb.constant(static_cast<double>(rec.stride), DType::I64));
        return Vs{k1, any_true(bb, active(bb, k1, nn, q1)), xx, nn, p1, q1};
      });
  return out[5];
}

enum class Kind { T, U, V, W, ShT, ShU, ShV, ShW, H, He, L, P };

Value sel(Builder& b, const Value& c, const Value& t, const Value& f) { return b.select(c, t, f); }
Value eqk(Builder& b, const Value& v, double k) { return cmpk(b, v, k, Cmp::EQ); }
Value gtk(Builder& b, const Value& v, double k) { return cmpk(b, v, k, Cmp::GT); }

// Chebyshev-style recurrence r = 2y q - p.
Recurrence cheb_rec(bool shifted) {
  return {2, 1, true, false, [shifted](Builder& b, const Value& x, const Value& q, const Value& p, const Value&) {
            Value y = shifted ? sub(b, add(b, x, x), K(b, x, 1)) : x;
            return sub(b, mul(b, add(b, y, y), q), p);
          }};
}

Value polynomial(Builder& b, Kind kind, const Value& x, const Value& n_in) {
  Value one = K(b, x, 1), zero = K(b, x, 0);
  // The degree: trunc(n); NaN, inf and |n| >= 2^63 read as a negative degree.
  Value tr = trunc_(b, n_in);
  Value bad = or_(b, isnan_(b, n_in), cmpk(b, abs_(b, tr), 9.2233720368547758e18, Cmp::GE));
  Value ni = b.convert(sel(b, bad, K(b, x, -1), tr), DType::I64);
  Value nf = b.convert(ni, x.dtype());
  Value even = b.compare(op2(b, "remainder", ni, b.constant(2, DType::I64, ni.shape())),
                         b.constant(0, DType::I64, ni.shape()), Cmp::EQ);
  Value neg = cmpk(b, nf, 0, Cmp::LT);
  Value n0 = eqk(b, nf, 0), n1 = eqk(b, nf, 1);
  Value np1 = add(b, nf, one), n2p1 = add(b, add(b, nf, nf), one);
  auto pm = [&](const Value& v) { return sel(b, even, v, neg_(b, v)); };  // +v for even n

  Value res;
  Recurrence rec;
  bool shifted = kind == Kind::ShT || kind == Kind::ShU || kind == Kind::ShV || kind == Kind::ShW;
  Value y = shifted ? sub(b, add(b, x, x), one) : x;
  Value ay = abs_(b, y);
  Value inside = cmpk(b, ay, 1, Cmp::LT);
  Value ac = acos_(b, y);
  Value half = mul(b, ac, K(b, x, 0.5));
  Value nh = add(b, nf, K(b, x, 0.5));
  // `edge_hi` / `edge_lo`: x at the top / bottom end of the interval.
  Value edge_hi = shifted ? eqk(b, x, 1) : and_(b, eqk(b, ay, 1), gtk(b, x, 0));
  Value edge_lo = shifted ? eqk(b, x, 0) : and_(b, eqk(b, ay, 1), not_(b, gtk(b, x, 0)));
  Value trig_ok;     // where the trigonometric form applies
  Value trig;        // its value
  Value first;       // the value at degree 1
  Value v_hi, v_lo;  // values at the interval ends
  switch (kind) {
    case Kind::T: case Kind::ShT:
      trig_ok = and_(b, gtk(b, nf, 6), inside);
      trig = op1(b, "cosine", mul(b, nf, ac));
      first = y;
      v_hi = one;
      v_lo = pm(one);
      break;
    case Kind::U: case Kind::ShU: {
      trig_ok = and_(b, gtk(b, nf, shifted ? 6 : 8), inside);
      Value s = op1(b, "sine", ac);
      Value a1 = mul(b, np1, ac);
      trig = sel(b, cmpk(b, s, 0, Cmp::NE), div(b, op1(b, "sine", a1), s),
                 div(b, mul(b, np1, op1(b, "cosine", a1)), y));
      first = add(b, y, y);
      v_hi = np1;
      v_lo = pm(np1);
      break;
    }
    case Kind::V: case Kind::ShV: {
      trig_ok = and_(b, gtk(b, nf, shifted ? 6 : 8), inside);
      trig = sel(b, cmpk(b, op1(b, "sine", half), 1, Cmp::NE),
                 div(b, op1(b, "cosine", mul(b, nh, ac)), op1(b, "cosine", half)), pm(n2p1));
      first = sub(b, add(b, y, y), one);
      v_hi = one;
      v_lo = pm(n2p1);
      break;
    }
    case Kind::W: case Kind::ShW: {
      trig_ok = and_(b, gtk(b, nf, shifted ? 4 : 8), inside);
      Value deg = shifted ? pm(one) : sel(b, gtk(b, x, 0), n2p1, pm(one));
      trig = sel(b, cmpk(b, op1(b, "cosine", half), 1, Cmp::NE),
                 div(b, op1(b, "sine", mul(b, nh, ac)), op1(b, "sine", half)), deg);
      first = add(b, add(b, y, y), one);
      v_hi = n2p1;
      v_lo = pm(one);
      break;
    }
    default: break;
  }

  switch (kind) {
    case Kind::T: case Kind::U: case Kind::V: case Kind::W:
    case Kind::ShT: case Kind::ShU: case Kind::ShV: case Kind::ShW: {
      rec = cheb_rec(shifted);
      Value plain = or_(b, or_(b, edge_hi, edge_lo), or_(b, trig_ok, or_(b, neg, or_(b, n0, n1))));
      res = recur(b, x, sel(b, plain, b.constant(0, DType::I64, ni.shape()), ni), one, first, rec);
      res = sel(b, n1, first, res);
      res = sel(b, n0, one, res);
      res = sel(b, trig_ok, trig, res);
      res = sel(b, edge_lo, v_lo, res);
      res = sel(b, edge_hi, v_hi, res);
      break;
    }
    case Kind::H: case Kind::He: {
      bool h = kind == Kind::H;
      double limit = x.dtype() == DType::F64 ? 512 : 128;
      first = h ? add(b, x, x) : x;
      if (h)
        rec = {2, 2, false, true, [](Builder& bb, const Value& xx, const Value& q, const Value& p, const Value& k) {
                 return sub(bb, mul(bb, add(bb, xx, xx), q), mul(bb, k, p));
               }};
      else
        rec = {1, 1, false, false, [](Builder& bb, const Value& xx, const Value& q, const Value& p, const Value& k) {
                 return sub(bb, mul(bb, xx, q), mul(bb, k, p));
               }};
      Value big = gtk(b, nf, limit);
      Value plain = or_(b, big, or_(b, neg, or_(b, n0, n1)));
      res = recur(b, x, sel(b, plain, b.constant(0, DType::I64, ni.shape()), ni), one, first, rec);
      res = sel(b, big, K(b, x, NAN), res);
      res = sel(b, n1, first, res);
      res = sel(b, n0, one, res);
      break;
    }
    case Kind::L: {
      first = sub(b, one, x);
      rec = {1, 1, false, false, [](Builder& bb, const Value& xx, const Value& q, const Value& p, const Value& k) {
               Value c = add(bb, add(bb, k, k), sub(bb, K(bb, xx, 1), xx));
               return div(bb, sub(bb, mul(bb, c, q), mul(bb, k, p)), add(bb, k, K(bb, xx, 1)));
             }};
      Value x0 = eqk(b, x, 0);
      Value plain = or_(b, x0, or_(b, neg, or_(b, n0, n1)));
      res = recur(b, x, sel(b, plain, b.constant(0, DType::I64, ni.shape()), ni), one, first, rec);
      res = sel(b, n1, first, res);
      res = sel(b, or_(b, n0, x0), one, res);
      break;
    }
    case Kind::P: {
      first = x;
      rec = {1, 1, false, false, [](Builder& bb, const Value& xx, const Value& q, const Value& p, const Value& k) {
               Value c = add(bb, add(bb, k, k), K(bb, xx, 1));
               return div(bb, sub(bb, mul(bb, mul(bb, c, xx), q), mul(bb, k, p)), add(bb, k, K(bb, xx, 1)));
             }};
      Value edge = eqk(b, abs_(b, x), 1);
      Value plain = or_(b, edge, or_(b, neg, or_(b, n0, n1)));
      res = recur(b, x, sel(b, plain, b.constant(0, DType::I64, ni.shape()), ni), one, first, rec);
      res = sel(b, n1, first, res);
      res = sel(b, n0, one, res);
      res = sel(b, edge, sel(b, or_(b, gtk(b, x, 0), even), one, neg_(b, one)), res);
      break;
    }
  }
  return sel(b, neg, zero, res);
}

// Only float32/float64: CPU has no reduced-precision kernels for these.
std::vector<Value> poly_rule(Ctx& ctx, Kind kind) {
  DType t = ctx.out(0).dtype;
  if (t != DType::F32 && t != DType::F64) throw Unsupported("polynomials: float32/float64 only");
  return map(ctx, {0, 1}, [kind](Builder& b, const Vs& v) { return polynomial(b, kind, v[0], v[1]); });
}

#define TPU_POLY(fn, name, kind)                                                      \
  TPU_LOWER(fn, name, name ".x_scalar", name ".n_scalar") { return poly_rule(ctx, kind); }

TPU_POLY(cheb_t_rule, "special_chebyshev_polynomial_t", Kind::T)
TPU_POLY(cheb_u_rule, "special_chebyshev_polynomial_u", Kind::U)
TPU_POLY(cheb_v_rule, "special_chebyshev_polynomial_v", Kind::V)
TPU_POLY(cheb_w_rule, "special_chebyshev_polynomial_w", Kind::W)
TPU_POLY(scheb_t_rule, "special_shifted_chebyshev_polynomial_t", Kind::ShT)
TPU_POLY(scheb_u_rule, "special_shifted_chebyshev_polynomial_u", Kind::ShU)
TPU_POLY(scheb_v_rule, "special_shifted_chebyshev_polynomial_v", Kind::ShV)
TPU_POLY(scheb_w_rule, "special_shifted_chebyshev_polynomial_w", Kind::ShW)
TPU_POLY(hermite_h_rule, "special_hermite_polynomial_h", Kind::H)
TPU_POLY(hermite_he_rule, "special_hermite_polynomial_he", Kind::He)
TPU_POLY(laguerre_rule, "special_laguerre_polynomial_l", Kind::L)
TPU_POLY(legendre_rule, "special_legendre_polynomial_p", Kind::P)

}  // namespace
}  // namespace tpu::lowering
