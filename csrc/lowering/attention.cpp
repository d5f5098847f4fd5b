// Scaled dot-product attention as one op, forward and backward, in the shape of
// PyTorch's flash-attention kernels: the forward keeps only the output and each row's
// log-sum-exp; the backward recomputes the probabilities from q, k and that log-sum-exp
// instead of reading a saved (L, S) matrix. q, k, v: (B, H, L|S, E); mask broadcasts to
// (B, H, L, S), bool (keep) or additive. Rows with every key masked give zeros (as
// PyTorch's math path does), not NaN.
#include <cmath>
#include <limits>

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
Scores scores(Ctx& ctx, const Value& q, const Value& k, bool causal, int mask_arg, int scale_arg,
              bool transposed = false) {
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
TPU_LOWER(sdpa_flash_forward, "_scaled_dot_product_flash_attention_for_cpu") {
  Builder& b = ctx.b;
  Value q = ctx.in(0), k = ctx.in(1), v = ctx.in(2);
  check_supported(ctx, q, k, v, 3);
  Scores sc = scores(ctx, q, k, ctx.flag(4), 5, 6);
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
  Scores sc = scores(ctx, q, k, ctx.flag(7), 8, 9, true);
  DType t = sc.t;
  const Shape& ts = sc.s.shape();                                              // (B,H,S,L)
  Value lse = b.broadcast_in_dim(b.convert(held[3], t), ts, {0, 1, 3});
  Value dead = b.compare(lse, b.constant(-INFINITY, t, ts), Cmp::EQ);
  Value pt = b.select(dead, b.constant(0, t, ts), b.unary("stablehlo.exponential", sub(b, sc.s, lse)));
  Value dout = b.convert(held[0], t), vt = b.convert(v, t), o = b.convert(ctx.in(4), t);
  Value dv = b.dot_general(pt, dout, {0, 1}, {0, 1}, {3}, {2}, t);            // (B,H,S,E)
  Value dpt = b.dot_general(vt, dout, {0, 1}, {0, 1}, {3}, {3}, t);           // (B,H,S,L)
  Value rowdot = reduce_sum(b, mul(b, dout, o), {3});                          // (B,H,L)
  Value dst = mul(b, pt, sub(b, dpt, b.broadcast_in_dim(rowdot, ts, {0, 1, 3})));
  dst = mul(b, dst, b.constant(sc.scale, t, ts));
  Value dq = b.dot_general(dst, b.convert(k, t), {0, 1}, {0, 1}, {2}, {2}, t);  // (B,H,L,E)
  Value dk = b.dot_general(dst, b.convert(q, t), {0, 1}, {0, 1}, {3}, {2}, t);  // (B,H,S,E)
  return {b.convert(dq, ctx.out(0).dtype), b.convert(dk, ctx.out(1).dtype),
          b.convert(dv, ctx.out(2).dtype)};
}

}  // namespace tpu::lowering
