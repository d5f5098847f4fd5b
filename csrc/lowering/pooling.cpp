// Pooling over any number of trailing spatial dims: adaptive average pooling (as
// products with averaging matrices) and 3-d average pooling. The 2-d window pools
// live in nn.cpp.
#include <algorithm>

#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

static Value as_out(Ctx& ctx, const Value& v, int j = 0) {
  return ctx.b.reshape(ctx.b.convert(v, ctx.out(j).dtype), ctx.out(j).shape);
}

// (out, in) matrix averaging bin o of an adaptive pool: 1/len over
// [floor(o * in / out), ceil((o + 1) * in / out)), 0 elsewhere.
static Value adaptive_matrix(Builder& b, int64_t in, int64_t out, DType t) {
  Shape s{out, in};
  auto c = [&](double v) { return b.constant(v, DType::I64, s); };
  auto idiv = [&](const Value& x, const Value& y) { return b.binary("stablehlo.divide", x, y); };
  Value o = b.iota(Type{DType::I64, s}, 0), i = b.iota(Type{DType::I64, s}, 1);
  Value start = idiv(mul(b, o, c(static_cast<double>(in))), c(static_cast<double>(out)));
  Value end = idiv(add(b, mul(b, add(b, o, c(1)), c(static_cast<double>(in))), c(static_cast<double>(out - 1))),
                   c(static_cast<double>(out)));
  Value inside = b.binary("stablehlo.and", b.compare(i, start, Cmp::GE), b.compare(i, end, Cmp::LT));
  Value w = div(b, b.constant(1, t, s), b.convert(sub(b, end, start), t));
  return b.select(inside, w, b.constant(0, t, s));
}

// Contracts the last k dims of x, one at a time, with a matrix per dim: `fwd` maps
// in -> out (matrix dim 1 contracted), else out -> in (dim 0). Each contraction
// moves the new dim to the end, so after k steps the order is restored.
static Value adaptive_apply(Builder& b, Value x, const Shape& in, const Shape& out, bool fwd) {
  int64_t k = static_cast<int64_t>(in.size()), lead = x.rank() - k;
  for (int64_t j = 0; j < k; ++j) {
    Value m = adaptive_matrix(b, in[j], out[j], x.dtype());
    x = b.dot_general(x, m, {}, {}, {lead}, {fwd ? 1 : 0}, x.dtype());
  }
  return x;
}

static Shape tail(const Shape& s, int64_t k) { return Shape(s.end() - k, s.end()); }

static std::vector<Value> adaptive_avg(Ctx& ctx, int64_t k) {
  Builder& b = ctx.b;
  Value x = b.convert(ctx.in(0), acc_type(ctx.in(0).dtype()));
  if (x.type.numel() == 0) throw Unsupported("empty adaptive pool");
  return {as_out(ctx, adaptive_apply(b, x, tail(x.shape(), k), tail(ctx.out(0).shape, k), true))};
}

static std::vector<Value> adaptive_avg_backward(Ctx& ctx, int64_t k) {
  Builder& b = ctx.b;
  Value g = b.convert(ctx.in(0), acc_type(ctx.in(0).dtype()));
  if (g.type.numel() == 0) throw Unsupported("empty adaptive pool");
  return {as_out(ctx, adaptive_apply(b, g, tail(ctx.out(0).shape, k), tail(g.shape(), k), false))};
}

TPU_LOWER(adaptive_avg_pool2d_, "_adaptive_avg_pool2d") { return adaptive_avg(ctx, 2); }
TPU_LOWER(adaptive_avg_pool3d_, "_adaptive_avg_pool3d") { return adaptive_avg(ctx, 3); }
TPU_LOWER(adaptive_avg_pool2d_bw, "_adaptive_avg_pool2d_backward") { return adaptive_avg_backward(ctx, 2); }
TPU_LOWER(adaptive_avg_pool3d_bw, "_adaptive_avg_pool3d_backward") { return adaptive_avg_backward(ctx, 3); }

// ---- avg_pool3d ----

struct Window {
  Shape k, s, p, in, out;
};

static Window window(Ctx& ctx, const Shape& in, const Shape& out, int k_i, int s_i, int p_i, int64_t n) {
  auto fill = [n](std::vector<int64_t> v, int64_t d) {
    if (v.empty()) v = {d};
    while (static_cast<int64_t>(v.size()) < n) v.push_back(v[0]);
    return v;
  };
  Window w;
  w.k = fill(ctx.ints(k_i), 1);
  w.s = ctx.is_none(s_i) || ctx.ints(s_i).empty() ? w.k : fill(ctx.ints(s_i), 1);
  w.p = fill(ctx.ints(p_i), 0);
  w.in = tail(in, n), w.out = tail(out, n);
  return w;
}

// Padding after the input so every output window fits (ceil_mode).
static int64_t hi_pad(const Window& w, int64_t i) {
  return std::max<int64_t>(0, (w.out[i] - 1) * w.s[i] + w.k[i] - w.in[i] - w.p[i]);
}

// Window sums of x over its last n dims.
static Value window_sum(Builder& b, const Value& x, const Window& w, bool pad_lo) {
  int64_t r = x.rank(), n = static_cast<int64_t>(w.k.size());
  Shape win(r, 1), str(r, 1);
  std::vector<std::pair<int64_t, int64_t>> pads(r, {0, 0});
  for (int64_t i = 0; i < n; ++i) {
    win[r - n + i] = w.k[i], str[r - n + i] = w.s[i];
    pads[r - n + i] = {pad_lo ? w.p[i] : 0, hi_pad(w, i)};
  }
  return b.reduce_window(x, b.constant(0, x.dtype()), win, str, pads, "stablehlo.add");
}

// Divisor per output position (shape w.out): divisor_override, or the window's size
// within the padded input (count_include_pad) or within the input.
static Value divisor(Ctx& ctx, const Window& w, DType t, bool include_pad, int div_i) {
  Builder& b = ctx.b;
  if (!ctx.is_none(div_i)) return b.constant(static_cast<double>(ctx.i(div_i)), t, w.out);
  if (!include_pad) return window_sum(b, b.constant(1, t, w.in), w, true);
  Shape padded = w.in;
  Window q = w;
  for (size_t i = 0; i < padded.size(); ++i) padded[i] += 2 * w.p[i], q.in[i] = padded[i], q.p[i] = 0;
  // Windows may overhang the padded input (ceil_mode): those positions do not count.
  return window_sum(b, b.constant(1, t, padded), q, false);
}

TPU_LOWER(avg_pool3d, "avg_pool3d") {
  Builder& b = ctx.b;
  Value x = b.convert(ctx.in(0), acc_type(ctx.in(0).dtype()));
  Window w = window(ctx, x.shape(), ctx.out(0).shape, 1, 2, 3, 3);
  Value s = window_sum(b, x, w, true);
  Value d = broadcast_to(b, divisor(ctx, w, x.dtype(), ctx.flag_or(5, true), 6), s.shape());
  return {as_out(ctx, div(b, s, d))};
}

// Each grad / divisor goes back to every input position of its window: one
// interior-padded copy per window tap, summed, the low padding cut off.
TPU_LOWER(avg_pool3d_backward, "avg_pool3d_backward") {
  Builder& b = ctx.b;
  Value go = b.convert(ctx.in(0), acc_type(ctx.in(0).dtype()));
  Window w = window(ctx, ctx.in(1).shape(), go.shape(), 2, 3, 4, 3);
  int64_t r = go.rank(), n = 3;
  Value g = div(b, go, broadcast_to(b, divisor(ctx, w, go.dtype(), ctx.flag(6), 7), go.shape()));
  Shape full(n);
  for (int64_t i = 0; i < n; ++i) full[i] = w.p[i] + w.in[i] + hi_pad(w, i);
  Value zero = b.constant(0, g.dtype());
  std::optional<Value> acc;
  Shape tap(n, 0);
  for (tap[0] = 0; tap[0] < w.k[0]; ++tap[0])
    for (tap[1] = 0; tap[1] < w.k[1]; ++tap[1])
      for (tap[2] = 0; tap[2] < w.k[2]; ++tap[2]) {
        Shape lo(r, 0), hi(r, 0), in(r, 0);
        for (int64_t i = 0; i < n; ++i) {
          int64_t d = r - n + i;
          lo[d] = tap[i], in[d] = w.s[i] - 1;
          hi[d] = full[i] - tap[i] - ((w.out[i] - 1) * w.s[i] + 1);
        }
        Value t = b.pad(g, zero, lo, hi, in);
        acc = acc ? add(b, *acc, t) : t;
      }
  Shape start(r, 0), limit = acc->shape(), one(r, 1);
  for (int64_t i = 0; i < n; ++i) start[r - n + i] = w.p[i], limit[r - n + i] = w.p[i] + w.in[i];
  return {as_out(ctx, b.slice(*acc, start, limit, one))};
}

}  // namespace tpu::lowering
