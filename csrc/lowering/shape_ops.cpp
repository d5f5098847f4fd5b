// Ops that move data into a new layout: padding, repeating, the *_copy forms of
// view ops, and the backward/scatter forms of slicing (a value written into a slice
// of zeros or of a copy).
#include "ir/views.h"
#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

static std::vector<int64_t> range(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

// `x` placed along `dim` at start, start + step, ... of a dim of size n; the other
// positions hold `fill`. An interior pad does the spacing.
static Value spread(Builder& b, const Value& x, int64_t dim, int64_t n, int64_t start, int64_t step,
                    const Value& fill) {
  int64_t r = x.rank(), len = x.shape()[dim];
  Shape lo(r, 0), hi(r, 0), in(r, 0);
  if (len == 0) {
    Shape s = x.shape();
    s[dim] = n;
    return broadcast_to(b, fill, s);
  }
  lo[dim] = start;
  in[dim] = step - 1;
  hi[dim] = n - start - ((len - 1) * step + 1);
  return b.pad(x, fill, lo, hi, in);
}

// `src` written over `self` at those positions along dim: a spread of src and of a
// true mask, then a select.
static Value put_spread(Builder& b, const Value& self, const Value& src, int64_t dim, int64_t start,
                        int64_t step) {
  int64_t n = self.shape()[dim];
  Value v = spread(b, b.convert(src, self.dtype()), dim, n, start, step, b.constant(0, self.dtype()));
  Value m = spread(b, b.constant(1, DType::Bool, src.shape()), dim, n, start, step,
                   b.constant(0, DType::Bool));
  return b.select(m, v, self);
}

// PyTorch's slice bounds: None is the whole dim, negatives wrap, then clamped.
static int64_t slice_start(Ctx& ctx, int idx, int64_t n) {
  int64_t s = ctx.i_or(idx, 0);
  if (s < 0) s += n;
  return std::min(std::max<int64_t>(s, 0), n);
}

TPU_LOWER(constant_pad_nd, "constant_pad_nd") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  auto pad = ctx.ints(1);
  int64_t r = x.rank();
  if (static_cast<int64_t>(pad.size()) > 2 * r) throw Unsupported("constant_pad_nd: pad too long");
  // Pairs run from the last dim backwards; negative pads crop.
  Shape lo(r, 0), hi(r, 0), in(r, 0);
  for (size_t j = 0; j + 1 < pad.size(); j += 2) {
    lo[r - 1 - j / 2] = pad[j];
    hi[r - 1 - j / 2] = pad[j + 1];
  }
  Value v = ctx.is_none(2) ? b.constant(0, x.dtype()) : ctx.scalar(2, x.dtype());
  return {b.pad(x, v, lo, hi, in)};
}

// x.repeat(r): x broadcast over new interleaved dims (r0, s0, r1, s1, ...), merged.
TPU_LOWER(repeat, "repeat") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  auto reps = ctx.ints(1);
  Shape s(reps.size() - x.rank(), 1);
  s.insert(s.end(), x.shape().begin(), x.shape().end());
  Shape wide;
  std::vector<int64_t> dims;
  for (size_t i = 0; i < reps.size(); ++i) {
    wide.push_back(reps[i]);
    wide.push_back(s[i]);
    dims.push_back(static_cast<int64_t>(2 * i + 1));
  }
  Value y = b.broadcast_in_dim(b.reshape(x, s), wide, dims);
  return {b.reshape(y, ctx.out(0).shape)};
}

// ---- *_copy forms of views ----

// Views whose elements keep their order: the copy is a reshape.
TPU_LOWER(reshape_copy, "view_copy", "_reshape_copy", "alias_copy", "squeeze_copy", "squeeze_copy.dim",
          "squeeze_copy.dims", "unsqueeze_copy") {
  return {ctx.b.reshape(ctx.in(0), ctx.out(0).shape)};
}

TPU_LOWER(expand_copy, "expand_copy") { return {broadcast_to(ctx.b, ctx.in(0), ctx.out(0).shape)}; }

TPU_LOWER(permute_copy, "permute_copy") {
  Value x = ctx.in(0);
  std::vector<int64_t> perm;
  for (auto d : ctx.ints(1)) perm.push_back(wrap_dim(d, x.rank()));
  return {ctx.b.transpose(x, perm)};
}

static Value swap(Builder& b, const Value& x, int64_t d0, int64_t d1) {
  if (x.rank() < 2) return x;
  auto perm = range(0, x.rank());
  std::swap(perm[wrap_dim(d0, x.rank())], perm[wrap_dim(d1, x.rank())]);
  return b.transpose(x, perm);
}

TPU_LOWER(t_copy, "t_copy") { return {swap(ctx.b, ctx.in(0), 0, 1)}; }
TPU_LOWER(transpose_copy, "transpose_copy.int") { return {swap(ctx.b, ctx.in(0), ctx.i(1), ctx.i(2))}; }

TPU_LOWER(narrow_copy, "narrow_copy") {
  Value x = ctx.in(0);
  int64_t dim = wrap_dim(ctx.i(1), x.rank()), n = x.shape()[dim];
  int64_t start = ctx.i(2) < 0 ? ctx.i(2) + n : ctx.i(2);
  Shape lo(x.rank(), 0), hi = x.shape(), one(x.rank(), 1);
  lo[dim] = start;
  hi[dim] = start + ctx.i(3);
  return {ctx.b.slice(x, lo, hi, one)};
}

// Consecutive pieces along dim, one result each.
static std::vector<Value> split_along(Ctx& ctx, const Value& x, int64_t dim,
                                      const std::vector<int64_t>& sizes, bool squeeze) {
  std::vector<Value> out;
  int64_t at = 0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    Shape lo(x.rank(), 0), hi = x.shape(), one(x.rank(), 1);
    lo[dim] = at;
    hi[dim] = at + sizes[j];
    at += sizes[j];
    Value piece = ctx.b.slice(x, lo, hi, one);
    out.push_back(squeeze ? ctx.b.reshape(piece, ctx.out(static_cast<int>(j)).shape) : piece);
  }
  return out;
}

TPU_LOWER(split_with_sizes_copy, "split_with_sizes_copy") {
  Value x = ctx.in(0);
  return split_along(ctx, x, wrap_dim(ctx.i_or(2, 0), x.rank()), ctx.ints(1), false);
}

TPU_LOWER(unbind_copy, "unbind_copy.int") {
  Value x = ctx.in(0);
  int64_t dim = wrap_dim(ctx.i_or(1, 0), x.rank());
  return split_along(ctx, x, dim, std::vector<int64_t>(x.shape()[dim], 1), true);
}

// The diagonal (offset) of dims d1, d2 as a new last dim: a gather of the points
// (i, i + offset) (or (i - offset, i) below the main diagonal).
TPU_LOWER(diagonal_copy, "diagonal_copy") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  int64_t r = x.rank(), off = ctx.i_or(1, 0);
  int64_t d1 = wrap_dim(ctx.i_or(2, 0), r), d2 = wrap_dim(ctx.i_or(3, 1), r);
  Type out = ctx.out(0);
  int64_t len = out.shape.back();
  std::vector<int64_t> rest;
  for (int64_t d = 0; d < r; ++d)
    if (d != d1 && d != d2) rest.push_back(d);
  Value x2 = b.transpose(x, [&] {
    std::vector<int64_t> p = rest;
    p.push_back(d1);
    p.push_back(d2);
    return p;
  }());
  Value i = b.iota(Type{DType::I64, {len, 1}}, 0);
  Value r0 = add(b, i, b.constant(static_cast<double>(std::max<int64_t>(-off, 0)), DType::I64, {len, 1}));
  Value c0 = add(b, i, b.constant(static_cast<double>(std::max<int64_t>(off, 0)), DType::I64, {len, 1}));
  int64_t nr = static_cast<int64_t>(rest.size());
  Shape slice(x2.shape().begin(), x2.shape().end());
  slice[nr] = 1, slice[nr + 1] = 1;
  // Gather layout: the rest dims as offsets first, the diagonal as the batch dim last.
  Shape gout(x2.shape().begin(), x2.shape().begin() + nr);
  gout.push_back(len);
  return {b.gather(x2, b.concatenate({r0, c0}, 1), range(0, nr), {nr, nr + 1}, {nr, nr + 1}, 1, slice,
                   gout)};
}

// Windows of `size` every `step` along dim, as a new last dim.
TPU_LOWER(unfold_copy, "unfold_copy") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  if (x.rank() == 0) x = b.reshape(x, {1});
  int64_t dim = wrap_dim(ctx.i(1), x.rank()), size = ctx.i(2), step = ctx.i(3);
  int64_t nw = (x.shape()[dim] - size) / step + 1;
  std::vector<Value> taps;
  Shape s1 = x.shape();
  s1[dim] = nw;
  s1.push_back(1);
  for (int64_t k = 0; k < size; ++k) {
    Shape lo(x.rank(), 0), hi = x.shape(), st(x.rank(), 1);
    lo[dim] = k;
    hi[dim] = k + (nw - 1) * step + 1;
    st[dim] = step;
    taps.push_back(b.reshape(b.slice(x, lo, hi, st), s1));
  }
  return {b.reshape(b.concatenate(taps, x.rank()), ctx.out(0).shape)};
}

TPU_LOWER(as_strided_copy, "as_strided_copy") {
  Value x = ctx.in(0);
  Value flat = ctx.b.reshape(x, {x.type.numel()});
  ir::Geometry g{ctx.ints(1), ctx.ints(2), ctx.i_or(3, 0)};
  return {ir::read_view(ctx.b, flat, g)};
}

// ---- backward of views: the grad written into zeros ----

TPU_LOWER(select_backward, "select_backward") {
  Builder& b = ctx.b;
  Value g = ctx.in(0);
  Shape in = ctx.ints(1);
  int64_t dim = wrap_dim(ctx.i(2), static_cast<int64_t>(in.size())), n = in[dim];
  int64_t idx = ctx.i(3) < 0 ? ctx.i(3) + n : ctx.i(3);
  Shape s = in;
  s[dim] = 1;
  return {spread(b, b.reshape(g, s), dim, n, idx, 1, b.constant(0, g.dtype()))};
}

TPU_LOWER(slice_backward, "slice_backward") {
  Builder& b = ctx.b;
  Value g = ctx.in(0);
  Shape in = ctx.ints(1);
  int64_t dim = wrap_dim(ctx.i(2), static_cast<int64_t>(in.size()));
  int64_t start = slice_start(ctx, 3, in[dim]);
  return {spread(b, g, dim, in[dim], start, ctx.i(5), b.constant(0, g.dtype()))};
}

// Zeros with `grad` on the diagonal (offset) of d1, d2: grad's last dim is padded
// to the size of the dim it indexes, broadcast, and masked to the diagonal.
TPU_LOWER(diagonal_backward, "diagonal_backward") {
  Builder& b = ctx.b;
  Value g = ctx.in(0);
  Shape in = ctx.ints(1);
  int64_t r = static_cast<int64_t>(in.size()), off = ctx.i(2);
  int64_t d1 = wrap_dim(ctx.i(3), r), d2 = wrap_dim(ctx.i(4), r);
  int64_t along = off >= 0 ? d1 : d2;  // the diagonal index runs along this dim
  int64_t gr = g.rank();
  Shape lo(gr, 0), hi(gr, 0), interior(gr, 0);
  hi[gr - 1] = in[along] - g.shape()[gr - 1];
  Value gp = b.pad(g, b.constant(0, g.dtype()), lo, hi, interior);
  std::vector<int64_t> map;
  for (int64_t d = 0; d < r; ++d)
    if (d != d1 && d != d2) map.push_back(d);
  map.push_back(along);
  Value full = b.broadcast_in_dim(gp, in, map);
  Type it{DType::I64, in};
  Value diff = sub(b, b.iota(it, d2), b.iota(it, d1));
  Value on = b.compare(diff, b.constant(static_cast<double>(off), DType::I64, in), Cmp::EQ);
  return {b.select(on, full, b.constant(0, g.dtype(), in))};
}

// Sum of the windows' grads back at their positions: one spread per window offset.
TPU_LOWER(unfold_backward, "unfold_backward") {
  Builder& b = ctx.b;
  Value g = ctx.in(0);  // input shape with dim -> windows, plus a last dim of size
  Shape in = ctx.ints(1);
  int64_t r = static_cast<int64_t>(in.size());
  if (r == 0) return {b.reshape(g, {})};
  int64_t dim = wrap_dim(ctx.i(2), r), size = ctx.i(3), step = ctx.i(4);
  Value zero = b.constant(0, g.dtype());
  Value acc = b.constant(0, g.dtype(), in);
  Shape tap = g.shape();
  tap.pop_back();
  for (int64_t k = 0; k < size; ++k) {
    Shape lo(g.rank(), 0), hi = g.shape(), one(g.rank(), 1);
    lo[g.rank() - 1] = k;
    hi[g.rank() - 1] = k + 1;
    Value gk = b.reshape(b.slice(g, lo, hi, one), tap);
    // g may broadcast against input_sizes (istft's window envelope, a batch of 1): CPU
    // expands it.
    acc = add(b, acc, broadcast_to(b, spread(b, gk, dim, in[dim], k, step, zero), in));
  }
  return {acc};
}

// ---- scatter forms: src written into a copy of self ----

TPU_LOWER(slice_scatter, "slice_scatter") {
  Value self = ctx.in(0), src = ctx.in(1);
  int64_t dim = wrap_dim(ctx.i_or(2, 0), self.rank());
  int64_t start = slice_start(ctx, 3, self.shape()[dim]);
  return {put_spread(ctx.b, self, src, dim, start, ctx.i_or(5, 1))};
}

TPU_LOWER(select_scatter, "select_scatter") {
  Value self = ctx.in(0);
  int64_t dim = wrap_dim(ctx.i(2), self.rank()), n = self.shape()[dim];
  int64_t idx = ctx.i(3) < 0 ? ctx.i(3) + n : ctx.i(3);
  Shape s = self.shape();
  s[dim] = 1;
  return {put_spread(ctx.b, self, ctx.b.reshape(ctx.in(1), s), dim, idx, 1)};
}

// self is taken as a dense tensor (its own storage, offset 0), as the functional
// op's clone is.
TPU_LOWER(as_strided_scatter, "as_strided_scatter") {
  Builder& b = ctx.b;
  Value self = ctx.in(0);
  Value flat = b.reshape(self, {self.type.numel()});
  ir::Geometry g{ctx.ints(2), ctx.ints(3), ctx.i_or(4, 0)};
  // The view must lie inside self, as CPU's as_strided checks (a write outside went nowhere).
  int64_t last = g.offset;
  bool empty = false;
  for (size_t i = 0; i < g.sizes.size(); ++i) {
    if (g.sizes[i] == 0) empty = true;
    else last += (g.sizes[i] - 1) * g.strides[i];
  }
  auto list = [](const Shape& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  if (!empty && (g.offset < 0 || last >= self.type.numel()))
    throw std::invalid_argument("as_strided_scatter: a view of sizes " + list(g.sizes) + ", strides " +
                                list(g.strides) + " and offset " + std::to_string(g.offset) +
                                " reaches element " + std::to_string(last) + " of self's " +
                                std::to_string(self.type.numel()));
  Value out = ir::write_view(b, &flat, flat.type, g, ctx.in(1));
  return {b.reshape(out, self.shape())};
}

// ---- im2col / col2im ----
// im2col: (N, C, H, W) -> (N, C*kh*kw, L); col2im is its adjoint (overlaps add).

struct Patch {
  int64_t kh, kw, dh, dw, ph, pw, sh, sw;
};

static Patch patch_args(Ctx& ctx, int k, int d, int p, int s) {
  auto two = [](std::vector<int64_t> v) {
    if (v.size() == 1) v.push_back(v[0]);
    return v;
  };
  auto kk = two(ctx.ints(k)), dd = two(ctx.ints(d)), pp = two(ctx.ints(p)), ss = two(ctx.ints(s));
  return Patch{kk[0], kk[1], dd[0], dd[1], pp[0], pp[1], ss[0], ss[1]};
}

static int64_t blocks(int64_t n, int64_t k, int64_t d, int64_t p, int64_t s) {
  return (n + 2 * p - (d * (k - 1) + 1)) / s + 1;
}

TPU_LOWER(im2col, "im2col") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  if (x.rank() == 3) x = b.reshape(x, {1, x.shape()[0], x.shape()[1], x.shape()[2]});
  Patch p = patch_args(ctx, 1, 2, 3, 4);
  int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  int64_t oh = blocks(h, p.kh, p.dh, p.ph, p.sh), ow = blocks(w, p.kw, p.dw, p.pw, p.sw);
  Value xp = b.pad(x, b.constant(0, x.dtype()), {0, 0, p.ph, p.pw}, {0, 0, p.ph, p.pw}, {0, 0, 0, 0});
  std::vector<Value> taps;
  for (int64_t i = 0; i < p.kh; ++i)
    for (int64_t j = 0; j < p.kw; ++j) {
      Value t = b.slice(xp, {0, 0, i * p.dh, j * p.dw},
                        {n, c, i * p.dh + (oh - 1) * p.sh + 1, j * p.dw + (ow - 1) * p.sw + 1},
                        {1, 1, p.sh, p.sw});
      taps.push_back(b.reshape(t, {n, c, 1, oh * ow}));
    }
  Value cols = b.concatenate(taps, 2);  // (N, C, kh*kw, L): channel-major rows, as PyTorch
  return {b.reshape(cols, ctx.out(0).shape)};
}

TPU_LOWER(col2im, "col2im") {
  Builder& b = ctx.b;
  Value cols = ctx.in(0);
  auto size = ctx.ints(1);
  if (size.size() == 1) size.push_back(size[0]);
  Patch p = patch_args(ctx, 2, 3, 4, 5);
  int64_t h = size[0], w = size[1];
  int64_t n = cols.rank() == 3 ? cols.shape()[0] : 1, k = p.kh * p.kw;
  int64_t c = cols.shape()[cols.rank() - 2] / k;
  int64_t oh = blocks(h, p.kh, p.dh, p.ph, p.sh), ow = blocks(w, p.kw, p.dw, p.pw, p.sw);
  DType t = acc_type(cols.dtype());
  Value x = b.reshape(b.convert(cols, t), {n, c, k, oh, ow});
  int64_t hp = h + 2 * p.ph, wp = w + 2 * p.pw;
  Value acc = b.constant(0, t, {n, c, hp, wp});
  for (int64_t i = 0; i < p.kh; ++i)
    for (int64_t j = 0; j < p.kw; ++j) {
      int64_t tap = i * p.kw + j;
      Value v = b.slice(x, {0, 0, tap, 0, 0}, {n, c, tap + 1, oh, ow}, {1, 1, 1, 1, 1});
      v = b.reshape(v, {n, c, oh, ow});
      Value zero = b.constant(0, t);
      v = spread(b, v, 2, hp, i * p.dh, p.sh, zero);
      v = spread(b, v, 3, wp, j * p.dw, p.sw, zero);
      acc = add(b, acc, v);
    }
  Value out = b.slice(acc, {0, 0, p.ph, p.pw}, {n, c, p.ph + h, p.pw + w}, {1, 1, 1, 1});
  return {b.reshape(b.convert(out, ctx.out(0).dtype), ctx.out(0).shape)};
}

}  // namespace tpu::lowering
