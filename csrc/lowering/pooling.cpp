// Pooling over any number of trailing spatial dims: adaptive average pooling (as
// products with averaging matrices), 3-d average pooling and 2-d/3-d max pooling with
// indices. The 2-d average pools live in nn.cpp.
#include <algorithm>

#include "lowering/helpers.h"
#include "lowering/search_util.h"

namespace tpu::lowering {

using ir::Cmp;
using search::land;
using search::lnot;
using search::lor;

static Value as_out(Ctx& ctx, const Value& v, int j = 0) {
  return ctx.b.reshape(ctx.b.convert(v, ctx.out(j).dtype), ctx.out(j).shape);
}

// (out, in) matrix averaging bin o of an adaptive pool: 1/len over
// [floor(o * in / out), ceil((o + 1) * in / out)), 0 elsewhere.
static Value adaptive_matrix(Builder& b, int64_t in, int64_t out, DType t, bool average = true) {
  Shape s{out, in};
  auto c = [&](double v) { return b.constant(v, DType::I64, s); };
  auto idiv = [&](const Value& x, const Value& y) { return b.binary("stablehlo.divide", x, y); };
  Value o = b.iota(Type{DType::I64, s}, 0), i = b.iota(Type{DType::I64, s}, 1);
  Value start = idiv(mul(b, o, c(static_cast<double>(in))), c(static_cast<double>(out)));
  Value end = idiv(add(b, mul(b, add(b, o, c(1)), c(static_cast<double>(in))), c(static_cast<double>(out - 1))),
                   c(static_cast<double>(out)));
  Value inside = b.binary("stablehlo.and", b.compare(i, start, Cmp::GE), b.compare(i, end, Cmp::LT));
  Value w = average ? div(b, b.constant(1, t, s), b.convert(sub(b, end, start), t)) : b.constant(1, t, s);
  return b.select(inside, w, b.constant(0, t, s));
}

// Contracts the last k dims of x, one at a time, with a matrix per dim: `fwd` maps
// in -> out (matrix dim 1 contracted), else out -> in (dim 0). Each contraction
// moves the new dim to the end, so after k steps the order is restored.
static Value adaptive_apply(Builder& b, Value x, const Shape& in, const Shape& out, bool fwd, bool average = true) {
  int64_t k = static_cast<int64_t>(in.size()), lead = x.rank() - k;
  for (int64_t j = 0; j < k; ++j) {
    Value m = adaptive_matrix(b, in[j], out[j], x.dtype(), average);
    x = b.dot_general(x, m, {}, {}, {lead}, {fwd ? 1 : 0}, x.dtype(), ir::DotPrecision::Highest);
  }
  return x;
}

static Shape tail(const Shape& s, int64_t k) { return Shape(s.end() - k, s.end()); }
static std::vector<int64_t> range_from(int64_t from, size_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < static_cast<int64_t>(to); ++i) v.push_back(i);
  return v;
}

static Value i64_vector(Builder& b, const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  int64_t n = static_cast<int64_t>(v.size());
  return b.raw("stablehlo.constant", {}, "value = dense<[" + s + "]> : tensor<" + std::to_string(n) + "xi64>",
               Type{DType::I64, {n}});
}

// Rounds float values to bfloat16's or float16's precision, kept in float (a convert
// pair could be dropped as excess precision).
static Value round_to(Builder& b, const Value& x, DType t) { return reduce_precision(b, x, t); }

// CPU's 3-d adaptive average for bfloat16/float16 sums each window in the dtype, element by
// element in (d, h, w) order, then divides by the three lengths one at a time, rounding
// every step; this does the same on float values rounded with reduce_precision. Each
// spatial dim d becomes (bins, longest window) by a gather; shorter windows add zeros.
static Value adaptive_avg3d_reduced(Builder& b, Value x, const Shape& out, DType t) {
  int64_t lead = x.rank() - 3;
  std::vector<int64_t> kmax(3);
  std::vector<std::vector<int64_t>> lens(3);
  for (int64_t j = 0; j < 3; ++j) {
    int64_t d = lead + 2 * j, in = x.shape()[d], n = out[j], k = 0;
    std::vector<int64_t> idx;
    for (int64_t o = 0; o < n; ++o) k = std::max(k, ((o + 1) * in + n - 1) / n - o * in / n);
    for (int64_t o = 0; o < n; ++o) {
      int64_t s = o * in / n;
      lens[j].push_back(((o + 1) * in + n - 1) / n - s);
      for (int64_t i = 0; i < k; ++i) idx.push_back(std::min(s + i, in - 1));
    }
    kmax[j] = k;
    int64_t r = x.rank();
    Shape slice = x.shape(), res = x.shape();
    slice[d] = 1, res[d] = n * k;
    std::vector<int64_t> offset;
    for (int64_t i = 0; i < r; ++i)
      if (i != d) offset.push_back(i);
    x = b.gather(x, b.reshape(i64_vector(b, idx), {n * k, 1}), offset, {d}, {d}, 1, slice, res);
    Shape split = x.shape();
    split[d] = n;
    split.insert(split.begin() + d + 1, k);
    x = b.reshape(x, split);
  }
  Shape full(x.shape().begin(), x.shape().begin() + lead);
  for (int64_t j = 0; j < 3; ++j) full.push_back(out[j]);
  auto inside = [&](int64_t j, int64_t i) {  // bins of dim j whose window reaches tap i
    Value len = i64_vector(b, lens[j]);
    Value ok = b.compare(len, b.constant(static_cast<double>(i), DType::I64, {out[j]}), Cmp::GT);
    return b.broadcast_in_dim(ok, full, {lead + j});
  };
  Value sum = b.constant(0, x.dtype(), full), zero = sum;
  for (int64_t i = 0; i < kmax[0]; ++i)
    for (int64_t h = 0; h < kmax[1]; ++h)
      for (int64_t w = 0; w < kmax[2]; ++w) {
        Shape start(x.rank(), 0), limit = x.shape(), ones(x.rank(), 1);
        start[lead + 1] = i, start[lead + 3] = h, start[lead + 5] = w;
        limit[lead + 1] = i + 1, limit[lead + 3] = h + 1, limit[lead + 5] = w + 1;
        Value v = b.reshape(b.slice(x, start, limit, ones), full);
        Value ok = b.binary("stablehlo.and", b.binary("stablehlo.and", inside(0, i), inside(1, h)), inside(2, w));
        sum = round_to(b, add(b, sum, b.select(ok, v, zero)), t);
      }
  for (int64_t j = 0; j < 3; ++j) {
    Value len = b.broadcast_in_dim(b.convert(i64_vector(b, lens[j]), x.dtype()), full, {lead + j});
    sum = round_to(b, div(b, sum, len), t);
  }
  return sum;
}

// Beyond this many taps per window the 3-d reduced-precision average keeps the float
// matrix products (one unrolled add per tap would make the program too long).
static constexpr int64_t kMaxUnrolledTaps = 512;

static std::vector<Value> adaptive_avg(Ctx& ctx, int64_t k) {
  Builder& b = ctx.b;
  DType t = ctx.in(0).dtype();
  Value x = b.convert(ctx.in(0), acc_type(t));
  int64_t r = x.rank();
  for (int64_t d = r - k; d < r; ++d)  // CPU's check (its meta kernel lacks it): no empty window dim
    if (x.shape()[d] == 0)
      throw std::invalid_argument("adaptive_avg_pool" + std::to_string(k) + "d(): Expected input to have non-zero size "
                                  "for non-batch dimensions, but input has sizes " + shape_text(x.shape()) +
                                  " with dimension " + std::to_string(d) + " being empty");
  if (x.type.numel() == 0) return {b.constant(0, ctx.out(0).dtype, ctx.out(0).shape)};  // empty batch
  Shape in = tail(x.shape(), k), out = tail(ctx.out(0).shape, k);
  if (k == 3 && (t == DType::BF16 || t == DType::F16)) {
    int64_t taps = 1;
    for (int64_t j = 0; j < 3; ++j) taps *= (in[j] + out[j] - 1) / std::max<int64_t>(out[j], 1) + 1;
    if (taps <= kMaxUnrolledTaps) return {as_out(ctx, adaptive_avg3d_reduced(b, x, out, t))};
  }
  if (t == DType::BF16 || t == DType::F16) {
    // CPU's 2-d kernel sums each window in float and divides by its size once.
    Value sum = adaptive_apply(b, x, in, out, true, false);
    int64_t lead = sum.rank() - k;
    Value size = b.constant(1, x.dtype(), sum.shape());
    for (int64_t j = 0; j < k; ++j) {
      std::vector<int64_t> lens;
      for (int64_t o = 0; o < out[j]; ++o) lens.push_back(((o + 1) * in[j] + out[j] - 1) / out[j] - o * in[j] / out[j]);
      size = mul(b, size, b.broadcast_in_dim(b.convert(i64_vector(b, lens), x.dtype()), sum.shape(), {lead + j}));
    }
    return {as_out(ctx, div(b, sum, size))};
  }
  return {as_out(ctx, adaptive_apply(b, x, in, out, true))};
}

static std::vector<Value> adaptive_avg_backward(Ctx& ctx, int64_t k) {
  Builder& b = ctx.b;
  Value g = b.convert(ctx.in(0), acc_type(ctx.in(0).dtype()));
  if (g.type.numel() == 0 || ctx.out(0).numel() == 0) return {b.constant(0, ctx.out(0).dtype, ctx.out(0).shape)};
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

// ---- adaptive max pooling ----
// Bin o of a dim covers [floor(o * in / out), ceil((o + 1) * in / out)). Every bin is read
// through K = the longest bin's taps (short bins repeat their last element, which changes
// no maximum), so the windows are one gather per dim.

struct Bins {
  int64_t k = 1;
  std::vector<int64_t> idx;  // out * k
};

static Bins bins(int64_t in, int64_t out) {
  Bins r;
  auto lo = [&](int64_t o) { return o * in / out; };
  auto hi = [&](int64_t o) { return ((o + 1) * in + out - 1) / out; };
  for (int64_t o = 0; o < out; ++o) r.k = std::max(r.k, hi(o) - lo(o));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < r.k; ++j) r.idx.push_back(std::min(lo(o) + j, hi(o) - 1));
  return r;
}

static Value i64_table(Builder& b, const std::vector<int64_t>& v, const Shape& shape) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  int64_t n = static_cast<int64_t>(v.size());
  Value c = b.raw("stablehlo.constant", {}, "value = dense<[" + s + "]> : tensor<" + std::to_string(n) + "xi64>",
                  Type{DType::I64, {n}});
  return b.reshape(c, shape);
}

// x (R, S1..Sk) with dim 1 + j replaced by its bins' taps (out_j * K_j).
static Value gather_bins(Builder& b, const Value& x, int64_t dim, const Bins& bn, int64_t out) {
  Shape s = x.shape();
  int64_t m = out * bn.k;
  Shape slice = s;
  slice[dim] = 1;
  Shape res = s;
  res[dim] = m;
  std::vector<int64_t> offs;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != dim) offs.push_back(i);
  // Output dims: the index dim lands where `dim` was (offset dims fill the others).
  return b.gather(x, i64_table(b, bn.idx, {m, 1}), offs, {dim}, {dim}, 1, slice, res);
}

static std::vector<Value> adaptive_max(Ctx& ctx, int64_t k) {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  Type o = ctx.out(0);
  if (x.type.numel() == 0 || o.numel() == 0)
    return {b.constant(0, o.dtype, o.shape), b.constant(0, ctx.out(1).dtype, ctx.out(1).shape)};
  Shape in = tail(x.shape(), k), out = tail(o.shape, k);
  int64_t rows = x.type.numel() / Type{x.dtype(), in}.numel();
  Shape rs{rows};
  rs.insert(rs.end(), in.begin(), in.end());
  Value v = b.reshape(x, rs);
  // Taps laid out (R, o1, K1, ..., ok, Kk); the flat input index of each tap alongside.
  Shape split{rows}, iota_shape;
  std::vector<Bins> bs;
  for (int64_t j = 0; j < k; ++j) {
    bs.push_back(bins(in[j], out[j]));
    v = gather_bins(b, v, 1 + j, bs[j], out[j]);
    split.push_back(out[j]), split.push_back(bs[j].k);
    iota_shape.push_back(out[j]), iota_shape.push_back(bs[j].k);
  }
  Value flat = b.constant(0, DType::I64, iota_shape);
  int64_t stride = 1;
  for (int64_t j = k - 1; j >= 0; --j) {
    Value t = b.broadcast_in_dim(i64_table(b, bs[j].idx, {out[j], bs[j].k}), iota_shape, {2 * j, 2 * j + 1});
    flat = add(b, flat, mul(b, t, b.constant(static_cast<double>(stride), DType::I64, iota_shape)));
    stride *= in[j];
  }
  // (R, o.., K..) with the taps flattened last.
  std::vector<int64_t> perm{0};
  int64_t kprod = 1;
  for (int64_t j = 0; j < k; ++j) perm.push_back(1 + 2 * j);
  for (int64_t j = 0; j < k; ++j) perm.push_back(2 + 2 * j), kprod *= bs[j].k;
  Shape red{rows};
  red.insert(red.end(), out.begin(), out.end());
  red.push_back(kprod);
  v = b.reshape(b.transpose(b.reshape(v, split), perm), red);
  std::vector<int64_t> iperm;
  for (int64_t q = 1; q < static_cast<int64_t>(perm.size()); ++q) iperm.push_back(perm[q] - 1);
  Shape ired(red.begin() + 1, red.end());
  Value fi = b.broadcast_in_dim(b.reshape(b.transpose(flat, iperm), ired), red, range_from(1, red.size()));
  bool fp = is_float(x.dtype());
  // CPU scans the window in order, taking a value when it is greater or NaN: the last NaN
  // wins, else the first maximum.
  auto combine = [&](Builder& b, const std::vector<Value>& a) {
    const Value &va = a[0], &ia = a[1], &vb = a[2], &ib = a[3];
    Value wins = b.binary("stablehlo.or", b.compare(va, vb, Cmp::GT),
                          b.binary("stablehlo.and", b.compare(va, vb, Cmp::EQ), b.compare(ia, ib, Cmp::LT)));
    if (fp) {
      Value na = b.compare(va, va, Cmp::NE), nb = b.compare(vb, vb, Cmp::NE);
      Value both = b.binary("stablehlo.and", na, nb);
      wins = b.select(both, b.compare(ia, ib, Cmp::GT),
                      b.select(na, b.constant(1, DType::Bool), b.select(nb, b.constant(0, DType::Bool), wins)));
    }
    return std::vector<Value>{b.select(wins, va, vb), b.select(wins, ia, ib)};
  };
  int64_t last = static_cast<int64_t>(red.size()) - 1;
  auto r = b.reduce({v, fi}, {b.constant(lowest(x.dtype()), x.dtype()), b.constant(9.2e18, DType::I64)}, {last},
                    combine);
  return {b.reshape(r[0], o.shape), b.convert(b.reshape(r[1], ctx.out(1).shape), ctx.out(1).dtype)};
}

TPU_LOWER(adaptive_max_pool2d, "adaptive_max_pool2d") { return adaptive_max(ctx, 2); }
TPU_LOWER(adaptive_max_pool3d, "adaptive_max_pool3d") { return adaptive_max(ctx, 3); }

// ---- max pooling with indices ----

// Windows with at most this many taps stack their taps (strided slices) and reduce them:
// that runs 2-3x faster than reduce_window on the XLA CPU plugin (a CNN's 2x2 pools).
// Larger windows use one variadic reduce_window, whose compile time does not grow with
// the window (a 7x7 window's stacked taps took 1.1-1.4 s to compile, reduce_window
// 60 ms) and which runs faster there too (3x3 stride 2: 3x).
constexpr int64_t kMaxStackedTaps = 4;

// Of two (value, flat index) pairs, the one a max pool keeps: index -1 (init, padding)
// always loses; otherwise the larger value, NaN counting as largest; equal values to the
// lower index, NaNs to the higher (CPU's scan keeps the first maximum but takes every
// NaN it meets). An order, so any combining order agrees with CPU's scan.
static std::vector<Value> max_with_index(Builder& b, const std::vector<Value>& a, bool fp) {
  const Value &va = a[0], &ia = a[1], &vb = a[2], &ib = a[3];
  Value zero = b.constant(0, DType::I64);
  Value better = b.compare(va, vb, Cmp::GT);
  Value wins = lor(b, better, land(b, b.compare(va, vb, Cmp::EQ), b.compare(ia, ib, Cmp::LT)));
  if (fp) {
    Value na = b.compare(va, va, Cmp::NE), nb = b.compare(vb, vb, Cmp::NE);
    wins = lor(b, wins, land(b, na, lnot(b, nb)));
    wins = lor(b, wins, land(b, land(b, na, nb), b.compare(ia, ib, Cmp::GT)));
  }
  Value pick = lor(b, land(b, b.compare(ia, zero, Cmp::GE), wins), b.compare(ib, zero, Cmp::LT));
  return {b.select(pick, va, vb), b.select(pick, ia, ib)};
}

// Each tap of every window as a strided slice of x padded with `lowest`, stacked on a
// new last dim, with the tap's flat input index (-1 in the padding).
static std::vector<Value> stacked_taps(Builder& b, const Value& x, const Window& w, const Shape& dil,
                                       const Shape& out) {
  int64_t r = x.rank(), n = static_cast<int64_t>(w.k.size());
  Shape lo(r, 0), hi(r, 0), none(r, 0);
  for (int64_t i = 0; i < n; ++i)
    lo[r - n + i] = w.p[i],
               hi[r - n + i] = std::max<int64_t>(0, (w.out[i] - 1) * w.s[i] + (w.k[i] - 1) * dil[i] + 1 - w.in[i] - w.p[i]);
  Value xp = b.pad(x, b.constant(lowest(x.dtype()), x.dtype()), lo, hi, none);
  auto c = [&](double v) { return b.constant(v, DType::I64, out); };
  Shape s1 = out;
  s1.push_back(1);
  std::vector<Value> vals, idxs;
  Shape tap(n, 0);
  for (bool more = true; more;) {
    Shape start(r, 0), limit = xp.shape(), stride(r, 1);
    Value ok, flat = c(0);
    for (int64_t i = 0; i < n; ++i) {
      int64_t a = r - n + i;
      start[a] = tap[i] * dil[i], limit[a] = start[a] + (w.out[i] - 1) * w.s[i] + 1, stride[a] = w.s[i];
      Value at = add(b, mul(b, b.iota(Type{DType::I64, out}, a), c(w.s[i])), c(tap[i] * dil[i] - w.p[i]));
      Value in = land(b, b.compare(at, c(0), Cmp::GE), b.compare(at, c(w.in[i]), Cmp::LT));
      ok = i ? land(b, ok, in) : in;
      flat = add(b, mul(b, flat, c(w.in[i])), at);
    }
    vals.push_back(b.reshape(b.slice(xp, start, limit, stride), s1));
    idxs.push_back(b.reshape(b.select(ok, flat, c(-1)), s1));
    more = false;  // next tap, last dim fastest
    for (int64_t i = n - 1; i >= 0 && !more; --i) {
      if (++tap[i] < w.k[i]) more = true;
      else tap[i] = 0;
    }
  }
  return {b.concatenate(vals, r), b.concatenate(idxs, r)};
}

// Max over each window of the last n dims with the flat input index (over those dims)
// of its first maximum; NaN counts as the maximum.
static std::vector<Value> max_pool_with_indices(Ctx& ctx, int64_t n) {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  const Shape& out = ctx.out(0).shape;
  Window w = window(ctx, x.shape(), out, 1, 2, 3, n);
  Shape dil = ctx.ints(4);
  if (dil.empty()) dil = {1};
  while (static_cast<int64_t>(dil.size()) < n) dil.push_back(dil[0]);
  bool fp = is_float(x.dtype());
  auto combine = [fp](Builder& b, const std::vector<Value>& a) { return max_with_index(b, a, fp); };
  std::vector<Value> inits = {b.constant(lowest(x.dtype()), x.dtype()), b.constant(-1, DType::I64)};
  int64_t r = x.rank(), taps = Type{DType::I64, w.k}.numel();
  std::vector<Value> vi;
  if (taps <= kMaxStackedTaps) {
    vi = b.reduce(stacked_taps(b, x, w, dil, out), inits, {r}, combine);
  } else {
    Shape win(r, 1), str(r, 1), dl(r, 1);
    std::vector<std::pair<int64_t, int64_t>> pads(r, {0, 0});
    for (int64_t i = 0; i < n; ++i) {
      int64_t a = r - n + i, span = (w.k[i] - 1) * dil[i] + 1;
      win[a] = w.k[i], str[a] = w.s[i], dl[a] = dil[i];
      // High padding reaches the output size PyTorch chose (ceil_mode) exactly.
      pads[a] = {w.p[i], std::max<int64_t>(0, (w.out[i] - 1) * w.s[i] + span - w.in[i] - w.p[i])};
    }
    Value flat = b.iota(Type{DType::I64, {Type{DType::I64, w.in}.numel()}}, 0);
    Value idx = b.broadcast_in_dim(b.reshape(flat, w.in), x.shape(), range_from(r - n, r));
    vi = b.reduce_window({x, idx}, inits, win, str, dl, pads, combine);
  }
  if (vi[0].shape() != out) throw std::logic_error("internal: max pool window count differs from PyTorch's");
  return {vi[0], b.convert(vi[1], ctx.out(1).dtype)};
}

TPU_LOWER(max_pool2d_with_indices, "max_pool2d_with_indices") { return max_pool_with_indices(ctx, 2); }
TPU_LOWER(max_pool3d_with_indices, "max_pool3d_with_indices") { return max_pool_with_indices(ctx, 3); }

// Max pool backwards: each output's grad added at the flat input position its index names.
static std::vector<Value> max_scatter(Ctx& ctx, int64_t k, int idx_arg) {
  Builder& b = ctx.b;
  Value g = ctx.in(0), self = ctx.in(1), idx = b.convert(ctx.in(idx_arg), DType::I64);
  Type o = ctx.out(0);
  DType t = acc_type(g.dtype());
  int64_t sp = Type{t, tail(self.shape(), k)}.numel(), osp = Type{t, tail(g.shape(), k)}.numel();
  if (self.type.numel() == 0 || g.type.numel() == 0) return {b.constant(0, o.dtype, o.shape)};
  int64_t rows = self.type.numel() / sp;
  Value gf = b.reshape(b.convert(g, t), {rows, osp});
  Value ix = b.reshape(idx, {rows, osp, 1});
  Value row = b.iota(Type{DType::I64, {rows, osp, 1}}, 0);
  auto sum = [](Builder& b, const std::vector<Value>& a) { return std::vector<Value>{add(b, a[0], a[1])}; };
  Value out = b.scatter(b.constant(0, t, {rows, sp}), b.concatenate({row, ix}, 2), gf, {}, {0, 1}, {0, 1}, 2, sum);
  return {b.convert(b.reshape(out, o.shape), o.dtype)};
}

TPU_LOWER(adaptive_max_pool2d_bw, "adaptive_max_pool2d_backward") { return max_scatter(ctx, 2, 2); }
TPU_LOWER(adaptive_max_pool3d_bw, "adaptive_max_pool3d_backward") { return max_scatter(ctx, 3, 2); }
TPU_LOWER(max_pool2d_with_indices_bw, "max_pool2d_with_indices_backward") { return max_scatter(ctx, 2, 7); }
TPU_LOWER(max_pool3d_with_indices_bw, "max_pool3d_with_indices_backward") { return max_scatter(ctx, 3, 7); }

}  // namespace tpu::lowering
