// Constant fills outside a recorded graph (Strict and Debug) of a tensor that spans its
// whole storage run no program: `zero_` (and a fill with +0) leaves the storage unwritten,
// which reads as zeros; another `fill_` of a few KiB at most becomes a host-to-device
// transfer of the filled bytes. The commonest case is autograd's seed of
// `loss.backward()`, `ones_like(loss)` (empty_like, then fill_), which would otherwise be
// a program of its own in every step of a compiled train step. The bytes are the scalar
// converted as CPU's fill converts it (c10::Scalar::to, which raises on overflow), laid
// out in the storage's existing type so later programs see the same signature as after
// a fill program. Counted in metrics() as `host_fills` (a transfer also as an h2d one).
#include <ATen/ATen.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/dtypes.h"
#include "backend/executor.h"
#include "backend/storage.h"

namespace tpu::backend {
namespace {

// Above this a device-side fill is cheaper than copying the bytes over (and on a real
// accelerator the transfer crosses PCIe); the seeds and small buffers are far below it.
constexpr size_t kMaxHostFillBytes = 4096;

std::atomic<int64_t> g_host_fills{0};

// One element of `type` holding `value`, as CPU's fill converts it; false for a type
// with no conversion here (the lowered kernel then decides).
bool element_bytes(const c10::Scalar& value, c10::ScalarType type, char* out, bool one_element) {
  // A one-element tensor of a half or float8 type is filled unchecked (kernel_checks.cpp's
  // fill_value): the value converts through float as .to() converts it.
  if (one_element && (type == c10::kHalf || type == c10::kBFloat16 || c10::isFloat8Type(type)) &&
      !value.isComplex()) {
    double d = value.toDouble();
    float f = std::isfinite(d) && std::abs(d) > std::numeric_limits<float>::max()
                  ? std::copysign(std::numeric_limits<float>::infinity(), d)
                  : static_cast<float>(d);
    switch (type) {
#define TPU_UNCHECKED_BYTES(T, name) \
  case c10::ScalarType::name: {      \
    T h(f);                          \
    std::memcpy(out, &h, sizeof(h)); \
    return true;                     \
  }
      TPU_UNCHECKED_BYTES(c10::Half, Half)
      TPU_UNCHECKED_BYTES(c10::BFloat16, BFloat16)
      TPU_UNCHECKED_BYTES(c10::Float8_e5m2, Float8_e5m2)
      TPU_UNCHECKED_BYTES(c10::Float8_e4m3fn, Float8_e4m3fn)
      TPU_UNCHECKED_BYTES(c10::Float8_e5m2fnuz, Float8_e5m2fnuz)
      TPU_UNCHECKED_BYTES(c10::Float8_e4m3fnuz, Float8_e4m3fnuz)
#undef TPU_UNCHECKED_BYTES
      default:
        return false;
    }
  }
  switch (type) {
#define TPU_ELEMENT_BYTES(T, name)          \
  case c10::ScalarType::name: {            \
    T v = value.to<T>();                   \
    std::memcpy(out, &v, sizeof(T));       \
    return true;                           \
  }
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX(TPU_ELEMENT_BYTES)
    TPU_ELEMENT_BYTES(uint16_t, UInt16)
    TPU_ELEMENT_BYTES(uint32_t, UInt32)
    TPU_ELEMENT_BYTES(uint64_t, UInt64)
#undef TPU_ELEMENT_BYTES
    default:
      return false;
  }
}

// A value whose bytes are all zero in every dtype (not -0.0).
bool is_positive_zero(const c10::Scalar& v) {
  if (v.isBoolean()) return !v.toBool();
  if (v.type() == c10::ScalarType::UInt64) return false;  // above INT64_MAX (toLong would throw)
  if (v.isIntegral(false)) return v.toLong() == 0;
  if (v.isFloatingPoint()) return v.toDouble() == 0.0 && !std::signbit(v.toDouble());
  return false;
}

}  // namespace

int64_t host_fill_count() { return g_host_fills.load(); }

// `self.fill_(value)` done as a transfer when it qualifies (see above); false leaves the
// call to the lowered kernel (deferred modes record fills into their graph instead).
bool try_host_fill(const at::Tensor& self, const c10::Scalar& value) {
  if (deferring() || !self.is_privateuseone() || self.is_conj() || self.is_neg()) return false;
  StorageData& sd = storage_of(self);
  if (!sd.unreadable.empty() || sd.nbytes == 0) return false;
  ir::Type st = storage_type(self);
  if (st.dtype != to_dtype(self.scalar_type()) || !geometry_of(self).covers(st.shape)) return false;
  if (is_positive_zero(value)) {
    // All bytes zero: the storage becomes unwritten again, which reads as zeros (the
    // optimizer states zeros_like makes; programs read such a storage as a constant).
    set_value(sd, Operand());
    g_host_fills += 1;
    return true;
  }
  if (sd.nbytes > kMaxHostFillBytes) return false;
  if (value.isComplex() && !self.is_complex()) return false;  // the lowered kernel's error
  char element[16];
  if (!element_bytes(value, self.scalar_type(), element, self.numel() == 1)) return false;
  const size_t item = self.element_size();
  int64_t n = 1;
  for (int64_t d : st.shape) n *= d;
  std::vector<char> bytes(static_cast<size_t>(n) * item);
  for (int64_t i = 0; i < n; ++i) std::memcpy(bytes.data() + i * item, element, item);
  FillingUnwritten filling(sd);  // the upload is its first buffer where it held none
  runtime::BufferPtr buf =
      guarded([&] { return runtime::Client::get().from_host(bytes.data(), st.dtype, st.shape, sd.device); });
  set_value(sd, std::move(buf));
  g_host_fills += 1;
  return true;
}

}  // namespace tpu::backend
