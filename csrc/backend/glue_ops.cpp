// Ops that are PyTorch plumbing rather than math: allocation, views (metadata only),
// resize, copies across devices, reading a scalar back.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>
#include <ATen/CPUFunctions.h>
#include <ATen/NativeFunctions.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstring>
#include <limits>
#include <mutex>
#include <optional>

#include "backend/captured_graph.h"
#include "backend/device.h"
#include "backend/device_checks.h"
#include "backend/dtypes.h"
#include "backend/executor.h"
#include "backend/inplace_donation.h"
#include "backend/storage.h"
#include "backend/sync_debug.h"
#include "ir/views.h"
#include "lowering/helpers.h"

namespace tpu::backend {
namespace {

constexpr c10::DispatchKeySet kTpuKeys(c10::DispatchKey::PrivateUse1);

// Most writes queued at once on one storage: bounds a batch's program.
constexpr size_t kMaxPendingWrites = 256;

// Writes `value` (broadcastable to dst, any dtype) into dst's view of its storage.
// With `src` (a tensor of dst's device, no lazy math bits, whose storage holds a
// buffer), `value` is not given: src's values are written, read in the program that
// writes them where the write is queued.
void assign(const at::Tensor& dst, Operand value, const at::Tensor* src = nullptr) {
  StorageData& s = storage_data(dst);  // its pending writes are joined or dropped here
  if (s.copy_of) apply_pending(s);
  DType dt = device_dtype(dst.scalar_type(), "copy_");
  ir::Geometry g = geometry_of(dst);
  // The type the storage has (or will have once its pending writes run).
  ir::Type st = s.pending.empty() ? storage_type(dst) : s.pending_type;
  bool covers = g.covers(st.shape);
  bool queue = !deferring() && !(itemsize(st.dtype) == itemsize(dt) && covers);
  if (src && queue) {
    Operand sv = ready_value(storage_of(*src));  // now: later writes to src must not show
    TORCH_INTERNAL_ASSERT(sv.buffer);
    if (s.pending.size() >= kMaxPendingWrites) apply_pending(s);
    if (s.pending.empty()) s.pending_type = st;
    Operand at = offset_is_operand(*src) ? Operand(view_offset_operand(*src)) : Operand();
    s.pending.push_back({g, dt, sv, true, geometry_of(*src), device_dtype(src->scalar_type(), "copy_"), at});
    return;
  }
  if (src) value = dense_value(*src);
  ir::Type vt = value.type();
  // The whole storage rewritten: the old bytes, and writes not run yet, are not needed.
  if (covers && vt.dtype == dt && st.dtype == dt && (vt.shape == st.shape || vt.shape == g.sizes)) {
    // Kept as it is (a contiguous view of the whole storage reads a value of its own
    // shape as that view): no program.
    s.pending.clear();
    set_value(s, value);
    return;
  }
  bool whole = itemsize(st.dtype) == itemsize(dt) && covers;
  if (whole) {
    s.pending.clear();
    std::string key = "assign:" + vt.str() + "->" + mlir_name(dt) + g.key() + st.str();
    ProgramPtr program = internal_program(key, [&](ir::Builder& b) -> std::vector<ir::Value> {
      ir::Value v = lowering::coerce(b, b.param(vt), dt, g.sizes);
      return {b.reshape(reinterpret_bytes(b, v, st.dtype), st.shape)};
    });
    // The old value is not read: its buffer goes first where nothing else holds it.
    std::vector<StorageData*> dropped;
    if (!deferring()) {
      runtime::ExecutablePtr exe = program->executable();
      dropped = drop_overwritten({&s}, s.device, exe->output_bytes() + exe->temp_bytes());
    }
    std::vector<Operand> args{std::move(value)};
    FillingUnwritten filling(s);  // the launch makes its first buffer where it held none
    Results out;
    try {
      out = run(program, args, s.device);
    } catch (const std::exception& e) {
      fail_overwrite(dropped, e);
      throw;
    }
    finish_overwrite(dropped);
    set_value(s, std::move(out[0]));
    return;
  }
  if (!s.value && s.pending.empty()) check_readable(s);
  if (deferring()) {
    // The pending graph already joins the writes into one program.
    Operand cur = storage_value(dst);
    std::vector<Operand> args{value, cur};
    // A row of a cache or an output filled step by step: one program for every offset.
    ir::Geometry kg = g;
    bool at = offset_is_operand(dst, /*written=*/true);
    if (at) {
      kg.offset = -1;
      args.push_back(view_offset_operand(dst));
    }
    std::string key = "assign:" + vt.str() + "->" + mlir_name(dt) + kg.key() + st.str();
    Operand written = run_internal(key, [&](ir::Builder& b) -> std::vector<ir::Value> {
      ir::Value v = lowering::coerce(b, b.param(vt), dt, g.sizes);
      ir::Value storage = b.param(st);
      std::optional<ir::Value> offset;
      if (at) offset = b.param(ir::Type{DType::I64, {}});
      // through the storage's bytes
      return {write_storage_view(b, storage, st, g, v, offset ? &*offset : nullptr)};
    }, args, s.device)[0];
    note_replacement(written, cur);  // the storage's new value, as an in-place op's
    set_value(s, std::move(written));
    return;
  }
  // Part of the storage: queued, run with the writes that follow it at the storage's
  // next use (one program for a DDP bucket's gradients instead of one per gradient,
  // each rewriting the whole bucket).
  if (s.pending.size() >= kMaxPendingWrites) apply_pending(s);
  if (s.pending.empty()) s.pending_type = st;
  s.pending.push_back({g, dt, value});
}

}  // namespace

void write_value(const at::Tensor& dst, Operand value) { assign(dst, std::move(value)); }

namespace {

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin, std::optional<c10::MemoryFormat> mf) {
  c10::Device dev = c10::device_or_default(device);
  check_device(dev.has_index() ? dev.index() : current_device());
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "tpu tensors are strided only");
  auto st = c10::dtype_or_default(dtype);
  device_dtype(st, "empty");
  c10::DeviceGuard guard(dev);
  return at::detail::empty_generic(size, tpu_allocator(), kTpuKeys, st, mf);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin) {
  c10::Device dev = c10::device_or_default(device);
  check_device(dev.has_index() ? dev.index() : current_device());
  auto st = c10::dtype_or_default(dtype);
  device_dtype(st, "empty_strided");
  c10::DeviceGuard guard(dev);
  return at::detail::empty_strided_generic(size, stride, tpu_allocator(), kTpuKeys, st);
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// Complex <-> (re, im) pairs: same storage, the dtype reinterpreted (programs read a
// view of another dtype through the storage's bytes), so writes show through both.
at::Tensor view_as_real(const at::Tensor& self) { return at::native::view_as_real(self); }
at::Tensor view_as_complex(const at::Tensor& self) { return at::native::view_as_complex(self); }

// PyTorch's autograd asks for zeros it will not write; a storage no op has written
// reads as zeros, so this is an allocation only. It is a plain tensor (not flagged
// as a ZeroTensor): the same values, just without CPU's shortcut for them.
at::Tensor efficientzerotensor(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin) {
  return empty_memory_format(size, dtype, layout, device, pin, std::nullopt);
}

at::Tensor unfold(const at::Tensor& self, int64_t dim, int64_t size, int64_t step) {
  return at::native::unfold(self, dim, size, step);
}

// Grows `storage` to `need` bytes (if smaller), keeping its values at the front, as
// CPU's resize does. (ATen's own resize would copy our DataPtr's context as bytes.)
void grow_storage(const c10::Storage& storage, size_t need, c10::Device device) {
  if (need <= storage.nbytes()) return;
  StorageData& old = *static_cast<StorageData*>(storage.data_ptr().get_context());
  if (!old.pending.empty() || old.copy_of) apply_pending(old);
  Operand old_value = old.value;
  int dev = old.device;
  c10::DeviceGuard guard(device);
  c10::DataPtr fresh = tpu_allocator()->allocate(need);
  if (old_value && old_value.type().numel() > 0) {
    // Keep the old contents at the front of the bigger storage.
    ir::Type ot = old_value.type();
    int64_t n_old = ot.numel();
    int64_t n_new = static_cast<int64_t>(need) / itemsize(ot.dtype);
    FillingUnwritten filling(*static_cast<StorageData*>(fresh.get_context()));
    set_value(*static_cast<StorageData*>(fresh.get_context()), guarded([&] {
      return run_internal("grow:" + ot.str() + "->" + std::to_string(n_new),
                          [&](ir::Builder& b) -> std::vector<ir::Value> {
        ir::Value flat = b.reshape(b.param(ot), {n_old});
        return {b.pad(flat, lowering::constant_any(b, 0, ot.dtype), {0}, {n_new - n_old}, {0})};
      }, {old_value}, dev)[0];
    }));
  }
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
  storage.unsafeGetStorageImpl()->set_nbytes(need);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> mf) {
  TORCH_CHECK(!mf.has_value() || *mf != c10::MemoryFormat::Preserve, "Unsupported memory format", *mf);
  // The same sizes keep the view's strides, as CPU's resize_ does (a memory format still restrides).
  if (self.sizes() == size) {
    if (mf.has_value()) self.unsafeGetTensorImpl()->empty_tensor_restride(*mf);
    return self;
  }
  // CPU's check (and message), before anything is allocated or queued.
  for (int64_t d : size) TORCH_CHECK(d >= 0, "numel: integer multiplication overflow");
  int64_t numel = c10::multiply_integers(size);
  size_t isz = self.dtype().itemsize();
  size_t need = static_cast<size_t>(self.storage_offset() + numel) * isz;
  grow_storage(self.storage(), need, self.device());
  std::vector<int64_t> sizes(size.begin(), size.end());
  self.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  if (mf.has_value() && *mf != c10::MemoryFormat::Contiguous)
    self.unsafeGetTensorImpl()->empty_tensor_restride(*mf);
  return self;
}

// torch.load rebuilds a tensor by setting it onto a restored storage: bytes it kept on
// the host are uploaded in the tensor's dtype and shape (serialization.cpp).
void upload_loaded_bytes_as(const at::Tensor& self) {
  StorageData* s = storage_record(*self.storage().unsafeGetStorageImpl());
  if (s && s->loaded_bytes.defined()) upload_loaded_bytes(*s, &self);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage src, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  // A view past the storage's end grows it first, as CPU's set_ does.
  bool valid = offset >= 0 && (stride.empty() || stride.size() == size.size()) &&
               std::all_of(size.begin(), size.end(), [](int64_t d) { return d >= 0; });
  if (valid && src.unsafeGetStorageImpl()->data_ptr().get_context() && src.device().is_privateuseone()) {
    size_t isz = self.dtype().itemsize();
    size_t need = stride.empty() ? at::detail::computeStorageNbytesContiguous(size, isz, offset)
                                 : at::detail::computeStorageNbytes(size, stride, isz, offset);
    if (src.resizable()) grow_storage(src, need, src.device());
  }
  at::cpu::set_(self, src, offset, size, stride);
  upload_loaded_bytes_as(self);
  return self;
}

// set_() with no source: a fresh empty tpu storage, as CPU's and CUDA's set_ give.
at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage fresh(c10::Storage::use_byte_size_t(), 0, tpu_allocator(), /*resizable=*/true);
  return at::cpu::set_(self, fresh, 0, {0}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& src) {
  return at::native::set_tensor_(self, src);
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage src) {
  int64_t n = static_cast<int64_t>(src.nbytes() / self.dtype().itemsize());
  at::cpu::set_(self, src, 0, {n}, {});
  upload_loaded_bytes_as(self);
  return self;
}

// The stored values `v` of src turned into those dst must store: src's lazy
// conjugate/negative bits applied, then dst's (both self-inverse).
Operand with_math_bits(const Operand& v, const at::Tensor& src, const at::Tensor& dst) {
  bool conj = src.is_conj() != dst.is_conj() && src.is_complex(), neg = src.is_neg() != dst.is_neg();
  if (!conj && !neg) return v;
  ir::Type vt = v.type();
  std::string key = std::string("mathbits:") + (conj ? "c" : "") + (neg ? "n" : "") + vt.str();
  return run_internal(key, [&](ir::Builder& b) -> std::vector<ir::Value> {
    ir::Value x = b.param(vt);
    if (conj) x = conj_value(b, x);
    return {neg ? b.unary("stablehlo.negate", x) : x};
  }, {v}, device_index(src))[0];
}

// copy_ across devices and dtypes; tpu->tpu runs one program.
// A storage up to kHostCopyAtOnce bytes comes to the host whole when part of it is
// read; one up to kHostCopyMax at the second read of part of the same value.
constexpr size_t kHostCopyAtOnce = 64 << 10;
constexpr size_t kHostCopyMax = 4 << 20;

// `src`'s view of its storage's host copy (made now if due), where `src` is part of a
// storage holding its plain computed values; else undefined. Printing a tensor reads each
// shown element and row, `[v.item() for v in t]` each element: one transfer then serves
// them all, not a program and a transfer each.
// Guards the host-copy fields: `item()` releases the GIL, so two threads may read one storage.
std::mutex g_host_copy_mu;

at::Tensor view_of_host_copy(const at::Tensor& src) {
  size_t storage_bytes = src.storage().nbytes();
  if (storage_bytes > kHostCopyMax) return {};
  StorageData& s = storage_of(src);
  if (!s.value || s.copy_of || !s.unreadable.empty() || s.nbytes != storage_bytes) return {};
  bool part = src.nbytes() < storage_bytes;
  std::shared_ptr<const std::vector<uint8_t>> bytes;
  {
    std::lock_guard<std::mutex> lock(g_host_copy_mu);
    if (!part && s.host_copy_of.expired()) return {};  // a whole read keeps no copy
  }
  runtime::BufferPtr buf = materialized(src);
  if (buf->dtype() != device_dtype(src.scalar_type(), "copy_") || buf->nbytes() != static_cast<int64_t>(storage_bytes))
    return {};  // a view with another dtype than the stored values': the general path
  {
    std::lock_guard<std::mutex> lock(g_host_copy_mu);
    if (s.host_copy_of.lock() == buf) {
      bytes = s.host_copy;
    } else if (!part) {
      return {};
    } else if (storage_bytes > kHostCopyAtOnce && s.part_read_of.lock() != buf) {
      s.part_read_of = buf;  // a single read of a large storage copies only its part
      return {};
    }
  }
  if (!bytes) {
    auto fresh = std::make_shared<std::vector<uint8_t>>(storage_bytes);
    runtime::Client::get().to_host(*buf, fresh->data(), storage_bytes);
    std::lock_guard<std::mutex> lock(g_host_copy_mu);
    s.host_copy = fresh;
    s.host_copy_of = buf;
    bytes = std::move(fresh);
  }
  int64_t n = static_cast<int64_t>(storage_bytes / src.element_size());
  void* data = const_cast<uint8_t*>(bytes->data());  // read only: copied from, never written
  return at::from_blob(data, {n}, [bytes](void*) {}, src.options().device(at::kCPU))
      .as_strided(src.sizes(), src.strides(), src.storage_offset());
}

// Copies `src`, a tpu tensor spanning its whole storage densely, to the CPU tensor
// `self` from the storage's buffer as it is: the host copy of a dense buffer is the
// storage's bytes whatever their dtype and shape, so reading the storage as bytes
// (torch.save copies each storage as uint8) or in another shape runs no program. False
// (nothing done) for part of a storage, where a program cuts the part out, and for a
// bool view of other bytes, which programs read as bools.
bool copy_whole_storage_to_host(at::Tensor& self, const at::Tensor& src) {
  size_t nbytes = src.storage().nbytes();
  if (src.storage_offset() != 0 || !src.is_contiguous() || src.nbytes() != nbytes || src.numel() == 0) return false;
  StorageData& s = storage_of(src);
  if (s.nbytes != nbytes) return false;
  check_readable(s);
  runtime::BufferPtr buf;
  if (s.value) {  // else never written: zeros
    buf = materialized(src);
    if (static_cast<size_t>(buf->nbytes()) != nbytes) return false;
    if (src.scalar_type() == at::kBool && buf->dtype() != DType::Bool) return false;
  }
  bool direct = self.is_contiguous() && self.scalar_type() == src.scalar_type() && self.sizes() == src.sizes() &&
                !src.is_conj() && !src.is_neg() && !self.is_conj() && !self.is_neg();
  at::Tensor host = direct ? self
                           : at::empty({static_cast<int64_t>(nbytes)}, src.options().device(at::kCPU).dtype(at::kByte))
                                 .view(src.scalar_type()).view(src.sizes());
  if (buf)
    runtime::Client::get().to_host(*buf, host.data_ptr(), nbytes);
  else
    std::memset(host.data_ptr(), 0, nbytes);
  if (direct) return true;
  // The buffer holds the stored values; lazy conjugate/negative bits apply on top.
  if (src.is_conj()) host = host.conj();
  if (src.is_neg()) host = at::_neg_view(host);
  self.copy_(host);
  return true;
}

at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  // src must broadcast to self, as CPU's copy_ checks (with its messages), before anything
  // is queued: a write of the wrong shape would only fail when the storage is next read.
  if (self.sizes() != src.sizes()) {
    std::vector<int64_t> shape = at::infer_size(self.sizes(), src.sizes());
    TORCH_CHECK(c10::IntArrayRef(shape) == self.sizes(), "output with shape ", self.sizes(),
                " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  }
  if (self.numel() == 0 || self.is_same(src)) return self;
  // Two views of the same elements, as CPU's copy_, before its overlap checks: nothing to do.
  if (self.is_alias_of(src) && self.storage_offset() == src.storage_offset() && self.strides() == src.strides() &&
      self.sizes() == src.sizes() && self.scalar_type() == src.scalar_type() && self.is_conj() == src.is_conj() &&
      self.is_neg() == src.is_neg())
    return self;
  if (self.is_privateuseone()) {  // as CPU's copy_ (a TensorIterator) checks
    at::assert_no_internal_overlap(self);
    if (src.is_privateuseone()) at::assert_no_partial_overlap(self, src);
  }
  return guarded([&]() -> at::Tensor& {
    if (self.is_privateuseone() && src.is_cpu()) {
      if (defer_loaded_bytes(self, src)) return self;  // torch.load's bytes: uploaded typed later
      // Sent as it is; the device program casts and broadcasts.
      at::Tensor host = src.resolve_conj().resolve_neg();  // lazy bits are host views
      // self's own bits: store the values that read back as src's (both self-inverse).
      if (self.is_conj() && host.is_complex()) host = host.conj_physical();
      if (self.is_neg()) host = host.neg();
      host = host.contiguous();
      DType st = device_dtype(host.scalar_type(), "copy_");
      std::vector<int64_t> dims(host.sizes().begin(), host.sizes().end());
      before_upload(device_index(self));  // a pending graph holding many dropped uploads runs first
      if (upload_replacing(self, host, st)) return self;  // the whole storage: its old buffer goes first
      // An unwritten storage the upload fills whole: the upload is its first buffer.
      FillingUnwritten filling;
      if (covers_storage(self) && self.numel() == host.numel()) filling.add(storage_data(self));
      auto buf = runtime::Client::get().from_host(host.data_ptr(), st, dims, device_index(self));
      note_upload(buf, device_index(self));
      assign(self, buf);
    } else if (self.is_cpu() && src.is_privateuseone()) {
      note_synchronizing_op("a copy to the CPU: .cpu(), .item(), .tolist(), printing");
      ReadOfComputed now({src});  // values already computed: read apart from pending work
      note_host_read();
      verify_device_checks();     // values read back must not come from a failed op
      at::Tensor host = view_of_host_copy(src);
      if (host.defined()) {
        if (src.is_conj()) host = host.conj();
        if (src.is_neg()) host = at::_neg_view(host);
        self.copy_(host);
        return self;
      }
      if (copy_whole_storage_to_host(self, src)) return self;
      auto buf = dense_buffer(src);
      if (self.is_contiguous() && self.scalar_type() == src.scalar_type() && self.sizes() == src.sizes() &&
          !src.is_conj() && !src.is_neg() && !self.is_conj() && !self.is_neg()) {
        // Straight into the destination: no second host copy (`.cpu()`, the staging of
        // tpu_dist; a parallel copy also waits for OpenMP threads on a busy machine).
        runtime::Client::get().to_host(*buf, self.data_ptr(), self.nbytes());
        return self;
      }
      host = at::empty(src.sizes(), src.options().device(at::kCPU));
      runtime::Client::get().to_host(*buf, host.data_ptr(), host.nbytes());
      // The buffer holds the stored values; lazy conjugate/negative bits apply on top.
      if (src.is_conj()) host = host.conj();
      if (src.is_neg()) host = at::_neg_view(host);
      self.copy_(host);
    } else {
      TORCH_CHECK(self.is_privateuseone() && src.is_privateuseone(), "copy_ from ", src.device(),
                  " to ", self.device(), " is not supported by the tpu backend");
      if (copy_view_later(self, src)) return self;
      bool plain = !src.is_conj() && !src.is_neg() && !self.is_conj() && !self.is_neg();
      if (plain && device_index(src) == device_index(self) && ready_value(storage_of(src)).buffer) {
        assign(self, {}, &src);  // src read where the write runs
        return self;
      }
      Operand v = with_math_bits(dense_value(src), src, self);
      if (device_index(src) != device_index(self))
        v = runtime::Client::get().copy_to_device(*resolve(v), device_index(self));
      assign(self, v);
    }
    return self;
  });
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor d = dst;
  copy_(d, self, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  at::Tensor d = dst;
  copy_(d, self, false);
  return dst;
}

at::Tensor to_copy(const at::Tensor& self, std::optional<c10::ScalarType> dtype,
                   std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                   std::optional<bool> pin, bool non_blocking, std::optional<c10::MemoryFormat> mf) {
  c10::Device dev = device.value_or(self.device());
  at::TensorOptions opts = self.options().dtype(dtype.value_or(self.scalar_type())).device(dev);
  // The layout as CPU/CUDA keep it: preserve_format copies the strides of a
  // non-overlapping and dense tensor, else dense strides in the same order of dimensions
  // (a permuted slice stays permuted); another format is taken as asked.
  c10::MemoryFormat format = mf.value_or(c10::MemoryFormat::Preserve);
  at::Tensor out;
  if (format == c10::MemoryFormat::Preserve)
    out = at::empty_strided(self.sizes(), self.is_non_overlapping_and_dense()
                                              ? self.strides().vec()
                                              : at::infer_dense_strides(self.sizes(), self.strides()), opts);
  else
    out = at::empty(self.sizes(), opts.memory_format(format));
  out.copy_(self, non_blocking);
  return out;
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(), " elements cannot be converted to Scalar");
  at::Tensor host = at::empty(self.sizes(), self.options().device(at::kCPU));
  at::Tensor h = host;
  copy_(h, self, false);
  return host.item();
}

// nn.Module._apply keeps a parameter object (and so weight ties, optimizer references and
// hooks) across `.to(device)` only when this says the two tensors' impls may be swapped
// (`param.data = moved`). PyTorch answers yes for dense CPU/CUDA pairs; a tpu tensor is
// the same plain strided TensorImpl, so dense CPU/tpu pairs are compatible too.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](c10::DispatchKeySet ks) {
    constexpr c10::DispatchKeySet backends(
        {c10::BackendComponent::CPUBit, c10::BackendComponent::PrivateUse1Bit});
    return ks.has(c10::DispatchKey::Dense) && ks.has_any(backends);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (dense(self.key_set()) && dense(from.key_set()));
}

// torch.optim passes the fused Adam(W) step a float lr, which a program would bake in;
// as the 0-dim operand of the lowered tensor_lr overload a schedule reuses one program.
template <bool kDecoupled>
void fused_adam_float_lr(at::TensorList self, at::TensorList grads, at::TensorList exp_avgs,
                         at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                         at::TensorList state_steps, double lr, double beta1, double beta2,
                         double weight_decay, double eps, bool amsgrad, bool maximize,
                         const std::optional<at::Tensor>& grad_scale,
                         const std::optional<at::Tensor>& found_inf) {
  // float64 parameters take the lr unrounded (CPU's kernel keeps it a double).
  bool f64 = !self.empty() && self[0].scalar_type() == at::kDouble;
  at::Tensor lr_t = at::scalar_tensor(lr, at::TensorOptions().dtype(f64 ? at::kDouble : at::kFloat));
  if constexpr (kDecoupled)
    at::_fused_adamw_(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr_t, beta1,
                      beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf);
  else
    at::_fused_adam_(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr_t, beta1,
                     beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf);
}

// torch.kaiser_window: PyTorch's composite computes the window through a DispatchStub
// (kaiser_window_stub) that has no tpu kernel. Here the window is allocated on the
// device and written by the lowered kaiser_window.beta_out. Arguments CPU refuses
// (negative length, a non-floating or complex dtype, a sparse layout) are refused by
// CPU's own composite, which raises its error before computing anything.
at::Tensor kaiser_window_beta(int64_t window_length, bool periodic, double beta,
                              std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                              std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  c10::ScalarType t = dtype.value_or(c10::get_default_dtype_as_scalartype());
  bool ok = window_length >= 0 && layout.value_or(c10::kStrided) == c10::kStrided &&
            (t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf);
  if (!ok) {
    at::kaiser_window(window_length, periodic, beta, dtype, layout, at::kCPU, pin_memory);
    TORCH_CHECK(false, "kaiser_window: unsupported arguments (window_length=", window_length, ", dtype=", t, ")");
  }
  at::Tensor out = at::empty({window_length}, at::TensorOptions().dtype(t).layout(layout).device(device)
                                                  .pinned_memory(pin_memory));
  if (window_length > 0) at::kaiser_window_out(out, window_length, periodic, beta);
  return out;
}

at::Tensor kaiser_window_periodic(int64_t window_length, bool periodic, std::optional<c10::ScalarType> dtype,
                                  std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                  std::optional<bool> pin_memory) {
  return kaiser_window_beta(window_length, periodic, 12.0, dtype, layout, device, pin_memory);
}

at::Tensor kaiser_window_default(int64_t window_length, std::optional<c10::ScalarType> dtype,
                                 std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                 std::optional<bool> pin_memory) {
  return kaiser_window_beta(window_length, true, 12.0, dtype, layout, device, pin_memory);
}

// Fused SGD and Adagrad likewise: the lowered tensor_lr overloads take the rate as a 0-dim
// operand (float32, or float64 when a parameter is float64, which CPU's kernel then reads
// in full). Adagrad's float overload marks state_steps as written; its kernel, like the
// tensor_lr one, leaves them as they are.
at::Tensor lr_operand(double lr, at::TensorList params) {
  bool f64 = false;
  for (const at::Tensor& p : params) f64 = f64 || p.scalar_type() == at::kDouble;
  return at::scalar_tensor(lr, at::TensorOptions().dtype(f64 ? at::kDouble : at::kFloat));
}

void fused_sgd_float_lr(at::TensorList self, at::TensorList grads, at::TensorList momentum_buffer_list,
                        double weight_decay, double momentum, double lr, double dampening, bool nesterov,
                        bool maximize, bool is_first_step, const std::optional<at::Tensor>& grad_scale,
                        const std::optional<at::Tensor>& found_inf) {
  at::_fused_sgd_(self, grads, momentum_buffer_list, weight_decay, momentum, lr_operand(lr, self), dampening,
                  nesterov, maximize, is_first_step, grad_scale, found_inf);
}

void fused_adagrad_float_lr(at::TensorList self, at::TensorList grads, at::TensorList state_sums,
                            at::TensorList state_steps, double lr, double lr_decay, double weight_decay, double eps,
                            bool maximize, const std::optional<at::Tensor>& grad_scale,
                            const std::optional<at::Tensor>& found_inf) {
  at::_fused_adagrad_(self, grads, state_sums, state_steps, lr_operand(lr, self), lr_decay, weight_decay, eps,
                      maximize, grad_scale, found_inf);
}

// torch.ao's fused observer / fake-quant step writes its running stats, scale and zero
// point and returns new tensors: the functional op (lowering/fake_quantize.cpp) computes
// all six, and the four written ones are copied back. The per-channel observer's first
// call sizes its empty stats first, as CPU does (+inf / -inf minima and maxima).
std::tuple<at::Tensor, at::Tensor> fused_moving_avg_obs_fq_helper(
    const at::Tensor& self, const at::Tensor& observer_on, const at::Tensor& fake_quant_on, at::Tensor& running_min,
    at::Tensor& running_max, at::Tensor& scale, at::Tensor& zero_point, double averaging_const, int64_t quant_min,
    int64_t quant_max, int64_t ch_axis, bool per_row_fake_quant, bool symmetric_quant) {
  if (per_row_fake_quant && running_min.numel() == 0 && self.dim() >= 2 && ch_axis >= 0 && ch_axis < self.dim()) {
    int64_t size = self.size(ch_axis);
    float inf = std::numeric_limits<float>::infinity();
    running_min.resize_(size).fill_(inf);
    running_max.resize_(size).fill_(-inf);
    scale.resize_(size);
    zero_point.resize_(size);
  }
  auto r = at::_fused_moving_avg_obs_fq_helper_functional(self, observer_on, fake_quant_on, running_min, running_max,
                                                          scale, zero_point, averaging_const, quant_min, quant_max,
                                                          ch_axis, per_row_fake_quant, symmetric_quant);
  running_min.copy_(std::get<2>(r));
  running_max.copy_(std::get<3>(r));
  scale.copy_(std::get<4>(r));
  zero_point.copy_(std::get<5>(r));
  return {std::get<0>(r), std::get<1>(r)};
}

}  // namespace

// Ops the generic lowered kernel must not claim: these are ours.
bool is_glue_op(const std::string& name) {
  static const char* kGlue[] = {"copy_", "_to_copy", "_copy_from", "_copy_from_and_resize",
                                "resize_", "empty.memory_format", "empty_strided", "as_strided",
                                "view", "_reshape_alias", "unfold", "_local_scalar_dense",
                                "set_.source_Storage_storage_offset", "set_.source_Tensor",
                                "set_.source_Storage", "set_", "_fused_sdp_choice", "nonzero", "masked_select",
                                "view_as_real", "view_as_complex", "_efficientzerotensor"};
  for (auto* g : kGlue) if (name == g) return true;
  return false;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", unfold);
  m.impl("view_as_real", view_as_real);
  m.impl("view_as_complex", view_as_complex);
  m.impl("_efficientzerotensor", efficientzerotensor);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_", set_empty);
  m.impl("copy_", copy_);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_to_copy", to_copy);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("_fused_adam_", fused_adam_float_lr<false>);
  m.impl("_fused_adamw_", fused_adam_float_lr<true>);
  m.impl("_fused_sgd_", fused_sgd_float_lr);
  m.impl("_fused_adagrad_", fused_adagrad_float_lr);
  m.impl("_fused_moving_avg_obs_fq_helper", fused_moving_avg_obs_fq_helper);
  // Metadata only (same storage, offset, sizes and strides): PyTorch's device-generic
  // kernel. The CPU fallback compared two host copies, never the same storage.
  m.impl("is_set_to", at::native::is_set_to);
  m.impl("kaiser_window", kaiser_window_default);
  m.impl("kaiser_window.periodic", kaiser_window_periodic);
  m.impl("kaiser_window.beta", kaiser_window_beta);
}

void drop_host_copy(StorageData& s) {
  std::lock_guard<std::mutex> lock(g_host_copy_mu);
  s.host_copy_of.reset();
  s.host_copy.reset();
  s.part_read_of.reset();
}

}  // namespace tpu::backend
