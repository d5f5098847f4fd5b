// grid_sampler_2d / grid_sampler_3d and their backwards. Input (N, C, [D,] H, W), grid
// (N, [Do,] Ho, Wo, n) holding (x, y[, z]) in [-1, 1]. Each output point reads a few input
// taps (bilinear: 2^n corners, nearest: one, bicubic: 4x4) at data-dependent positions:
// a row gather from the input viewed as (N * S, C). The backward scatters grad * weight
// to the same taps and differentiates the weights for the grid.
#include <cmath>
#include <functional>

#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

namespace {

enum { kBilinear = 0, kNearest = 1, kBicubic = 2 };
enum { kZeros = 0, kBorder = 1, kReflection = 2 };

struct Sampler {
  Builder& b;
  int64_t n, N, C, P;       // spatial rank, batch, channels, output points
  std::vector<int64_t> size, stride;  // per coordinate (x, y, z): input size and flat stride
  int64_t S = 1;            // input points per batch
  Shape pshape;             // (N, P)
  DType t;
  int mode, pad;
  bool align;

  Value k(double v) const { return b.constant(v, t, pshape); }
  Value land(const Value& x, const Value& y) const { return b.binary("stablehlo.and", x, y); }

  // PyTorch's clip / reflect of a source coordinate, with d result / d input.
  std::pair<Value, Value> clip(const Value& x, int64_t sz) const {
    Value lo = b.compare(x, k(0), Cmp::LE), hi = b.compare(x, k(static_cast<double>(sz - 1)), Cmp::GE);
    Value r = b.select(lo, k(0), b.select(hi, k(static_cast<double>(sz - 1)), x));
    Value g = b.select(b.binary("stablehlo.or", lo, hi), k(0), k(1));
    // NaN (a reflected inf too) reads as coordinate 0 in CPU's vectorized 2-d kernel and as
    // size - 1 in its scalar 3-d one (std::min(size - 1, NaN) keeps size - 1).
    r = b.select(b.compare(x, x, Cmp::NE), k(n == 3 ? static_cast<double>(sz - 1) : 0), r);
    return {r, g};
  }
  std::pair<Value, Value> reflect(const Value& x, int64_t twice_lo, int64_t twice_hi) const {
    if (twice_lo == twice_hi) return {k(0), k(0)};
    double mn = twice_lo / 2.0, span = (twice_hi - twice_lo) / 2.0;
    Value in = sub(b, x, k(mn));
    Value neg = b.compare(in, k(0), Cmp::LT);
    Value sgn = b.select(neg, k(-1), k(1));
    in = b.unary("stablehlo.abs", in);
    Value extra = b.binary("stablehlo.remainder", in, k(span));
    Value flips = b.unary("stablehlo.floor", div(b, in, k(span)));
    Value even = b.compare(b.binary("stablehlo.remainder", flips, k(2)), k(0), Cmp::EQ);
    Value r = b.select(even, add(b, extra, k(mn)), add(b, sub(b, k(span), extra), k(mn)));
    return {r, b.select(even, sgn, b.unary("stablehlo.negate", sgn))};
  }
  Value unnormalize(const Value& g, int64_t sz) const {
    if (align) return mul(b, div(b, add(b, g, k(1)), k(2)), k(static_cast<double>(sz - 1)));
    return div(b, sub(b, mul(b, add(b, g, k(1)), k(static_cast<double>(sz))), k(1)), k(2));
  }
  // Padding applied to an unnormalized coordinate; {coord, d coord / d input}.
  std::pair<Value, Value> padded(const Value& x, int64_t sz) const {
    if (pad == kBorder) return clip(x, sz);
    if (pad == kReflection) {
      auto [r, gr] = align ? reflect(x, 0, 2 * (sz - 1)) : reflect(x, -1, 2 * sz - 1);
      auto [c, gc] = clip(r, sz);
      return {c, mul(b, gr, gc)};
    }
    return {x, k(1)};
  }
  double unnorm_grad(int64_t sz) const { return align ? (sz - 1) / 2.0 : sz / 2.0; }

  // A tap at float coordinates (one per dim): whether it lies inside, and its clamped global row.
  std::pair<Value, Value> tap(const std::vector<Value>& at) const {
    Value ok = b.constant(1, DType::Bool, pshape);
    Value row = b.iota(Type{DType::I64, pshape}, 0);
    row = mul(b, row, b.constant(static_cast<double>(S), DType::I64, pshape));
    for (int64_t d = 0; d < n; ++d) {
      double hi = static_cast<double>(size[d]);
      ok = land(ok, land(b.compare(at[d], k(0), Cmp::GE), b.compare(at[d], k(hi), Cmp::LT)));
      Value i = b.convert(b.clamp(k(0), at[d], k(hi - 1)), DType::I64);
      i = b.select(b.compare(at[d], at[d], Cmp::NE), b.constant(0, DType::I64, pshape), i);
      row = add(b, row, mul(b, i, b.constant(static_cast<double>(stride[d]), DType::I64, pshape)));
    }
    return {ok, row};
  }
};

struct Tap {
  Value ok, row, w;        // inside, global row (N, P), weight (N, P)
  std::vector<Value> dw;   // d weight / d source coordinate, per dim (bilinear, bicubic)
};

Value cubic1(const Sampler& s, const Value& x) {  // ((A + 2) x - (A + 3)) x^2 + 1
  const double A = -0.75;
  return add(s.b, mul(s.b, mul(s.b, sub(s.b, mul(s.b, s.k(A + 2), x), s.k(A + 3)), x), x), s.k(1));
}
Value cubic2(const Sampler& s, const Value& x) {  // ((A x - 5A) x + 8A) x - 4A
  const double A = -0.75;
  Builder& b = s.b;
  return sub(b, mul(b, add(b, mul(b, sub(b, mul(b, s.k(A), x), s.k(5 * A)), x), s.k(8 * A)), x), s.k(4 * A));
}
Value dcubic1(const Sampler& s, const Value& x) {  // 3 (A + 2) x^2 - 2 (A + 3) x
  const double A = -0.75;
  Builder& b = s.b;
  return mul(b, sub(b, mul(b, s.k(3 * (A + 2)), x), s.k(2 * (A + 3))), x);
}
Value dcubic2(const Sampler& s, const Value& x) {  // 3A x^2 - 10A x + 8A
  const double A = -0.75;
  Builder& b = s.b;
  return add(b, mul(b, sub(b, mul(b, s.k(3 * A), x), s.k(10 * A)), x), s.k(8 * A));
}

// The taps of every output point, with the source coordinates' d / d grid multipliers.
std::vector<Tap> taps(const Sampler& s, const Value& grid, std::vector<Value>& mult) {
  Builder& b = s.b;
  std::vector<Value> src;
  mult.clear();
  for (int64_t d = 0; d < s.n; ++d) {
    Shape st(grid.rank(), 0), lim = grid.shape(), one(grid.rank(), 1);
    st.back() = d, lim.back() = d + 1;
    Value g = b.reshape(b.slice(grid, st, lim, one), s.pshape);
    Value u = s.unnormalize(g, s.size[d]);
    if (s.mode == kBicubic) {
      src.push_back(u);
      mult.push_back(s.k(s.unnorm_grad(s.size[d])));
      continue;
    }
    auto [c, gc] = s.padded(u, s.size[d]);
    src.push_back(c);
    mult.push_back(mul(b, gc, s.k(s.unnorm_grad(s.size[d]))));
  }
  std::vector<Tap> out;
  if (s.mode == kNearest) {
    std::vector<Value> at;
    for (auto& x : src) at.push_back(b.unary("stablehlo.round_nearest_even", x));
    auto [ok, row] = s.tap(at);
    out.push_back({ok, row, s.k(1), {}});
    return out;
  }
  std::vector<Value> fl, fr;
  for (auto& x : src) {
    fl.push_back(b.unary("stablehlo.floor", x));
    fr.push_back(sub(b, x, fl.back()));
  }
  if (s.mode == kBilinear) {
    for (int64_t c = 0; c < (int64_t{1} << s.n); ++c) {
      std::vector<Value> at, term;
      for (int64_t d = 0; d < s.n; ++d) {
        bool hi = (c >> d) & 1;
        at.push_back(hi ? add(b, fl[d], s.k(1)) : fl[d]);
        term.push_back(hi ? fr[d] : sub(b, add(b, fl[d], s.k(1)), src[d]));
      }
      Tap t;
      std::tie(t.ok, t.row) = s.tap(at);
      t.w = term[0];
      for (int64_t d = 1; d < s.n; ++d) t.w = mul(b, t.w, term[d]);
      for (int64_t d = 0; d < s.n; ++d) {
        Value g = s.k(((c >> d) & 1) ? 1 : -1);
        for (int64_t e = 0; e < s.n; ++e)
          if (e != d) g = mul(b, g, term[e]);
        t.dw.push_back(g);
      }
      out.push_back(t);
    }
    return out;
  }
  // Bicubic (2-d): 4 x 4 taps, each coordinate padded on its own.
  std::vector<std::vector<Value>> w(2), dw(2);
  for (int64_t d = 0; d < 2; ++d) {
    Value t = fr[d], one = s.k(1), two = s.k(2);
    w[d] = {cubic2(s, add(b, t, one)), cubic1(s, t), cubic1(s, sub(b, one, t)), cubic2(s, sub(b, two, t))};
    dw[d] = {dcubic2(s, add(b, t, one)), dcubic1(s, t), b.unary("stablehlo.negate", dcubic1(s, sub(b, one, t))),
             b.unary("stablehlo.negate", dcubic2(s, sub(b, two, t)))};
  }
  for (int64_t j = 0; j < 4; ++j)
    for (int64_t i = 0; i < 4; ++i) {
      std::vector<Value> at;
      for (int64_t d = 0; d < 2; ++d) {
        Value x = add(b, fl[d], s.k(static_cast<double>((d == 0 ? i : j) - 1)));
        x = s.padded(x, s.size[d]).first;
        // CPU truncates the padded coordinate to an integer before its bounds check.
        at.push_back(b.select(b.compare(x, s.k(0), Cmp::LT), b.unary("stablehlo.ceil", x), b.unary("stablehlo.floor", x)));
      }
      Tap t;
      std::tie(t.ok, t.row) = s.tap(at);
      t.w = mul(b, w[0][i], w[1][j]);
      t.dw = {mul(b, dw[0][i], w[1][j]), mul(b, w[0][i], dw[1][j])};
      out.push_back(t);
    }
  return out;
}

Sampler make(Ctx& ctx, const Value& input, const Value& grid, int first) {
  // CPU computes the coordinates of f16/bf16 grids in that precision, which moves taps.
  DType in_t = ctx.in(first - 2).dtype();
  if (in_t == DType::F16 || in_t == DType::BF16) throw Unsupported("grid_sampler in low precision");
  Sampler s{ctx.b, input.rank() - 2, input.shape()[0], input.shape()[1], 1};
  for (int64_t d = 0; d < s.n; ++d) s.P *= grid.shape()[1 + d];
  int64_t r = input.rank(), st = 1;
  for (int64_t d = 0; d < s.n; ++d) {
    s.size.push_back(input.shape()[r - 1 - d]);
    s.stride.push_back(st);
    st *= s.size.back();
  }
  s.S = st;
  s.pshape = {s.N, s.P};
  s.t = input.dtype();
  s.mode = static_cast<int>(ctx.i(first));
  s.pad = static_cast<int>(ctx.i(first + 1));
  s.align = ctx.flag(first + 2);
  if (s.mode < 0 || s.mode > 2 || s.pad < 0 || s.pad > 2) throw Unsupported("grid_sampler mode");
  if (s.mode == kBicubic && s.n != 2) throw Unsupported("bicubic grid_sampler_3d");
  return s;
}

// Input (N, C, S...) as rows (N * S, C).
Value as_rows(Builder& b, const Value& x, const Sampler& s) {
  std::vector<int64_t> perm{0};
  for (int64_t i = 2; i < x.rank(); ++i) perm.push_back(i);
  perm.push_back(1);
  return b.reshape(b.transpose(x, perm), {s.N * s.S, s.C});
}

// (N, P, C) -> (N, C, out...)
Value to_output(Builder& b, const Value& v, const Shape& out) {
  return b.reshape(b.transpose(v, {0, 2, 1}), out);
}

// Per-tap (N, P) values stacked on a leading tap dim: (T, N, P).
Value stack(Builder& b, const std::vector<Tap>& ts, const std::function<Value(const Tap&)>& f) {
  std::vector<Value> vs;
  for (auto& tp : ts) {
    Value v = f(tp);
    vs.push_back(b.reshape(v, {1, v.shape()[0], v.shape()[1]}));
  }
  return vs.size() == 1 ? vs[0] : b.concatenate(vs, 0);
}

// The (T, N, P) rows of every tap read at once: (T, N, P, C).
Value gather_taps(Builder& b, const Value& rows, const Value& idx, const Sampler& s, int64_t T) {
  int64_t m = T * s.N * s.P;
  Value g = b.gather(rows, b.reshape(idx, {m, 1}), {1}, {0}, {0}, 1, {1, s.C}, {m, s.C});
  return b.reshape(g, {T, s.N, s.P, s.C});
}

Value per_tap_point(Builder& b, const Value& v, const Sampler& s) {  // (T, N, P) -> (T, N, P, C)
  return b.broadcast_in_dim(v, {v.shape()[0], s.N, s.P, s.C}, {0, 1, 2});
}

std::vector<Value> forward(Ctx& ctx) {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  DType t = acc_type(o.dtype);
  Value input = b.convert(ctx.in(0), t), grid = b.convert(ctx.in(1), t);
  if (input.type.numel() == 0 || grid.type.numel() == 0) return {b.constant(0, o.dtype, o.shape)};
  Sampler s = make(ctx, input, grid, 2);
  std::vector<Value> mult;
  auto ts = taps(s, grid, mult);
  int64_t T = static_cast<int64_t>(ts.size());
  Value idx = stack(b, ts, [](const Tap& tp) { return tp.row; });
  Value ok = per_tap_point(b, stack(b, ts, [](const Tap& tp) { return tp.ok; }), s);
  Value w = per_tap_point(b, stack(b, ts, [](const Tap& tp) { return tp.w; }), s);
  Value v = gather_taps(b, as_rows(b, input, s), idx, s, T);
  // CPU's 2-d kernel multiplies the weight by a masked-out 0, so a NaN/inf coordinate's NaN
  // weight gives NaN under zeros padding; its 3-d kernel skips such taps.
  if (s.n == 2) v = mul(b, b.select(ok, v, b.constant(0, t, v.shape())), w);
  else v = b.select(ok, mul(b, v, w), b.constant(0, t, v.shape()));
  return {b.convert(to_output(b, reduce_sum(b, v, {0}), o.shape), o.dtype)};
}

// backward(grad_output, input, grid, mode, padding, align_corners, output_mask)
std::vector<Value> backward(Ctx& ctx) {
  Builder& b = ctx.b;
  Type gi = ctx.out(0), gg = ctx.out(1);
  DType t = acc_type(ctx.in(1).dtype());
  Value go = b.convert(ctx.in(0), t), input = b.convert(ctx.in(1), t), grid = b.convert(ctx.in(2), t);
  bool want_in = gi.dtype != DType::Invalid, want_grid = gg.dtype != DType::Invalid;
  auto zeros = [&](const Type& ty) {
    return ty.dtype == DType::Invalid ? b.constant(0, DType::F32) : b.constant(0, ty.dtype, ty.shape);
  };
  if (input.type.numel() == 0 || grid.type.numel() == 0) return {zeros(gi), zeros(gg)};
  Sampler s = make(ctx, input, grid, 3);
  std::vector<Value> mult;
  auto ts = taps(s, grid, mult);
  int64_t T = static_cast<int64_t>(ts.size()), m = T * s.N * s.P;
  // grad_output (N, C, out...) as (T, N, P, C).
  Value g = b.transpose(b.reshape(go, {s.N, s.C, s.P}), {0, 2, 1});
  g = b.broadcast_in_dim(g, {T, s.N, s.P, s.C}, {1, 2, 3});
  Value idx = stack(b, ts, [](const Tap& tp) { return tp.row; });
  Value ok_tp = stack(b, ts, [](const Tap& tp) { return tp.ok; });  // (T, N, P)
  Value ok = per_tap_point(b, ok_tp, s);
  Value zero = b.constant(0, t, {T, s.N, s.P, s.C});
  auto sum = [](Builder& b, const std::vector<Value>& a) { return std::vector<Value>{add(b, a[0], a[1])}; };
  Value din = b.constant(0, t, {s.N * s.S, s.C});
  if (want_in) {
    Value w = per_tap_point(b, stack(b, ts, [](const Tap& tp) { return tp.w; }), s);
    Value u = b.select(ok, mul(b, g, w), zero);
    din = b.scatter(din, b.reshape(idx, {m, 1}), b.reshape(u, {m, s.C}), {1}, {0}, {0}, 1, sum);
  }
  std::vector<std::optional<Value>> dsrc(s.n);
  if (want_grid && s.mode != kNearest) {
    Value gv = b.select(ok, mul(b, g, gather_taps(b, as_rows(b, input, s), idx, s, T)), zero);
    Value gsum = reduce_sum(b, gv, {3});  // over channels: (T, N, P)
    for (int64_t d = 0; d < s.n; ++d) {
      Value dw = stack(b, ts, [d](const Tap& tp) { return tp.dw[d]; });
      Value term = mul(b, gsum, dw);
      // As in the forward: CPU's 3-d kernel skips outside taps, its 2-d one keeps 0 * NaN.
      if (s.n == 3) term = b.select(ok_tp, term, b.constant(0, t, term.shape()));
      dsrc[d] = reduce_sum(b, term, {0});
    }
  }
  Value in_grad = zeros(gi), grid_grad = zeros(gg);
  if (want_in) {
    // rows (N * S, C) back to (N, C, S...)
    Shape moved{s.N};
    for (int64_t i = 2; i < input.rank(); ++i) moved.push_back(input.shape()[i]);
    moved.push_back(s.C);
    std::vector<int64_t> perm{0, input.rank() - 1};
    for (int64_t i = 1; i < input.rank() - 1; ++i) perm.push_back(i);
    in_grad = b.convert(b.transpose(b.reshape(din, moved), perm), gi.dtype);
  }
  if (want_grid) {
    std::vector<Value> parts;
    for (int64_t d = 0; d < s.n; ++d) {
      Value v = s.mode == kNearest ? s.k(0) : mul(b, *dsrc[d], mult[d]);
      Shape ps{s.N, s.P, 1};
      parts.push_back(b.reshape(v, ps));
    }
    grid_grad = b.convert(b.reshape(b.concatenate(parts, 2), gg.shape), gg.dtype);
  }
  return {in_grad, grid_grad};
}

}  // namespace

TPU_LOWER(grid_sampler_2d, "grid_sampler_2d") { return forward(ctx); }
TPU_LOWER(grid_sampler_3d, "grid_sampler_3d") { return forward(ctx); }
TPU_LOWER(grid_sampler_2d_backward, "grid_sampler_2d_backward") { return backward(ctx); }
TPU_LOWER(grid_sampler_3d_backward, "grid_sampler_3d_backward") { return backward(ctx); }

}  // namespace tpu::lowering
