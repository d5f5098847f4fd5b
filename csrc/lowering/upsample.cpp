// Upsampling backwards (nearest, nearest-exact, linear, bicubic), the nearest, linear and bicubic
// forwards and the antialiased bilinear/bicubic resize, forward and backward. Every mode is separable: along one dim,
// output o reads taps idx[o][k] with weights w[o][k]. The tap tables depend on shapes and
// scales only, so they are computed here (in CPU's math type, with PyTorch's CPU formulas,
// so the chosen indices are the same) and embedded as constants. Forward: gather + weighted sum
// per dim (last dim first, as CPU); backward: the adjoint, a scatter-add per dim.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "lowering/helpers.h"

namespace tpu::lowering {

namespace {

using Scale = std::optional<double>;

struct Taps {
  int64_t k = 1;
  std::vector<int64_t> idx;  // out * k
  std::vector<double> w;     // out * k (float values unless the taps were made in double)
};

enum class Mode { Nearest, NearestExact, Linear, Cubic, LinearAA, CubicAA };

// PyTorch's area_pixel_compute_scale in T: float, or double for float64 (CPU's opmath type).
template <class T>
T pixel_scale(int64_t in, int64_t out, bool align, Scale s) {
  if (align) return out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0);
  if (s && *s > 0) return static_cast<T>(1.0 / *s);
  return static_cast<T>(in) / static_cast<T>(out);
}

template <class T>
T source_index(T scale, int64_t o, bool align, bool cubic) {
  if (align) return scale * static_cast<T>(o);
  T src = scale * (static_cast<T>(o) + T(0.5)) - T(0.5);
  return (!cubic && src < 0) ? T(0) : src;
}

template <class T>
T cubic1(T x, T a) { return ((a + 2) * x - (a + 3)) * x * x + 1; }
template <class T>
T cubic2(T x, T a) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; }

template <class T>
T aa_filter(T x, bool cubic) {
  x = std::fabs(x);
  if (!cubic) return x < T(1) ? T(1) - x : T(0);
  const T a = T(-0.5);
  if (x < T(1)) return cubic1(x, a);
  if (x < T(2)) return cubic2(x, a);
  return T(0);
}

// Nearest indices use float whatever the dtype, as CPU's; weights use T.
template <class T>
Taps make_taps(Mode m, int64_t in, int64_t out, bool align, Scale s) {
  Taps t;
  auto push = [&t](int64_t i, T w) { t.idx.push_back(i), t.w.push_back(static_cast<double>(w)); };
  if (m == Mode::Nearest || m == Mode::NearestExact) {
    float sc = (s && *s > 0) ? static_cast<float>(1.0 / *s) : static_cast<float>(in) / static_cast<float>(out);
    for (int64_t o = 0; o < out; ++o) {
      int64_t i;
      if (m == Mode::NearestExact) {
        i = static_cast<int64_t>(std::floor(static_cast<float>((o + 0.5) * sc)));
      } else if (out == in) {
        i = o;
      } else if (out == 2 * in) {
        i = o >> 1;
      } else {
        i = static_cast<int64_t>(std::floor(static_cast<float>(o) * sc));
      }
      push(std::min(i, in - 1), T(1));
    }
    return t;
  }
  T sc = pixel_scale<T>(in, out, align, s);
  if (m == Mode::Linear) {
    t.k = 2;
    for (int64_t o = 0; o < out; ++o) {
      if (out == in) {
        push(o, T(1)), push(o, T(0));
        continue;
      }
      T real = source_index<T>(sc, o, align, false);
      int64_t i0 = std::min(static_cast<int64_t>(std::floor(real)), in - 1);
      T l1 = std::min(std::max(real - static_cast<T>(i0), T(0)), T(1));
      push(i0, T(1) - l1), push(i0 + (i0 < in - 1 ? 1 : 0), l1);
    }
    return t;
  }
  if (m == Mode::Cubic) {
    t.k = 4;
    const T a = T(-0.75);
    for (int64_t o = 0; o < out; ++o) {
      T real = source_index<T>(sc, o, align, true);
      int64_t i0 = std::min(static_cast<int64_t>(std::floor(real)), in - 1);
      T l = std::min(std::max(real - static_cast<T>(i0), T(0)), T(1));
      T c[4] = {cubic2(l + T(1), a), cubic1(l, a), cubic1(T(1) - l, a), cubic2(T(2) - l, a)};
      for (int64_t j = 0; j < 4; ++j) push(std::max<int64_t>(std::min(i0 - 1 + j, in - 1), 0), c[j]);
    }
    return t;
  }
  // Antialiased: a filter stretched by the scale when downsampling, normalized per output.
  bool cubic = m == Mode::CubicAA;
  T interp = cubic ? T(4) : T(2);
  T support = sc >= T(1) ? static_cast<T>((interp * 0.5) * sc) : interp * T(0.5);
  t.k = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  // The mixed T/double steps follow CPU's, so the window bounds agree exactly.
  T inv = sc >= T(1) ? static_cast<T>(1.0 / sc) : T(1);
  for (int64_t o = 0; o < out; ++o) {
    T center = static_cast<T>(static_cast<double>(sc) * (static_cast<double>(o) + 0.5));
    int64_t lo = std::max<int64_t>(static_cast<int64_t>(static_cast<double>(center - support) + 0.5), 0);
    int64_t n = std::min<int64_t>(static_cast<int64_t>(static_cast<double>(center + support) + 0.5), in) - lo;
    n = std::clamp<int64_t>(n, 0, t.k);
    std::vector<T> w(t.k, T(0));
    T total = T(0);
    for (int64_t j = 0; j < n; ++j) {
      double arg = (static_cast<double>(static_cast<T>(j + lo) - center) + 0.5) * static_cast<double>(inv);
      w[j] = aa_filter<T>(static_cast<T>(arg), cubic);
      total += w[j];
    }
    if (total != T(0))
      for (int64_t j = 0; j < n; ++j) w[j] /= total;
    for (int64_t j = 0; j < t.k; ++j) push(std::min(lo + j, in - 1), j < n ? w[j] : T(0));
  }
  return t;
}

Value const_i64(Builder& b, const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  int64_t n = static_cast<int64_t>(v.size());
  return b.raw("stablehlo.constant", {}, "value = dense<[" + s + "]> : tensor<" + std::to_string(n) + "xi64>",
               Type{DType::I64, {n}});
}

// CPU computes the taps in the op's math type: double for float64, float otherwise.
Taps taps_for(DType dt, Mode m, int64_t in, int64_t out, bool align, Scale s) {
  return dt == DType::F64 ? make_taps<double>(m, in, out, align, s) : make_taps<float>(m, in, out, align, s);
}

Value const_weights(Builder& b, const std::vector<double>& v, DType dt) {
  bool f64 = dt == DType::F64;
  std::string s;
  char buf[40];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, f64 ? "%.17e" : "%.9e", v[i]);
    s += (i ? ", " : "") + std::string(buf);
  }
  int64_t n = static_cast<int64_t>(v.size());
  DType ct = f64 ? DType::F64 : DType::F32;
  return b.raw("stablehlo.constant", {},
               "value = dense<[" + s + "]> : tensor<" + std::to_string(n) + (f64 ? "xf64>" : "xf32>"), Type{ct, {n}});
}

// x with dim d moved to the front and the rest flattened: (n, R), plus how to undo it.
struct Front {
  std::vector<int64_t> perm, inv;
  Shape moved;  // shape after the transpose
};

Front front(const Shape& s, int64_t d) {
  Front f;
  f.perm.push_back(d);
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i)
    if (i != d) f.perm.push_back(i);
  f.inv.assign(s.size(), 0);
  for (size_t i = 0; i < f.perm.size(); ++i) f.inv[f.perm[i]] = static_cast<int64_t>(i), f.moved.push_back(s[f.perm[i]]);
  return f;
}

// Along dim d: out[o] = sum_k w[o][k] * x[idx[o][k]]   (in -> out).
Value apply_fwd(Builder& b, const Value& x, int64_t d, const Taps& t, int64_t out) {
  Front f = front(x.shape(), d);
  int64_t n = f.moved[0], rest = n ? x.type.numel() / n : 0, m = out * t.k;
  Value xf = b.reshape(b.transpose(x, f.perm), {n, rest});
  Value idx = b.reshape(const_i64(b, t.idx), {m, 1});
  Value g = b.gather(xf, idx, {1}, {0}, {0}, 1, {1, rest}, {m, rest});
  Value y = g;
  if (t.k > 1) {
    Value w = b.convert(b.broadcast_in_dim(b.reshape(const_weights(b, t.w, x.dtype()), {out, t.k}), {out, t.k, rest}, {0, 1}), x.dtype());
    y = reduce_sum(b, mul(b, b.reshape(g, {out, t.k, rest}), w), {1});
  }
  Shape moved = f.moved;
  moved[0] = out;
  return b.transpose(b.reshape(y, moved), f.inv);
}

// The adjoint: grad_in[idx[o][k]] += w[o][k] * grad_out[o]   (out -> in).
Value apply_bwd(Builder& b, const Value& g, int64_t d, const Taps& t, int64_t in) {
  Front f = front(g.shape(), d);
  int64_t out = f.moved[0], rest = out ? g.type.numel() / out : 0, m = out * t.k;
  Value gf = b.reshape(b.transpose(g, f.perm), {out, rest});
  Value u = b.broadcast_in_dim(gf, {out, t.k, rest}, {0, 2});
  Value w = b.convert(b.broadcast_in_dim(b.reshape(const_weights(b, t.w, g.dtype()), {out, t.k}), {out, t.k, rest}, {0, 1}), g.dtype());
  u = b.reshape(mul(b, u, w), {m, rest});
  Value idx = b.reshape(const_i64(b, t.idx), {m, 1});
  auto sum = [](Builder& b, const std::vector<Value>& a) { return std::vector<Value>{add(b, a[0], a[1])}; };
  Value r = b.scatter(b.constant(0, g.dtype(), {in, rest}), idx, u, {1}, {0}, {0}, 1, sum);
  Shape moved = f.moved;
  moved[0] = in;
  return b.transpose(b.reshape(r, moved), f.inv);
}

std::vector<Scale> scales(Ctx& ctx, int first, int n) {
  std::vector<Scale> s;
  for (int i = 0; i < n; ++i) {
    int a = first + i;
    s.push_back(a < ctx.num_args() && !ctx.is_none(a) ? Scale(ctx.f(a)) : std::nullopt);
  }
  return s;
}

// backward(grad_output, output_size, input_size, [align_corners,] scales...).
std::vector<Value> backward(Ctx& ctx, Mode m, int n, bool has_align) {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  Value g = b.convert(ctx.in(0), acc_type(o.dtype));
  if (g.type.numel() == 0 || o.numel() == 0) return {b.constant(0, o.dtype, o.shape)};
  bool align = has_align && ctx.flag(3);
  auto sc = scales(ctx, has_align ? 4 : 3, n);
  int64_t r = g.rank();
  for (int i = n - 1; i >= 0; --i) {
    int64_t d = r - n + i, in = o.shape[d], out = g.shape()[d];
    g = apply_bwd(b, g, d, taps_for(g.dtype(), m, in, out, align, sc[i]), in);
  }
  return {b.convert(g, o.dtype)};
}

// Linear/bilinear/trilinear/bicubic forward: self, output_size, align_corners, scales...
// As CPU's kernels: weights in the dtype (but see float_weights), weighted sums in the math type (float for
// bfloat16/float16), rounded to the dtype once at the end. (PyTorch's decomposition, run
// before, kept float weights, so bfloat16 results near zero differed from CPU's a lot.)
// v rounded to nearest-even with `bits` significant bits (8 for bfloat16, 11 for float16)
// and no finer than 2^min_exp (the subnormal step), returned as a double.
double round_bits(double v, int bits, int min_exp) {
  if (v == 0 || !std::isfinite(v)) return v;
  int e;
  std::frexp(v, &e);
  double step = std::ldexp(1.0, std::max(e - bits, min_exp));
  return std::nearbyint(v / step) * step;
}

// CPU's kernel keeps its weights in the op's dtype: a linear tap pair is (1 - l, l) with l
// rounded first and 1 - l computed in the dtype; cubic weights are each rounded.
void round_weights(Taps& t, Mode m, DType dt) {
  if (dt != DType::BF16 && dt != DType::F16) return;
  int bits = dt == DType::BF16 ? 8 : 11, min_exp = dt == DType::BF16 ? -133 : -24;
  auto rnd = [&](double v) { return round_bits(static_cast<float>(v), bits, min_exp); };
  for (size_t i = 0; i < t.w.size(); i += static_cast<size_t>(t.k)) {
    if (m == Mode::Linear) {
      t.w[i + 1] = rnd(t.w[i + 1]);
      t.w[i] = rnd(1.0 - t.w[i + 1]);
    } else {
      for (int64_t j = 0; j < t.k; ++j) t.w[i + j] = rnd(t.w[i + j]);
    }
  }
}

// Whether CPU picks its vectorized linear kernel, whose weights stay float: a channels-last
// input of more than 3 channels, or (2-d only) outputs with height + width <= 128. Its
// generic kernel keeps them in the dtype. Layout is read as "not contiguous" (a strided
// non-channels-last input is taken as channels-last), and assumed contiguous where a
// context cannot tell.
bool float_weights(Ctx& ctx, int n, const Shape& out) {
  int64_t r = static_cast<int64_t>(out.size());
  if (n == 2 && out[r - 2] + out[r - 1] <= 128) return true;
  if (n == 1 || out[1] <= 3) return false;
  try {
    return !ctx.contiguous(0);
  } catch (const Unsupported&) {
    return false;
  }
}

// uint8 images, as CPU's integer kernel (its antialiased and plain resizes alike): per
// resized dim (last first; a dim of unchanged size is left alone), the mode's taps in
// double, weights turned into int16 fixed point with the most bits that keep the
// largest below 2^15, sums in int32 rounded at the shift and clamped to [0, 255].
std::vector<Value> u8_forward(Ctx& ctx, Mode m) {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  Value x = b.convert(ctx.in(0), DType::I32);
  if (x.type.numel() == 0 || o.numel() == 0) return {b.constant(0, o.dtype, o.shape)};
  bool align = ctx.flag(2);
  auto sc = scales(ctx, 3, 2);
  int64_t r = x.rank();
  for (int i = 1; i >= 0; --i) {
    int64_t d = r - 2 + i, in = x.shape()[d], out = o.shape[d];
    if (in == out) continue;
    Taps t = make_taps<double>(m, in, out, align, sc[i]);
    // Taps clamped onto one input pixel (at the borders) weigh as one: CPU adds their
    // weights before the rounding to fixed point.
    for (int64_t o = 0; o < out; ++o)
      for (int64_t j = 1; j < t.k; ++j)
        for (int64_t q = 0; q < j; ++q)
          if (t.idx[o * t.k + q] == t.idx[o * t.k + j]) {
            t.w[o * t.k + q] += t.w[o * t.k + j];
            t.w[o * t.k + j] = 0;
            break;
          }
    double w_max = *std::max_element(t.w.begin(), t.w.end());
    int bits = 0;
    while (bits < 22 && static_cast<int>(0.5 + w_max * static_cast<double>(1 << (bits + 1))) < (1 << 15)) ++bits;
    Taps fixed = t;
    for (double& w : fixed.w) w = static_cast<double>(static_cast<int>(w < 0 ? -0.5 + std::ldexp(w, bits) : 0.5 + std::ldexp(w, bits)));
    Front f = front(x.shape(), d);
    int64_t rest = x.type.numel() / in, k = t.k;
    Value xf = b.reshape(b.transpose(x, f.perm), {in, rest});
    Value g = b.reshape(b.gather(xf, b.reshape(const_i64(b, t.idx), {out * k, 1}), {1}, {0}, {0}, 1, {1, rest},
                                 {out * k, rest}), {out, k, rest});
    Value w = b.broadcast_in_dim(b.reshape(b.convert(const_weights(b, fixed.w, DType::F32), DType::I32), {out, k}),
                                 {out, k, rest}, {0, 1});
    Value sum = add(b, reduce_sum(b, mul(b, g, w), {1}), b.constant(double(1 << (bits - 1)), DType::I32, {out, rest}));
    Value y = b.binary("stablehlo.shift_right_arithmetic", sum, b.constant(bits, DType::I32, {out, rest}));
    y = b.clamp(b.constant(0, DType::I32, {}), y, b.constant(255, DType::I32, {}));
    Shape moved = f.moved;
    moved[0] = out;
    x = b.transpose(b.reshape(y, moved), f.inv);
  }
  return {b.convert(x, o.dtype)};
}

std::vector<Value> forward(Ctx& ctx, Mode m, int n) {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  if (o.dtype == DType::U8) {
    // CPU's uint8 kernel serves 2-d images only; its other linear kernels refuse uint8.
    if (n != 2) throw DtypeNotImplemented("compute_indices_weights_linear");
    return u8_forward(ctx, m);
  }
  bool keep_float = m == Mode::Linear && float_weights(ctx, n, o.shape);
  Value x = b.convert(ctx.in(0), acc_type(o.dtype));
  if (x.type.numel() == 0 || o.numel() == 0) return {b.constant(0, o.dtype, o.shape)};
  bool align = ctx.flag(2);
  auto sc = scales(ctx, 3, n);
  int64_t r = x.rank();
  for (int i = n - 1; i >= 0; --i) {
    int64_t d = r - n + i, in = x.shape()[d], out = o.shape[d];
    Taps t = taps_for(x.dtype(), m, in, out, align, sc[i]);
    if (!keep_float) round_weights(t, m, o.dtype);
    x = apply_fwd(b, x, d, t, out);
  }
  return {b.convert(x, o.dtype)};
}

// Nearest/nearest-exact forward along dim d: each output reads one input, so no math and
// no dtype change. The source indices are static, so the cheapest form is picked from
// them: an unchanged dim is left alone, an integer upsample (o -> o / f) is a broadcast
// plus reshape, an evenly strided pick (o -> a + o * s) a strided slice, and any other
// ratio a gather by a constant index list (in range by construction: no bound check).
Value nearest_dim(Builder& b, const Value& x, int64_t d, const std::vector<int64_t>& idx) {
  Shape s = x.shape();
  int64_t in = s[d], out = static_cast<int64_t>(idx.size()), r = x.rank();
  auto follows = [&](auto f) {
    for (int64_t o = 0; o < out; ++o)
      if (idx[o] != f(o)) return false;
    return true;
  };
  if (in == out && follows([](int64_t o) { return o; })) return x;
  if (out % in == 0 && follows([&](int64_t o) { return o / (out / in); })) {
    Shape wide = s;
    wide.insert(wide.begin() + d + 1, out / in);
    std::vector<int64_t> dims;
    for (int64_t i = 0; i < r; ++i) dims.push_back(i <= d ? i : i + 1);
    Shape res = s;
    res[d] = out;
    return b.reshape(b.broadcast_in_dim(x, wide, dims), res);
  }
  int64_t start = idx[0], step = out > 1 ? idx[1] - idx[0] : 1;
  if (step > 0 && follows([&](int64_t o) { return start + o * step; })) {
    Shape lo(r, 0), hi = s, st(r, 1);
    lo[d] = start, hi[d] = start + (out - 1) * step + 1, st[d] = step;
    return b.slice(x, lo, hi, st);
  }
  std::vector<int64_t> offset, sizes = s;
  for (int64_t i = 0; i < r; ++i)
    if (i != d) offset.push_back(i);
  sizes[d] = 1;
  Shape res = s;
  res[d] = out;
  return b.gather(x, b.reshape(const_i64(b, idx), {out, 1}), offset, {d}, {d}, 1, sizes, res);
}

// CPU's 1-d and 3-d forwards (its generic N-d kernel) pick indices unlike its 2-d one and
// the backwards (make_taps): no out == in / out == 2 * in shortcuts, the scale in the math
// type (double for float64), and nearest-exact as floorf(max(s * (o + 0.5) - 0.5, 0) + 0.5)
// with the multiply-add fused, as CPU's build computes it.
template <class T>
std::vector<int64_t> generic_nearest_idx(Mode m, int64_t in, int64_t out, Scale s) {
  T sc = (s && *s > 0) ? static_cast<T>(1.0 / *s) : static_cast<T>(in) / static_cast<T>(out);
  std::vector<int64_t> idx;
  for (int64_t o = 0; o < out; ++o) {
    float real;
    if (m == Mode::NearestExact) {
      T src = std::fma(sc, static_cast<T>(o) + T(0.5), T(-0.5));
      real = static_cast<float>(static_cast<double>(src < T(0) ? T(0) : src) + 0.5);
    } else {
      real = static_cast<float>(sc * static_cast<T>(o));
    }
    idx.push_back(std::min(static_cast<int64_t>(std::floor(real)), in - 1));
  }
  return idx;
}

// upsample_nearest{1,2,3}d / _upsample_nearest_exact{1,2,3}d: self, output_size, scales...
// (the .vec overloads are composite: they reach the backend as these). Indices as CPU's:
// the given scale when one is passed, clamped to in - 1; 2-d as make_taps (CPU's 2-d
// kernel, any layout), 1-d and 3-d as generic_nearest_idx.
std::vector<Value> nearest_forward(Ctx& ctx, Mode m, int n) {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  Value x = ctx.in(0);
  if (x.type.numel() == 0 || o.numel() == 0) return {b.constant(0, o.dtype, o.shape)};
  auto sc = scales(ctx, 2, n);
  int64_t r = x.rank();
  for (int i = n - 1; i >= 0; --i) {
    int64_t d = r - n + i;
    int64_t in = x.shape()[d], out = o.shape[d];
    std::vector<int64_t> idx = n == 2                ? make_taps<float>(m, in, out, false, sc[i]).idx
                               : o.dtype == DType::F64 ? generic_nearest_idx<double>(m, in, out, sc[i])
                                                       : generic_nearest_idx<float>(m, in, out, sc[i]);
    x = nearest_dim(b, x, d, idx);
  }
  return {x};
}

// Antialiased forward: self, output_size, align_corners, scales_h, scales_w.
std::vector<Value> aa_forward(Ctx& ctx, bool cubic) {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  if (o.dtype == DType::U8) return u8_forward(ctx, cubic ? Mode::CubicAA : Mode::LinearAA);
  Value x = b.convert(ctx.in(0), acc_type(o.dtype));
  if (x.type.numel() == 0 || o.numel() == 0) return {b.constant(0, o.dtype, o.shape)};
  bool align = ctx.flag(2);
  auto sc = scales(ctx, 3, 2);
  int64_t r = x.rank();
  for (int i = 1; i >= 0; --i) {
    int64_t d = r - 2 + i, in = x.shape()[d], out = o.shape[d];
    if (in == out) continue;  // CPU leaves an unresized dim alone
    x = apply_fwd(b, x, d, taps_for(x.dtype(), cubic ? Mode::CubicAA : Mode::LinearAA, in, out, align, sc[i]), out);
  }
  return {b.convert(x, o.dtype)};
}

}  // namespace

TPU_LOWER(upsample_nearest1d, "upsample_nearest1d") { return nearest_forward(ctx, Mode::Nearest, 1); }
TPU_LOWER(upsample_nearest2d, "upsample_nearest2d") { return nearest_forward(ctx, Mode::Nearest, 2); }
TPU_LOWER(upsample_nearest3d, "upsample_nearest3d") { return nearest_forward(ctx, Mode::Nearest, 3); }
TPU_LOWER(upsample_nearest_exact1d, "_upsample_nearest_exact1d") {
  return nearest_forward(ctx, Mode::NearestExact, 1);
}
TPU_LOWER(upsample_nearest_exact2d, "_upsample_nearest_exact2d") {
  return nearest_forward(ctx, Mode::NearestExact, 2);
}
TPU_LOWER(upsample_nearest_exact3d, "_upsample_nearest_exact3d") {
  return nearest_forward(ctx, Mode::NearestExact, 3);
}
TPU_LOWER(upsample_nearest1d_bw, "upsample_nearest1d_backward") { return backward(ctx, Mode::Nearest, 1, false); }
TPU_LOWER(upsample_nearest2d_bw, "upsample_nearest2d_backward") { return backward(ctx, Mode::Nearest, 2, false); }
TPU_LOWER(upsample_nearest3d_bw, "upsample_nearest3d_backward") { return backward(ctx, Mode::Nearest, 3, false); }
TPU_LOWER(upsample_nearest_exact1d_bw, "_upsample_nearest_exact1d_backward") {
  return backward(ctx, Mode::NearestExact, 1, false);
}
TPU_LOWER(upsample_nearest_exact2d_bw, "_upsample_nearest_exact2d_backward") {
  return backward(ctx, Mode::NearestExact, 2, false);
}
TPU_LOWER(upsample_nearest_exact3d_bw, "_upsample_nearest_exact3d_backward") {
  return backward(ctx, Mode::NearestExact, 3, false);
}
TPU_LOWER(upsample_linear1d, "upsample_linear1d") { return forward(ctx, Mode::Linear, 1); }
TPU_LOWER(upsample_bilinear2d, "upsample_bilinear2d") { return forward(ctx, Mode::Linear, 2); }
TPU_LOWER(upsample_trilinear3d, "upsample_trilinear3d") { return forward(ctx, Mode::Linear, 3); }
TPU_LOWER(upsample_bicubic2d, "upsample_bicubic2d") { return forward(ctx, Mode::Cubic, 2); }
TPU_LOWER(upsample_linear1d_bw, "upsample_linear1d_backward") { return backward(ctx, Mode::Linear, 1, true); }
TPU_LOWER(upsample_bilinear2d_bw, "upsample_bilinear2d_backward") { return backward(ctx, Mode::Linear, 2, true); }
TPU_LOWER(upsample_trilinear3d_bw, "upsample_trilinear3d_backward") { return backward(ctx, Mode::Linear, 3, true); }
TPU_LOWER(upsample_bicubic2d_bw, "upsample_bicubic2d_backward") { return backward(ctx, Mode::Cubic, 2, true); }
TPU_LOWER(upsample_bilinear2d_aa, "_upsample_bilinear2d_aa") { return aa_forward(ctx, false); }
TPU_LOWER(upsample_bicubic2d_aa, "_upsample_bicubic2d_aa") { return aa_forward(ctx, true); }
TPU_LOWER(upsample_bilinear2d_aa_bw, "_upsample_bilinear2d_aa_backward") {
  return backward(ctx, Mode::LinearAA, 2, true);
}
TPU_LOWER(upsample_bicubic2d_aa_bw, "_upsample_bicubic2d_aa_backward") {
  return backward(ctx, Mode::CubicAA, 2, true);
}

}  // namespace tpu::lowering
