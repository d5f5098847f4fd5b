// Joining, gathering, scattering, sorting and reordering.
//
// Out-of-range indices: PyTorch raises, but index values are unknown when lowering,
// so they get XLA's semantics instead (gather clamps, scatter drops the update).
#include <algorithm>
#include <optional>
#include <stdexcept>

#include "lowering/helpers.h"
#include "lowering/scan.h"

namespace tpu::lowering {

using ir::Cmp;

static Value i64(Builder& b, const Value& x) { return b.convert(x, DType::I64); }

// Out-of-range indices are an error (raised at the next synchronization), never a
// silently clamped read or write: an IndexError, or a RuntimeError where CPU's kernels
// raise one (gather and scatters; index_add on a tensor of more than one dimension).
static std::string bounds_message(const Ctx& ctx, int64_t dim, int64_t size, bool negative_ok) {
  std::string base = ctx.op().substr(0, ctx.op().find('.'));
  if (!base.empty() && base.back() == '_') base.pop_back();
  static const char* runtime_ops[] = {"gather", "scatter", "scatter_add", "scatter_reduce"};
  bool runtime = std::find(std::begin(runtime_ops), std::end(runtime_ops), base) != std::end(runtime_ops) ||
                 (base == "index_add" && ctx.type_of(0).shape.size() > 1) ||
                 // CPU's index_fill_ and index_copy_ fail restriding a dim of size 0 first.
                 (size == 0 && (base == "index_fill" || base == "index_copy"));
  return (runtime ? "RuntimeError: aten::" : "aten::") + ctx.op() + ": index out of bounds for dimension " + std::to_string(dim) +
         " with size " + std::to_string(size) + " (valid indices: " +
         (negative_ok ? std::to_string(-size) : std::string("0")) + " to " + std::to_string(size - 1) + ")";
}

static void check_bounds(Ctx& ctx, const Value& idx, int64_t dim, int64_t size, bool negative_ok) {
  check_in_range(ctx, idx, negative_ok ? -size : 0, size,
            bounds_message(ctx, dim, size, negative_ok));
}

// Index values with negative entries wrapped by `size`, as PyTorch's indexing does.
static Value wrap_index(Builder& b, const Value& idx, int64_t size) {
  Value x = i64(b, idx);
  Value neg = b.compare(x, b.constant(0, DType::I64, x.shape()), Cmp::LT);
  return b.select(neg, add(b, x, b.constant(static_cast<double>(size), DType::I64, x.shape())), x);
}

static std::vector<int64_t> range(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

static std::vector<int64_t> inverse(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  return inv;
}

// Region bodies for scatter.
static std::vector<Value> take_new(Builder&, const std::vector<Value>& a) { return {a[1]}; }
static std::vector<Value> accumulate(Builder& b, const std::vector<Value>& a) {
  return {b.binary(a[0].dtype() == DType::Bool ? "stablehlo.or" : "stablehlo.add", a[0], a[1])};
}

// ---- cat / stack ----

// One concatenate of n operands takes XLA about n^2 to compile (a stack of 4000 small
// tensors took most of a minute). Joined in groups of at most kConcatArity, each group
// behind an optimization barrier (else XLA fuses the tree back into one n-operand loop),
// it compiles in about linear time; the values are the same.
static Value concatenate_many(Builder& b, std::vector<Value> xs, int64_t dim) {
  constexpr size_t kConcatArity = 64;  // 64..256 compiled about alike (n = 2000), 16 slower
  while (xs.size() > kConcatArity) {
    std::vector<Value> joined;
    for (size_t i = 0; i < xs.size(); i += kConcatArity) {
      std::vector<Value> group(xs.begin() + i, xs.begin() + std::min(xs.size(), i + kConcatArity));
      joined.push_back(group.size() == 1 ? group[0] : b.optimization_barrier({b.concatenate(group, dim)})[0]);
    }
    xs = std::move(joined);
  }
  return b.concatenate(xs, dim);
}

// Inputs join in the promoted dtype; legacy empty 1-D inputs (shape [0]) are skipped.
// With every input skipped, CPU checks no dim: cat([empty(0)] * 2, 1) is an empty(0).
TPU_LOWER(cat, "cat") {
  Type out = ctx.out(0);
  std::vector<Value> xs;
  for (auto& x : ctx.list(0)) {
    if (x.rank() == 1 && x.shape()[0] == 0) continue;  // the shape-[0] case
    xs.push_back(ctx.b.convert(x, out.dtype));
  }
  if (xs.empty()) return {ctx.b.constant(0, out.dtype, out.shape)};
  return {concatenate_many(ctx.b, xs, wrap_dim(ctx.i(1), out.rank()))};
}

TPU_LOWER(stack, "stack") {
  Type out = ctx.out(0);
  int64_t dim = wrap_dim(ctx.i(1), out.rank());
  std::vector<Value> xs;
  for (auto& x : ctx.list(0)) {
    Shape s = x.shape();
    s.insert(s.begin() + dim, 1);
    xs.push_back(ctx.b.reshape(ctx.b.convert(x, out.dtype), s));
  }
  return {concatenate_many(ctx.b, xs, dim)};
}

// ---- index_select / gather / scatter along one dim ----

// Slices of `x` along `dim` at the (1-D or 0-D) positions `index`, shaped `out`: whole
// slices by default, or each slice's leading part (out[d] <= x's size along d != dim).
static Value take_along(Builder& b, const Value& x, int64_t dim, const Value& index,
                        std::optional<Shape> out_shape = std::nullopt) {
  int64_t n = index.type.numel();
  Value idx = b.reshape(i64(b, index), {n, 1});
  Shape out = out_shape ? *out_shape : x.shape();
  out[dim] = n;
  Shape sizes = out;
  sizes[dim] = 1;
  std::vector<int64_t> offset;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != dim) offset.push_back(d);
  return b.gather(x, idx, offset, {dim}, {dim}, 1, sizes, out);
}

TPU_LOWER(index_select, "index_select") {
  Value x = ctx.in(0);
  int64_t picks = ctx.type_of(2).numel();
  if (x.rank() == 0 && picks != 1)  // a scalar's result is a scalar: one index exactly
    throw std::invalid_argument("index_select(): Index to scalar can have only 1 value, got " +
                                std::to_string(picks) + " value(s)");
  if (x.rank() == 0) x = ctx.b.reshape(x, {1});
  int64_t dim = wrap_dim(ctx.i(1), x.rank());
  check_bounds(ctx, ctx.in(2), dim, x.shape()[dim], false);
  Value r = take_along(ctx.b, x, dim, ctx.in(2));
  return {ctx.b.reshape(r, ctx.out(0).shape)};
}

// A 1-D index repeated along every other dim (PyG's dst.unsqueeze(-1).expand(E, F)):
// gather and the scatters are then a row gather/scatter, as index_select and index_add
// are, instead of one with a coordinate tuple per element (5-20x slower). Told from index
// argument i's layout (stride 0, or size 1, along every dim but `dim`), as its values are
// unknown here; programs are keyed by layout, so the choice is fixed per program.
static bool is_row_index(const Ctx& ctx, int i, int64_t dim) {
  Type t = ctx.type_of(i);
  auto strides = ctx.strides(i);
  if (t.numel() == 0 || strides.size() != t.shape.size()) return false;
  for (int64_t d = 0; d < t.rank(); ++d)
    if (d != dim && t.shape[d] != 1 && strides[d] != 0) return false;
  return true;
}

// That 1-D index (`index` shaped like the operand): its entries along dim.
static Value row_of(Builder& b, const Value& index, int64_t dim) {
  int64_t r = index.rank(), n = index.shape()[dim];
  Shape limit(r, 1);
  limit[dim] = n;
  return b.reshape(b.slice(index, Shape(r, 0), limit, Shape(r, 1)), {n});
}

// Full coordinates (shape index.shape + [rank]) of every element of `index` in the
// operand: its own position, with `index`'s value along `dim`.
static Value coords(Builder& b, const Value& index, int64_t dim) {
  Type it{DType::I64, index.shape()};
  Shape s1 = index.shape();
  s1.push_back(1);
  std::vector<Value> parts;
  for (int64_t d = 0; d < index.rank(); ++d)
    parts.push_back(b.reshape(d == dim ? i64(b, index) : b.iota(it, d), s1));
  return b.concatenate(parts, index.rank());
}

// self.gather(dim, index): one element per index entry.
TPU_LOWER(gather, "gather") {
  Builder& b = ctx.b;
  Value x = ctx.in(0), index = ctx.in(2);
  // An empty index gives an empty result (its rank may exceed the input's).
  if (index.type.numel() == 0) return {b.constant(0, ctx.out(0).dtype, ctx.out(0).shape)};
  if (x.rank() == 0) x = b.reshape(x, {1});
  if (index.rank() == 0) index = b.reshape(index, {1});
  int64_t dim = wrap_dim(ctx.i(1), x.rank());
  if (index.rank() == x.rank() && is_row_index(ctx, 2, dim)) {
    Value row = row_of(b, index, dim);
    check_bounds(ctx, row, dim, x.shape()[dim], false);
    return {b.reshape(take_along(b, x, dim, row, index.shape()), ctx.out(0).shape)};
  }
  check_bounds(ctx, index, dim, x.shape()[dim], false);
  auto all = range(0, x.rank());
  Value r = b.gather(x, coords(b, index, dim), {}, all, all, index.rank(), Shape(x.rank(), 1),
                     index.shape());
  return {b.reshape(r, ctx.out(0).shape)};
}

static Value index_scatter(Builder& b, const Value& self, int64_t dim, const Value& index,
                           const Value& src, const ir::RegionFn& fn);

// Operands of the scatter family, rank >= 1, with src cut to index's shape. `row`: the
// 1-D index when index is one repeated along the other dims (is_row_index).
struct ScatterArgs {
  Value self, index, src;
  int64_t dim;
  std::optional<Value> row;
};

// self with `updates` (index-shaped) scattered along dim at `index`, combined by `fn`.
static Value scatter_dim(Builder& b, const Value& self, const ScatterArgs& a, const Value& updates,
                         const ir::RegionFn& fn) {
  if (a.index.type.numel() == 0) return self;  // nothing to write (index rank may exceed self's)
  // Row windows as index's (each at most self's size along the other dims).
  if (a.row) return index_scatter(b, self, a.dim, *a.row, updates, fn);
  auto all = range(0, self.rank());
  return b.scatter(self, coords(b, a.index, a.dim), updates, {}, all, all, a.index.rank(), fn);
}

static ScatterArgs scatter_args(Ctx& ctx, bool src_is_scalar) {
  Builder& b = ctx.b;
  ScatterArgs a;
  a.self = ctx.in(0);
  a.index = ctx.in(2);
  if (a.self.rank() == 0) a.self = b.reshape(a.self, {1});
  if (a.index.rank() == 0) a.index = b.reshape(a.index, {1});
  a.dim = wrap_dim(ctx.i(1), a.self.rank());
  if (a.index.rank() == a.self.rank() && is_row_index(ctx, 2, a.dim)) a.row = row_of(b, a.index, a.dim);
  check_bounds(ctx, a.row ? *a.row : a.index, a.dim, a.self.shape()[a.dim], false);
  DType t = a.self.dtype();
  if (src_is_scalar) {
    a.src = broadcast_to(b, ctx.scalar(3, t), a.index.shape());
  } else {
    Value src = b.convert(ctx.in(3), t);
    if (src.rank() == 0) src = b.reshape(src, {1});
    a.src = b.slice(src, Shape(src.rank(), 0), a.index.shape(), Shape(src.rank(), 1));
  }
  return a;
}

// Reducing scatters of bf16/f16 accumulate in f32 and round once, as CPU's
// scatter kernels do (plain writes need no widening).
static Value scatter_with(Ctx& ctx, bool scalar, const ir::RegionFn& fn, bool reduces) {
  Builder& b = ctx.b;
  auto a = scatter_args(ctx, scalar);
  DType t = a.self.dtype(), acc = reduces ? acc_type(t) : t;
  Value r = scatter_dim(b, b.convert(a.self, acc), a, b.convert(a.src, acc), fn);
  return b.reshape(b.convert(r, t), ctx.out(0).shape);
}

// Combiner for a named reduce (scatter.reduce's add/multiply, scatter_reduce's
// sum/prod/amax/amin; mean sums and divides afterwards).
static ir::RegionFn combiner(const std::string& reduce) {
  std::string op;
  if (reduce == "add" || reduce == "sum" || reduce == "mean") op = "stablehlo.add";
  else if (reduce == "multiply" || reduce == "prod") op = "stablehlo.multiply";
  else if (reduce == "amax") op = "stablehlo.maximum";
  else if (reduce == "amin") op = "stablehlo.minimum";
  else throw Unsupported("scatter reduce " + reduce);
  return [op](Builder& b, const std::vector<Value>& a) {
    DType t = a[0].dtype();
    if (t == DType::Bool) {
      bool any = op == "stablehlo.add" || op == "stablehlo.maximum";
      return std::vector<Value>{b.binary(any ? "stablehlo.or" : "stablehlo.and", a[0], a[1])};
    }
    Value r = b.binary(op, a[0], a[1]);
    if (is_float(t) && (op == "stablehlo.maximum" || op == "stablehlo.minimum")) {
      // NaN wins, spelled out: XLA:CPU's maximum/minimum may drop it.
      r = b.select(b.compare(a[1], a[1], Cmp::NE), a[1], r);
      r = b.select(b.compare(a[0], a[0], Cmp::NE), a[0], r);
    }
    return std::vector<Value>{r};
  };
}

// Identity of a reduce over t, filling `shape`. INT64_MAX has no exact double, so
// it is made as (-1 >>> 1).
static Value identity(Builder& b, const std::string& reduce, DType t, const Shape& shape) {
  if (reduce == "amin" && t == DType::I64) {
    Value m = b.binary("stablehlo.shift_right_logical", b.constant(-1, t), b.constant(1, t));
    return broadcast_to(b, m, shape);
  }
  double v = reduce == "prod" ? 1 : reduce == "amax" ? lowest(t) : reduce == "amin" ? highest(t) : 0;
  return b.constant(v, t, shape);
}

TPU_LOWER(scatter_src, "scatter.src") { return {scatter_with(ctx, false, take_new, false)}; }
TPU_LOWER(scatter_value, "scatter.value") { return {scatter_with(ctx, true, take_new, false)}; }
TPU_LOWER(scatter_add, "scatter_add") { return {scatter_with(ctx, false, accumulate, true)}; }
TPU_LOWER(scatter_reduce_, "scatter.reduce") {
  return {scatter_with(ctx, false, combiner(ctx.str(4)), true)};
}
TPU_LOWER(scatter_value_reduce, "scatter.value_reduce") {
  return {scatter_with(ctx, true, combiner(ctx.str(4)), true)};
}

// How many updates a row index sends to each element of self: counted once per row
// (a 1-D scatter), spread along the other dims as far as the index reaches.
static Value row_hits(Builder& b, const ScatterArgs& a, DType t) {
  const Shape& s = a.self.shape();
  int64_t n = a.row->type.numel();
  Value per_row = index_scatter(b, b.constant(0, t, {s[a.dim]}), 0, *a.row, b.constant(1, t, {n}), accumulate);
  Value hits = b.broadcast_in_dim(per_row, s, {a.dim});
  for (int64_t d = 0; d < a.self.rank(); ++d) {
    int64_t reach = a.index.shape()[d];
    if (d == a.dim || reach == s[d]) continue;
    Value inside = b.compare(b.iota(Type{DType::I64, s}, d),
                             b.constant(static_cast<double>(reach), DType::I64, s), Cmp::LT);
    hits = b.select(inside, hits, b.constant(0, t, s));
  }
  return hits;
}

// scatter_reduce.two. Without include_self, targets start from the reduction's
// identity; mean divides by the number of contributions (self counting as one),
// flooring for integers; untouched positions keep self. bf16/f16 accumulate in f32;
// mean rounds the sum to the dtype before dividing, as CPU.
TPU_LOWER(scatter_reduce_two, "scatter_reduce.two") {
  Builder& b = ctx.b;
  auto a = scatter_args(ctx, false);
  std::string red = ctx.str(4);
  bool include_self = ctx.flag_or(5, true);
  DType st = a.self.dtype(), t = acc_type(st);
  // Complex values have no order: CPU's kernel refuses (the fallback raises its error).
  if (is_complex(st) && (red == "amax" || red == "amin")) throw Unsupported("scatter_reduce " + red + " of complex");
  a.self = b.convert(a.self, t);
  a.src = b.convert(a.src, t);
  const Shape& s = a.self.shape();
  Value hits = a.row ? row_hits(b, a, t)
                     : scatter_dim(b, b.constant(0, t, s), a, b.constant(1, t, a.index.shape()), accumulate);
  Value touched = b.compare(hits, b.constant(0, t, s), Cmp::NE);
  Value base = a.self;
  if (!include_self) {
    base = b.select(touched, identity(b, red, t, s), a.self);
  }
  Value r = scatter_dim(b, base, a, a.src, combiner(red));
  if (red == "mean") {
    if (t != st) r = b.convert(b.convert(r, st), t);
    Value n = include_self ? add(b, hits, b.constant(1, t, s)) : hits;
    n = b.select(touched, n, b.constant(1, t, s));
    Value q = div(b, r, n);
    if (!is_float(t) && !is_complex(t)) {  // integers floor: step down where the remainder is negative
      Value rem = b.binary("stablehlo.remainder", r, n);
      Value zero = b.constant(0, t, s);
      Value down = b.binary("stablehlo.and", b.compare(rem, zero, Cmp::NE),
                            b.compare(rem, zero, Cmp::LT));
      q = b.select(down, sub(b, q, b.constant(1, t, s)), q);
    }
    r = q;
  }
  return {b.reshape(b.convert(r, st), ctx.out(0).shape)};
}

// index_add / index_copy / index_fill: whole slices along dim at 1-D `index`.
static Value index_scatter(Builder& b, const Value& self, int64_t dim, const Value& index,
                           const Value& src, const ir::RegionFn& fn) {
  int64_t n = index.type.numel();
  std::vector<int64_t> window;
  for (int64_t d = 0; d < self.rank(); ++d)
    if (d != dim) window.push_back(d);
  return b.scatter(self, b.reshape(i64(b, index), {n, 1}), src, window, {dim}, {dim}, 1, fn);
}

// index_add / index_copy: args (self, dim, index, source[, alpha]); `scale` multiplies
// the source slices (index_add's alpha) before they are combined by `fn`.
static std::vector<Value> index_write(Ctx& ctx, const ir::RegionFn& fn, bool scale) {
  Builder& b = ctx.b;
  Value self = ctx.in(0), index = ctx.in(2);
  if (scale) {
    // CPU's index_add checks this in its kernel, not in the meta function PyTorch plans
    // with: a source of other slices would be read as if it had self's.
    Shape ss = self.shape(), rs = ctx.in(3).shape();
    int64_t d = ss.empty() ? 0 : wrap_dim(ctx.i(1), self.rank());
    bool ok = ss.size() == rs.size();
    for (size_t i = 0; ok && i < ss.size(); ++i) ok = static_cast<int64_t>(i) == d || ss[i] == rs[i];
    if (!ok)
      throw std::runtime_error("source tensor shape must match self tensor shape, excluding the specified "
                               "dimension. Got self.shape = " + shape_text(ss) + " source.shape = " + shape_text(rs));
  }
  if (self.rank() == 0) self = b.reshape(self, {1});
  int64_t dim = wrap_dim(ctx.i(1), self.rank());
  check_bounds(ctx, index, dim, self.shape()[dim], false);
  Shape s = self.shape();
  s[dim] = index.type.numel();
  DType t = self.dtype();
  Value src = b.reshape(b.convert(ctx.in(3), t), s);
  if (!scale) return {b.reshape(index_scatter(b, self, dim, index, src, fn), ctx.out(0).shape)};
  Value alpha = ctx.scalar(4, t);
  // Updates in index order, each rounded to t (with t = bf16/f16 what CPU's
  // slice-by-slice loop does).
  Value seq = index_scatter(b, self, dim, index, mul(b, src, broadcast_to(b, alpha, s)), fn);
  DType acc = acc_type(t);
  if (acc != t && self.rank() > 1 && (dim == 0 || dim == self.rank() - 1)) {
    // CPU runs these (alpha 1) as a scatter_add accumulating in f32, rounded once.
    Value once = b.convert(index_scatter(b, b.convert(self, acc), dim, index, b.convert(src, acc), fn), t);
    Value unit = b.compare(b.convert(alpha, acc), b.constant(1, acc), Cmp::EQ);
    seq = b.select(broadcast_to(b, unit, self.shape()), once, seq);
  }
  return {b.reshape(seq, ctx.out(0).shape)};
}

TPU_LOWER(index_add, "index_add") { return index_write(ctx, accumulate, true); }
TPU_LOWER(index_copy, "index_copy") { return index_write(ctx, take_new, false); }

// index_fill wraps negative indices, unlike index_add/index_copy.
TPU_LOWER(index_fill, "index_fill.int_Scalar", "index_fill.int_Tensor") {
  Builder& b = ctx.b;
  Value self = ctx.in(0);
  if (self.rank() == 0) self = b.reshape(self, {1});
  int64_t dim = wrap_dim(ctx.i(1), self.rank());
  check_bounds(ctx, ctx.in(2), dim, self.shape()[dim], true);
  Value index = wrap_index(b, ctx.in(2), self.shape()[dim]);
  Value v = ctx.is_tensor(3) ? b.convert(ctx.in(3), self.dtype()) : ctx.scalar(3, self.dtype());
  Shape s = self.shape();
  s[dim] = index.type.numel();
  Value src = broadcast_to(b, b.reshape(v, {}), s);
  return {b.reshape(index_scatter(b, self, dim, index, src, take_new), ctx.out(0).shape)};
}

// ---- advanced indexing: index.Tensor / index_put ----

// How x[indices] maps onto one gather/scatter: the indexed dims move to the front
// (perm), their broadcast index tensors stack into `coords` (B + [k]), and PyTorch
// places the B dims of the result at `front` (the first indexed dim when the indexed
// dims are adjacent, else 0).
struct AdvIndex {
  std::vector<int64_t> perm;
  Value coords;
  int64_t k = 0, nb = 0, front = 0;
  Shape batch, rest;
};

static AdvIndex plan(Ctx& ctx, const Shape& shape, const std::vector<std::optional<Value>>& idx) {
  Builder& b = ctx.b;
  AdvIndex p;
  std::vector<int64_t> dims;
  std::vector<Value> vals;
  for (size_t d = 0; d < idx.size(); ++d) {
    if (!idx[d]) continue;
    DType t = idx[d]->dtype();
    if (t == DType::Bool || t == DType::U8)
      throw Unsupported("boolean mask index: data-dependent shape");
    dims.push_back(static_cast<int64_t>(d));
    vals.push_back(*idx[d]);
  }
  if (dims.empty()) throw Unsupported("index without index tensors");
  // The kernel checks raise CPU's errors for these first; a rule must never read past
  // self's dims (out_of_range: an IndexError).
  if (idx.size() > shape.size())
    throw std::out_of_range("too many indices for tensor of dimension " + std::to_string(shape.size()) + " (got " +
                            std::to_string(idx.size()) + ")");
  for (auto& v : vals) {
    if (!broadcastable(p.batch, v.shape()))
      throw std::out_of_range("shape mismatch: indexing tensors could not be broadcast together");
    p.batch = broadcast_shapes(p.batch, v.shape());
  }
  p.k = static_cast<int64_t>(dims.size());
  p.nb = static_cast<int64_t>(p.batch.size());
  Shape b1 = p.batch;
  b1.push_back(1);
  std::vector<Value> parts;
  for (size_t j = 0; j < vals.size(); ++j) {
    check_bounds(ctx, vals[j], dims[j], shape[dims[j]], true);
    parts.push_back(b.reshape(broadcast_to(b, wrap_index(b, vals[j], shape[dims[j]]), p.batch), b1));
  }
  p.coords = b.concatenate(parts, p.nb);
  bool adjacent = true;
  for (size_t j = 1; j < dims.size(); ++j) adjacent &= dims[j] == dims[j - 1] + 1;
  p.front = adjacent ? dims[0] : 0;
  p.perm = dims;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) {
      p.perm.push_back(d);
      p.rest.push_back(shape[d]);
    }
  return p;
}

// Permutation taking the gather layout (B..., rest...) to PyTorch's result layout.
static std::vector<int64_t> result_perm(const AdvIndex& p) {
  int64_t nr = static_cast<int64_t>(p.rest.size());
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < p.front; ++i) perm.push_back(p.nb + i);
  for (int64_t i = 0; i < p.nb; ++i) perm.push_back(i);
  for (int64_t i = p.front; i < nr; ++i) perm.push_back(p.nb + i);
  return perm;
}

TPU_LOWER(index, "index.Tensor", "_unsafe_index.Tensor") {
  Builder& b = ctx.b;
  Value self = ctx.in(0);
  AdvIndex p = plan(ctx, self.shape(), ctx.opt_list(1));
  Value x = b.transpose(self, p.perm);
  Shape sizes(p.k, 1), out = p.batch;
  sizes.insert(sizes.end(), p.rest.begin(), p.rest.end());
  out.insert(out.end(), p.rest.begin(), p.rest.end());
  auto lead = range(0, p.k);
  Value r = b.gather(x, p.coords, range(p.nb, p.nb + static_cast<int64_t>(p.rest.size())), lead,
                     lead, p.nb, sizes, out);
  return {b.transpose(r, result_perm(p))};
}

// self[mask] = values with one bool mask: not data-dependent when every selected
// element receives the same values (values constant along the masked count dim),
// so it is a select.
static Value put_mask(Builder& b, const Value& self, const std::vector<std::optional<Value>>& idx,
                      const Value& values, bool acc) {
  int64_t p = -1, n = 0;
  for (size_t d = 0; d < idx.size(); ++d) {
    if (!idx[d]) continue;
    if (n++ || (idx[d]->dtype() != DType::Bool && idx[d]->dtype() != DType::U8))
      throw Unsupported("index_put with a mask among other indices");
    p = static_cast<int64_t>(d);
  }
  Value mask = b.convert(*idx[p], DType::Bool);
  int64_t m = mask.rank(), rank = self.rank();
  // values broadcast against the result shape self[:p] + [count] + self[p+m:].
  int64_t rr = rank - m + 1;
  if (values.rank() > rr) throw Unsupported("index_put values rank");
  Shape vs(rr - values.rank(), 1);
  vs.insert(vs.end(), values.shape().begin(), values.shape().end());
  if (vs[p] != 1) throw Unsupported("index_put with a mask and per-element values");
  Shape vself(vs.begin(), vs.begin() + p);
  vself.insert(vself.end(), m, 1);
  vself.insert(vself.end(), vs.begin() + p + 1, vs.end());
  Value v = broadcast_to(b, b.reshape(b.convert(values, self.dtype()), vself), self.shape());
  Shape ms(p, 1);
  ms.insert(ms.end(), mask.shape().begin(), mask.shape().end());
  ms.insert(ms.end(), rank - p - m, 1);
  Value mb = broadcast_to(b, b.reshape(mask, ms), self.shape());
  if (acc) v = accumulate(b, {self, v})[0];
  return b.select(mb, v, self);
}

// The mask's position among the indices, and how many elements `values` gives along the
// count dim of self[mask] (1 when they broadcast); -1 when no index is a mask. `mixed`:
// integer index tensors beside the mask (x[mask, idx]); their broadcast shape [L] fixes
// the count: the mask must select L elements, or one, which broadcasts (CPU's rule).
struct MaskPut {
  int64_t pos = -1, count = 1;
  bool mixed = false;
};

static bool is_mask(const std::optional<Value>& i) {
  return i && (i->dtype() == DType::Bool || i->dtype() == DType::U8);
}

static MaskPut mask_put(const std::vector<std::optional<Value>>& idx, const Value& self, const Value& values) {
  MaskPut r;
  int64_t others = 0;
  for (size_t d = 0; d < idx.size(); ++d) {
    if (is_mask(idx[d])) {
      if (r.pos >= 0) throw Unsupported("index_put with more than one mask");
      r.pos = static_cast<int64_t>(d);
    } else if (idx[d]) {
      ++others;
    }
  }
  if (r.pos < 0) return r;
  if (others) {
    Shape bs;
    for (size_t d = 0; d < idx.size(); ++d)
      if (idx[d] && !is_mask(idx[d])) bs = broadcast_shapes(bs, idx[d]->shape());
    // Other index tensors of one dim (> 1 long) fix the result's shape; otherwise it
    // depends on the mask's count.
    if (bs.size() != 1 || bs[0] < 2) throw Unsupported("index_put with a mask among other indices");
    r.count = bs[0];
    r.mixed = true;
    return r;
  }
  // values align to the right of the result shape self[:p] + [count] + self[p+m:].
  int64_t rr = self.rank() - idx[r.pos]->rank() + 1, lead = rr - values.rank();
  if (lead < 0) throw Unsupported("index_put values rank");
  if (r.pos >= lead) r.count = values.shape()[r.pos - lead];
  return r;
}

// self[mask] = values where values give one row per selected element (x[mask]'s
// backward, masked assignment of gathered rows): the mask's first `count` true elements,
// in row-major order, become integer coordinates (a stable sort puts them first), so
// the put is an ordinary scatter. The mask must select exactly `count` elements, as
// CPU raises otherwise; that is checked on the device.
static std::vector<std::optional<Value>> mask_to_coords(Ctx& ctx, std::vector<std::optional<Value>> idx,
                                                        const MaskPut& mp, const Value& values) {
  Builder& b = ctx.b;
  Value mask = b.convert(*idx[mp.pos], DType::Bool);
  const Shape& ms = mask.shape();
  int64_t n = mask.type.numel();
  Value flat = b.reshape(mask, {n});
  Value total = reduce_sum(b, b.convert(flat, DType::I64), {0});
  Value exact = b.compare(total, b.constant(static_cast<double>(mp.count), DType::I64), Cmp::EQ);
  Value one = b.compare(total, b.constant(1.0, DType::I64), Cmp::EQ);
  if (mp.mixed) {
    ctx.check(b.binary("stablehlo.or", exact, one),  // an IndexError, as on CPU
              "shape mismatch: indexing tensors could not be broadcast together (the mask "
              "selects neither " + std::to_string(mp.count) + " elements nor one)");
  } else {
    std::string vshape;
    for (auto d : values.shape()) vshape += (vshape.empty() ? "" : ", ") + std::to_string(d);
    ctx.check(exact, "RuntimeError: shape mismatch: value tensor of shape [" + vshape +
                         "] cannot be broadcast to indexing result (the mask selects another number of elements)");
  }
  if (mp.count == 0) return idx;
  // Unselected positions sort after selected ones; ties keep row-major order.
  Value key = b.convert(b.unary("stablehlo.not", flat), DType::I32);
  Value pos = b.iota(Type{DType::I64, {n}}, 0);
  auto sorted = b.sort({key, pos}, 0, true, [](Builder& b, const std::vector<Value>& a) {
    return std::vector<Value>{b.compare(a[0], a[1], Cmp::LT)};
  });
  Value first = b.slice(sorted[1], {0}, {mp.count}, {1});
  if (mp.mixed) {
    // One selected element broadcasts against the other index tensors.
    Value lone = broadcast_to(b, b.slice(first, {0}, {1}, {1}), {mp.count});
    first = b.select(broadcast_to(b, b.reshape(one, {1}), {mp.count}), lone, first);
  }
  // Row-major flat position -> one coordinate per mask dim.
  std::vector<std::optional<Value>> out(idx.begin(), idx.begin() + mp.pos);
  int64_t stride = n;
  for (int64_t d = 0; d < mask.rank(); ++d) {
    int64_t size = ms[d];
    stride = size ? stride / size : 0;
    Value c = first;
    if (stride > 1) c = b.binary("stablehlo.divide", c, b.constant(static_cast<double>(stride), DType::I64, {mp.count}));
    if (d > 0) c = b.binary("stablehlo.remainder", c, b.constant(static_cast<double>(size), DType::I64, {mp.count}));
    out.push_back(c);
  }
  out.insert(out.end(), idx.begin() + mp.pos + 1, idx.end());
  return out;
}

TPU_LOWER(index_put, "index_put", "_index_put_impl", "_unsafe_index_put") {
  Builder& b = ctx.b;
  Value self = ctx.in(0), values = ctx.in(2);
  auto idx = ctx.opt_list(1);
  bool acc = ctx.flag_or(3, false);
  MaskPut mp = mask_put(idx, self, values);
  if (mp.pos >= 0 && mp.count == 1) return {put_mask(b, self, idx, values, acc)};
  if (mp.pos >= 0) {
    idx = mask_to_coords(ctx, idx, mp, values);
    if (mp.count == 0) return {self};  // an all-false mask (checked): nothing is written
  }
  AdvIndex p = plan(ctx, self.shape(), idx);
  // values: broadcast to the shape self[indices] has, then into the scatter layout.
  auto rp = result_perm(p);
  Shape gather_shape = p.batch;
  gather_shape.insert(gather_shape.end(), p.rest.begin(), p.rest.end());
  Shape result_shape;
  for (auto d : rp) result_shape.push_back(gather_shape[d]);
  if (!expandable(values.shape(), result_shape))  // the kernel check raises CPU's error first
    throw std::invalid_argument("shape mismatch: value tensor cannot be broadcast to indexing result");
  Value upd = b.transpose(coerce(b, values, self.dtype(), result_shape), inverse(rp));
  auto lead = range(0, p.k);
  Value r = b.scatter(b.transpose(self, p.perm), p.coords, upd,
                      range(p.nb, p.nb + static_cast<int64_t>(p.rest.size())), lead, lead, p.nb,
                      acc ? ir::RegionFn(accumulate) : ir::RegionFn(take_new));
  return {b.transpose(r, inverse(p.perm))};
}

// The k-th true element of mask (row-major; self and mask broadcast to the result's
// shape) takes source's k-th element; k is an inclusive count of the mask (a scan).
TPU_LOWER(masked_scatter, "masked_scatter") {
  Builder& b = ctx.b;
  // CPU rejects uint8 masks here (masked_fill and indexing still take them).
  DType mt = ctx.in(1).dtype();
  if (mt == DType::U8) throw std::invalid_argument("masked_scatter_ only supports boolean masks, but got mask with dtype Byte");
  if (mt != DType::Bool) throw Unsupported("masked_scatter with a non-boolean mask");
  const Shape& shape = ctx.out(0).shape;
  Value self = broadcast_to(b, ctx.in(0), shape);
  Value mask = broadcast_to(b, b.convert(ctx.in(1), DType::Bool), shape);
  Value src = b.convert(ctx.in(2), self.dtype());
  int64_t n = self.type.numel(), m = src.type.numel();
  if (n == 0) return {self};
  Value ones = reduce_sum(b, b.convert(b.reshape(mask, {n}), DType::I64), {0});
  ctx.check(b.compare(ones, b.constant(static_cast<double>(m), DType::I64), Cmp::LE),
            "RuntimeError: Number of elements of source < number of ones in mask");
  if (m == 0) return {self};
  Value k = inclusive_scan(b, b.convert(b.reshape(mask, {n}), DType::I64), "stablehlo.add", 0);
  Value pos = b.binary("stablehlo.maximum", sub(b, k, b.constant(1, DType::I64, {n})),
                       b.constant(0, DType::I64, {n}));
  Value picked = b.gather(b.reshape(src, {m}), b.reshape(pos, {n, 1}), {}, {0}, {0}, 1, {1}, {n});
  return {b.select(mask, b.reshape(picked, self.shape()), self)};
}

// ---- sort / topk ----

// Strict "comes before" for sorting: NaN counts as larger than every number, so it
// goes last ascending and first descending, as PyTorch.
static Value before(Builder& b, const Value& x, const Value& y, bool descending) {
  Value r = b.compare(x, y, descending ? Cmp::GT : Cmp::LT);
  if (!is_float(x.dtype())) return r;
  Value xn = b.compare(x, x, Cmp::NE), yn = b.compare(y, y, Cmp::NE);
  Value nan_first = descending ? b.binary("stablehlo.and", xn, b.unary("stablehlo.not", yn))
                               : b.binary("stablehlo.and", b.unary("stablehlo.not", xn), yn);
  return b.binary("stablehlo.or", r, nan_first);
}

// Always stable: ties keep input order (a valid answer for unstable sort too).
static std::vector<Value> sort_dim(Builder& b, const Value& x, int64_t dim, bool descending) {
  Value idx = b.iota(Type{DType::I64, x.shape()}, dim);
  return b.sort({x, idx}, dim, true, [&](Builder& b, const std::vector<Value>& a) {
    return std::vector<Value>{before(b, a[0], a[1], descending)};
  });
}

static std::vector<Value> sort_rule(Ctx& ctx, int dim_i, int desc_i) {
  Value x = ctx.in(0);
  int64_t dim = wrap_dim(ctx.i_or(dim_i, -1), x.rank());  // checked for 0-dim too, as CPU
  if (x.rank() == 0) return {x, ctx.b.constant(0, DType::I64)};
  return sort_dim(ctx.b, x, dim, ctx.flag_or(desc_i, false));
}

TPU_LOWER(sort, "sort") { return sort_rule(ctx, 1, 2); }
TPU_LOWER(sort_stable, "sort.stable") { return sort_rule(ctx, 2, 3); }

TPU_LOWER(topk, "topk") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  int64_t dim = wrap_dim(ctx.i_or(2, -1), x.rank()), k = ctx.i(1);
  if (x.rank() == 0) return {x, b.constant(0, DType::I64)};
  auto r = sort_dim(b, x, dim, ctx.flag_or(3, true));
  Shape lim = x.shape();
  lim[dim] = k;
  Shape zero(x.rank(), 0), one(x.rank(), 1);
  return {b.slice(r[0], zero, lim, one), b.slice(r[1], zero, lim, one)};
}

// ---- reordering ----

TPU_LOWER(flip, "flip") {
  Value x = ctx.in(0);
  auto dims = ctx.ints(1);
  if (dims.empty() || x.rank() == 0) return {x};
  return {ctx.b.reverse(x, reduce_dims(dims, x.rank()))};
}

// x rolled by s along dim: its last s elements, then the rest.
static Value roll_dim(Builder& b, const Value& x, int64_t dim, int64_t shift) {
  int64_t n = x.shape()[dim];
  if (n == 0) return x;
  int64_t s = ((shift % n) + n) % n;
  if (s == 0) return x;
  Shape lo(x.rank(), 0), hi = x.shape(), one(x.rank(), 1);
  Shape mid_hi = hi, mid_lo = lo;
  mid_hi[dim] = n - s;
  mid_lo[dim] = n - s;
  return b.concatenate({b.slice(x, mid_lo, hi, one), b.slice(x, lo, mid_hi, one)}, dim);
}

TPU_LOWER(roll, "roll") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  auto shifts = ctx.ints(1);
  auto dims = ctx.is_none(2) ? std::vector<int64_t>{} : ctx.ints(2);
  if (dims.empty()) {  // roll the flattened tensor
    Value flat = roll_dim(b, b.reshape(x, {x.type.numel()}), 0, shifts.at(0));
    return {b.reshape(flat, x.shape())};
  }
  if (dims.size() != shifts.size()) throw Unsupported("roll: shifts and dims differ in length");
  for (size_t j = 0; j < dims.size(); ++j) x = roll_dim(b, x, wrap_dim(dims[j], x.rank()), shifts[j]);
  return {x};
}

// tril/triu keep elements whose column - row is <= / >= diagonal.
static Value triangle(Ctx& ctx, bool lower) {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  if (x.rank() < 2) throw Unsupported("tril/triu of rank < 2");
  Type it{DType::I64, x.shape()};
  Value diff = sub(b, b.iota(it, x.rank() - 1), b.iota(it, x.rank() - 2));
  Value k = b.constant(static_cast<double>(ctx.i_or(1, 0)), DType::I64, x.shape());
  Value keep = b.compare(diff, k, lower ? Cmp::LE : Cmp::GE);
  return b.select(keep, x, full_like(b, x, 0));
}

TPU_LOWER(tril, "tril") { return {triangle(ctx, true)}; }
TPU_LOWER(triu, "triu") { return {triangle(ctx, false)}; }

}  // namespace tpu::lowering
