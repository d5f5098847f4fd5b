// Scaled dot-product attention as one op, forward and backward, in the shape of
// PyTorch's flash-attention kernels: the forward keeps only the output and each row's
// log-sum-exp; the backward recomputes the probabilities from q, k and that log-sum-exp
// instead of reading a saved (L, S) matrix. q, k, v: (B, H, L|S, E); mask broadcasts to
// (B, H, L, S), bool (keep) or additive. Rows with every key masked give zeros (as
// PyTorch's math path does), not NaN.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>

#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

namespace {

struct Scores {
  Value s;       // (B, H, L, S) scaled, masked scores in f32 (f64 for f64 inputs)
  DType t;       // that compute dtype
  double scale;
};

// q kᵀ · scale, (B, H, L, S), with the causal and explicit masks applied (-inf where
// masked); `transposed` gives the same scores as k qᵀ, (B, H, S, L) (the backward's).
// `q0`, `k0`: the first query's and key's index in the whole sequence (causal blocks).
Scores scores(Ctx& ctx, const Value& q, const Value& k, bool causal, int mask_arg, int scale_arg,
              bool transposed = false, int64_t q0 = 0, int64_t k0 = 0) {
  Builder& b = ctx.b;
  DType t = q.dtype() == DType::F64 ? DType::F64 : DType::F32;
  int64_t e = q.shape()[3];
  double scale = ctx.is_none(scale_arg) ? 1.0 / std::sqrt(static_cast<double>(e)) : ctx.f(scale_arg);
  Value qt = b.convert(q, t), kt = b.convert(k, t);
  Value s = transposed ? b.dot_general(kt, qt, {0, 1}, {0, 1}, {3}, {3}, t)
                       : b.dot_general(qt, kt, {0, 1}, {0, 1}, {3}, {3}, t);
  const Shape& ss = s.shape();
  s = mul(b, s, b.constant(scale, t, ss));
  Value ninf = b.constant(-std::numeric_limits<double>::infinity(), t, ss);
  int qd = transposed ? 3 : 2, kd = transposed ? 2 : 3;  // the query and key dims of s
  if (causal) {  // query i sees keys j <= i (top-left aligned, like PyTorch)
    Value i = b.iota(Type{DType::I64, ss}, qd), j = b.iota(Type{DType::I64, ss}, kd);
    if (q0 != k0) i = add(b, i, b.constant(static_cast<double>(q0 - k0), DType::I64, ss));
    s = b.select(b.compare(j, i, Cmp::LE), s, ninf);
  }
  if (mask_arg >= 0 && !ctx.is_none(mask_arg)) {
    Value m = ctx.in(mask_arg);
    Shape ms{ss[0], ss[1], ss[qd], ss[kd]};  // the mask broadcast in (L, S) order
    Value mb = m.dtype() == DType::Bool ? broadcast_to(b, m, ms) : coerce(b, m, t, ms);
    if (transposed) mb = b.transpose(mb, {0, 1, 3, 2});
    s = m.dtype() == DType::Bool ? b.select(mb, s, ninf) : add(b, s, mb);
  }
  return {s, t, scale};
}

// x[:, :, from:to].
Value rows(Builder& b, const Value& x, int64_t from, int64_t to) {
  Shape start{0, 0, from, 0}, limit = x.shape();
  limit[2] = to;
  return b.slice(x, start, limit, {1, 1, 1, 1});
}

// Causal attention with no explicit mask skips what the mask removes: the forward takes
// the queries in blocks, each reading the keys up to its last query only; the backward
// takes the keys in blocks, each reading the queries from its first key on. With n
// blocks that is (n + 1) / 2n of the scores, exponentials and contractions. Measured on
// XLA:CPU (B 2, H 4, E 64, sequence 1,024): forward 2.2-2.5x and backward 1.5-1.7x
// faster in 4 or 8 blocks. At 256 in 2 blocks the gain (a quarter of the forward, a
// tenth of the backward) did not pay for the fused GPT step's longer compile (+0.55-0.9 s
// of 3.2-3.9 s): shorter sequences stay one block.
// TPU_CAUSAL_BLOCK_ROWS: the rows per block (default 256, at most 8 blocks); 0: off.
// Returns the block boundaries (query and key index alike: the mask is top-left aligned).
std::vector<int64_t> causal_blocks(int64_t len) {
  static const int64_t rows = [] {
    const char* e = std::getenv("TPU_CAUSAL_BLOCK_ROWS");
    return e && *e ? std::max<int64_t>(0, std::atoll(e)) : int64_t{256};
  }();
  int64_t n = rows > 0 ? std::max<int64_t>(1, std::min<int64_t>(8, len / rows)) : 1;
  std::vector<int64_t> at;
  for (int64_t i = 0; i <= n; ++i) at.push_back(len * i / n);
  return at;
}

void check_supported(Ctx& ctx, const Value& q, const Value& k, const Value& v, int dropout_arg) {
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) throw Unsupported("attention: not 4-d");
  if (!is_float(q.dtype())) throw Unsupported("attention: dtype");
  if (ctx.f(dropout_arg) != 0.0) throw Unsupported("attention: dropout");
  if (q.shape()[1] != k.shape()[1] || k.shape()[1] != v.shape()[1])
    throw Unsupported("attention: grouped heads");
}

}  // namespace

// _scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *, attn_mask,
// scale) -> (output, logsumexp (B, H, L) f32)
namespace {
// Attention of queries q (starting at index q0) over keys k, v (starting at 0): the
// output and each query's log-sum-exp.
std::pair<Value, Value> attend(Ctx& ctx, const Value& q, const Value& k, const Value& v, bool causal,
                               int64_t q0) {
  Builder& b = ctx.b;
  Scores sc = scores(ctx, q, k, causal, 5, 6, false, q0, 0);
  Value m = reduce_max(b, sc.s, {3});
  Value finite_m = b.select(b.compare(m, b.constant(-INFINITY, sc.t, m.shape()), Cmp::EQ),
                            b.constant(0, sc.t, m.shape()), m);
  // e = exp(s - m) is formed once, read by the sum and the dot; out = (e v) / sum(e)
  // divides the (L, E) result instead of forming the (L, S) probabilities e / sum(e).
  Value e = b.unary("stablehlo.exponential", sub(b, sc.s, b.broadcast_in_dim(finite_m, sc.s.shape(), {0, 1, 2})));
  Value z = reduce_sum(b, e, {3});
  Value lse = add(b, b.unary("stablehlo.log", z), finite_m);  // -inf for dead rows
  Value n = b.dot_general(e, b.convert(v, sc.t), {0, 1}, {0, 1}, {3}, {2}, sc.t);
  const Shape& ns = n.shape();
  Value zb = b.broadcast_in_dim(z, ns, {0, 1, 2}), zero = b.constant(0, sc.t, ns);
  Value out = b.select(b.compare(zb, zero, Cmp::EQ), zero, div(b, n, zb));  // dead rows: zeros
  return {out, lse};
}
}  // namespace

// _scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *, attn_mask,
// scale) -> (output, logsumexp (B, H, L) f32)
TPU_LOWER(sdpa_flash_forward, "_scaled_dot_product_flash_attention_for_cpu") {
  Builder& b = ctx.b;
  Value q = ctx.in(0), k = ctx.in(1), v = ctx.in(2);
  check_supported(ctx, q, k, v, 3);
  bool causal = ctx.flag(4);
  int64_t len = q.shape()[2], keys = k.shape()[2];
  std::vector<int64_t> at = causal && ctx.is_none(5) ? causal_blocks(len) : std::vector<int64_t>{0, len};
  std::vector<Value> outs, lses;
  for (size_t i = 0; i + 1 < at.size(); ++i) {
    int64_t seen = causal ? std::min(at[i + 1], keys) : keys;  // keys up to the block's last query
    bool whole = at.size() == 2;
    auto [out, lse] = attend(ctx, whole ? q : rows(b, q, at[i], at[i + 1]), whole ? k : rows(b, k, 0, seen),
                             whole ? v : rows(b, v, 0, seen), causal, at[i]);
    outs.push_back(out);
    lses.push_back(lse);
  }
  Value out = outs.size() == 1 ? outs[0] : b.concatenate(outs, 2);
  Value lse = lses.size() == 1 ? lses[0] : b.concatenate(lses, 2);
  return {b.convert(out, ctx.out(0).dtype), b.convert(lse, ctx.out(1).dtype)};
}

// _scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, logsumexp,
// dropout_p, is_causal, *, attn_mask, scale) -> (grad_q, grad_k, grad_v)
// Works on transposed probabilities pᵀ (B, H, S, L) from k qᵀ: a different program from
// the forward's q kᵀ, so a fused program cannot merge the two and keep the forward's p
// alive until the backward; the barrier also ties the recomputation to grad_out.
TPU_LOWER(sdpa_flash_backward, "_scaled_dot_product_flash_attention_for_cpu_backward") {
  Builder& b = ctx.b;
  Value q = ctx.in(1), k = ctx.in(2), v = ctx.in(3);
  check_supported(ctx, q, k, v, 6);
  auto held = b.optimization_barrier({ctx.in(0), q, k, ctx.in(5)});
  // Depending on grad_out keeps the recomputation apart from the forward's (and after
  // grad_out exists).
  q = b.after(held[1], held[0]);
  k = b.after(held[2], held[0]);
  bool causal = ctx.flag(7);
  int64_t len = q.shape()[2], keys = k.shape()[2];
  DType t = q.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Value dout = b.convert(held[0], t), o = b.convert(ctx.in(4), t), lse_all = b.convert(held[3], t);
  Value rowdot_all = reduce_sum(b, mul(b, dout, o), {3});  // (B,H,L)
  // Key blocks [at[j], at[j+1]), each with the queries that see them: from its first key on.
  std::vector<int64_t> at = causal && ctx.is_none(8) ? causal_blocks(keys) : std::vector<int64_t>{0, keys};
  bool whole = at.size() == 2;
  std::vector<Value> dks, dvs;
  std::optional<Value> dq;
  for (size_t j = 0; j + 1 < at.size(); ++j) {
    int64_t k0 = at[j], k1 = at[j + 1], q0 = whole ? 0 : std::min(k0, len);
    Value kb = whole ? k : rows(b, k, k0, k1), vb = whole ? v : rows(b, v, k0, k1);
    if (q0 == len) {  // no query sees these keys
      dks.push_back(b.constant(0, t, kb.shape()));
      dvs.push_back(b.constant(0, t, vb.shape()));
      continue;
    }
    Value qb = whole ? q : rows(b, q, q0, len);
    Value doutb = whole ? dout : rows(b, dout, q0, len), ob = whole ? o : rows(b, o, q0, len);
    Value lse = whole ? lse_all : b.slice(lse_all, {0, 0, q0}, {lse_all.shape()[0], lse_all.shape()[1], len}, {1, 1, 1});
    Value rowdot = whole ? rowdot_all : b.slice(rowdot_all, {0, 0, q0}, {rowdot_all.shape()[0], rowdot_all.shape()[1], len}, {1, 1, 1});
    Scores sc = scores(ctx, qb, kb, causal, 8, 9, true, q0, k0);
    const Shape& ts = sc.s.shape();                                              // (B,H,S,L)
    Value lseb = b.broadcast_in_dim(lse, ts, {0, 1, 3});
    Value dead = b.compare(lseb, b.constant(-INFINITY, t, ts), Cmp::EQ);
    Value pt = b.select(dead, b.constant(0, t, ts), b.unary("stablehlo.exponential", sub(b, sc.s, lseb)));
    Value vt = b.convert(vb, t);
    dvs.push_back(b.dot_general(pt, doutb, {0, 1}, {0, 1}, {3}, {2}, t));       // (B,H,S,E)
    Value dpt = b.dot_general(vt, doutb, {0, 1}, {0, 1}, {3}, {3}, t);          // (B,H,S,L)
    Value dst = mul(b, pt, sub(b, dpt, b.broadcast_in_dim(rowdot, ts, {0, 1, 3})));
    dst = mul(b, dst, b.constant(sc.scale, t, ts));
    Value dqb = b.dot_general(dst, b.convert(kb, t), {0, 1}, {0, 1}, {2}, {2}, t);  // (B,H,L,E)
    dks.push_back(b.dot_general(dst, b.convert(qb, t), {0, 1}, {0, 1}, {3}, {2}, t));  // (B,H,S,E)
    if (q0 > 0) dqb = b.pad(dqb, b.constant(0, t), {0, 0, q0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0});
    dq = dq ? add(b, *dq, dqb) : dqb;
  }
  Value dk = dks.size() == 1 ? dks[0] : b.concatenate(dks, 2);
  Value dv = dvs.size() == 1 ? dvs[0] : b.concatenate(dvs, 2);
  return {b.convert(*dq, ctx.out(0).dtype), b.convert(dk, ctx.out(1).dtype), b.convert(dv, ctx.out(2).dtype)};
}

}  // namespace tpu::lowering
