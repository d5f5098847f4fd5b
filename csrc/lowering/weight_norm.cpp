// Weight normalization's fused backward (the forward is PyTorch's decomposition).
// w = g * v / |v|, the norm taken over every dim but `dim`; per slice, with s = <grad_w, v>:
// grad_g = s / |v| and grad_v = g / |v| * (grad_w - v * s / |v|^2).
#include "lowering/helpers.h"

namespace tpu::lowering {

// grad_w, saved_v, saved_g, saved_norms, dim -> (grad_v, grad_g).
TPU_LOWER(weight_norm_interface_backward, "_weight_norm_interface_backward") {
  Builder& b = ctx.b;
  DType t = acc_type(ctx.in(0).dtype());
  Value gw = b.convert(ctx.in(0), t), v = b.convert(ctx.in(1), t);
  const Shape& s = v.shape();
  int64_t dim = wrap_dim(ctx.i(4), v.rank());
  std::vector<int64_t> others;
  for (int64_t d = 0; d < v.rank(); ++d)
    if (d != dim) others.push_back(d);
  // g and the norms are v's shape with every dim but `dim` of size 1.
  auto spread = [&](const Value& x) { return broadcast_to(b, b.reshape(b.convert(x, t), ctx.out(1).shape), s); };
  Value norms = b.reshape(b.convert(ctx.in(3), t), ctx.out(1).shape);
  Value dot = b.reshape(reduce_sum(b, mul(b, gw, v), others), ctx.out(1).shape);
  Value grad_g = div(b, dot, norms);
  Value n = spread(norms);
  Value proj = mul(b, v, div(b, spread(dot), mul(b, n, n)));
  Value grad_v = mul(b, div(b, spread(ctx.in(2)), n), sub(b, gw, proj));
  return {b.convert(grad_v, ctx.out(0).dtype), b.convert(grad_g, ctx.out(1).dtype)};
}

}  // namespace tpu::lowering
