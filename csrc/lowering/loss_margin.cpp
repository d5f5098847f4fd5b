// Backwards of the multi-class margin losses, from their hinge terms:
//   multi_margin:      z_j = margin - x[y] + x[j] (j != y), loss sum_j w[y] max(0, z_j)^p / C
//   multilabel_margin: z_jk = 1 - x[j] + x[k] (j a target, k not), loss sum max(0, z_jk) / C
// Each active hinge pushes +h into its k / j and -h into the target.
#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

namespace {

enum { kNone = 0, kMean = 1, kSum = 2 };

// grad_output scaled per sample: (N, 1) for reduction none, a scalar broadcast otherwise.
Value grad_scale(Builder& b, const Value& go, int64_t reduction, int64_t n, int64_t c, DType t) {
  Value g = b.convert(go, t);
  if (reduction == kNone && g.rank() == 1) return b.broadcast_in_dim(g, {n, c}, {0});
  return b.broadcast_in_dim(b.reshape(g, {}), {n, c}, {});
}

}  // namespace

// multi_margin_loss(self, target, p, margin, weight, reduction): the hinge terms
// z_j (j != y) raised to p, weighted by w[y], summed over classes / C.
TPU_LOWER(multi_margin_loss, "multi_margin_loss") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  DType t = acc_type(o.dtype);
  Value x = b.convert(ctx.in(0), t);
  if (x.rank() > 2 || x.type.numel() == 0) throw Unsupported("multi_margin_loss: shape");
  int64_t c = x.rank() == 0 ? 1 : x.shape().back(), n = x.rank() == 2 ? x.shape()[0] : 1;
  x = b.reshape(x, {n, c});
  Value y = b.reshape(b.convert(ctx.in(1), DType::I64), {n});
  check_in_range(ctx, y, 0, c, "RuntimeError: multi_margin_loss: target out of range");
  Shape nc{n, c};
  Value p = b.broadcast_in_dim(ctx.scalar(2, t), nc, {});
  Value margin = b.broadcast_in_dim(ctx.scalar(3, t), nc, {});
  Value is_y = b.compare(b.iota(Type{DType::I64, nc}, 1), b.broadcast_in_dim(y, nc, {0}), Cmp::EQ);
  Value xy = reduce_sum(b, b.select(is_y, x, b.constant(0, t, nc)), {1});
  Value z = b.binary("stablehlo.maximum", add(b, sub(b, margin, b.broadcast_in_dim(xy, nc, {0})), x), b.constant(0, t, nc));
  Value h = b.select(b.compare(p, b.constant(1, t, nc), Cmp::EQ), z, mul(b, z, z));
  if (!ctx.is_none(4)) {
    Value w = b.convert(b.reshape(ctx.in(4), {ctx.in(4).type.numel()}), t);
    Value wy = b.gather(w, b.reshape(b.clamp(b.constant(0, DType::I64, {n}), y, b.constant(static_cast<double>(c - 1), DType::I64, {n})), {n, 1}),
                        {}, {0}, {0}, 1, {1}, {n});
    h = mul(b, h, b.broadcast_in_dim(wy, nc, {0}));
  }
  Value l = div_count(b, reduce_sum(b, b.select(is_y, b.constant(0, t, nc), h), {1}), static_cast<double>(c));
  int64_t red = ctx.i(5);
  if (red != kNone) {
    l = reduce_sum(b, l, {0});
    if (red == kMean) l = div_count(b, l, static_cast<double>(n));
  }
  return {b.convert(b.reshape(l, o.shape), o.dtype)};
}

// multi_margin_loss_backward(grad_output, self, target, p, margin, weight, reduction)
TPU_LOWER(multi_margin_loss_backward, "multi_margin_loss_backward") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  DType t = acc_type(o.dtype);
  Value x = b.convert(ctx.in(1), t);
  if (x.rank() > 2) throw Unsupported("multi_margin_loss: rank");
  int64_t c = x.rank() == 0 ? 1 : x.shape().back(), n = x.rank() == 2 ? x.shape()[0] : 1;
  if (x.type.numel() == 0) return {b.constant(0, o.dtype, o.shape)};
  x = b.reshape(x, {n, c});
  Value y = b.reshape(b.convert(ctx.in(2), DType::I64), {n});
  // p (1 or 2, checked by the caller) and margin are runtime scalars.
  Shape nc{n, c};
  Value p = b.broadcast_in_dim(ctx.scalar(3, t), nc, {});
  Value margin = b.broadcast_in_dim(ctx.scalar(4, t), nc, {});
  int64_t red = ctx.i(6);
  check_in_range(ctx, y, 0, c, "RuntimeError: multi_margin_loss: target out of range");
  Value cls = b.iota(Type{DType::I64, nc}, 1);
  Value is_y = b.compare(cls, b.broadcast_in_dim(y, nc, {0}), Cmp::EQ);
  Value xy = reduce_sum(b, b.select(is_y, x, b.constant(0, t, nc)), {1});  // x[y]
  Value z = add(b, sub(b, margin, b.broadcast_in_dim(xy, nc, {0})), x);
  double g0 = red == kMean ? 1.0 / static_cast<double>(n * c) : 1.0 / static_cast<double>(c);
  Value h = b.select(b.compare(p, b.constant(1, t, nc), Cmp::EQ), b.constant(g0, t, nc),
                     mul(b, b.constant(2 * g0, t, nc), z));
  if (!ctx.is_none(5)) {
    Value w = b.convert(b.reshape(ctx.in(5), {ctx.in(5).type.numel()}), t);
    Value wy = b.gather(w, b.reshape(y, {n, 1}), {}, {0}, {0}, 1, {1}, {n});
    h = mul(b, h, b.broadcast_in_dim(wy, nc, {0}));
  }
  Value active = b.binary("stablehlo.and", b.compare(z, b.constant(0, t, nc), Cmp::GT), b.unary("stablehlo.not", is_y));
  h = b.select(active, h, b.constant(0, t, nc));
  Value hy = reduce_sum(b, h, {1});
  Value gx = b.select(is_y, b.broadcast_in_dim(b.unary("stablehlo.negate", hy), nc, {0}), h);
  gx = mul(b, gx, grad_scale(b, ctx.in(0), red, n, c, t));
  return {b.convert(b.reshape(gx, o.shape), o.dtype)};
}

// multilabel_margin terms of x (N, C) and target (N, C): which target positions count (up
// to the first -1), their classes one-hot (N, P, C), and the hinge values (N, P, C).
struct Multilabel {
  Value valid, onehot, z, is_target;
};

static Multilabel multilabel(Ctx& ctx, const Value& x, const Value& tgt, int64_t n, int64_t c) {
  Builder& b = ctx.b;
  DType t = x.dtype();
  Shape nc{n, c}, ncc{n, c, c};
  Value tg = b.reshape(b.convert(tgt, DType::I64), nc);
  Value pos = b.iota(Type{DType::I64, nc}, 1);
  Value neg = b.compare(tg, b.constant(-1, DType::I64, nc), Cmp::EQ);
  Value first = reduce_min(b, b.select(neg, pos, b.constant(static_cast<double>(c), DType::I64, nc)), {1});
  Multilabel m;
  m.valid = b.compare(pos, b.broadcast_in_dim(first, nc, {0}), Cmp::LT);
  Value oob = b.binary("stablehlo.or", b.compare(tg, b.constant(0, DType::I64, nc), Cmp::LT),
                       b.compare(tg, b.constant(static_cast<double>(c), DType::I64, nc), Cmp::GE));
  Value bad = reduce_max(b, b.convert(b.binary("stablehlo.and", m.valid, oob), DType::I64), {0, 1});
  ctx.check(b.compare(bad, b.constant(0, DType::I64), Cmp::EQ), "RuntimeError: multilabel_margin_loss: target out of range");
  Value tc = b.clamp(b.constant(0, DType::I64, nc), tg, b.constant(static_cast<double>(c - 1), DType::I64, nc));
  m.onehot = b.binary("stablehlo.and",
                      b.compare(b.broadcast_in_dim(tc, ncc, {0, 1}), b.iota(Type{DType::I64, ncc}, 2), Cmp::EQ),
                      b.broadcast_in_dim(m.valid, ncc, {0, 1}));
  m.is_target = reduce_max(b, b.convert(m.onehot, DType::I64), {1});  // (N, C)
  m.is_target = b.compare(m.is_target, b.constant(0, DType::I64, nc), Cmp::NE);
  Value zero3 = b.constant(0, t, ncc);
  Value xt = reduce_sum(b, b.select(m.onehot, b.broadcast_in_dim(x, ncc, {0, 2}), zero3), {2});  // x[target_p]
  m.z = add(b, sub(b, b.constant(1, t, ncc), b.broadcast_in_dim(xt, ncc, {0, 1})), b.broadcast_in_dim(x, ncc, {0, 2}));
  return m;
}

// Hinge (p, k) counts when p is a target position, k no target class, and z > 0.
static Value active(Builder& b, const Multilabel& m, const Value& is_target, int64_t n, int64_t c) {
  Shape ncc{n, c, c};
  return b.binary("stablehlo.and", b.compare(m.z, b.constant(0, m.z.dtype(), ncc), Cmp::GT),
                  b.binary("stablehlo.and", b.broadcast_in_dim(m.valid, ncc, {0, 1}),
                           b.unary("stablehlo.not", b.broadcast_in_dim(is_target, ncc, {0, 2}))));
}

// multilabel_margin_loss_forward(self, target, reduction) -> (loss, is_target)
TPU_LOWER(multilabel_margin_loss_forward, "multilabel_margin_loss_forward") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  DType t = acc_type(ctx.in(0).dtype());
  Value x = b.convert(ctx.in(0), t);
  if (x.rank() > 2 || x.type.numel() == 0) throw Unsupported("multilabel_margin_loss: shape");
  int64_t c = x.rank() == 0 ? 1 : x.shape().back(), n = x.rank() == 2 ? x.shape()[0] : 1;
  x = b.reshape(x, {n, c});
  Multilabel m = multilabel(ctx, x, ctx.in(1), n, c);
  Value a = active(b, m, m.is_target, n, c);
  Value l = reduce_sum(b, b.select(a, div_count(b, m.z, static_cast<double>(c)),
                                   b.constant(0, t, m.z.shape())), {1, 2});  // (N)
  int64_t red = ctx.i(2);
  if (red == kMean) l = div_count(b, reduce_sum(b, l, {0}), static_cast<double>(n));
  if (red == kSum) l = reduce_sum(b, l, {0});
  Type it = ctx.out(1);
  return {b.convert(b.reshape(l, o.shape), o.dtype), b.reshape(b.convert(m.is_target, it.dtype), it.shape)};
}

// multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target)
TPU_LOWER(multilabel_margin_loss_backward, "multilabel_margin_loss_backward") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  DType t = acc_type(o.dtype);
  Value x = b.convert(ctx.in(1), t);
  if (x.rank() > 2) throw Unsupported("multilabel_margin_loss: rank");
  int64_t c = x.rank() == 0 ? 1 : x.shape().back(), n = x.rank() == 2 ? x.shape()[0] : 1;
  if (x.type.numel() == 0) return {b.constant(0, o.dtype, o.shape)};
  x = b.reshape(x, {n, c});
  Shape nc{n, c}, ncc{n, c, c};
  Multilabel m = multilabel(ctx, x, ctx.in(2), n, c);
  // CPU reads the saved is_target.
  Value ist = b.compare(b.reshape(b.convert(ctx.in(4), t), nc), b.constant(0, t, nc), Cmp::NE);
  Value cnt = b.convert(active(b, m, ist, n, c), t);
  Value plus = reduce_sum(b, cnt, {1});   // per class k
  Value per_p = reduce_sum(b, cnt, {2});  // per target position
  Value minus = reduce_sum(b, mul(b, b.convert(m.onehot, t), b.broadcast_in_dim(per_p, ncc, {0, 1})), {1});
  int64_t red = ctx.i(3);
  double g0 = red == kMean ? 1.0 / static_cast<double>(n * c) : 1.0 / static_cast<double>(c);
  Value gx = mul(b, sub(b, plus, minus), b.constant(g0, t, nc));
  gx = mul(b, gx, grad_scale(b, ctx.in(0), red, n, c, t));
  return {b.convert(b.reshape(gx, o.shape), o.dtype)};
}

}  // namespace tpu::lowering
