#include "ir/views.h"

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

// Reads a view with no size-1 or stride-0 dims.
Value read_compact(Builder& b, const Value& storage, const Geometry& g) {
  if (g.covers(storage.shape()) && g.sizes == storage.shape()) return storage;
  int64_t n = storage.type.numel();
  if (g.is_contiguous()) {
    Value f = b.slice(flat(b, storage), {g.offset}, {g.offset + g.numel()}, {1});
    return b.reshape(f, g.sizes);
  }
  // General strides (transposes, steps, overlaps): gather over computed flat indices.
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
  if (g.numel() == 0) return b.constant(0, storage.dtype(), g.sizes);
  std::vector<int64_t> kept;
  Geometry c = compact(g, &kept);
  Value v = read_compact(b, storage, c);
  if (c.sizes.size() == g.sizes.size()) return v;
  return b.broadcast_in_dim(v, g.sizes, kept);
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
  } else {
    Value idx = b.reshape(view_indices(b, g, n), {g.numel(), 1});
    out = b.scatter(f, idx, upd, {}, {0}, {0}, 1, [](Builder&, const std::vector<Value>& a) {
      return std::vector<Value>{a[1]};
    });
  }
  return b.reshape(out, st.shape);
}

}  // namespace tpu::ir
