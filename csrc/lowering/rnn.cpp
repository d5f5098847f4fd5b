// Fused LSTM and GRU cells: what nn.LSTM / nn.GRU call on tpu for each time step
// (the gate matmuls run before, as mm). The forward saves a workspace of activated
// gates that only our backward reads; its layout follows the meta kernels
// ([B, 4H] for LSTM, [B, 5H] for GRU). Math runs in float32 for half types; the
// kernel rounds the results to the output dtypes once.
#include "lowering/helpers.h"

namespace tpu::lowering {
namespace {

Value acc_in(Ctx& ctx, int i) {
  Value v = ctx.in(i);
  return ctx.b.convert(v, acc_type(v.dtype()));
}

// Columns [k*h, (k+1)*h) of a [B, n*h] value.
Value chunk(Builder& b, const Value& x, int64_t k, int64_t h) {
  return b.slice(x, {0, k * h}, {x.shape()[0], (k + 1) * h}, {1, 1});
}

// Gate pre-activations plus the optional bias (a row broadcast over the batch).
Value with_bias(Ctx& ctx, const Value& gates, int bias_arg) {
  if (ctx.is_none(bias_arg)) return gates;
  Value bias = ctx.b.convert(ctx.in(bias_arg), gates.dtype());
  return add(ctx.b, gates, ctx.b.broadcast_in_dim(bias, gates.shape(), {1}));
}

Value sigmoid(Builder& b, const Value& x) { return b.unary("stablehlo.logistic", x); }
Value tanh(Builder& b, const Value& x) { return b.unary("stablehlo.tanh", x); }
Value one_minus(Builder& b, const Value& x) { return sub(b, full_like(b, x, 1), x); }
Value placeholder(Builder& b) { return b.constant(0, DType::F32); }

}  // namespace

// (input_gates, hidden_gates, cx, input_bias, hidden_bias) -> (hy, cy, workspace):
// gates i, f, g, o; cy = f*cx + i*g; hy = o*tanh(cy); workspace = activated gates.
TPU_LOWER(fused_lstm_cell, "_thnn_fused_lstm_cell") {
  Builder& b = ctx.b;
  b.mark_recurrent_step();
  Value gates = add(b, with_bias(ctx, acc_in(ctx, 0), 3), with_bias(ctx, acc_in(ctx, 1), 4));
  Value cx = acc_in(ctx, 2);
  int64_t h = cx.shape()[1];
  Value i = sigmoid(b, chunk(b, gates, 0, h)), f = sigmoid(b, chunk(b, gates, 1, h));
  Value g = tanh(b, chunk(b, gates, 2, h)), o = sigmoid(b, chunk(b, gates, 3, h));
  Value cy = add(b, mul(b, f, cx), mul(b, i, g));
  Value hy = mul(b, o, tanh(b, cy));
  return {hy, cy, b.concatenate({i, f, g, o}, 1)};
}

// (grad_hy, grad_cy, cx, cy, workspace, has_bias) -> (grad_gates, grad_cx, grad_bias).
TPU_LOWER(fused_lstm_cell_backward, "_thnn_fused_lstm_cell_backward_impl") {
  Builder& b = ctx.b;
  b.mark_recurrent_step();
  if (ctx.is_none(0) && ctx.is_none(1)) return {placeholder(b), placeholder(b), placeholder(b)};
  Value cx = acc_in(ctx, 2), cy = acc_in(ctx, 3), ws = acc_in(ctx, 4);
  int64_t h = cx.shape()[1];
  Value zero = full_like(b, cx, 0);
  Value ghy = ctx.is_none(0) ? zero : acc_in(ctx, 0);
  Value gcy = ctx.is_none(1) ? zero : acc_in(ctx, 1);
  Value i = chunk(b, ws, 0, h), f = chunk(b, ws, 1, h), g = chunk(b, ws, 2, h), o = chunk(b, ws, 3, h);
  Value tcy = tanh(b, cy);
  // d cy: from grad_cy and through hy = o*tanh(cy).
  Value gc = add(b, gcy, mul(b, mul(b, ghy, o), one_minus(b, mul(b, tcy, tcy))));
  Value gi = mul(b, mul(b, gc, g), mul(b, i, one_minus(b, i)));
  Value gf = mul(b, mul(b, gc, cx), mul(b, f, one_minus(b, f)));
  Value gg = mul(b, mul(b, gc, i), one_minus(b, mul(b, g, g)));
  Value go = mul(b, mul(b, ghy, tcy), mul(b, o, one_minus(b, o)));
  Value grad_gates = b.concatenate({gi, gf, gg, go}, 1);
  Value grad_bias = ctx.flag(5) ? reduce_sum(b, grad_gates, {0}) : placeholder(b);
  return {grad_gates, mul(b, gc, f), grad_bias};
}

// (input_gates, hidden_gates, hx, input_bias, hidden_bias) -> (hy, workspace): gates
// r, z, n; n = tanh(in + r*hn); hy = n + z*(hx - n); workspace = [r, z, n, hx, hn].
TPU_LOWER(fused_gru_cell, "_thnn_fused_gru_cell") {
  Builder& b = ctx.b;
  b.mark_recurrent_step();
  Value ig = with_bias(ctx, acc_in(ctx, 0), 3), hg = with_bias(ctx, acc_in(ctx, 1), 4);
  Value hx = acc_in(ctx, 2);
  int64_t h = hx.shape()[1];
  Value r = sigmoid(b, add(b, chunk(b, ig, 0, h), chunk(b, hg, 0, h)));
  Value z = sigmoid(b, add(b, chunk(b, ig, 1, h), chunk(b, hg, 1, h)));
  Value hn = chunk(b, hg, 2, h);
  Value n = tanh(b, add(b, chunk(b, ig, 2, h), mul(b, r, hn)));
  Value hy = add(b, n, mul(b, z, sub(b, hx, n)));
  return {hy, b.concatenate({r, z, n, hx, hn}, 1)};
}

// (grad_hy, workspace, has_bias) -> (grad_input_gates, grad_hidden_gates, grad_hx,
// grad_input_bias, grad_hidden_bias).
TPU_LOWER(fused_gru_cell_backward, "_thnn_fused_gru_cell_backward") {
  Builder& b = ctx.b;
  b.mark_recurrent_step();
  Value ghy = acc_in(ctx, 0), ws = acc_in(ctx, 1);
  int64_t h = ghy.shape()[1];
  Value r = chunk(b, ws, 0, h), z = chunk(b, ws, 1, h), n = chunk(b, ws, 2, h);
  Value hx = chunk(b, ws, 3, h), hn = chunk(b, ws, 4, h);
  Value gz = mul(b, mul(b, ghy, sub(b, hx, n)), mul(b, z, one_minus(b, z)));
  Value gn = mul(b, mul(b, ghy, one_minus(b, z)), one_minus(b, mul(b, n, n)));
  Value gr = mul(b, mul(b, gn, hn), mul(b, r, one_minus(b, r)));
  Value g_in = b.concatenate({gr, gz, gn}, 1);
  Value g_hid = b.concatenate({gr, gz, mul(b, gn, r)}, 1);
  bool bias = ctx.flag(2);
  return {g_in, g_hid, mul(b, ghy, z), bias ? reduce_sum(b, g_in, {0}) : placeholder(b),
          bias ? reduce_sum(b, g_hid, {0}) : placeholder(b)};
}

}  // namespace tpu::lowering
