// CTC loss (_ctc_loss and its backward) for int-list lengths, which fix every length at
// compile time. Log-space alpha (forward) and beta (backward) recursions over time run in
// stablehlo.while loops over the extended label sequence l' = (blank, t1, blank, t2, ...,
// blank) of S = 2 * max_target_length + 1 states, batched; CPU's exact log-add form.
#include <algorithm>
#include <functional>
#include <limits>

#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Ctc {
  int64_t T, B, C, L, S;
  std::vector<int64_t> il, tl;
  DType t;
  Value labels;  // (B, S) i64: l'
  Value lpl;     // (T, B, S): log_probs at l'
};

Value i64_const(Builder& b, const std::vector<int64_t>& v, const Shape& shape) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  int64_t n = static_cast<int64_t>(v.size());
  Value c = b.raw("stablehlo.constant", {}, "value = dense<[" + s + "]> : tensor<" + std::to_string(n) + "xi64>",
                  Type{DType::I64, {n}});
  return b.reshape(c, shape);
}

// log_probs (T, B, C), targets ((B, maxL) padded or 1-D concatenated), lengths, blank.
Ctc setup(Ctx& ctx, int lp_i, int tg_i, int il_i, int tl_i, int blank_i) {
  Builder& b = ctx.b;
  Ctc c;
  Value lp = ctx.in(lp_i);
  if (lp.rank() != 3) throw Unsupported("ctc_loss: log_probs must be (T, B, C)");
  c.T = lp.shape()[0], c.B = lp.shape()[1], c.C = lp.shape()[2];
  c.t = acc_type(lp.dtype());
  c.il = ctx.ints(il_i), c.tl = ctx.ints(tl_i);
  int64_t blank = ctx.i(blank_i);
  Value tg = b.convert(ctx.in(tg_i), DType::I64);
  if (static_cast<int64_t>(c.il.size()) != c.B || static_cast<int64_t>(c.tl.size()) != c.B || blank < 0 ||
      blank >= c.C || c.T == 0 || c.B == 0)
    throw Unsupported("ctc_loss: arguments CPU rejects");
  c.L = 0;
  int64_t off = 0;
  std::vector<int64_t> pos;  // (B, maxL) positions into the flattened targets
  for (int64_t i = 0; i < c.B; ++i) {
    if (c.il[i] < 0 || c.il[i] > c.T || c.tl[i] < 0) throw Unsupported("ctc_loss: lengths CPU rejects");
    c.L = std::max(c.L, c.tl[i]);
  }
  int64_t width = tg.rank() == 2 ? tg.shape()[1] : 0;
  if (tg.rank() == 2 && (c.L > width || tg.shape()[0] < c.B)) throw Unsupported("ctc_loss: targets too short");
  int64_t total = 0;
  for (auto v : c.tl) total += v;
  if (tg.rank() == 1 && total != tg.shape()[0]) throw Unsupported("ctc_loss: targets size");
  if (tg.rank() != 1 && tg.rank() != 2) throw Unsupported("ctc_loss: targets rank");
  int64_t Lp = std::max<int64_t>(c.L, 1);
  for (int64_t i = 0; i < c.B; ++i) {
    for (int64_t j = 0; j < Lp; ++j) {
      int64_t jj = std::min(j, std::max<int64_t>(c.tl[i] - 1, 0));
      pos.push_back(tg.rank() == 2 ? i * width + jj : off + jj);
    }
    off += c.tl[i];
  }
  c.S = 2 * c.L + 1;
  Value flat = b.reshape(tg, {tg.type.numel()});
  Value tgt = tg.type.numel() == 0 ? b.constant(0, DType::I64, {c.B, Lp})
                                    : b.reshape(b.gather(flat, i64_const(b, pos, {c.B * Lp, 1}), {}, {0}, {0}, 1, {1},
                                                         {c.B * Lp}),
                                                {c.B, Lp});
  // l'[s]: blank at even s, target (s - 1) / 2 at odd s.
  std::vector<Value> cols;
  Value blank_col = b.constant(static_cast<double>(blank), DType::I64, {c.B, 1});
  for (int64_t s = 0; s < c.S; ++s)
    cols.push_back(s % 2 == 0 ? blank_col : b.slice(tgt, {0, (s - 1) / 2}, {c.B, (s - 1) / 2 + 1}, {1, 1}));
  c.labels = b.clamp(b.constant(0, DType::I64, {c.B, c.S}), b.concatenate(cols, 1),
                     b.constant(static_cast<double>(c.C - 1), DType::I64, {c.B, c.S}));
  // lpl[t, b, s] = log_probs[t, b, l'[b, s]]
  Shape is{c.T, c.B, c.S, 1};
  Value ti = b.iota(Type{DType::I64, is}, 0), bi = b.iota(Type{DType::I64, is}, 1);
  Value li = b.broadcast_in_dim(c.labels, is, {1, 2});
  Value idx = b.concatenate({ti, bi, li}, 3);
  c.lpl = b.gather(b.convert(lp, c.t), idx, {}, {0, 1, 2}, {0, 1, 2}, 3, {1, 1, 1}, {c.T, c.B, c.S});
  return c;
}

// Per-(b, s) static masks.
Value mask_bs(Builder& b, const Ctc& c, const std::function<bool(int64_t, int64_t)>& f) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < c.B; ++i)
    for (int64_t s = 0; s < c.S; ++s) v.push_back(f(i, s) ? 1 : 0);
  return b.compare(i64_const(b, v, {c.B, c.S}), b.constant(0, DType::I64, {c.B, c.S}), Cmp::NE);
}

// Shifts along s by k (k > 0: x[s - k]; k < 0: x[s + |k|]), filling -inf.
Value shift(Builder& b, const Value& x, int64_t k) {
  Value ninf = b.constant(kNegInf, x.dtype());
  int64_t S = x.shape()[1];
  if (k > 0) return b.slice(b.pad(x, ninf, {0, k}, {0, 0}, {0, 0}), {0, 0}, {x.shape()[0], S}, {1, 1});
  return b.slice(b.pad(x, ninf, {0, 0}, {0, -k}, {0, 0}), {0, -k}, {x.shape()[0], S - k}, {1, 1});
}

// log(exp(a - m) + exp(b - m) + exp(c - m)) + m with m = max (0 when all are -inf).
Value logadd3(Builder& b, const Value& x, const Value& y, const Value& z) {
  Value m = b.binary("stablehlo.maximum", b.binary("stablehlo.maximum", x, y), z);
  Value ninf = full_like(b, m, kNegInf);
  m = b.select(b.compare(m, ninf, Cmp::EQ), full_like(b, m, 0), m);
  auto e = [&](const Value& v) { return b.unary("stablehlo.exponential", sub(b, v, m)); };
  return add(b, b.unary("stablehlo.log", add(b, add(b, e(x), e(y)), e(z))), m);
}

// The skip transition s - 2 -> s is allowed when l'[s] != l'[s - 2].
Value skip_mask(Builder& b, const Ctc& c) {
  Value l2 = b.pad(b.slice(c.labels, {0, 0}, {c.B, std::max<int64_t>(c.S - 2, 0)}, {1, 1}),
                   b.constant(-1, DType::I64), {0, 2}, {0, 0}, {0, 0});
  l2 = b.slice(l2, {0, 0}, {c.B, c.S}, {1, 1});
  return b.compare(c.labels, l2, Cmp::NE);
}

Value row_at(Builder& b, const Value& x3, const Value& t) {  // x3 (T, B, S)[t] -> (B, S)
  Value z = b.constant(0, DType::I64);
  Shape sz{1, x3.shape()[1], x3.shape()[2]};
  return b.reshape(b.dynamic_slice(x3, {t, z, z}, sz), {x3.shape()[1], x3.shape()[2]});
}

Value put_row(Builder& b, const Value& x3, const Value& row, const Value& t) {
  Value z = b.constant(0, DType::I64);
  return b.dynamic_update_slice(x3, b.reshape(row, {1, row.shape()[0], row.shape()[1]}), {t, z, z});
}

// Per-b static time limit as a (B, S) i64 tensor.
Value per_b(Builder& b, const Ctc& c, const std::vector<int64_t>& v) {
  return b.broadcast_in_dim(i64_const(b, v, {c.B}), {c.B, c.S}, {0});
}

// log_alpha (T, B, S), -inf outside t < il[b], s <= 2 tl[b].
Value alphas(Builder& b, const Ctc& c) {
  Shape bs{c.B, c.S};
  Value ninf = b.constant(kNegInf, c.t, bs);
  Value live = mask_bs(b, c, [&](int64_t i, int64_t s) { return s <= 2 * c.tl[i]; });
  Value first = mask_bs(b, c, [&](int64_t i, int64_t s) { return c.il[i] > 0 && (s == 0 || (s == 1 && c.tl[i] > 0)); });
  Value a0 = b.select(first, row_at(b, c.lpl, b.constant(0, DType::I64)), ninf);
  Value buf = put_row(b, b.constant(kNegInf, c.t, {c.T, c.B, c.S}), a0, b.constant(0, DType::I64));
  Value skip = skip_mask(b, c);
  Value il = per_b(b, c, c.il);
  auto r = b.while_loop(
      {b.constant(1, DType::I64), a0, buf, c.lpl},
      [&](Builder& bb, const std::vector<Value>& st) {
        return std::vector<Value>{bb.compare(st[0], bb.constant(static_cast<double>(c.T), DType::I64), Cmp::LT)};
      },
      [&](Builder& bb, const std::vector<Value>& st) {
        const Value &t = st[0], &a = st[1];
        Value ni = bb.constant(kNegInf, c.t, bs);
        Value n = logadd3(bb, a, shift(bb, a, 1), bb.select(skip, shift(bb, a, 2), ni));
        n = add(bb, n, row_at(bb, st[3], t));
        Value tb = bb.broadcast_in_dim(t, bs, {});
        Value active = bb.binary("stablehlo.and", live, bb.compare(tb, il, Cmp::LT));
        Value row = bb.select(active, n, ni);
        Value next = bb.select(bb.compare(tb, il, Cmp::LT), row, a);  // frozen after il[b] - 1
        return std::vector<Value>{add(bb, t, bb.constant(1, DType::I64)), next, put_row(bb, st[2], row, t), st[3]};
      });
  return r[2];
}

// The final alpha of each b (at t = il[b] - 1): alpha[2L] (+) alpha[2L - 1].
Value nll(Builder& b, const Ctc& c, const Value& la) {
  // Row il[b] - 1 of each b, picked with a static one-hot over t.
  std::vector<int64_t> pick;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t i = 0; i < c.B; ++i) pick.push_back(c.il[i] > 0 && t == c.il[i] - 1);
  Shape tbs{c.T, c.B, c.S};
  Value p = b.compare(b.broadcast_in_dim(i64_const(b, pick, {c.T, c.B}), tbs, {0, 1}),
                      b.constant(0, DType::I64, tbs), Cmp::NE);
  Value last = reduce_max(b, b.select(p, la, b.constant(kNegInf, c.t, tbs)), {0});  // (B, S)
  Value ninf = b.constant(kNegInf, c.t, {c.B, c.S});
  auto at = [&](int64_t d) {
    Value m = mask_bs(b, c, [&](int64_t i, int64_t s) { return c.tl[i] * 2 - d >= 0 && s == c.tl[i] * 2 - d; });
    return reduce_max(b, b.select(m, last, ninf), {1});
  };
  Value l1 = at(0), l2 = at(1), nb = b.constant(kNegInf, c.t, {c.B});
  Value ll = logadd3(b, l1, l2, nb);
  // Empty inputs: likelihood 1 for an empty target, else 0.
  std::vector<int64_t> e0, einf;
  for (int64_t i = 0; i < c.B; ++i) e0.push_back(c.il[i] == 0 && c.tl[i] == 0), einf.push_back(c.il[i] == 0 && c.tl[i] > 0);
  auto flag = [&](const std::vector<int64_t>& v) {
    return b.compare(i64_const(b, v, {c.B}), b.constant(0, DType::I64, {c.B}), Cmp::NE);
  };
  ll = b.select(flag(e0), b.constant(0, c.t, {c.B}), b.select(flag(einf), nb, ll));
  return b.unary("stablehlo.negate", ll);
}

}  // namespace

// _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity)
//   -> (neg_log_likelihood (B), log_alpha (B, T, S)); zero_infinity acts in ctc_loss.
TPU_LOWER(ctc_loss, "_ctc_loss") {
  Builder& b = ctx.b;
  Ctc c = setup(ctx, 0, 1, 2, 3, 4);
  if (ctx.out(1).shape != Shape{c.B, c.T, c.S}) throw Unsupported("ctc_loss: log_alpha shape");
  Value la = alphas(b, c);
  Value out_la = b.transpose(la, {1, 0, 2});
  return {b.convert(nll(b, c, la), ctx.out(0).dtype), b.convert(b.reshape(out_la, ctx.out(1).shape), ctx.out(1).dtype)};
}

// _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha,
//                    blank, zero_infinity): beta by the mirrored recursion, then per class
// c the log-sum of alpha * beta over the states labelled c, as CPU.
TPU_LOWER(ctc_loss_backward, "_ctc_loss_backward") {
  Builder& b = ctx.b;
  Ctc c = setup(ctx, 1, 2, 3, 4, 7);
  Shape bs{c.B, c.S}, tbs{c.T, c.B, c.S};
  Value la = b.transpose(b.convert(ctx.in(6), c.t), {1, 0, 2});  // (T, B, S)
  if (la.shape() != tbs) throw Unsupported("ctc_loss_backward: log_alpha shape");
  Value live = mask_bs(b, c, [&](int64_t i, int64_t s) { return s <= 2 * c.tl[i]; });
  Value endm = mask_bs(b, c, [&](int64_t i, int64_t s) { return s == 2 * c.tl[i] || s == 2 * c.tl[i] - 1; });
  Value il = per_b(b, c, c.il);
  // Skip s + 2 -> s allowed when l'[s + 2] != l'[s] (and s + 2 < 2L + 1).
  Value skip2 = mask_bs(b, c, [&](int64_t i, int64_t s) { return s < 2 * c.tl[i] - 1; });
  Value lab2 = b.slice(b.pad(c.labels, b.constant(-1, DType::I64), {0, 0}, {0, 2}, {0, 0}), {0, 2}, {c.B, c.S + 2},
                       {1, 1});
  skip2 = b.binary("stablehlo.and", skip2, b.compare(lab2, c.labels, Cmp::NE));
  Value ninf_bs = b.constant(kNegInf, c.t, bs);
  auto r = b.while_loop(
      {b.constant(static_cast<double>(c.T - 1), DType::I64), ninf_bs, b.constant(kNegInf, c.t, tbs), c.lpl},
      [&](Builder& bb, const std::vector<Value>& st) {
        return std::vector<Value>{bb.compare(st[0], bb.constant(0, DType::I64), Cmp::GE)};
      },
      [&](Builder& bb, const std::vector<Value>& st) {
        const Value &t = st[0], &nb = st[1];
        Value ni = bb.constant(kNegInf, c.t, bs);
        Value lp = row_at(bb, st[3], t);
        Value rec = add(bb, logadd3(bb, nb, shift(bb, nb, -1), bb.select(skip2, shift(bb, nb, -2), ni)), lp);
        rec = bb.select(live, rec, ni);
        Value tb = bb.broadcast_in_dim(t, bs, {});
        Value last = bb.compare(add(bb, tb, bb.constant(1, DType::I64, bs)), il, Cmp::EQ);
        Value before = bb.compare(add(bb, tb, bb.constant(1, DType::I64, bs)), il, Cmp::LT);
        Value beta = bb.select(last, bb.select(endm, lp, ni), bb.select(before, rec, ni));
        return std::vector<Value>{sub(bb, t, bb.constant(1, DType::I64)), beta, put_row(bb, st[2], beta, t), st[3]};
      });
  Value lb = r[2];
  // Valid alpha region only (a CPU-made log_alpha is uninitialized elsewhere).
  std::vector<int64_t> valid;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t i = 0; i < c.B; ++i)
      for (int64_t s = 0; s < c.S; ++s) valid.push_back(t < c.il[i] && s <= 2 * c.tl[i]);
  Value vm = b.compare(i64_const(b, valid, tbs), b.constant(0, DType::I64, tbs), Cmp::NE);
  Value ab = b.select(vm, add(b, la, lb), b.constant(kNegInf, c.t, tbs));
  // lcab[t, b, k] = log sum over s with l'[b, s] == k of exp(ab[t, b, s]).
  Shape full{c.T, c.B, c.S, c.C};
  Value hit = b.compare(b.broadcast_in_dim(c.labels, full, {1, 2}), b.iota(Type{DType::I64, full}, 3), Cmp::EQ);
  Value abf = b.broadcast_in_dim(ab, full, {0, 1, 2});
  Value m = reduce_max(b, b.select(hit, abf, b.constant(kNegInf, c.t, full)), {2});  // (T, B, C)
  Shape tbc{c.T, c.B, c.C};
  m = b.select(b.compare(m, b.constant(kNegInf, c.t, tbc), Cmp::EQ), b.constant(0, c.t, tbc), m);
  Value ex = b.unary("stablehlo.exponential", sub(b, abf, b.broadcast_in_dim(m, full, {0, 1, 3})));
  Value lcab = add(b, b.unary("stablehlo.log", reduce_sum(b, b.select(hit, ex, b.constant(0, c.t, full)), {2})), m);
  Value lp = b.convert(ctx.in(1), c.t);
  Value nllv = b.broadcast_in_dim(b.convert(ctx.in(5), c.t), tbc, {1});
  Value gr = b.broadcast_in_dim(b.convert(ctx.in(0), c.t), tbc, {1});
  Value g = mul(b, sub(b, b.unary("stablehlo.exponential", lp),
                       b.unary("stablehlo.exponential", sub(b, add(b, lcab, nllv), lp))),
                gr);
  std::vector<int64_t> tmask;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t i = 0; i < c.B; ++i) tmask.push_back(t < c.il[i]);
  Value keep = b.compare(b.broadcast_in_dim(i64_const(b, tmask, {c.T, c.B}), tbc, {0, 1}),
                         b.constant(0, DType::I64, tbc), Cmp::NE);
  if (ctx.flag_or(8, false))
    keep = b.binary("stablehlo.and", keep,
                    b.compare(nllv, b.constant(std::numeric_limits<double>::infinity(), c.t, tbc), Cmp::NE));
  g = b.select(keep, g, b.constant(0, c.t, tbc));
  return {b.convert(g, ctx.out(0).dtype)};
}

}  // namespace tpu::lowering
