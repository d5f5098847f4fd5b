// Neural-network ops: softmax, normalizations, embeddings, losses, pooling and
// convolution. Math runs in f32 for f16/bf16 inputs (acc_type) and is rounded once
// at the end, as PyTorch's CPU/CUDA kernels do.
#include <algorithm>
#include <cmath>

#include "lowering/compensated_sum.h"
#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

static Value to_acc(Builder& b, const Value& x) { return b.convert(x, acc_type(x.dtype())); }
static Value as_out(Ctx& ctx, const Value& v, int j = 0) {
  return ctx.b.reshape(ctx.b.convert(v, ctx.out(j).dtype), ctx.out(j).shape);
}
static Value scalar_like(Builder& b, double v, const Value& like) { return full_like(b, like, v); }
// `r` reduced over dims, broadcast back to `shape`.
static Value back(Builder& b, const Value& r, const Shape& shape, const std::vector<int64_t>& dims) {
  return broadcast_to(b, keep_dims(b, r, shape, dims), shape);
}
static std::vector<int64_t> range(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < to; ++i) v.push_back(i);
  return v;
}
static int64_t count(const Shape& s, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (auto d : dims) n *= s[d];
  return n;
}
static Value mean_over(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  return div_count(b, reduce_sum(b, x, dims), static_cast<double>(count(x.shape(), dims)));
}
// mean_over with a compensated sum (within about an ulp of the exact mean).
static Value exact_mean_over(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  return div_count(b, compensated_sum(b, x, dims), static_cast<double>(count(x.shape(), dims)));
}

// The mean of a norm's rows: compensated from kExactRowMean elements on, where a plain
// reduce's error grew past CPU's (LayerNorm over (16, 32, 32) of randn + 1e3: 6e-4 against
// CPU's 2e-5). Shorter rows (a transformer's d_model) keep the plain, faster sum.
constexpr int64_t kExactRowMean = 4096;
static Value row_mean(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  return count(x.shape(), dims) >= kExactRowMean ? exact_mean_over(b, x, dims) : mean_over(b, x, dims);
}

// Whether output j of a backward op is wanted: PyTorch leaves the ones its
// output_mask turns off undefined (dtype Invalid); those get a scalar placeholder.
static bool wanted(Ctx& ctx, int j) { return ctx.out(j).dtype != DType::Invalid; }
static Value placeholder(Ctx& ctx) { return ctx.b.constant(0, DType::F32); }

// Scatter combiner that adds (duplicate indices sum).
static std::vector<Value> sum_region(Builder& b, const std::vector<Value>& a) {
  return {add(b, a[0], a[1])};
}

// ---- softmax ----

// Rank-0 inputs behave as one-element vectors.
static Value vec(Builder& b, const Value& x) { return x.rank() == 0 ? b.reshape(x, {1}) : x; }

static Value softmax(Ctx& ctx, bool log) {
  Builder& b = ctx.b;
  Value x = vec(b, to_acc(b, ctx.in(0)));
  int64_t dim = wrap_dim(ctx.i(1), x.rank());
  // A row of -inf gives NaN, as in PyTorch.
  Value z = sub(b, x, back(b, reduce_max(b, x, {dim}), x.shape(), {dim}));
  Value e = b.unary("stablehlo.exponential", z);
  Value s = back(b, reduce_sum(b, e, {dim}), x.shape(), {dim});
  return as_out(ctx, log ? sub(b, z, b.unary("stablehlo.log", s)) : div(b, e, s));
}

TPU_LOWER(softmax_, "_softmax") {
  wrap_dim(ctx.i(1), ctx.type_of(0).rank());  // CPU checks the dim before the dtype,
  if (ctx.type_of(0).numel() > 0) require_float(ctx, 0, "softmax");  // which it checks where there are values

  return {softmax(ctx, false)};
}
TPU_LOWER(log_softmax_, "_log_softmax") {
  wrap_dim(ctx.i(1), ctx.type_of(0).rank());
  if (ctx.type_of(0).numel() > 0) require_float(ctx, 0, "log_softmax");
  return {softmax(ctx, true)};
}

// grad * y - y * sum(grad * y)   (softmax)
// grad - exp(y) * sum(grad)      (log_softmax)
static Value softmax_grad(Ctx& ctx, bool log) {
  Builder& b = ctx.b;
  Value g = vec(b, to_acc(b, ctx.in(0))), y = vec(b, b.convert(ctx.in(1), g.dtype()));
  int64_t dim = wrap_dim(ctx.i(2), g.rank());
  if (log) {
    Value s = back(b, reduce_sum(b, g, {dim}), g.shape(), {dim});
    return as_out(ctx, sub(b, g, mul(b, b.unary("stablehlo.exponential", y), s)));
  }
  Value gy = mul(b, g, y);
  return as_out(ctx, sub(b, gy, mul(b, y, back(b, reduce_sum(b, gy, {dim}), g.shape(), {dim}))));
}

TPU_LOWER(softmax_backward, "_softmax_backward_data") { return {softmax_grad(ctx, false)}; }
TPU_LOWER(log_softmax_backward, "_log_softmax_backward_data") { return {softmax_grad(ctx, true)}; }

// ---- layer norm ----

// Optional per-element parameter at `idx` (shape = trailing dims of `shape`),
// broadcast to `shape` in dtype t.
static std::optional<Value> param_b(Ctx& ctx, int idx, DType t, const Shape& shape) {
  if (ctx.is_none(idx)) return std::nullopt;
  return coerce(ctx.b, ctx.in(idx), t, shape);
}

TPU_LOWER(native_layer_norm, "native_layer_norm") {
  Builder& b = ctx.b;
  Value x = to_acc(b, ctx.in(0));
  const Shape shape = x.shape();
  int64_t axis = x.rank() - static_cast<int64_t>(ctx.ints(1).size());
  // Several normalized dims are one row: XLA:CPU reduces a single trailing dim far more
  // accurately than several (randn + 1e3 over (16, 32, 32): 6e-4 -> 6e-5 of the output).
  if (x.rank() - axis > 1) {
    Shape rows(shape.begin(), shape.begin() + axis);
    rows.push_back(count(shape, range(axis, x.rank())));
    x = b.reshape(x, rows);
  }
  auto dims = range(axis, x.rank());
  Value mean = row_mean(b, x, dims);
  Value d = sub(b, x, back(b, mean, x.shape(), dims));
  Value var = row_mean(b, mul(b, d, d), dims);  // biased
  Value rstd = b.unary("stablehlo.rsqrt", add(b, var, scalar_like(b, ctx.f(4), var)));
  Value y = b.reshape(mul(b, d, back(b, rstd, x.shape(), dims)), shape);
  if (auto w = param_b(ctx, 2, y.dtype(), shape)) y = mul(b, y, *w);
  if (auto bias = param_b(ctx, 3, y.dtype(), shape)) y = add(b, y, *bias);
  return {as_out(ctx, y, 0), as_out(ctx, mean, 1), as_out(ctx, rstd, 2)};
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = grad * weight;
// dweight = sum(grad * xhat), dbias = sum(grad) over the batch dims (in blocks).
TPU_LOWER(native_layer_norm_backward, "native_layer_norm_backward") {
  Builder& b = ctx.b;
  Value go = to_acc(b, ctx.in(0));
  Value x = b.convert(ctx.in(1), go.dtype());
  const Shape& s = x.shape();
  int64_t axis = x.rank() - static_cast<int64_t>(ctx.ints(2).size());
  auto norm = range(axis, x.rank()), batch = range(0, axis);
  Value mean = broadcast_to(b, b.convert(ctx.in(3), go.dtype()), s);
  Value rstd = broadcast_to(b, b.convert(ctx.in(4), go.dtype()), s);
  Value xhat = mul(b, sub(b, x, mean), rstd);
  std::vector<Value> outs;
  if (wanted(ctx, 0)) {
    Value g = go;
    if (auto w = param_b(ctx, 5, go.dtype(), s)) g = mul(b, g, *w);
    // Compensated row sums: dx sums to zero over a row, and a loss that reaches the norm
    // through a constant grad (a mean of its output) makes dx itself zero, so all of dx
    // is these sums' rounding, which the backward upstream carries into every gradient.
    Value t = sub(b, g, back(b, exact_mean_over(b, g, norm), s, norm));
    t = sub(b, t, mul(b, xhat, back(b, exact_mean_over(b, mul(b, g, xhat), norm), s, norm)));
    outs.push_back(as_out(ctx, mul(b, rstd, t), 0));
  } else {
    outs.push_back(placeholder(ctx));
  }
  outs.push_back(wanted(ctx, 1) ? as_out(ctx, blocked_sum(b, mul(b, go, xhat), batch), 1) : placeholder(ctx));
  outs.push_back(wanted(ctx, 2) ? as_out(ctx, blocked_sum(b, go, batch), 2) : placeholder(ctx));
  return outs;
}

// ---- group norm ----
// Input (N, C, *) is viewed as (N, G, C/G * HxW); weight and bias are per channel.

static Value per_channel(Builder& b, const Value& p, DType t, int64_t n, int64_t c, int64_t hw) {
  return b.broadcast_in_dim(b.convert(p, t), {n, c, hw}, {1});
}

TPU_LOWER(native_group_norm, "native_group_norm") {
  Builder& b = ctx.b;
  Value in = to_acc(b, ctx.in(0));
  int64_t n = ctx.i(3), c = ctx.i(4), hw = ctx.i(5), g = ctx.i(6);
  Value x = b.reshape(in, {n, g, c / g * hw});
  Value mean = row_mean(b, x, {2});
  Value d = sub(b, x, back(b, mean, x.shape(), {2}));
  Value rstd = b.unary("stablehlo.rsqrt",
                       add(b, row_mean(b, mul(b, d, d), {2}), scalar_like(b, ctx.f(7), mean)));
  Value y = b.reshape(mul(b, d, back(b, rstd, x.shape(), {2})), {n, c, hw});
  if (!ctx.is_none(1)) y = mul(b, y, per_channel(b, ctx.in(1), y.dtype(), n, c, hw));
  if (!ctx.is_none(2)) y = add(b, y, per_channel(b, ctx.in(2), y.dtype(), n, c, hw));
  return {as_out(ctx, y, 0), as_out(ctx, mean, 1), as_out(ctx, rstd, 2)};
}

TPU_LOWER(native_group_norm_backward, "native_group_norm_backward") {
  Builder& b = ctx.b;
  Value go = to_acc(b, ctx.in(0));
  int64_t n = ctx.i(5), c = ctx.i(6), hw = ctx.i(7), g = ctx.i(8);
  DType t = go.dtype();
  Shape grouped{n, g, c / g * hw}, chan{n, c, hw};
  Value x = b.reshape(b.convert(ctx.in(1), t), grouped);
  Value mean = back(b, b.convert(ctx.in(2), t), grouped, {2});
  Value rstd = back(b, b.convert(ctx.in(3), t), grouped, {2});
  Value xhat = mul(b, sub(b, x, mean), rstd);
  Value go_c = b.reshape(go, chan), xhat_c = b.reshape(xhat, chan);
  std::vector<Value> outs;
  if (wanted(ctx, 0)) {
    Value gw = ctx.is_none(4) ? go_c : mul(b, go_c, per_channel(b, ctx.in(4), t, n, c, hw));
    gw = b.reshape(gw, grouped);
    Value r = sub(b, gw, back(b, mean_over(b, gw, {2}), grouped, {2}));
    r = sub(b, r, mul(b, xhat, back(b, mean_over(b, mul(b, gw, xhat), {2}), grouped, {2})));
    outs.push_back(as_out(ctx, mul(b, rstd, r), 0));
  } else {
    outs.push_back(placeholder(ctx));
  }
  // Per-channel sums over N and HxW, compensated as batch norm's (plain: 10x CPU's error).
  outs.push_back(wanted(ctx, 1) ? as_out(ctx, compensated_sum(b, mul(b, go_c, xhat_c), {0, 2}), 1)
                                : placeholder(ctx));
  outs.push_back(wanted(ctx, 2) ? as_out(ctx, compensated_sum(b, go_c, {0, 2}), 2) : placeholder(ctx));
  return outs;
}

// ---- embedding ----

// Rows of `weight` (V, D) at `indices` (any shape): indices.shape + [D].
TPU_LOWER(embedding, "embedding") {
  Builder& b = ctx.b;
  Value w = ctx.in(0), idx = b.convert(ctx.in(1), DType::I64);
  int64_t n = idx.type.numel(), d = w.shape()[1];
  check_in_range(ctx, idx, 0, w.shape()[0],
                 w.shape()[0] == 0  // CPU's index_select refuses an empty weight first
                     ? std::string("RuntimeError: aten::embedding: index_select(): self indexing axis dim should be positive")
                     : "aten::embedding: index out of range: valid indices are 0 to " + std::to_string(w.shape()[0] - 1));
  Value r = b.gather(w, b.reshape(idx, {n, 1}), {1}, {0}, {0}, 1, {1, d}, {n, d});
  return {b.reshape(r, ctx.out(0).shape)};
}

// embedding_renorm_(weight, indices, max_norm, norm_type): each row at `indices` whose
// norm exceeds max_norm is scaled to max_norm / (norm + 1e-7), as CPU's kernel does; a
// repeated index writes its row's one new value again.
TPU_LOWER(embedding_renorm, "embedding_renorm") {
  Builder& b = ctx.b;
  Value w = ctx.in(0), idx = b.convert(ctx.in(1), DType::I64);
  int64_t n = idx.type.numel(), d = w.shape()[1];
  double max_norm = ctx.f(2), p = ctx.f(3);
  check_in_range(ctx, idx, 0, w.shape()[0],
                 "aten::embedding_renorm_: index out of range: valid indices are 0 to " +
                     std::to_string(w.shape()[0] - 1));
  if (n == 0) return {as_out(ctx, w)};
  Value flat = b.reshape(idx, {n, 1});
  Value rows = to_acc(b, b.gather(w, flat, {1}, {0}, {0}, 1, {1, d}, {n, d}));
  DType t = rows.dtype();
  Value a = b.unary("stablehlo.abs", rows), norm;
  if (p == 2) {
    norm = b.unary("stablehlo.sqrt", reduce_sum(b, mul(b, rows, rows), {1}));
  } else if (p == 1) {
    norm = reduce_sum(b, a, {1});
  } else if (std::isinf(p) && p > 0) {
    norm = reduce_max(b, a, {1});
  } else {
    Value sum = reduce_sum(b, b.binary("stablehlo.power", a, b.constant(p, t, {n, d})), {1});
    norm = b.binary("stablehlo.power", sum, b.constant(1 / p, t, {n}));
  }
  Value scale = b.select(b.compare(norm, b.constant(max_norm, t, {n}), Cmp::GT),
                         div(b, b.constant(max_norm, t, {n}), add(b, norm, b.constant(1e-7, t, {n}))),
                         b.constant(1, t, {n}));
  Value scaled = b.convert(mul(b, rows, b.broadcast_in_dim(scale, {n, d}, {0})), w.dtype());
  auto take_new = [](Builder&, const std::vector<Value>& v) { return std::vector<Value>{v[1]}; };
  return {as_out(ctx, b.scatter(w, flat, scaled, {1}, {0}, {0}, 1, take_new))};
}

// Rows of grad summed into their index's row, padding_idx's row left zero; with
// scale_grad_by_freq each row is divided by how often its index occurs.
TPU_LOWER(embedding_dense_backward, "embedding_dense_backward") {
  Builder& b = ctx.b;
  Value idx = b.convert(ctx.in(1), DType::I64);
  int64_t n = idx.type.numel(), v = ctx.i(2), pad = ctx.i(3);
  Value g = to_acc(b, ctx.in(0));
  int64_t d = g.type.numel() / std::max<int64_t>(n, 1);
  g = b.reshape(g, {n, d});
  Value flat = b.reshape(idx, {n, 1});
  if (ctx.flag(4)) {
    Value counts = b.scatter(b.constant(0, g.dtype(), {v}), flat, b.constant(1, g.dtype(), {n}), {},
                             {0}, {0}, 1, sum_region);
    Value per = b.gather(counts, flat, {}, {0}, {0}, 1, {1}, {n});
    g = div(b, g, b.broadcast_in_dim(per, {n, d}, {0}));
  }
  Value keep = b.compare(idx, b.constant(static_cast<double>(pad), DType::I64, idx.shape()), Cmp::NE);
  g = b.select(b.broadcast_in_dim(b.reshape(keep, {n}), {n, d}, {0}), g, full_like(b, g, 0));
  Value r = b.scatter(b.constant(0, g.dtype(), {v, d}), flat, g, {1}, {0}, {0}, 1, sum_region);
  return {as_out(ctx, r)};
}

// ---- losses ----
// reduction: 0 none, 1 mean, 2 sum.

static Value reduce_loss(Builder& b, const Value& l, int64_t reduction) {
  if (reduction == 0) return l;
  auto all = range(0, l.rank());
  return reduction == 1 ? mean_over(b, l, all) : reduce_sum(b, l, all);
}

// Gradient of the reduction: grad_output broadcast to `shape`, / N for mean.
static Value loss_grad(Ctx& ctx, const Value& go, const Shape& shape, int64_t reduction, DType t) {
  Builder& b = ctx.b;
  Value g = coerce(b, go, t, shape);
  if (reduction == 1) {
    double n = 1;
    for (auto s : shape) n *= s;
    g = div_count(b, g, n);
  }
  return g;
}

// One-hot of `target` along the class dim of self (dim 1, or 0 for 1-D self), the
// class weight of each target (1 without weight), zeroed where target is
// ignore_index. Works for nll_loss and nll_loss2d alike.
struct NllParts {
  Value onehot, w;  // onehot: self-shaped bool; w: target-shaped
  Value valid;      // target-shaped: target != ignore_index
  int64_t cdim;
};

static NllParts nll_parts(Ctx& ctx, const Value& self, const Value& target, int w_idx, int64_t ignore) {
  Builder& b = ctx.b;
  NllParts p;
  p.cdim = self.rank() >= 2 ? 1 : 0;
  const Shape& s = self.shape();
  std::vector<int64_t> tdims;
  for (int64_t d = 0; d < self.rank(); ++d)
    if (d != p.cdim) tdims.push_back(d);
  Value t = b.convert(target, DType::I64);
  Value tb = b.broadcast_in_dim(t, s, tdims);
  p.onehot = b.compare(b.iota(Type{DType::I64, s}, p.cdim), tb, Cmp::EQ);
  DType ft = self.dtype();
  Value zero = b.constant(0, ft, s);
  if (ctx.is_none(w_idx)) {
    p.w = b.constant(1, ft, t.shape());
  } else {
    Value wb = b.broadcast_in_dim(b.convert(ctx.in(w_idx), ft), s, {p.cdim});
    p.w = reduce_sum(b, b.select(p.onehot, wb, zero), {p.cdim});
  }
  p.valid = b.compare(t, b.constant(static_cast<double>(ignore), DType::I64, t.shape()), Cmp::NE);
  p.w = b.select(p.valid, p.w, full_like(b, p.w, 0));
  return p;
}

// Every target a class of self (or ignore_index), checked on the device as CPU does.
static void check_targets(Ctx& ctx, const Value& self, const Value& target, int64_t ignore) {
  Builder& b = ctx.b;
  int64_t c = self.shape()[self.rank() >= 2 ? 1 : 0];
  Value t = b.convert(target, DType::I64);
  auto k = [&](double v) { return b.constant(v, DType::I64, t.shape()); };
  Value in = b.binary("stablehlo.and", b.compare(t, k(0), Cmp::GE), b.compare(t, k(static_cast<double>(c)), Cmp::LT));
  Value ok = b.binary("stablehlo.or", in, b.compare(t, k(static_cast<double>(ignore)), Cmp::EQ));
  ctx.check(all_true(b, ok), ctx.op() + ": Target out of bounds: valid targets are 0 to " + std::to_string(c - 1) +
                                 " (or ignore_index " + std::to_string(ignore) + ")");
}

// Returns {loss, total_weight}; total_weight is 0 for reduction none, as on CPU.
static std::vector<Value> nll_forward(Ctx& ctx) {
  Builder& b = ctx.b;
  Value x = to_acc(b, ctx.in(0));
  int64_t reduction = ctx.i(3);
  check_targets(ctx, x, ctx.in(1), ctx.i(4));
  NllParts p = nll_parts(ctx, x, ctx.in(1), 2, ctx.i(4));
  Value picked = reduce_sum(b, b.select(p.onehot, x, full_like(b, x, 0)), {p.cdim});
  Value nz = b.compare(p.w, full_like(b, p.w, 0), Cmp::NE);  // ignored: 0 even for inf input
  Value l = b.select(nz, b.unary("stablehlo.negate", mul(b, picked, p.w)), full_like(b, p.w, 0));
  auto all = range(0, l.rank());
  Value total = reduce_sum(b, p.w, all);
  if (reduction == 0) return {as_out(ctx, l, 0), as_out(ctx, b.constant(0, total.dtype()), 1)};
  Value s = reduce_sum(b, l, all);
  return {as_out(ctx, reduction == 1 ? div(b, s, total) : s, 0), as_out(ctx, total, 1)};
}

// d self = -w * grad at the target class (grad / total_weight for mean).
static Value nll_backward(Ctx& ctx) {
  Builder& b = ctx.b;
  Value x = to_acc(b, ctx.in(1));
  int64_t reduction = ctx.i(4);
  NllParts p = nll_parts(ctx, x, ctx.in(2), 3, ctx.i(5));
  Value g = b.convert(ctx.in(0), x.dtype());
  if (reduction != 0) g = broadcast_to(b, b.reshape(g, {}), p.w.shape());
  if (reduction == 1)
    g = div(b, g, broadcast_to(b, b.reshape(b.convert(ctx.in(6), x.dtype()), {}), p.w.shape()));
  // An ignored target contributes nothing, not 0 * (grad / total): when every target
  // is ignored the total weight is 0 and that product is NaN (CPU skips them).
  Value gt = b.select(p.valid, b.unary("stablehlo.negate", mul(b, g, p.w)), full_like(b, p.w, 0));
  std::vector<int64_t> tdims;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != p.cdim) tdims.push_back(d);
  Value gb = b.broadcast_in_dim(gt, x.shape(), tdims);
  return as_out(ctx, b.select(p.onehot, gb, full_like(b, x, 0)));
}

TPU_LOWER(nll_loss_forward, "nll_loss_forward", "nll_loss2d_forward") { return nll_forward(ctx); }
TPU_LOWER(nll_loss_backward, "nll_loss_backward", "nll_loss2d_backward") { return {nll_backward(ctx)}; }

// Both operands of a pointwise loss in the compute type, broadcast together.
static std::pair<Value, Value> loss_operands(Ctx& ctx, int a, int bi) {
  Builder& b = ctx.b;
  Value x = ctx.in(a), y = ctx.in(bi);
  DType t = acc_type(promote(x.dtype(), y.dtype()));
  Shape s = broadcast_shapes(x.shape(), y.shape());
  return {coerce(b, x, t, s), coerce(b, y, t, s)};
}

TPU_LOWER(mse_loss, "mse_loss") {
  auto [x, y] = loss_operands(ctx, 0, 1);
  Value d = sub(ctx.b, x, y);
  return {as_out(ctx, reduce_loss(ctx.b, mul(ctx.b, d, d), ctx.i_or(2, 1)))};
}

TPU_LOWER(mse_loss_backward, "mse_loss_backward") {
  Builder& b = ctx.b;
  auto [x, y] = loss_operands(ctx, 1, 2);
  Value g = loss_grad(ctx, ctx.in(0), x.shape(), ctx.i(3), x.dtype());
  return {as_out(ctx, mul(b, mul(b, scalar_like(b, 2, x), sub(b, x, y)), g))};
}

// -w * (y * log(x) + (1 - y) * log(1 - x)), each log clamped at -100 as PyTorch.
TPU_LOWER(binary_cross_entropy, "binary_cross_entropy") {
  Builder& b = ctx.b;
  auto [x, y] = loss_operands(ctx, 0, 1);
  Value lo = scalar_like(b, -100, x), one = scalar_like(b, 1, x);
  auto unit = [&](const Value& v) {  // 0 <= v <= 1, false for NaN
    return all_true(b, b.binary("stablehlo.and", b.compare(v, scalar_like(b, 0, v), Cmp::GE),
                                b.compare(v, one, Cmp::LE)));
  };
  ctx.check(unit(x), "RuntimeError: binary_cross_entropy: all elements of input should be between 0 and 1");
  ctx.check(unit(y), "RuntimeError: binary_cross_entropy: all elements of target should be between 0 and 1");
  Value lx = b.binary("stablehlo.maximum", b.unary("stablehlo.log", x), lo);
  Value l1x = b.binary("stablehlo.maximum", b.unary("stablehlo.log", sub(b, one, x)), lo);
  Value l = b.unary("stablehlo.negate", add(b, mul(b, y, lx), mul(b, sub(b, one, y), l1x)));
  if (!ctx.is_none(2)) l = mul(b, l, coerce(b, ctx.in(2), l.dtype(), l.shape()));
  return {as_out(ctx, reduce_loss(b, l, ctx.i_or(3, 1)))};
}

// grad * w * (x - y) / max(x * (1 - x), 1e-12)
TPU_LOWER(binary_cross_entropy_backward, "binary_cross_entropy_backward") {
  Builder& b = ctx.b;
  auto [x, y] = loss_operands(ctx, 1, 2);
  Value one = scalar_like(b, 1, x);
  Value den = b.binary("stablehlo.maximum", mul(b, x, sub(b, one, x)), scalar_like(b, 1e-12, x));
  Value r = div(b, sub(b, x, y), den);
  if (!ctx.is_none(3)) r = mul(b, r, coerce(b, ctx.in(3), r.dtype(), r.shape()));
  return {as_out(ctx, mul(b, r, loss_grad(ctx, ctx.in(0), x.shape(), ctx.i_or(4, 1), x.dtype())))};
}

// |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta; beta == 0 is plain L1.
TPU_LOWER(smooth_l1_loss, "smooth_l1_loss") {
  Builder& b = ctx.b;
  auto [x, y] = loss_operands(ctx, 0, 1);
  double beta = ctx.f_or(3, 1.0);
  if (beta < 0) throw std::invalid_argument("smooth_l1_loss does not support negative values for beta.");
  Value ad = b.unary("stablehlo.abs", sub(b, x, y));
  Value l = ad;
  if (beta > 0) {
    Value quad = div(b, mul(b, scalar_like(b, 0.5, ad), mul(b, ad, ad)), scalar_like(b, beta, ad));
    Value lin = sub(b, ad, scalar_like(b, 0.5 * beta, ad));
    l = b.select(b.compare(ad, scalar_like(b, beta, ad), Cmp::LT), quad, lin);
  }
  return {as_out(ctx, reduce_loss(b, l, ctx.i_or(2, 1)))};
}

TPU_LOWER(smooth_l1_loss_backward, "smooth_l1_loss_backward") {
  Builder& b = ctx.b;
  auto [x, y] = loss_operands(ctx, 1, 2);
  double beta = ctx.f(4);
  Value d = sub(b, x, y);
  Value r = b.unary("stablehlo.sign", d);
  if (beta > 0) {
    Value in = b.compare(b.unary("stablehlo.abs", d), scalar_like(b, beta, d), Cmp::LT);
    r = b.select(in, div(b, d, scalar_like(b, beta, d)), r);
  }
  return {as_out(ctx, mul(b, r, loss_grad(ctx, ctx.in(0), x.shape(), ctx.i(3), x.dtype())))};
}

// ---- pooling ----
// The last two dims are pooled; any leading dims (N, C or just C) are batch.

struct Pool {
  int64_t kh, kw, sh, sw, ph, pw, dh = 1, dw = 1;
  int64_t h, w, oh, ow;
};

static Pool pool_geometry(Ctx& ctx, const Shape& in, const Shape& out, int k_i, int s_i, int p_i,
                          int d_i) {
  auto two = [](std::vector<int64_t> v, int64_t dflt0) {
    if (v.empty()) v = {dflt0};
    if (v.size() == 1) v.push_back(v[0]);
    return v;
  };
  Pool p;
  auto k = two(ctx.ints(k_i), 1);
  auto s = ctx.is_none(s_i) || ctx.ints(s_i).empty() ? k : two(ctx.ints(s_i), 1);
  auto pd = two(ctx.ints(p_i), 0);
  p.kh = k[0], p.kw = k[1], p.sh = s[0], p.sw = s[1], p.ph = pd[0], p.pw = pd[1];
  if (d_i >= 0) {
    auto d = two(ctx.ints(d_i), 1);
    p.dh = d[0], p.dw = d[1];
  }
  size_t r = in.size();
  p.h = in[r - 2], p.w = in[r - 1], p.oh = out[r - 2], p.ow = out[r - 1];
  return p;
}

// High padding so that the output sizes PyTorch chose (ceil_mode) are reached.
static int64_t pad_hi(int64_t n, int64_t out, int64_t k, int64_t s, int64_t d, int64_t lo) {
  return std::max<int64_t>(0, (out - 1) * s + (k - 1) * d + 1 - n - lo);
}

// x padded by `v` on the pooled dims (lo = padding, hi as needed for the output).
static Value pool_pad(Builder& b, const Value& x, const Pool& p, double v) {
  int64_t r = x.rank();
  Shape lo(r, 0), hi(r, 0), in(r, 0);
  lo[r - 2] = p.ph, lo[r - 1] = p.pw;
  hi[r - 2] = pad_hi(p.h, p.oh, p.kh, p.sh, p.dh, p.ph);
  hi[r - 1] = pad_hi(p.w, p.ow, p.kw, p.sw, p.dw, p.pw);
  return b.pad(x, b.constant(v, x.dtype()), lo, hi, in);
}

// Per-window divisor of avg_pool2d, shaped like the pooled dims: the window's size
// clipped to the padded input (count_include_pad) or to the input itself.
static Value avg_divisor(Ctx& ctx, const Pool& p, DType t, bool include_pad, int div_i) {
  Builder& b = ctx.b;
  if (!ctx.is_none(div_i)) return broadcast_to(b, b.number(static_cast<double>(ctx.i(div_i)), t), {p.oh, p.ow});
  Value ones = b.constant(1, t, {p.h, p.w});
  Pool q = p;
  if (include_pad) {
    ones = b.constant(1, t, {p.h + 2 * p.ph, p.w + 2 * p.pw});
    q.h += 2 * p.ph, q.w += 2 * p.pw, q.ph = 0, q.pw = 0;
  }
  Value padded = pool_pad(b, ones, q, 0);
  // Opaque: XLA would fold the counts and multiply by their reciprocals; CPU divides.
  return opaque(b, b.reduce_window(padded, b.constant(0, t), {p.kh, p.kw}, {p.sh, p.sw}, {{0, 0}, {0, 0}},
                                   "stablehlo.add"));
}

TPU_LOWER(avg_pool2d, "avg_pool2d") {
  Builder& b = ctx.b;
  Value x = to_acc(b, ctx.in(0));
  Pool p = pool_geometry(ctx, x.shape(), ctx.out(0).shape, 1, 2, 3, -1);
  int64_t r = x.rank();
  Value xp = pool_pad(b, x, p, 0);
  Shape win(r, 1), str(r, 1);
  win[r - 2] = p.kh, win[r - 1] = p.kw, str[r - 2] = p.sh, str[r - 1] = p.sw;
  Value s = b.reduce_window(xp, b.constant(0, x.dtype()), win, str,
                            std::vector<std::pair<int64_t, int64_t>>(r, {0, 0}), "stablehlo.add");
  Value d = broadcast_to(b, avg_divisor(ctx, p, x.dtype(), ctx.flag_or(5, true), 6), s.shape());
  return {as_out(ctx, div(b, s, d))};
}

// Whether tap `i` of a window (k, stride s, pad lo, n outputs) lands on the input (size h)
// for some output: a ceil_mode window far larger than its input (EfficientNet pools a
// 1x1 map with a 320-wide window) has taps that only ever see padding.
static bool tap_hits_input(int64_t i, int64_t h, int64_t lo, int64_t s, int64_t n) {
  for (int64_t o = 0; o < n; ++o)
    if (o * s + i - lo >= 0 && o * s + i - lo < h) return true;
  return false;
}

// Each output's grad / divisor is spread back over its window: for each tap (i, j)
// the grads are placed at their window's (i, j) input position by an interior pad,
// summed, and the padding cut off. Taps that only see padding are skipped (otherwise
// a 320x320 window is 102,400 pads, minutes of compile).
TPU_LOWER(avg_pool2d_backward, "avg_pool2d_backward") {
  Builder& b = ctx.b;
  Value go = to_acc(b, ctx.in(0));
  Value self = ctx.in(1);
  Pool p = pool_geometry(ctx, self.shape(), go.shape(), 2, 3, 4, -1);
  int64_t r = go.rank();
  Value g = div(b, go, broadcast_to(b, avg_divisor(ctx, p, go.dtype(), ctx.flag(6), 7), go.shape()));
  int64_t hp = p.h + p.ph + pad_hi(p.h, p.oh, p.kh, p.sh, 1, p.ph);
  int64_t wp = p.w + p.pw + pad_hi(p.w, p.ow, p.kw, p.sw, 1, p.pw);
  Value zero = b.constant(0, g.dtype());
  std::optional<Value> acc;
  for (int64_t i = 0; i < p.kh; ++i)
    for (int64_t j = 0; j < p.kw; ++j) {
      if (!tap_hits_input(i, p.h, p.ph, p.sh, p.oh) || !tap_hits_input(j, p.w, p.pw, p.sw, p.ow))
        continue;
      Shape lo(r, 0), hi(r, 0), in(r, 0);
      lo[r - 2] = i, lo[r - 1] = j, in[r - 2] = p.sh - 1, in[r - 1] = p.sw - 1;
      hi[r - 2] = hp - i - ((p.oh - 1) * p.sh + 1);
      hi[r - 1] = wp - j - ((p.ow - 1) * p.sw + 1);
      Value t = b.pad(g, zero, lo, hi, in);
      acc = acc ? add(b, *acc, t) : t;
    }
  Shape start(r, 0), limit = acc->shape(), one(r, 1);
  start[r - 2] = p.ph, start[r - 1] = p.pw;
  limit[r - 2] = p.ph + p.h, limit[r - 1] = p.pw + p.w;
  return {as_out(ctx, b.slice(*acc, start, limit, one))};
}

// ---- convolution ----
// Layout NC* / OI* with any number of spatial dims; stablehlo.convolution via raw.

// "[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]" from the leading two dims of each ("bf").
static std::string conv_numbers(int64_t n, const char* lhs, const char* rhs, const char* out) {
  auto spec = [n](const char* two) {
    std::string s = std::string("[") + two[0] + ", " + two[1];
    for (int64_t i = 0; i < n; ++i) s += ", " + std::to_string(i);
    return s + "]";
  };
  return spec(lhs) + "x" + spec(rhs) + "->" + spec(out);
}

static Value conv(Builder& b, const Value& lhs, const Value& rhs, const std::string& numbers,
                  const Shape& strides, const std::vector<std::pair<int64_t, int64_t>>& pads,
                  const Shape& lhs_dil, const Shape& rhs_dil, int64_t groups, int64_t batch_groups,
                  const Type& out) {
  std::string pad = "dense<[";
  for (size_t i = 0; i < pads.size(); ++i)
    pad += (i ? ", [" : "[") + std::to_string(pads[i].first) + ", " + std::to_string(pads[i].second) + "]";
  pad += "]> : tensor<" + std::to_string(pads.size()) + "x2xi64>";
  if (pads.empty()) pad = "dense<> : tensor<0x2xi64>";
  std::string attrs = "batch_group_count = " + std::to_string(batch_groups) +
                      " : i64, dimension_numbers = #stablehlo.conv<" + numbers +
                      ">, feature_group_count = " + std::to_string(groups) +
                      " : i64, lhs_dilation = " + ir::i64_array(lhs_dil) + ", padding = " + pad +
                      ", rhs_dilation = " + ir::i64_array(rhs_dil) +
                      ", window_strides = " + ir::i64_array(strides) + b.precision_config(lhs, rhs);
  return b.raw("stablehlo.convolution", {lhs, rhs}, attrs, out);
}

struct ConvArgs {
  int64_t n = 0;  // spatial dims
  Shape stride, pad, dil, out_pad;
  int64_t groups = 1;
};

static ConvArgs conv_args(Ctx& ctx, int64_t n, int first) {
  auto fill = [n](std::vector<int64_t> v, int64_t d) {
    if (v.empty()) v = {d};
    while (static_cast<int64_t>(v.size()) < n) v.push_back(v[0]);
    return v;
  };
  ConvArgs a;
  a.n = n;
  a.stride = fill(ctx.ints(first), 1);
  a.pad = fill(ctx.ints(first + 1), 0);
  a.dil = fill(ctx.ints(first + 2), 1);
  a.out_pad = fill(ctx.ints(first + 4), 0);
  a.groups = ctx.i(first + 5);
  // CPU's convolution rejects these before its meta kernel (which the shapes came from) can.
  for (int64_t p : a.pad)
    if (p < 0) throw std::invalid_argument(ctx.op() + ": negative padding is not supported");
  return a;
}

// Gradient of a plain convolution with respect to its input (equivalently, the
// transposed convolution): grad (N, O, *) against the weight (O, I/g, *) flipped,
// its O/g and I roles swapped per group, over the stride-dilated grad.
static Value conv_input_grad(Builder& b, const Value& g, const Value& w, const ConvArgs& a,
                             const Shape& in_spatial, const Type& out) {
  int64_t o = w.shape()[0], ig = w.shape()[1], gr = a.groups;
  Shape k(w.shape().begin() + 2, w.shape().end());
  // (O, I/g, k...) -> (g, O/g, I/g, k...) -> (O/g, g, I/g, k...) -> (O/g, I, k...)
  Shape split{gr, o / gr, ig};
  split.insert(split.end(), k.begin(), k.end());
  std::vector<int64_t> perm{1, 0, 2};
  for (int64_t i = 0; i < a.n; ++i) perm.push_back(3 + i);
  Shape merged{o / gr, gr * ig};
  merged.insert(merged.end(), k.begin(), k.end());
  Value rhs = b.reshape(b.transpose(b.reshape(w, split), perm), merged);
  rhs = b.reverse(rhs, range(2, 2 + a.n));
  std::vector<std::pair<int64_t, int64_t>> pads;
  for (int64_t i = 0; i < a.n; ++i) {
    int64_t kd = (k[i] - 1) * a.dil[i] + 1, od = (g.shape()[2 + i] - 1) * a.stride[i] + 1;
    int64_t lo = kd - a.pad[i] - 1;
    pads.push_back({lo, in_spatial[i] + kd - 1 - od - lo});
  }
  return conv(b, g, rhs, conv_numbers(a.n, "bf", "io", "bf"), Shape(a.n, 1), pads, a.stride, a.dil,
              gr, 1, out);
}

TPU_LOWER(convolution, "convolution", "convolution_overrideable") {
  Builder& b = ctx.b;
  Type out = ctx.out(0);
  DType acc = acc_type(out.dtype);
  // Operands stay in their (low) precision; the result accumulates in acc.
  Value x = b.convert(ctx.in(0), out.dtype), w = b.convert(ctx.in(1), out.dtype);
  ConvArgs a = conv_args(ctx, x.rank() - 2, 3);
  Type rt{acc, out.shape};
  Value y;
  if (ctx.flag(6)) {  // transposed: the input gradient of the mirror convolution
    std::vector<int64_t> op = ctx.ints(7), st = ctx.ints(3), dl = ctx.ints(5);
    for (size_t d = 0; d < op.size(); ++d) {
      int64_t s = st.size() == 1 ? st[0] : st.at(d), l = dl.size() == 1 ? dl[0] : dl.at(d);
      if (op[d] >= s && op[d] >= l)  // as CPU checks (its shapes would not add up otherwise)
        throw std::invalid_argument("output padding must be smaller than either stride or dilation, but got "
                                    "output_padding " + std::to_string(op[d]) + ", stride " + std::to_string(s) +
                                    " and dilation " + std::to_string(l) + " in spatial dim " + std::to_string(d));
    }
    Shape sp(out.shape.begin() + 2, out.shape.end());
    // output_padding only grows the high side; the conv sees the full output size.
    y = conv_input_grad(b, x, w, a, sp, rt);
  } else {
    std::vector<std::pair<int64_t, int64_t>> pads;
    for (int64_t i = 0; i < a.n; ++i) pads.push_back({a.pad[i], a.pad[i]});
    y = conv(b, x, w, conv_numbers(a.n, "bf", "oi", "bf"), a.stride, pads, Shape(a.n, 1), a.dil,
             a.groups, 1, rt);
  }
  if (!ctx.is_none(2)) {
    y = add(b, y, b.broadcast_in_dim(b.convert(ctx.in(2), acc), out.shape, {1}));
  }
  return {b.convert(y, out.dtype)};
}

// Gradient of a plain convolution's weight: the input correlated with the grad, batch
// taking the role of features and the groups split over the batch (batch_group_count).
static Value conv_weight_grad(Builder& b, const Value& x, const Value& g, const ConvArgs& a, const Type& out) {
  std::vector<std::pair<int64_t, int64_t>> pads;
  for (int64_t i = 0; i < a.n; ++i) {
    int64_t kd = (out.shape[2 + i] - 1) * a.dil[i] + 1;
    int64_t od = (g.shape()[2 + i] - 1) * a.stride[i] + 1;
    pads.push_back({a.pad[i], od - x.shape()[2 + i] + kd - a.pad[i] - 1});
  }
  // Grouped, batch_group_count = groups: XLA:CPU expands it into a buffer of about
  // groups x (one sample of x) (19 GB for GLM-5-Next's 24,576-channel depthwise conv).
  // Past kGroupedExpansionBytes the groups go in the features instead: x as (I/g batch,
  // (group, n) features, *) against the grad as (n in, O out, *), feature_group_count =
  // groups, giving (I/g, O, *). Not always: XLA accumulates that form less accurately
  // (a depthwise 5x5 weight grad: 13 ulps against 4.9).
  constexpr double kGroupedExpansionBytes = 256.0 * (1 << 20);
  const Shape& xs = x.shape();
  double expansion = static_cast<double>(a.groups) * x.type.numel() / std::max<int64_t>(xs[0], 1) * 4;
  if (a.groups == 1 || expansion <= kGroupedExpansionBytes)
    return conv(b, x, g, conv_numbers(a.n, "fb", "io", "fb"), a.dil, pads, Shape(a.n, 1), a.stride, 1, a.groups,
                out);
  int64_t n = xs[0], G = a.groups, ig = xs[1] / G;
  Shape split = {n, G, ig}, merged = {ig, G * n};
  std::vector<int64_t> perm = {2, 1, 0}, back = {1, 0};
  for (int64_t i = 0; i < a.n; ++i) {
    split.push_back(xs[2 + i]), merged.push_back(xs[2 + i]);
    perm.push_back(3 + i), back.push_back(2 + i);
  }
  Value lhs = b.reshape(b.transpose(b.reshape(x, split), perm), merged);
  Shape os = {out.shape[1], out.shape[0]};
  for (int64_t i = 0; i < a.n; ++i) os.push_back(out.shape[2 + i]);
  Value r = conv(b, lhs, g, conv_numbers(a.n, "bf", "io", "bf"), a.dil, pads, Shape(a.n, 1), a.stride, G, 1,
                 Type{out.dtype, os});
  return b.transpose(r, back);
}

// Plain convolutions: grad_input as above, grad_weight by conv_weight_grad. A transposed
// convolution is the adjoint of the plain one (in its input), so its grad_input is the
// plain convolution of the grad and its grad_weight the plain weight gradient with the
// roles of input and grad swapped. grad_bias sums the grad.
TPU_LOWER(convolution_backward, "convolution_backward") {
  Builder& b = ctx.b;
  bool transposed = ctx.flag(7);
  Value g = ctx.in(0), x = ctx.in(1), w = ctx.in(2);
  DType acc = acc_type(g.dtype());
  x = b.convert(x, g.dtype()), w = b.convert(w, g.dtype());
  ConvArgs a = conv_args(ctx, x.rank() - 2, 4);
  std::vector<Value> outs;
  if (wanted(ctx, 0)) {
    Shape sp(x.shape().begin() + 2, x.shape().end());
    Value gi;
    if (transposed) {
      std::vector<std::pair<int64_t, int64_t>> pads;
      for (int64_t i = 0; i < a.n; ++i) pads.push_back({a.pad[i], a.pad[i]});
      // The plain convolution's size, cut to x's: output_padding (which may reach the
      // dilation) only added rows x never fed.
      Shape full = x.shape(), one(x.rank(), 1), zero(x.rank(), 0);
      for (int64_t i = 0; i < a.n; ++i) {
        int64_t kd = (w.shape()[2 + i] - 1) * a.dil[i] + 1;
        full[2 + i] = (g.shape()[2 + i] + 2 * a.pad[i] - kd) / a.stride[i] + 1;
      }
      gi = conv(b, g, w, conv_numbers(a.n, "bf", "oi", "bf"), a.stride, pads, Shape(a.n, 1), a.dil, a.groups, 1,
                Type{acc, full});
      if (full != x.shape()) gi = b.slice(gi, zero, x.shape(), one);
    } else {
      gi = conv_input_grad(b, g, w, a, sp, Type{acc, x.shape()});
    }
    outs.push_back(as_out(ctx, gi, 0));
  } else {
    outs.push_back(placeholder(ctx));
  }
  if (wanted(ctx, 1)) {
    Type wt{acc, w.shape()};
    outs.push_back(as_out(ctx, transposed ? conv_weight_grad(b, g, x, a, wt) : conv_weight_grad(b, x, g, a, wt), 1));
  } else {
    outs.push_back(placeholder(ctx));
  }
  if (wanted(ctx, 2)) {
    std::vector<int64_t> dims{0};
    for (int64_t i = 0; i < a.n; ++i) dims.push_back(2 + i);
    // A plain sum over N x spatial (thousands of terms, added one by one on XLA:CPU)
    // drifts tens of ulps where CPU's kernel stays within a few; compensated, about one.
    outs.push_back(as_out(ctx, compensated_sum(b, b.convert(g, acc), dims), 2));
  } else {
    outs.push_back(placeholder(ctx));
  }
  return outs;
}

}  // namespace tpu::lowering
