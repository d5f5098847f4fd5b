// Reductions into slots chosen by an index: index_reduce, segment_reduce (and its
// backward).
#include <cmath>

#include "lowering/search_util.h"

namespace tpu::lowering {

using ir::Cmp;
using namespace search;

// a op b for index_reduce's and segment_reduce's reductions; amax/amin let a NaN on
// either side win, as CPU's `isnan(src) ? src : std::max(self, src)`.
static Value combine(Builder& b, const std::string& red, const Value& x, const Value& y) {
  if (red == "sum" || red == "mean") return x.dtype() == DType::Bool ? lor(b, x, y) : add(b, x, y);
  if (red == "prod") return x.dtype() == DType::Bool ? land(b, x, y) : mul(b, x, y);
  bool mx = red == "amax" || red == "max";
  if (x.dtype() == DType::Bool) return mx ? lor(b, x, y) : land(b, x, y);
  Value r = b.binary(mx ? "stablehlo.maximum" : "stablehlo.minimum", x, y);
  if (!is_float(x.dtype())) return r;
  r = b.select(is_nan(b, y), y, r);
  return b.select(is_nan(b, x), x, r);
}

static Value identity(Builder& b, const std::string& red, DType t, const Shape& s) {
  if (red == "prod") return b.constant(1, t, s);
  if (red == "amax" || red == "max") return extreme(b, t, false, s);
  if (red == "amin" || red == "min") return extreme(b, t, true, s);
  return b.constant(0, t, s);
}

// Integer division rounding down (divisor > 0).
static Value floor_div(Builder& b, const Value& x, const Value& n) {
  Value q = div(b, x, n);
  Value rem = b.binary("stablehlo.remainder", x, n);
  Value down = b.compare(rem, full_like(b, rem, 0), Cmp::LT);
  return b.select(down, sub(b, q, full_like(b, q, 1)), q);
}

// index_reduce(self, dim, index, source, reduce, include_self): source's slices along
// dim combined into self's slices at index. Without include_self, the slices that are
// hit start from the reduction's identity; mean divides by the number of
// contributions (self counting as one), rounding down for integers.
TPU_LOWER(index_reduce, "index_reduce") {
  Builder& b = ctx.b;
  Value self = ctx.in(0), index = ctx.in(2), src = ctx.in(3);
  std::string red = ctx.str(4);
  bool include_self = ctx.flag_or(5, true);
  if (red != "prod" && red != "mean" && red != "amax" && red != "amin")
    throw Unsupported("index_reduce " + red);
  if (is_complex(self.dtype())) throw Unsupported("index_reduce of complex");  // CPU's kernel refuses it
  if (self.rank() == 0) self = b.reshape(self, {1});
  int64_t dim = wrap_dim(ctx.i(1), self.rank()), m = index.type.numel();
  int64_t size = self.shape()[dim];
  int64_t slices = ctx.type_of(3).rank() == 0 ? 1 : ctx.type_of(3).shape[dim];
  if (m != slices)
    throw std::invalid_argument("index_reduce_(): Number of indices (" + std::to_string(m) +
                                ") should be equal to source.size(dim): (" + std::to_string(slices) +
                                "), for dim: " + std::to_string(dim));
  check_in_range(ctx, index, 0, size,
            "index_reduce(): index out of bounds for dimension " + std::to_string(dim) + " with size " +
                std::to_string(size));
  DType t = self.dtype();
  Shape ss = self.shape();
  ss[dim] = m;
  src = b.reshape(b.convert(src, t), ss);
  std::vector<int64_t> window;
  for (int64_t d = 0; d < self.rank(); ++d)
    if (d != dim) window.push_back(d);
  Value at = b.reshape(b.convert(index, DType::I64), {m, 1});
  auto scatter = [&](const Value& into, const Value& upd, const std::string& how) {
    return b.scatter(into, at, upd, window, {dim}, {dim}, 1, [how](Builder& q, const std::vector<Value>& a) {
      return std::vector<Value>{combine(q, how, a[0], a[1])};
    });
  };
  DType ct = is_float(t) ? t : DType::I64;
  Value hits = scatter(b.constant(0, ct, self.shape()), b.constant(1, ct, ss), "sum");
  Value touched = b.compare(hits, full_like(b, hits, 0), Cmp::NE);
  Value base = include_self ? self : b.select(touched, identity(b, red, t, self.shape()), self);
  Value r = scatter(base, src, red);
  if (red == "mean") {
    Value n = include_self ? add(b, hits, full_like(b, hits, 1)) : hits;
    n = b.select(touched, n, full_like(b, n, 1));
    if (is_float(t)) r = div(b, r, n);
    else r = b.convert(floor_div(b, b.convert(r, DType::I64), n), t);
  }
  return {b.reshape(r, ctx.out(0).shape)};
}

// ---- segment_reduce ----

// Membership of data positions in segments: mask[lead..., S, N], true where segment s
// holds position j. Segments come from lengths (consecutive) or offsets.
struct Segments {
  Value mask, len;  // len: [lead..., S] int64
  int64_t axis = 0, segs = 0;
};

static Segments segments(Ctx& ctx, int lengths_i, int offsets_i, int64_t n) {
  Builder& b = ctx.b;
  Segments g;
  Value start, end;
  if (!ctx.is_none(lengths_i)) {
    Value len = b.convert(ctx.in(lengths_i), DType::I64);
    int64_t r = len.rank();
    g.segs = len.shape().back();
    // Exclusive prefix sum along the last dim by a small triangular product.
    Shape s2 = len.shape();
    s2.push_back(g.segs);
    Value ii = b.iota(Type{DType::I64, s2}, r - 1), kk = b.iota(Type{DType::I64, s2}, r);
    std::vector<int64_t> keep;
    for (int64_t d = 0; d < r - 1; ++d) keep.push_back(d);
    keep.push_back(r);
    Value lk = b.broadcast_in_dim(len, s2, keep);
    start = reduce_sum(b, b.select(b.compare(kk, ii, Cmp::LT), lk, b.constant(0, DType::I64, s2)), {r});
    end = add(b, start, len);
  } else if (!ctx.is_none(offsets_i)) {
    Value off = b.convert(ctx.in(offsets_i), DType::I64);
    int64_t r = off.rank();
    g.segs = off.shape().back() - 1;
    Shape lo(r, 0), hi = off.shape(), one(r, 1);
    hi[r - 1] = g.segs;
    start = b.slice(off, lo, hi, one);
    lo[r - 1] = 1;
    hi[r - 1] = g.segs + 1;
    end = b.slice(off, lo, hi, one);
  } else {
    throw Unsupported("segment_reduce without lengths or offsets");
  }
  g.len = sub(b, end, start);
  int64_t r = start.rank();
  Shape ms = start.shape();
  ms.push_back(n);
  std::vector<int64_t> keep;
  for (int64_t d = 0; d < r; ++d) keep.push_back(d);
  Value j = b.iota(Type{DType::I64, ms}, r);
  Value in = land(b, b.compare(j, b.broadcast_in_dim(start, ms, keep), Cmp::GE),
                  b.compare(j, b.broadcast_in_dim(end, ms, keep), Cmp::LT));
  g.mask = in;
  return g;
}

// x [lead..., N, trail...] spread to [lead..., S, N, trail...], and the segment mask
// broadcast to the same shape.
static std::pair<Value, Value> spread(Builder& b, const Value& x, const Segments& g, int64_t axis) {
  Shape s = x.shape();
  s.insert(s.begin() + axis, g.segs);
  std::vector<int64_t> xd, md;
  for (int64_t d = 0; d < x.rank(); ++d) xd.push_back(d < axis ? d : d + 1);
  for (int64_t d = 0; d <= axis + 1; ++d) md.push_back(d);
  return {b.broadcast_in_dim(x, s, xd), b.broadcast_in_dim(g.mask, s, md)};
}

static std::string seg_name(const std::string& red) {
  if (red == "max") return "amax";
  if (red == "min") return "amin";
  return red;
}

// CPU's checks of segment_reduce's segments when !unsafe (read at the call, as CPU and
// CUDA read them on the host): lengths non-negative, each row summing to the data's
// size along axis; offsets non-decreasing (CPU's kernel refuses a negative length).
static void check_segments(Ctx& ctx, const Segments& g, int lengths_i, int64_t n) {
  Builder& b = ctx.b;
  if (!ctx.is_none(lengths_i)) {
    Value len = g.len;
    if (len.type.numel() == 0)  // CPU's lengths.min() of nothing
      throw std::invalid_argument(
          "min(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with "
          "the 'dim' argument.");
    ctx.check(all_true(b, b.compare(len, full_like(b, len, 0), Cmp::GE)),
              "RuntimeError: lengths contains negative value!");
    Value total = reduce_sum(b, len, {len.rank() - 1});
    ctx.check(all_true(b, b.compare(total, full_like(b, total, static_cast<double>(n)), Cmp::EQ)),
              "RuntimeError: segment_reduce(): Expected all rows of lengths along axis to sum to "
              "data.size(lengths.dim()-1) when !unsafe.");
  } else if (g.len.type.numel() > 0) {
    ctx.check(all_true(b, b.compare(g.len, full_like(b, g.len, 0), Cmp::GE)),
              "RuntimeError: Expected segment_length >= 0 to be true, but got false.  (Could this error message "
              "be improved?  If so, please report an enhancement request to PyTorch.)");
  }
}

// segment_reduce(data, reduce, lengths, indices, offsets, axis, unsafe, initial):
// each segment folds its elements into `initial` (else the reduction's identity; an
// empty mean without initial is NaN); mean divides by the segment's length.
TPU_LOWER(segment_reduce, "segment_reduce") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  std::string red = ctx.str(1);
  if (!ctx.is_none(3)) throw Unsupported("segment_reduce with indices");
  DType t = x.dtype();
  if (!is_float(t)) throw Unsupported("segment_reduce of non-floats");
  int64_t axis = wrap_dim(ctx.i_or(5, 0), x.rank()), n = x.shape()[axis];
  Segments g = segments(ctx, 2, 4, n);
  if (!ctx.flag_or(6, false)) check_segments(ctx, g, 2, n);
  std::string r = seg_name(red);
  auto [xs, ms] = spread(b, x, g, axis);
  Value id = identity(b, r, t, xs.shape());
  Value picked = b.select(ms, xs, id);
  bool has_init = !ctx.is_none(7);
  Value acc = b.reduce({picked}, {identity(b, r, t, {})}, {axis + 1}, [&](Builder& q, const std::vector<Value>& a) {
    return std::vector<Value>{combine(q, r, a[0], a[1])};
  })[0];
  const Shape& os = acc.shape();
  if (has_init) acc = combine(b, r, broadcast_to(b, ctx.scalar(7, t), os), acc);
  Shape ls = g.len.shape();
  Shape trail(os.begin() + axis + 1, os.end());
  Value len = b.convert(g.len, t);
  Shape lfull = ls;
  lfull.insert(lfull.end(), trail.begin(), trail.end());
  len = b.reshape(broadcast_to(b, b.reshape(len, [&] { Shape q = ls; q.insert(q.end(), trail.size(), 1); return q; }()), lfull), os);
  if (red == "mean") {
    Value empty = b.compare(len, full_like(b, len, 0), Cmp::EQ);
    Value q = div(b, acc, len);
    Value e = has_init ? acc : b.constant(NAN, t, os);
    acc = b.select(empty, e, q);
  }
  return {b.reshape(acc, ctx.out(0).shape)};
}

// _segment_reduce_backward(grad, output, data, reduce, lengths, offsets, axis,
// initial), as CPU: sum copies the segment's grad, mean divides it by the length;
// max/min give it to the elements equal to the output (or NaN), and with two or more
// such elements divide the positive shares by their number; prod gives
// grad * output / x, or grad times the product of the other elements (with initial)
// where x is 0 or NaN.
TPU_LOWER(segment_reduce_backward, "_segment_reduce_backward") {
  Builder& b = ctx.b;
  Value grad = ctx.in(0), out = ctx.in(1), x = ctx.in(2);
  std::string red = ctx.str(3);
  DType t = x.dtype();
  if (!is_float(t)) throw Unsupported("segment_reduce backward of non-floats");
  int64_t axis = wrap_dim(ctx.i_or(6, 0), x.rank()), n = x.shape()[axis];
  Segments g = segments(ctx, 4, 5, n);
  auto [xs, ms] = spread(b, x, g, axis);
  const Shape& s = xs.shape();  // [lead..., S, N, trail...]
  std::vector<int64_t> od;      // grad/output [lead..., S, trail...] into s
  for (int64_t d = 0; d < grad.rank(); ++d) od.push_back(d <= axis ? d : d + 1);
  Value gs = b.broadcast_in_dim(grad, s, od), os = b.broadcast_in_dim(out, s, od);
  Value zero = b.constant(0, t, s);
  Value contrib;
  if (red == "sum") {
    contrib = gs;
  } else if (red == "mean") {
    std::vector<int64_t> ld;
    for (int64_t d = 0; d <= axis; ++d) ld.push_back(d);
    contrib = div(b, gs, b.broadcast_in_dim(b.convert(g.len, t), s, ld));
  } else if (red == "max" || red == "min") {
    Value hit = land(b, ms, lor(b, is_nan(b, xs), b.compare(xs, os, Cmp::EQ)));
    Value cnt = reduce_sum(b, b.select(hit, b.constant(1, t, s), zero), {axis + 1});
    std::vector<int64_t> cd;
    for (int64_t d = 0; d < s.size(); ++d)
      if (d != axis + 1) cd.push_back(d);
    Value cb = b.broadcast_in_dim(cnt, s, cd);
    Value share = b.select(land(b, b.compare(cb, b.constant(2, t, s), Cmp::GE), b.compare(gs, zero, Cmp::GT)),
                           div(b, gs, cb), gs);
    contrib = b.select(hit, share, zero);
  } else if (red == "prod") {
    int64_t big = 1;
    for (auto d : s) big *= d;
    if (big * n > (int64_t(1) << 24)) throw Unsupported("segment_reduce prod backward: too large");
    // Product of the segment's other elements: [.., S, N(j), N(k), trail] masked by k != j.
    Shape s3 = s;
    s3.insert(s3.begin() + axis + 2, n);
    std::vector<int64_t> jd, kd;
    for (int64_t d = 0; d < s.size(); ++d) {
      jd.push_back(d <= axis + 1 ? d : d + 1);
      kd.push_back(d <= axis ? d : d + 1);
    }
    Value xk = b.broadcast_in_dim(xs, s3, kd), mk = b.broadcast_in_dim(ms, s3, kd);
    Value jj = b.iota(Type{DType::I64, s3}, axis + 1), kk = b.iota(Type{DType::I64, s3}, axis + 2);
    Value other = land(b, mk, b.compare(jj, kk, Cmp::NE));
    Value excl = b.reduce(b.select(other, xk, b.constant(1, t, s3)), b.constant(1, t), {axis + 2},
                          "stablehlo.multiply");
    if (!ctx.is_none(7)) excl = mul(b, excl, broadcast_to(b, ctx.scalar(7, t), s));
    Value special = lor(b, is_nan(b, xs), b.compare(xs, zero, Cmp::EQ));
    Value plain = div(b, mul(b, gs, os), xs);
    contrib = b.select(special, mul(b, gs, excl), plain);
  } else {
    throw Unsupported("segment_reduce backward " + red);
  }
  // Each position belongs to at most one segment: sum over segments picks it.
  Value r = reduce_sum(b, b.select(ms, contrib, zero), {axis});
  return {b.reshape(r, ctx.out(0).shape)};
}

}  // namespace tpu::lowering
