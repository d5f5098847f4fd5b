// matrix_exp by scaling and squaring: each matrix is scaled by 2^-s so that its 1-norm
// is at most 1, exp of the scaled matrix comes from its Taylor polynomial of degree 18
// (truncation below double precision there), and s squarings undo the scaling. CPU's own
// float32 result loses ~1e-3 relative on entries that cancel; this agrees with it within
// the conformance tolerance on OpInfo's samples, not bit for bit.
#include <cmath>

#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

// Defined in linalg.cpp.
namespace linalg_base {
void check_float(DType t);
}  // namespace linalg_base

namespace {

// Batched x @ y for (*, n, n) values.
Value bmm(Builder& b, const Value& x, const Value& y) {
  std::vector<int64_t> batch;
  for (int64_t i = 0; i < x.rank() - 2; ++i) batch.push_back(i);
  return b.dot_general(x, y, batch, batch, {x.rank() - 1}, {x.rank() - 2}, x.dtype(), ir::DotPrecision::Highest);
}

// 2^-s exactly, built from the exponent bits (s integer in [0, max exponent)).
Value exp2_neg(Builder& b, const Value& s, DType t) {
  bool f32 = t == DType::F32;
  DType it = f32 ? DType::I32 : DType::I64;
  Value e = sub(b, b.constant(f32 ? 127 : 1023, it, s.shape()), b.convert(s, it));
  Value bits = b.binary("stablehlo.shift_left", e, b.constant(f32 ? 23 : 52, it, s.shape()));
  return b.bitcast(bits, t);
}

}  // namespace

TPU_LOWER(linalg_matrix_exp, "linalg_matrix_exp") {
  Builder& b = ctx.b;
  Value a = ctx.in(0);
  DType t = a.dtype();
  linalg_base::check_float(t);
  int64_t r = a.rank();
  if (a.type.numel() == 0) return {a};
  Shape bs(a.shape().begin(), a.shape().end() - 2);
  std::vector<int64_t> lead;
  for (int64_t i = 0; i < r - 2; ++i) lead.push_back(i);
  // s = ceil(log2(|A|_1)), clamped to [0, largest exponent]; NaN gives 0.
  Value norm = reduce_max(b, reduce_sum(b, b.unary("stablehlo.abs", a), {r - 2}), {r - 2});
  Value lg = b.unary("stablehlo.ceil", div(b, b.unary("stablehlo.log", norm),
                                          b.constant(std::log(2.0), t, bs)));
  double top = t == DType::F32 ? 126 : 1022;
  lg = b.select(b.compare(lg, lg, Cmp::NE), b.constant(0, t, bs), lg);
  Value s = b.convert(b.clamp(b.constant(0, t, bs), lg, b.constant(top, t, bs)), DType::I64);
  Value x = mul(b, a, b.broadcast_in_dim(exp2_neg(b, s, t), a.shape(), lead));
  // Horner: P = I + X/k P from k = 18 down to 1.
  Type it{DType::I64, a.shape()};
  Value eye = b.convert(b.compare(b.iota(it, r - 2), b.iota(it, r - 1), Cmp::EQ), t);
  Value p = eye;
  for (int k = 18; k >= 1; --k) {
    Value xp = k == 18 ? x : bmm(b, x, p);
    p = add(b, eye, div_count(b, xp, k));
  }
  // Square each matrix s times: the loop runs to the largest s, the others stop early.
  Value smax = r > 2 ? reduce_max(b, s, lead) : s;
  auto st = b.while_loop(
      {b.constant(0, DType::I64), p},
      [&](Builder& b, const std::vector<Value>& v) {
        return std::vector<Value>{b.compare(v[0], smax, Cmp::LT)};
      },
      [&](Builder& b, const std::vector<Value>& v) {
        Value go = b.compare(b.broadcast_in_dim(v[0], bs, {}), s, Cmp::LT);
        Value sq = b.select(b.broadcast_in_dim(go, a.shape(), lead), bmm(b, v[1], v[1]), v[1]);
        return std::vector<Value>{add(b, v[0], b.constant(1, DType::I64)), sq};
      });
  return {st[1]};
}

}  // namespace tpu::lowering
