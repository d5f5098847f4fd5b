// Scans beyond cumsum/cumprod: cummax, cummin (value and index), logcumsumexp.
// Each is an inclusive scan in log2(n) Hillis-Steele steps: every element combines
// with the running result `shift` before it, the identity where there is none.
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

using Combine = std::function<std::vector<Value>(Builder&, const std::vector<Value>& earlier,
                                                 const std::vector<Value>& later)>;

static std::vector<Value> scan(Builder& b, std::vector<Value> xs, const std::vector<Value>& ids,
                               int64_t dim, const Combine& f) {
  int64_t n = xs[0].shape()[dim];
  for (int64_t shift = 1; shift < n; shift *= 2) xs = f(b, shifted(b, xs, ids, dim, shift), xs);
  return xs;
}

// cummax/cummin: CPU keeps the running extreme and moves it on `x >= best` (`<=` for
// min), so ties go to the later index, and a NaN takes over and stays (later NaNs
// move the index). The pair order this defines is total, so the scan is exact.
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
  auto r = scan(b, {v, idx}, ids, dim, [is_max](Builder& q, const std::vector<Value>& e,
                                                const std::vector<Value>& l) {
    Value take = q.compare(l[0], e[0], is_max ? Cmp::GE : Cmp::LE);
    if (is_float(l[0].dtype()))
      take = lor(q, is_nan(q, l[0]), land(q, lnot(q, is_nan(q, e[0])), take));
    return std::vector<Value>{q.select(take, l[0], e[0]), q.select(take, l[1], e[1])};
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
  auto r = scan(b, {x}, {b.constant(lowest(x.dtype()), x.dtype())}, dim,
                [](Builder& q, const std::vector<Value>& e, const std::vector<Value>& l) {
    return std::vector<Value>{log_add_exp(q, e[0], l[0])};
  });
  return {b.convert(r[0], t)};
}

}  // namespace tpu::lowering
