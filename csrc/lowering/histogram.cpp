// Histograms with CPU's bin arithmetic (see histogram.h), and the histc rule.
#include "lowering/histogram.h"

#include "lowering/factory.h"

#include "lowering/search_util.h"

namespace tpu::lowering::hist {

using ir::Cmp;
using namespace search;

Outer outer_from_data(Builder& b, const Value& x) {
  int64_t m = x.shape()[0], d = x.shape()[1];
  Outer o;
  if (m == 0) {
    o.left = b.constant(0, DType::F64, {d});
    o.right = b.constant(1, DType::F64, {d});
  } else {
    o.left = b.convert(reduce_min(b, x, {0}), DType::F64);
    o.right = b.convert(reduce_max(b, x, {0}), DType::F64);
  }
  auto finite = [&](const Value& v) { return b.raw("stablehlo.is_finite", {v}, "", Type{DType::Bool, v.shape()}); };
  Value ok = land(b, finite(o.left), finite(o.right));
  o.ok = b.compare(reduce_min(b, b.convert(ok, DType::I32), {0}), b.constant(1, DType::I32), Cmp::EQ);
  Value same = b.compare(o.left, o.right, Cmp::EQ);
  Value half = b.constant(0.5, DType::F64, {d});
  o.left = b.select(same, sub(b, o.left, half), o.left);
  o.right = b.select(same, add(b, o.right, half), o.right);
  return o;
}

// Bin of each element of column x [M] over `edges` [E] (both dtype t), as int64; -1
// for elements outside [edges[0], edges[E-1]] or NaN.
static Value bin_of(Builder& b, const Value& x, const Value& edges, Find find) {
  int64_t m = x.shape()[0], e = edges.shape()[0];
  DType t = x.dtype();
  Shape s{m};
  Value left = broadcast_to(b, b.slice(edges, {0}, {1}, {1}), s);
  Value right = broadcast_to(b, b.slice(edges, {e - 1}, {e}, {1}), s);
  Value inside = land(b, b.compare(x, left, Cmp::GE), b.compare(x, right, Cmp::LE));
  auto I = [&](double v) { return b.constant(v, DType::I64, s); };
  Value pos;
  if (find == Find::Search) {
    pos = sub(b, reduce_sum(b, b.convert(b.compare(broadcast_to(b, edges, {m, e}),
                                                    b.broadcast_in_dim(x, {m, e}, {0}), Cmp::LE),
                                          DType::I64), {1}), I(1));
  } else {
    // (x - left) * bins / (right - left) in t, truncated.
    Value q = div(b, mul(b, sub(b, x, left), b.constant(double(e - 1), t, s)), sub(b, right, left));
    // Outside elements are dropped below; keep the conversion in range meanwhile.
    q = b.select(inside, q, b.constant(0, t, s));
    pos = b.convert(q, DType::I64);
    if (find == Find::LinearLocal) {
      // upper_bound over edges[max(0, pos-1) : min(pos+2, E)], minus one.
      Value lo = b.binary("stablehlo.maximum", sub(b, pos, I(1)), I(0));
      Value hi = b.binary("stablehlo.minimum", add(b, pos, I(2)), I(double(e)));
      Value cnt = I(0);
      for (int k = 0; k < 3; ++k) {
        Value at = add(b, lo, I(k));
        Value in_range = b.compare(at, hi, Cmp::LT);
        Value ev = gather_flat(b, edges, b.clamp(I(0), at, I(double(e - 1))));
        cnt = add(b, cnt, b.convert(land(b, in_range, b.compare(ev, x, Cmp::LE)), DType::I64));
      }
      pos = sub(b, add(b, lo, cnt), I(1));
    }
  }
  // The rightmost bin includes its right edge.
  pos = b.select(b.compare(pos, I(double(e - 1)), Cmp::EQ), I(double(e - 2)), pos);
  return b.select(inside, pos, I(-1));
}

Value histogram(Builder& b, const Value& x, const std::vector<Value>& edges,
                const std::optional<Value>& weight, bool density, Find find) {
  int64_t m = x.shape()[0], d = x.shape()[1];
  DType t = x.dtype();
  Shape hs;
  for (auto& e : edges) hs.push_back(e.shape()[0] - 1);
  int64_t total = 1;
  for (auto h : hs) total *= h;
  Value hist = b.constant(0, t, {total});
  if (m > 0 && total > 0) {
    Shape s{m};
    Value flat = b.constant(0, DType::I64, s), skip = b.constant(0, DType::Bool, s);
    Shape strides = ir::contiguous_strides(hs);
    for (int64_t j = 0; j < d; ++j) {
      Value col = b.reshape(b.slice(x, {0, j}, {m, j + 1}, {1, 1}), s);
      Value pos = bin_of(b, col, edges[j], find);
      skip = lor(b, skip, b.compare(pos, b.constant(-1, DType::I64, s), Cmp::EQ));
      flat = add(b, flat, mul(b, pos, b.constant(double(strides[j]), DType::I64, s)));
    }
    flat = b.select(skip, b.constant(double(total), DType::I64, s), flat);  // dropped
    Value w = weight ? b.reshape(b.convert(*weight, t), s) : b.constant(1, t, s);
    hist = b.scatter(hist, b.reshape(flat, {m, 1}), w, {}, {0}, {0}, 1,
                     [](Builder& q, const std::vector<Value>& a) { return std::vector<Value>{add(q, a[0], a[1])}; });
  }
  hist = b.reshape(hist, hs);
  if (density) {
    std::vector<int64_t> all;
    for (int64_t j = 0; j < d; ++j) all.push_back(j);
    hist = div(b, hist, broadcast_to(b, reduce_sum(b, hist, all), hs));
    for (int64_t j = 0; j < d; ++j) {
      int64_t e = edges[j].shape()[0];
      Value len = sub(b, b.slice(edges[j], {1}, {e}, {1}), b.slice(edges[j], {0}, {e - 1}, {1}));
      hist = div(b, hist, b.broadcast_in_dim(len, hs, {j}));
    }
  }
  return hist;
}

}  // namespace tpu::lowering::hist

namespace tpu::lowering {

using ir::Cmp;

// histc(self, bins, min, max): edges from min/max (else the data's min/max; equal ones
// widened by 1 each way) in f64 as CPU, then linear interpolation over linspace edges.
TPU_LOWER(histc, "histc") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  DType out_t = x.dtype();
  // Integer inputs bin like CUDA's (CPU refuses them; transformers' MoE counts tokens per
  // expert this way off the CPU): in floating point, counts returned in the input's type.
  if (!is_float(out_t)) x = b.convert(x, itemsize(out_t) > 4 ? DType::F64 : DType::F32);
  DType t = x.dtype();
  int64_t bins = ctx.i_or(1, 100), n = x.type.numel();
  Value lo = ctx.is_none(2) ? b.constant(0, DType::F64) : ctx.scalar(2, DType::F64);
  Value hi = ctx.is_none(3) ? b.constant(0, DType::F64) : ctx.scalar(3, DType::F64);
  Value flat = b.reshape(x, {n, 1});
  if (n > 0) {
    Value use_data = b.compare(lo, hi, Cmp::EQ);
    lo = b.select(use_data, b.convert(reduce_min(b, flat, {0, 1}), DType::F64), lo);
    hi = b.select(use_data, b.convert(reduce_max(b, flat, {0, 1}), DType::F64), hi);
  }
  Value same = b.compare(lo, hi, Cmp::EQ);
  lo = b.select(same, sub(b, lo, b.constant(1, DType::F64)), lo);
  hi = b.select(same, add(b, hi, b.constant(1, DType::F64)), hi);
  auto finite = [&](const Value& v) { return b.raw("stablehlo.is_finite", {v}, "", Type{DType::Bool, {}}); };
  ctx.check(search::land(b, finite(lo), finite(hi)), "RuntimeError: torch.histc: range of [min, max] is not finite");
  ctx.check(b.compare(lo, hi, Cmp::LT), "RuntimeError: torch.histc: max must be larger than min");
  Value edges = linspace_values(b, lo, hi, bins + 1, t);
  return {b.convert(hist::histogram(b, flat, {edges}, std::nullopt, false, hist::Find::Linear), out_t)};
}

}  // namespace tpu::lowering
