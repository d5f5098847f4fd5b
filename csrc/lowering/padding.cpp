// Backwards of reflection and replication padding (1-3 trailing dims). Along each padded
// dim, output position o copies input position src(o); the gradient adds every output's
// grad back at src(o): a scatter-add per dim, last dim first.
#include <algorithm>

#include "lowering/helpers.h"

namespace tpu::lowering {

namespace {

// src(o) for o in [0, in + lo + hi); lo / hi may be negative (cropping).
std::vector<int64_t> sources(int64_t in, int64_t lo, int64_t hi, bool reflect) {
  std::vector<int64_t> v;
  for (int64_t o = 0; o < in + lo + hi; ++o) {
    int64_t p = o - lo;
    if (reflect) {
      if (p < 0) p = -p;
      if (p >= in) p = 2 * (in - 1) - p;
    } else {
      p = std::clamp<int64_t>(p, 0, in - 1);
    }
    v.push_back(p);
  }
  return v;
}

// grad (.., out, ..) at dim d -> (.., in, ..): grad_in[src(o)] += grad[o].
Value scatter_dim(Builder& b, const Value& g, int64_t d, const std::vector<int64_t>& src, int64_t in) {
  std::vector<int64_t> perm{d};
  for (int64_t i = 0; i < g.rank(); ++i)
    if (i != d) perm.push_back(i);
  std::vector<int64_t> inv(perm.size());
  Shape moved;
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i), moved.push_back(g.shape()[perm[i]]);
  int64_t out = moved[0], rest = out ? g.type.numel() / out : 0;
  Value gf = b.reshape(b.transpose(g, perm), {out, rest});
  std::string s;
  for (size_t i = 0; i < src.size(); ++i) s += (i ? ", " : "") + std::to_string(src[i]);
  Value idx = b.raw("stablehlo.constant", {}, "value = dense<[" + s + "]> : tensor<" + std::to_string(out) + "xi64>",
                    Type{DType::I64, {out}});
  auto sum = [](Builder& b, const std::vector<Value>& a) { return std::vector<Value>{add(b, a[0], a[1])}; };
  Value r = b.scatter(b.constant(0, g.dtype(), {in, rest}), b.reshape(idx, {out, 1}), gf, {1}, {0}, {0}, 1, sum);
  moved[0] = in;
  return b.transpose(b.reshape(r, moved), inv);
}

// backward(grad_output, self, padding): padding lists (lo, hi) pairs, last dim first.
std::vector<Value> pad_backward(Ctx& ctx, int64_t n, bool reflect) {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  Value g = b.convert(ctx.in(0), acc_type(o.dtype));
  auto pads = ctx.ints(2);
  if (static_cast<int64_t>(pads.size()) != 2 * n) throw Unsupported("padding size");
  if (g.type.numel() == 0 || o.numel() == 0) return {b.constant(0, o.dtype, o.shape)};
  int64_t r = g.rank();
  for (int64_t j = 0; j < n; ++j) {
    int64_t d = r - 1 - j, in = o.shape[d], lo = pads[2 * j], hi = pads[2 * j + 1];
    if (in + lo + hi != g.shape()[d]) throw Unsupported("padding / grad size mismatch");
    if (reflect && (lo >= in || hi >= in)) throw Unsupported("reflection padding too large");
    g = scatter_dim(b, g, d, sources(in, lo, hi, reflect), in);
  }
  return {b.convert(g, o.dtype)};
}

}  // namespace

TPU_LOWER(reflection_pad1d_bw, "reflection_pad1d_backward") { return pad_backward(ctx, 1, true); }
TPU_LOWER(reflection_pad2d_bw, "reflection_pad2d_backward") { return pad_backward(ctx, 2, true); }
TPU_LOWER(reflection_pad3d_bw, "reflection_pad3d_backward") { return pad_backward(ctx, 3, true); }
TPU_LOWER(replication_pad1d_bw, "replication_pad1d_backward") { return pad_backward(ctx, 1, false); }
TPU_LOWER(replication_pad2d_bw, "replication_pad2d_backward") { return pad_backward(ctx, 2, false); }
TPU_LOWER(replication_pad3d_bw, "replication_pad3d_backward") { return pad_backward(ctx, 3, false); }

}  // namespace tpu::lowering
