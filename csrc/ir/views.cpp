#include "ir/views.h"

#include <algorithm>
#include <stdexcept>

namespace tpu::ir {

int64_t Geometry::numel() const {
  int64_t n = 1;
  for (auto s : sizes) n *= s;
  return n;
}

bool Geometry::is_contiguous() const {
  int64_t expected = 1;
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    if (sizes[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

bool Geometry::covers(const Shape& storage_shape) const {
  int64_t n = 1;
  for (auto s : storage_shape) n *= s;
  return offset == 0 && numel() == n && is_contiguous();
}

std::string Geometry::key() const {
  std::string k = "[" + ints(sizes) + "|" + ints(strides) + "|" + std::to_string(offset) + "]";
  return k;
}

namespace {

Value flat(Builder& b, const Value& storage) {
  return b.reshape(storage, {storage.type.numel()});
}

// Flat element indices of every position of the view, shaped `sizes`.
Value view_indices(Builder& b, const Geometry& g, int64_t storage_numel) {
  DType it = storage_numel < (int64_t(1) << 31) ? DType::I32 : DType::I64;
  Type t{it, g.sizes};
  Value idx = b.constant(static_cast<double>(g.offset), it, g.sizes);
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    if (g.sizes[d] == 1 || g.strides[d] == 0) continue;
    Value io = b.iota(t, static_cast<int64_t>(d));
    Value term = b.binary("stablehlo.multiply", io,
                          b.constant(static_cast<double>(g.strides[d]), it, g.sizes));
    idx = b.binary("stablehlo.add", idx, term);
  }
  return idx;
}

// Drops size-1 and stride-0 dimensions: a view of the same storage that holds every
// distinct element once, plus the dims of `g` it keeps.
Geometry compact(const Geometry& g, std::vector<int64_t>* kept) {
  Geometry c;
  c.offset = g.offset;
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    if (g.sizes[d] == 1 || g.strides[d] == 0) continue;
    c.sizes.push_back(g.sizes[d]);
    c.strides.push_back(g.strides[d]);
    kept->push_back(static_cast<int64_t>(d));
  }
  return c;
}

// A view whose dims, ordered by decreasing stride, each step a whole number of the next
// dim's extents (transposes, column slices, steps): it is a box in the storage region
// [offset, offset + sizes[p0] * strides[p0]) reshaped to `dims`, read with slices and a
// transpose instead of a gather over computed indices.
struct Box {
  std::vector<int64_t> order;  // view dims by decreasing stride
  Shape dims;                  // the region's shape: [size_p0, s_p0/s_p1, ..., s_last]
  int64_t span = 0;            // elements in the region
};

bool as_box(const Geometry& g, Box* box) {
  size_t k = g.sizes.size();
  if (k == 0) return false;
  std::vector<int64_t> order(k);
  for (size_t i = 0; i < k; ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t c) { return g.strides[a] > g.strides[c]; });
  Shape dims{g.sizes[order[0]]};
  for (size_t j = 0; j + 1 < k; ++j) {
    int64_t s = g.strides[order[j]], t = g.strides[order[j + 1]];
    if (t <= 0 || s % t != 0 || s / t < g.sizes[order[j + 1]]) return false;  // overlapping
    dims.push_back(s / t);
  }
  dims.push_back(g.strides[order[k - 1]]);
  box->order = order;
  box->dims = dims;
  box->span = g.sizes[order[0]] * g.strides[order[0]];
  return true;
}

// The flat storage with zeros appended so that `end` elements exist.
Value padded_flat(Builder& b, const Value& storage, int64_t end) {
  Value f = flat(b, storage);
  int64_t n = f.type.numel();
  if (end <= n) return f;
  return b.pad(f, b.constant(0, f.dtype()), {0}, {end - n}, {0});
}

// Box positions of the view's elements (sizes in box order, plus a trailing 1).
Shape box_limits(const Geometry& g, const Box& box) {
  Shape lim;
  for (int64_t d : box.order) lim.push_back(g.sizes[d]);
  lim.push_back(1);
  return lim;
}

// Transpose from box order back to the view's dim order.
std::vector<int64_t> inverse(const std::vector<int64_t>& order) {
  std::vector<int64_t> inv(order.size());
  for (size_t j = 0; j < order.size(); ++j) inv[order[j]] = static_cast<int64_t>(j);
  return inv;
}

// The box as a slice of the whole storage: when the storage is a whole number of the
// box's outer steps, it reshapes to the box's dims (outer extent widened) and the
// offset becomes start indices. Reading then copies nothing a consumer cannot fuse,
// where the padded region would be a copy of the whole storage.
bool box_in_storage(const Geometry& g, const Box& box, int64_t n, Shape* dims, Shape* starts) {
  int64_t outer = g.strides[box.order[0]];
  if (outer <= 0 || n % outer != 0) return false;
  *dims = box.dims;
  (*dims)[0] = n / outer;
  Shape lim = box_limits(g, box);
  starts->assign(dims->size(), 0);
  int64_t rest = g.offset;
  for (size_t j = dims->size(); j-- > 0;) {
    (*starts)[j] = rest % (*dims)[j];
    rest /= (*dims)[j];
    if ((*starts)[j] + lim[j] > (*dims)[j]) return false;
  }
  return rest == 0;
}

Value read_box(Builder& b, const Value& storage, const Geometry& g, const Box& box) {
  Shape lim = box_limits(g, box), sorted(lim.begin(), lim.end() - 1);
  if (Shape dims, starts; box_in_storage(g, box, storage.type.numel(), &dims, &starts)) {
    Shape ends(starts.size());
    for (size_t j = 0; j < starts.size(); ++j) ends[j] = starts[j] + lim[j];
    Value v = b.slice(b.reshape(storage, dims), starts, ends, Shape(dims.size(), 1));
    return b.transpose(b.reshape(v, sorted), inverse(box.order));
  }
  Value f = padded_flat(b, storage, g.offset + box.span);
  Value region = b.reshape(b.slice(f, {g.offset}, {g.offset + box.span}, {1}), box.dims);
  Value v = b.slice(region, Shape(lim.size(), 0), lim, Shape(lim.size(), 1));
  v = b.reshape(v, sorted);
  return b.transpose(v, inverse(box.order));
}

Value write_box(Builder& b, const Value& storage, const Geometry& g, const Box& box, const Value& value) {
  int64_t n = storage.type.numel();
  Shape lim = box_limits(g, box);
  Value upd = b.reshape(b.transpose(value, box.order), lim);
  if (Shape dims, starts; box_in_storage(g, box, n, &dims, &starts)) {
    std::vector<Value> at;
    for (int64_t s : starts) at.push_back(b.constant(static_cast<double>(s), DType::I64));
    return b.reshape(b.dynamic_update_slice(b.reshape(storage, dims), upd, at), {n});
  }
  int64_t end = g.offset + box.span;
  Value f = padded_flat(b, storage, end);
  Value region = b.reshape(b.slice(f, {g.offset}, {end}, {1}), box.dims);
  Value zero = b.constant(0, DType::I64);
  region = b.dynamic_update_slice(region, upd, std::vector<Value>(lim.size(), zero));
  Value start = b.constant(static_cast<double>(g.offset), DType::I64);
  Value out = b.dynamic_update_slice(f, b.reshape(region, {box.span}), {start});
  if (out.type.numel() > n) out = b.slice(out, {0}, {n}, {1});
  return out;
}

// A view whose writes land in a box: no element written twice (stride-0 dims of size
// one only).
bool writable_box(const Geometry& g, Box* box) {
  for (size_t d = 0; d < g.sizes.size(); ++d)
    if (g.strides[d] == 0 && g.sizes[d] != 1) return false;
  std::vector<int64_t> kept;
  Geometry c = compact(g, &kept);
  return as_box(c, box);
}

// Reads a view with no size-1 or stride-0 dims.
Value read_compact(Builder& b, const Value& storage, const Geometry& g) {
  if (g.covers(storage.shape()) && g.sizes == storage.shape()) return storage;
  int64_t n = storage.type.numel();
  if (g.is_contiguous()) {
    Value f = b.slice(flat(b, storage), {g.offset}, {g.offset + g.numel()}, {1});
    return b.reshape(f, g.sizes);
  }
  Box box;
  if (as_box(g, &box)) return read_box(b, storage, g, box);
  // Overlapping or irregular strides: gather over computed flat indices.
  Value idx = view_indices(b, g, n);
  return b.gather(flat(b, storage), idx, {}, {0}, {0}, static_cast<int64_t>(g.sizes.size()), {1},
                  g.sizes);
}

}  // namespace

Value reinterpret(Builder& b, const Value& storage, DType to) {
  if (storage.dtype() == to) return storage;
  Value x = flat(b, storage);
  // Bools have no bit layout in StableHLO: they travel as bytes.
  if (x.dtype() == DType::Bool) x = b.convert(x, DType::U8);
  if (to == DType::Bool) return b.convert(reinterpret(b, x, DType::U8), DType::Bool);
  int64_t a = itemsize(x.dtype()), c = itemsize(to), n = x.type.numel();
  if (a < c) {
    if (n % (c / a)) throw std::invalid_argument("a storage of " + std::to_string(n * a) +
                                                 " bytes holds no whole number of " + mlir_name(to));
    x = b.reshape(x, {n / (c / a), c / a});
  }
  Value y = b.bitcast(x, to);
  return b.reshape(y, {y.type.numel()});
}

Value read_view(Builder& b, const Value& storage, const Geometry& g) {
  if (g.numel() == 0) {  // (fp8 has no literal syntax: an f32 zero, converted)
    if (is_fp8(storage.dtype())) return b.convert(b.constant(0, DType::F32, g.sizes), storage.dtype());
    return b.constant(0, storage.dtype(), g.sizes);
  }
  std::vector<int64_t> kept;
  Geometry c = compact(g, &kept);
  Value v = read_compact(b, storage, c);
  if (c.sizes.size() == g.sizes.size()) return v;
  return b.broadcast_in_dim(v, g.sizes, kept);
}

// The elements a view that holds one spans from its start (strides are never negative).
static int64_t span_of(const Geometry& g) {
  int64_t span = 1;
  for (size_t d = 0; d < g.sizes.size(); ++d) span += (g.sizes[d] - 1) * g.strides[d];
  return span;
}

static Geometry at_start(const Geometry& g) {
  Geometry s = g;
  s.offset = 0;
  return s;
}

Value read_view_at(Builder& b, const Value& storage, const Geometry& g, const Value& offset) {
  Value region = b.dynamic_slice(flat(b, storage), {offset}, {span_of(g)});
  return read_view(b, region, at_start(g));
}

// Elementwise x != y by bits (a NaN equals itself, -0 differs from 0).
// Complex values differ where either part does.
static Value differs(Builder& b, const Value& x, const Value& y) {
  DType t = x.dtype();
  if (is_complex(t)) {
    Type part{t == DType::C128 ? DType::F64 : DType::F32, x.shape()};
    auto re = [&](const Value& z) { return b.raw("stablehlo.real", {z}, "", part); };
    auto im = [&](const Value& z) { return b.raw("stablehlo.imag", {z}, "", part); };
    return b.binary("stablehlo.or", differs(b, re(x), re(y)), differs(b, im(x), im(y)));
  }
  DType bits = itemsize(t) == 1   ? DType::I8
               : itemsize(t) == 2 ? DType::I16
               : itemsize(t) == 4 ? DType::I32
                                  : DType::I64;
  if (is_float(t)) return b.compare(b.bitcast(x, bits), b.bitcast(y, bits), Cmp::NE);
  return b.compare(x, y, Cmp::NE);
}

Value write_view(Builder& b, const Value* storage, const Type& st, const Geometry& g,
                 const Value& value_in) {
  Value value = b.convert(value_in, st.dtype);
  if (g.covers(st.shape)) return b.reshape(value, st.shape);
  if (!storage) throw std::logic_error("internal: partial view write without its storage");
  if (g.numel() == 0) return *storage;
  int64_t n = st.numel();
  Value f = flat(b, *storage);
  Value upd = b.reshape(value, {g.numel()});
  Value out;
  if (g.is_contiguous()) {
    Value start = b.constant(static_cast<double>(g.offset), DType::I64);
    out = b.dynamic_update_slice(f, upd, {start});
  } else if (Box box; writable_box(g, &box)) {
    std::vector<int64_t> kept;
    Geometry c = compact(g, &kept);
    out = write_box(b, f, c, box, b.reshape(value, c.sizes));
  } else {
    // Overlapping strides (an expanded view): several elements share one location, all
    // holding its old value. Only the elements the op changed are written (the others
    // are sent out of range, which scatter drops), so a location takes its new value
    // whichever element comes last, as CPU's sequential writes do.
    Value idx = b.reshape(view_indices(b, g, n), {g.numel(), 1});
    Value old = b.gather(f, idx, {}, {0}, {0}, 1, {1}, {g.numel()});
    Value idx_changed = b.select(b.reshape(differs(b, upd, old), {g.numel(), 1}), idx,
                                 b.constant(static_cast<double>(n), idx.dtype(), {g.numel(), 1}));
    out = b.scatter(f, idx_changed, upd, {}, {0}, {0}, 1, [](Builder&, const std::vector<Value>& a) {
      return std::vector<Value>{a[1]};
    });
  }
  return b.reshape(out, st.shape);
}

Value write_view_at(Builder& b, const Value& storage, const Geometry& g, const Value& value,
                    const Value& offset) {
  if (g.numel() == 0) return storage;
  // The region the view spans, written as a view at its start, then put back where it
  // was taken: the view lies inside the storage, so neither the slice nor the update
  // is ever clamped. (A dense view's region is the view: only the update remains.)
  Value f = flat(b, storage);
  Value region = b.dynamic_slice(f, {offset}, {span_of(g)});
  region = write_view(b, &region, region.type, at_start(g), value);
  return b.reshape(b.dynamic_update_slice(f, region, {offset}), storage.shape());
}

}  // namespace tpu::ir
