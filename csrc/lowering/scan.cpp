// Scans: cumsum, cumprod, cummax, cummin (value and index), logcumsumexp, each one
// inclusive scan of an associative, commutative combine in blocks (inclusive_scan, scan.h).
#include "lowering/scan.h"

#include "lowering/compensated_sum.h"
#include "lowering/search_util.h"

namespace tpu::lowering {

using ir::Cmp;
using namespace search;

// xs (same shape) shifted by `shift` along dim, the identity filling the front.
static std::vector<Value> shifted(Builder& b, const std::vector<Value>& xs,
                                  const std::vector<Value>& ids, int64_t dim, int64_t shift) {
  std::vector<Value> out;
  for (size_t j = 0; j < xs.size(); ++j) {
    int64_t r = xs[j].rank();
    Shape lo(r, 0), hi(r, 0), in(r, 0), start(r, 0), one(r, 1);
    lo[dim] = shift;
    out.push_back(b.slice(b.pad(xs[j], ids[j], lo, hi, in), start, xs[j].shape(), one));
  }
  return out;
}

// Inclusive scan of xs along `axis` of extent w: a window of w ending at each element.
static std::vector<Value> window_scan(Builder& b, const std::vector<Value>& xs, const std::vector<Value>& ids,
                                      int64_t axis, int64_t w, const ScanCombine& f) {
  const int64_t r = xs[0].rank();
  Shape window(r, 1), strides(r, 1);
  window[axis] = w;
  std::vector<std::pair<int64_t, int64_t>> padding(r, {0, 0});
  padding[axis] = {w - 1, 0};
  const size_t k = xs.size();
  return b.reduce_window(xs, ids, window, strides, {}, padding, [&f, k](Builder& q, const std::vector<Value>& a) {
    return f(q, std::vector<Value>(a.begin(), a.begin() + k), std::vector<Value>(a.begin() + k, a.end()));
  });
}

// Inclusive scan along dim in blocks (of 16): each block by a window reduction, the
// blocks' totals scanned the same way (recursively), and each block then combined with
// the total of the blocks before it. About block + 1 combines per element in two arrays of
// its size, where a window over the whole dim is n^2/2 combines, and log2(n) Hillis-Steele
// steps kept an array per step on XLA:CPU (a 2^24 float cumsum took 8 s and 98 bytes per
// element). Costly combines take smaller blocks.
std::vector<Value> inclusive_scan(Builder& b, std::vector<Value> xs, const std::vector<Value>& ids, int64_t dim,
                                  const ScanCombine& f, int64_t block) {
  const Shape shape = xs[0].shape();
  const int64_t n = shape[dim], r = xs[0].rank();
  if (n <= 1) return xs;
  if (n <= block) return window_scan(b, xs, ids, dim, n, f);
  const int64_t m = (n + block - 1) / block;
  Shape split;  // dim as [m, block]
  for (int64_t d = 0; d < r; ++d) {
    if (d == dim) {
      split.push_back(m);
      split.push_back(block);
    } else {
      split.push_back(shape[d]);
    }
  }
  Shape lo(r, 0), hi(r, 0), in(r, 0);
  hi[dim] = m * block - n;  // the identity after the end changes nothing before it
  for (size_t j = 0; j < xs.size(); ++j) xs[j] = b.reshape(b.pad(xs[j], ids[j], lo, hi, in), split);
  std::vector<Value> within = window_scan(b, xs, ids, dim + 1, block, f);
  Shape start(r + 1, 0), one(r + 1, 1), totals_shape = shape;
  start[dim + 1] = block - 1;
  totals_shape[dim] = m;
  std::vector<Value> totals;
  for (const Value& w : within) totals.push_back(b.reshape(b.slice(w, start, split, one), totals_shape));
  std::vector<Value> before = shifted(b, inclusive_scan(b, totals, ids, dim, f, block), ids, dim, 1);
  std::vector<int64_t> keep;  // every dim of the totals but the block's own
  for (int64_t d = 0; d <= r; ++d)
    if (d != dim + 1) keep.push_back(d);
  for (Value& v : before) v = b.broadcast_in_dim(v, split, keep);
  std::vector<Value> out = f(b, before, within);
  Shape padded = shape, zero(r, 0), step(r, 1);
  padded[dim] = m * block;
  for (Value& v : out) v = b.slice(b.reshape(v, padded), zero, shape, step);
  return out;
}

Value inclusive_scan(Builder& b, const Value& x, const std::string& op, int64_t dim) {
  Value id = op == "stablehlo.add"        ? b.constant(0, x.dtype())
             : op == "stablehlo.multiply" ? b.constant(1, x.dtype())
                                          : extreme(b, x.dtype(), op == "stablehlo.minimum");
  return inclusive_scan(b, {x}, {id}, dim, [op](Builder& q, const std::vector<Value>& u, const std::vector<Value>& v) {
    return std::vector<Value>{q.binary(op, u[0], v[0])};
  })[0];
}

// cumsum / cumprod: the input cast to the result's dtype first (a narrower dtype= rounds
// every element), then scanned in its accumulation type (f32 for f16/bf16).
static Value cum_arith(Ctx& ctx, const std::string& op) {
  Builder& b = ctx.b;
  Type t = ctx.out(0);
  Value x = b.convert(b.convert(ctx.in(0), t.dtype), acc_type(t.dtype));
  if (x.rank() == 0) return b.reshape(b.convert(x, t.dtype), t.shape);
  int64_t dim = wrap_dim(ctx.i(1), x.rank());
  if (op == "stablehlo.multiply" && t.dtype == DType::F32 && x.shape()[dim] >= kCompensatedProductCount) {
    auto pe = inclusive_scan(b, {x, full_like(b, x, 0)}, {b.constant(1, x.dtype()), b.constant(0, x.dtype())},
                             dim, combine_products, 8);
    x = products_result(b, pe[0], pe[1]);
  } else {
    x = inclusive_scan(b, x, op, dim);
  }
  return b.reshape(b.convert(x, t.dtype), t.shape);
}

TPU_LOWER(cumsum, "cumsum") { return {cum_arith(ctx, "stablehlo.add")}; }
TPU_LOWER(cumprod, "cumprod") { return {cum_arith(ctx, "stablehlo.multiply")}; }

// cummax/cummin: CPU keeps the running extreme and moves it on `x >= best` (`<=` for
// min), so ties go to the later index, and a NaN takes over and stays (later NaNs
// move the index). So the result is the pair first in a total order: a NaN, then the
// larger (smaller) value, then the later index; the combine picks it, in either order.
static std::vector<Value> cum_extreme(Ctx& ctx, bool is_max) {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  if (x.type.numel() == 0) return {x, b.constant(0, DType::I64, x.shape())};  // CPU checks no dim then
  if (x.rank() == 0) {
    int64_t d = ctx.i(1);
    if (d != 0 && d != -1)  // out_of_range: raised as an IndexError, as CPU's
      throw std::out_of_range("Expected reduction dim -1 or 0 for scalar but got " + std::to_string(d));
    return {x, b.constant(0, DType::I64)};
  }
  int64_t dim = wrap_dim(ctx.i(1), x.rank());
  DType t = x.dtype();
  Value v = t == DType::Bool ? b.convert(x, DType::U8) : x;
  Value idx = b.iota(Type{DType::I64, x.shape()}, dim);
  std::vector<Value> ids = {extreme(b, v.dtype(), !is_max), b.constant(-1, DType::I64)};
  auto r = inclusive_scan(b, {v, idx}, ids, dim, [is_max](Builder& q, const std::vector<Value>& u,
                                                const std::vector<Value>& w) {
    Value later = q.compare(w[1], u[1], Cmp::GT);
    Value beats = q.compare(w[0], u[0], is_max ? Cmp::GT : Cmp::LT);
    Value take = lor(q, beats, land(q, q.compare(w[0], u[0], Cmp::EQ), later));
    if (is_float(w[0].dtype())) {
      Value nu = is_nan(q, u[0]), nw = is_nan(q, w[0]);
      take = q.select(nw, lor(q, lnot(q, nu), later), land(q, lnot(q, nu), take));
    }
    return std::vector<Value>{q.select(take, w[0], u[0]), q.select(take, w[1], u[1])};
  });
  return {b.convert(r[0], t), r[1]};
}

TPU_LOWER(cummax, "cummax") { return cum_extreme(ctx, true); }
TPU_LOWER(cummin, "cummin") { return cum_extreme(ctx, false); }

// log(exp(x) + exp(y)) as CPU's kernel: log1p(exp(min - max)) + max, where a NaN y
// wins, and equal infinities (min == max, not finite) return x.
static Value log_add_exp(Builder& b, const Value& x, const Value& y) {
  Value ny = is_nan(b, y);
  Value mn = b.select(ny, y, b.select(b.compare(y, x, Cmp::LT), y, x));
  Value mx = b.select(ny, y, b.select(b.compare(y, x, Cmp::GT), y, x));
  Value finite = b.raw("stablehlo.is_finite", {mn}, "", Type{DType::Bool, mn.shape()});
  Value general = lor(b, b.compare(mn, mx, Cmp::NE), finite);
  Value r = add(b, b.unary("stablehlo.log_plus_one", b.unary("stablehlo.exponential", sub(b, mn, mx))), mx);
  return b.select(general, r, x);
}

// Low-precision floats scan in f32 and round once.
TPU_LOWER(logcumsumexp, "logcumsumexp") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  DType t = ctx.out(0).dtype;
  if (!is_float(t)) throw Unsupported("logcumsumexp of non-floats");
  x = b.convert(x, acc_type(t));
  if (x.rank() == 0) return {b.convert(x, t)};
  int64_t dim = wrap_dim(ctx.i(1), x.rank());
  auto r = inclusive_scan(b, {x}, {b.constant(lowest(x.dtype()), x.dtype())}, dim,
                [](Builder& q, const std::vector<Value>& u, const std::vector<Value>& v) {
    return std::vector<Value>{log_add_exp(q, u[0], v[0])};
  }, 8);
  return {b.convert(r[0], t)};
}

}  // namespace tpu::lowering
