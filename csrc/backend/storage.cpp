#include "backend/storage.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>

#include "backend/device.h"
#include "backend/dtypes.h"
#include "backend/executor.h"
#include "lowering/helpers.h"
#include "runtime/client.h"

namespace tpu::backend {
namespace {

void delete_storage(void* ctx) { delete static_cast<StorageData*>(ctx); }

class TpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    // A forked child must fail here, before a deferred graph records anything.
    guarded([] { runtime::Client::check_not_forked(); return 0; });
    c10::DeviceIndex dev = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index();
    auto* s = new StorageData{dev, nbytes, {}};
    // The data pointer is only an identity: device memory is never host-addressable.
    return c10::DataPtr(s, s, &delete_storage, c10::Device(c10::DeviceType::PrivateUse1, dev));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_storage; }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "tpu storages are not host-addressable; copy tensors with .to() or copy_()");
  }
};

TpuAllocator g_allocator;

}  // namespace

c10::Allocator* tpu_allocator() { return &g_allocator; }
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator)

StorageData& storage_of(const at::Tensor& t) {
  void* ctx = t.storage().data_ptr().get_context();
  TORCH_INTERNAL_ASSERT(ctx && t.storage().data_ptr().get_deleter() == &delete_storage,
                        "tensor storage is not a tpu storage");
  return *static_cast<StorageData*>(ctx);
}

int device_index(const at::Tensor& t) { return t.device().has_index() ? t.device().index() : 0; }

ir::Geometry geometry_of(const at::Tensor& t) {
  ir::Geometry g;
  g.sizes.assign(t.sizes().begin(), t.sizes().end());
  g.strides.assign(t.strides().begin(), t.strides().end());
  g.offset = t.storage_offset();
  return g;
}

ir::Type storage_type(const at::Tensor& t) {
  StorageData& s = storage_of(t);
  if (s.value) return s.value.type();
  // Not written yet: shape the buffer like the tensor when it spans the storage.
  DType d = device_dtype(t.scalar_type(), "tpu storage");
  int64_t n = static_cast<int64_t>(s.nbytes) / itemsize(d);
  ir::Geometry g = geometry_of(t);
  if (g.covers({n})) return ir::Type{d, g.sizes};
  return ir::Type{d, {n}};
}

void check_not_donated(const StorageData& s) {
  TORCH_CHECK(s.donated_to.empty(), "this tpu tensor was donated to ", s.donated_to,
              " and can no longer be used");
}

Operand storage_value(const at::Tensor& t) {
  StorageData& s = storage_of(t);
  if (s.value) return s.value;
  check_not_donated(s);
  ir::Type ty = storage_type(t);
  s.value = run_internal("zeros:" + ty.str(), [&](ir::Builder& b) -> std::vector<ir::Value> {
    return {lowering::constant_any(b, 0, ty.dtype, ty.shape)};
  }, {}, s.device)[0];
  return s.value;
}

runtime::BufferPtr materialized(const at::Tensor& t) {
  StorageData& s = storage_of(t);
  runtime::BufferPtr b = resolve(storage_value(t));
  s.value = b;  // forget the slot: the storage now holds the buffer itself
  return b;
}

std::string view_key(const at::Tensor& t) {
  return mlir_name(device_dtype(t.scalar_type(), "copy")) + geometry_of(t).key() + storage_type(t).str() +
         (storage_of(t).value ? "" : "z");
}

// A dense value holding exactly `t`'s values (its own storage's value when that fits).
Operand dense_value(const at::Tensor& t) {
  StorageData& s = storage_of(t);
  check_not_donated(s);
  DType dt = device_dtype(t.scalar_type(), "read");
  ir::Geometry g = geometry_of(t);
  ir::Type st = storage_type(t);
  if (s.value && st.dtype == dt && g.covers(st.shape) && st.shape == g.sizes) return s.value;
  bool has = static_cast<bool>(s.value);
  std::vector<Operand> args;
  if (has) args.push_back(s.value);
  return run_internal("dense:" + view_key(t), [&](ir::Builder& b) -> std::vector<ir::Value> {
    ir::Value src = has ? b.param(st) : lowering::constant_any(b, 0, st.dtype, st.shape);
    if (src.dtype() != dt) src = reinterpret_bytes(b, src, dt);
    return {ir::read_view(b, src, g)};
  }, args, s.device)[0];
}

runtime::BufferPtr dense_buffer(const at::Tensor& t) { return resolve(dense_value(t)); }

at::Tensor wrap_value(Operand value, c10::ScalarType dtype, at::IntArrayRef sizes, int device) {
  // The allocator places the storage on the current device: switch only if it differs.
  std::optional<c10::DeviceGuard> guard;
  if (current_device() != device) guard.emplace(c10::Device(c10::DeviceType::PrivateUse1, device));
  constexpr c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  at::Tensor t = at::detail::empty_generic(sizes, &g_allocator, ks, dtype, std::nullopt);
  storage_of(t).value = std::move(value);
  return t;
}

at::Tensor wrap_value(Operand value, c10::ScalarType dtype, at::IntArrayRef sizes, at::IntArrayRef strides,
                      int device) {
  // The allocator places the storage on the current device: switch only if it differs.
  std::optional<c10::DeviceGuard> guard;
  if (current_device() != device) guard.emplace(c10::Device(c10::DeviceType::PrivateUse1, device));
  constexpr c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  at::Tensor t = at::detail::empty_strided_generic(sizes, strides, &g_allocator, ks, dtype);
  storage_of(t).value = std::move(value);
  return t;
}

std::vector<int64_t> physical_order(at::IntArrayRef sizes, at::IntArrayRef strides) {
  std::vector<int64_t> order(sizes.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = static_cast<int64_t>(d);
  // Size-1 dims index nothing: keep them in place relative to each other (first).
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    bool a1 = sizes[a] == 1, b1 = sizes[b] == 1;
    if (a1 || b1) return a1 && !b1;
    return strides[a] > strides[b];
  });
  int64_t last = -1;
  for (int64_t d : order) {
    if (sizes[d] == 1) continue;
    if (d < last) return order;
    last = d;
  }
  return {};
}

static DType part_of(DType c) { return c == DType::C128 ? DType::F64 : DType::F32; }

ir::Value reinterpret_bytes(ir::Builder& b, const ir::Value& v_in, DType to) {
  if (v_in.dtype() == to) return v_in;
  ir::Value v = v_in;
  int64_t n = v.type.numel(), a = itemsize(v.dtype()), c = itemsize(to);
  if (a < c && (n * a) % c) {  // pad to whole elements of `to`
    int64_t extra = (c - (n * a) % c) / a;
    v = b.pad(b.reshape(v, {n}), lowering::constant_any(b, 0, v.dtype()), {0}, {extra}, {0});
    n += extra;
  }
  if (!is_complex(v.dtype()) && !is_complex(to)) return ir::reinterpret(b, v, to);
  if (is_complex(v.dtype())) {  // interleave (re, im), then reinterpret the parts
    ir::Type pt{part_of(v.dtype()), {n, 1}};
    ir::Value flat = b.reshape(v, {n});
    ir::Value re = b.reshape(b.raw("stablehlo.real", {flat}, "", ir::Type{pt.dtype, {n}}), pt.shape);
    ir::Value im = b.reshape(b.raw("stablehlo.imag", {flat}, "", ir::Type{pt.dtype, {n}}), pt.shape);
    return reinterpret_bytes(b, b.reshape(b.concatenate({re, im}, 1), {2 * n}), to);
  }
  ir::Value parts = ir::reinterpret(b, v, part_of(to));  // to the parts, then pair them
  int64_t m = parts.type.numel();
  ir::Value pairs = b.reshape(parts, {m / 2, 2});
  ir::Value re = b.reshape(b.slice(pairs, {0, 0}, {m / 2, 1}, {1, 1}), {m / 2});
  ir::Value im = b.reshape(b.slice(pairs, {0, 1}, {m / 2, 2}, {1, 1}), {m / 2});
  return b.raw("stablehlo.complex", {re, im}, "", ir::Type{to, {m / 2}});
}

ir::Value as_storage(ir::Builder& b, const ir::Value& v, const ir::Type& st) {
  ir::Value flat = reinterpret_bytes(b, v, st.dtype);
  int64_t n = st.numel();
  if (flat.type.numel() > n) flat = b.slice(flat, {0}, {n}, {1});
  return b.reshape(flat, st.shape);
}

ir::Value conj_value(ir::Builder& b, const ir::Value& v) {
  ir::Type pt{part_of(v.dtype()), v.shape()};
  ir::Value im = b.unary("stablehlo.negate", b.raw("stablehlo.imag", {v}, "", pt));
  return b.raw("stablehlo.complex", {b.raw("stablehlo.real", {v}, "", pt), im}, "", v.type);
}

ir::Value apply_math_bits(ir::Builder& b, const ir::Value& v, const at::Tensor& t) {
  ir::Value out = v;
  if (t.is_conj() && is_complex(v.dtype())) out = conj_value(b, out);
  if (t.is_neg()) out = b.unary("stablehlo.negate", out);
  return out;
}

const char* math_bits_key(const at::Tensor& t) {
  bool c = t.is_conj(), n = t.is_neg();
  return c && n ? "~-" : c ? "~" : n ? "-" : "";
}

}  // namespace tpu::backend
