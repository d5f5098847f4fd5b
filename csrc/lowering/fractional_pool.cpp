// Fractional max pooling (2-d and 3-d). The pseudo-random window starts come from the
// op's `random_samples` argument (one u in [0, 1) per batch, plane and spatial dim), so
// the rule itself is deterministic: start_i = int((i + u) a) - int(u a) with
// a = (in - k) / (out - 1) in the input's dtype, and the last window ends at the edge.
#include <cmath>

#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

namespace {

struct Frac {
  int64_t planes;             // batch * channels
  Shape in, out, k;           // spatial sizes (T,) H, W
  bool batched;
};

Frac geometry(Ctx& ctx, int nd) {
  Value x = ctx.in(0);
  Frac f;
  f.batched = x.rank() == nd + 2;
  if (!f.batched && x.rank() != nd + 1) throw Unsupported("fractional_max_pool: input rank");
  f.in.assign(x.shape().end() - nd, x.shape().end());
  f.k = ctx.ints(1);
  f.out = ctx.ints(2);
  f.planes = x.type.numel() / std::max<int64_t>(1, ir::Type{x.dtype(), f.in}.numel());
  if (x.type.numel() == 0) throw Unsupported("fractional_max_pool: empty input");
  return f;
}

// Window starts (planes, out[d]) for spatial dim d, from sample column `col`.
Value starts(Builder& b, const Value& samples, int64_t col, int64_t planes, int64_t in, int64_t out,
             int64_t k) {
  DType t = samples.dtype();
  Shape s{planes, out};
  Value u = b.reshape(b.slice(samples, {0, col}, {planes, col + 1}, {1, 1}), {planes});
  u = b.broadcast_in_dim(u, s, {0});
  Value last = b.constant(static_cast<double>(in - k), DType::I64, s);
  if (out == 1) return last;
  Value alpha = div(b, b.constant(static_cast<double>(in - k), t, s),
                    b.constant(static_cast<double>(out - 1), t, s));
  Value i = b.convert(b.iota(Type{DType::I64, s}, 1), t);
  Value st = sub(b, b.convert(b.convert(mul(b, add(b, i, u), alpha), DType::I32), DType::I64),
                 b.convert(b.convert(mul(b, u, alpha), DType::I32), DType::I64));
  Value is_last = b.compare(b.iota(Type{DType::I64, s}, 1), b.constant(out - 1, DType::I64, s), Cmp::EQ);
  return b.select(is_last, last, st);
}

// (values, flat spatial indices), each (planes, out...), of fractional max pooling.
std::pair<Value, Value> pool(Ctx& ctx, int nd) {
  Builder& b = ctx.b;
  Frac f = geometry(ctx, nd);
  Value x = ctx.in(0);
  DType t = x.dtype();
  if (t != DType::F32 && t != DType::F64) throw Unsupported("fractional_max_pool: dtype");
  int64_t spatial = Type{t, f.in}.numel();
  Value flat = b.reshape(x, {f.planes * spatial});
  Value samples = b.reshape(b.convert(ctx.in(3), t), {f.planes, nd});
  // Sample columns: 2-d (W, H); 3-d (T, H, W).
  std::vector<int64_t> col = nd == 2 ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{0, 1, 2};
  Shape os{f.planes};
  for (auto o : f.out) os.push_back(o);
  std::vector<Value> start;  // per dim, broadcast to (planes, out...)
  for (int d = 0; d < nd; ++d) {
    Value s = starts(b, samples, col[d], f.planes, f.in[d], f.out[d], f.k[d]);
    start.push_back(b.broadcast_in_dim(s, os, {0, d + 1}));
  }
  Value plane = b.iota(Type{DType::I64, os}, 0);
  auto c = [&](double v) { return b.constant(v, DType::I64, os); };
  Value best = b.constant(-INFINITY, t, os);
  Value best_i = c(0);
  // Taps in row-major window order; a later tap wins if larger or NaN (CPU's rule).
  Shape tap(nd, 0);
  for (bool first = true;; first = false) {
    Value pos = c(0);
    for (int d = 0; d < nd; ++d)
      pos = add(b, mul(b, pos, c(static_cast<double>(f.in[d]))), add(b, start[d], c(static_cast<double>(tap[d]))));
    Value v = b.gather(flat, b.reshape(add(b, mul(b, plane, c(static_cast<double>(spatial))), pos), [&] {
                         Shape s = os;
                         s.push_back(1);
                         return s;
                       }()),
                       {}, {0}, {0}, static_cast<int64_t>(os.size()), {1}, os);
    if (first) best_i = pos;  // CPU starts from the window's first tap at -inf
    Value take = b.binary("stablehlo.or", b.compare(v, best, Cmp::GT), b.compare(v, v, Cmp::NE));
    best = b.select(take, v, best);
    best_i = b.select(take, pos, best_i);
    int d = nd - 1;
    while (d >= 0 && ++tap[d] == f.k[d]) tap[d--] = 0;
    if (d < 0) break;
  }
  return {best, best_i};
}

std::vector<Value> forward(Ctx& ctx, int nd) {
  auto [v, i] = pool(ctx, nd);
  Builder& b = ctx.b;
  return {b.reshape(v, ctx.out(0).shape), b.reshape(b.convert(i, ctx.out(1).dtype), ctx.out(1).shape)};
}

// grad_input: grad_output added at each output's winning position of its plane.
std::vector<Value> backward(Ctx& ctx, int nd) {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  Value g = ctx.in(0), idx = ctx.in(4);
  int64_t spatial = Type{o.dtype, Shape(o.shape.end() - nd, o.shape.end())}.numel();
  int64_t planes = o.numel() / std::max<int64_t>(1, spatial);
  if (o.numel() == 0) throw Unsupported("fractional_max_pool backward: empty");
  int64_t per = g.type.numel() / std::max<int64_t>(1, planes);
  DType acc = acc_type(o.dtype);
  Value gi = b.reshape(b.convert(g, acc), {planes * per});
  Value plane = b.iota(Type{DType::I64, {planes, per}}, 0);
  Value flat = add(b, mul(b, plane, b.constant(static_cast<double>(spatial), DType::I64, {planes, per})),
                   b.reshape(b.convert(idx, DType::I64), {planes, per}));
  Value zeros = b.constant(0, acc, {planes * spatial});
  Value r = b.scatter(zeros, b.reshape(flat, {planes * per, 1}), gi, {}, {0}, {0}, 1,
                      [](Builder& bb, const std::vector<Value>& a) {
                        return std::vector<Value>{bb.binary("stablehlo.add", a[0], a[1])};
                      });
  return {b.reshape(b.convert(r, o.dtype), o.shape)};
}

}  // namespace

TPU_LOWER(fractional_max_pool2d_rule, "fractional_max_pool2d") { return forward(ctx, 2); }
TPU_LOWER(fractional_max_pool3d_rule, "fractional_max_pool3d") { return forward(ctx, 3); }
TPU_LOWER(fractional_max_pool2d_bwd, "fractional_max_pool2d_backward") { return backward(ctx, 2); }
TPU_LOWER(fractional_max_pool3d_bwd, "fractional_max_pool3d_backward") { return backward(ctx, 3); }

}  // namespace tpu::lowering
