#include "backend/storage.h"
#include "backend/memory_history.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/accumulate.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>

#include "backend/device.h"
#include "backend/dtypes.h"
#include "backend/profiler.h"
#include "backend/executor.h"
#include "backend/inplace_donation.h"
#include "lowering/helpers.h"
#include "runtime/client.h"

namespace tpu::backend {
namespace {

// torch.profiler(profile_memory=True) with tpu activities: storages are the device's
// allocations (a relaxed load when no session records).
void report_to_profiler(const StorageData* s, int64_t bytes) {
  if (g_memory_history_on.load(std::memory_order_relaxed)) record_storage_event(s, bytes);
  if (!g_device_tracing.load(std::memory_order_relaxed) || !c10::memoryProfilingEnabled()) return;
  const runtime::DeviceStats& st = runtime::Client::get().stats(s->device);
  size_t live = static_cast<size_t>(std::max<int64_t>(st.user_bytes(), 0));
  c10::reportMemoryUsageToProfiler(const_cast<StorageData*>(s), bytes, live, live,
                                   c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(s->device)));
}

thread_local int t_allocating_for_value = 0;  // AllocatingForValue scopes alive

void delete_storage(void* ctx) {
  auto* s = static_cast<StorageData*>(ctx);
  report_to_profiler(s, -static_cast<int64_t>(s->nbytes));
  delete s;
}


// A DeviceAllocator, so torch.accelerator's memory functions reach it as torch.tpu's do.
// Buffers are the runtime's: nothing is cached here, so there is no cache to empty and no
// stream to record; the figures are the runtime's counts of live device buffers.
// A storage no op wrote yet holds no buffer (its first write makes one), but its bytes
// count from its allocation: the limit is checked here, raising out-of-memory at the
// `empty` or `zeros` that passes it, as CUDA does. Launches queued or flushed before it
// may still free buffers their callers dropped: they finish before it gives up.
void count_unwritten(StorageData& s) {
  runtime::Client& c = runtime::Client::get();
  runtime::DeviceStats& st = c.stats(s.device);
  const int64_t bytes = static_cast<int64_t>(s.nbytes);
  if (st.allocated() + bytes > c.memory_limit(s.device) && !all_launched())
    guarded([] { settle_launched(); return 0; });
  try {
    guarded([&] { c.check_capacity(s.device, bytes, "a tensor's allocation"); return 0; });
  } catch (...) {
    delete &s;
    throw;
  }
  st.unwritten_bytes += bytes;
  s.unwritten_bytes = bytes;
  st.bump_peak(st.user_bytes());
}

class TpuAllocator final : public c10::DeviceAllocator {
 public:
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex d) override {
    runtime::DeviceStats& s = settled_memory_stats(d);
    c10::CachingDeviceAllocator::DeviceStats out;
    constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    // One device buffer is one allocation, block and segment (no caching pool between).
    for (auto* bytes : {&out.allocated_bytes, &out.reserved_bytes, &out.active_bytes, &out.requested_bytes}) {
      auto& all = (*bytes)[kAll];
      all.current = s.user_bytes();
      all.peak = s.peak_bytes.load();
      all.allocated = s.allocated_bytes.load();
      all.freed = s.freed_bytes.load();
    }
    for (auto* count : {&out.allocation, &out.segment, &out.active}) {
      auto& all = (*count)[kAll];
      all.current = s.live_buffers.load();
      all.peak = s.peak_buffers.load();
      all.allocated = s.num_allocs.load();
      all.freed = s.num_frees.load();
    }
    out.num_ooms = s.num_ooms.load();
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex d) override { settled_memory_stats(d).reset_accumulated(); }
  void resetPeakStats(c10::DeviceIndex d) override { settled_memory_stats(d).reset_peaks(); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override {
    int64_t total = runtime::Client::get().memory_limit(d);
    int64_t used = settled_memory_stats(d).allocated();
    return {static_cast<size_t>(std::max<int64_t>(total - used, 0)), static_cast<size_t>(total)};
  }

  c10::DataPtr allocate(size_t nbytes) override {
    // A forked child must fail here, before a deferred graph records anything.
    guarded([] { runtime::Client::check_not_forked(); return 0; });
    c10::DeviceIndex dev = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index();
    // More than the device can ever hold: raised here, where CUDA raises it, and not at
    // the first launch that fills it (fills and factories are recorded lazily).
    int64_t limit = runtime::Client::get().memory_limit(dev);
    if (nbytes > static_cast<size_t>(limit)) runtime::Client::get().stats(dev).num_ooms.fetch_add(1);
    TORCH_CHECK_WITH(OutOfMemoryError, nbytes <= static_cast<size_t>(limit),
                     "TPU out of memory. Tried to allocate ", nbytes, " bytes on tpu:", static_cast<int>(dev),
                     ", more than its limit of ", limit, " bytes (torch_tpu)");
    auto* s = new StorageData{dev, nbytes, {}};
    if (t_allocating_for_value == 0 && nbytes > 0) count_unwritten(*s);
    report_to_profiler(s, static_cast<int64_t>(nbytes));
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

// Memory figures count buffers: pending deferred values run first. A query never raises,
// as torch.cuda's counters: a launch that failed (out of memory) stays recorded on the
// values it lost, which raise it when read, and for this thread's next sync.
runtime::DeviceStats& settled_memory_stats(int device) {
  if (device < 0) device = current_device();
  guarded([] { flush("memory query"); settle_launched(); return 0; });
  return runtime::Client::get().stats(device);
}

c10::Allocator* tpu_allocator() { return &g_allocator; }
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator)

StorageData* storage_record(const c10::StorageImpl& impl) {
  const c10::DataPtr& data = impl.data_ptr();
  if (data.get_deleter() == &delete_storage) return static_cast<StorageData*>(data.get_context());
  // A storage PyTorch made over a tpu storage's data pointer (at::from_blob) points at
  // that storage's record.
  auto* s = static_cast<StorageData*>(data.get());
  if (impl.device_type() != c10::DeviceType::PrivateUse1 || !s || s->tag != StorageData::kTag) return nullptr;
  return s;
}

static StorageData& record_of(const at::Tensor& t) {
  // By reference: a copy of the Storage would count a reference up and down.
  const c10::StorageImpl* impl = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  const c10::DataPtr& data = impl->data_ptr();
  if (data.get_deleter() == &delete_storage) return *static_cast<StorageData*>(data.get_context());
  StorageData* s = storage_record(*impl);
  // PyTorch slices an UntypedStorage into a new storage whose data pointer is offset into
  // the old one's; ours point at their record, so only slices from byte 0 are recognized.
  TORCH_CHECK_NOT_IMPLEMENTED(s, "tpu: this storage is not one the tpu backend made; a slice of a tpu "
                              "UntypedStorage must start at byte 0 (storage[0:n]), or use a tensor view");
  return *s;
}

StorageData& storage_data(const at::Tensor& t) {
  StorageData& s = record_of(t);
  if (s.loaded_bytes.defined()) upload_loaded_bytes(s);  // used before a tensor gave its dtype
  return s;
}

void upload_loaded_bytes(StorageData& s, const at::Tensor* as) {
  DType dt = DType::U8;
  std::vector<int64_t> dims{static_cast<int64_t>(s.nbytes)};
  if (as) {
    bool spans = as->storage_offset() == 0 && as->is_contiguous() && as->numel() > 0 && as->nbytes() == s.nbytes;
    if (!spans) {
      if (!s.loaded_dtype) s.loaded_dtype = as->scalar_type();
      return;  // a later tensor may span it
    }
    dt = device_dtype(as->scalar_type(), "torch.load");
    dims.assign(as->sizes().begin(), as->sizes().end());
  } else if (s.loaded_dtype && s.nbytes % c10::elementSize(*s.loaded_dtype) == 0) {
    dt = device_dtype(*s.loaded_dtype, "torch.load");
    dims = {static_cast<int64_t>(s.nbytes / c10::elementSize(*s.loaded_dtype))};
  }
  at::Tensor host = std::move(s.loaded_bytes);
  s.loaded_bytes = at::Tensor();
  s.loaded_dtype.reset();
  FillingUnwritten filling(s);
  set_value(s, runtime::Client::get().from_host(host.data_ptr(), dt, dims, s.device));
}

StorageData& storage_of(const at::Tensor& t) {
  StorageData& s = storage_data(t);
  if (!s.pending.empty() || s.copy_of) apply_pending(s);
  return s;
}

ReadOfComputed::ReadOfComputed(std::initializer_list<std::reference_wrapper<const at::Tensor>> ts) {
  if (!deferring()) return;
  for (const at::Tensor& t : ts)
    if (t.defined() && t.is_privateuseone() && pending(storage_of(t).value)) return;
  now_.emplace();
}

Operand ready_value(const StorageData& s) {
  if (!s.value.buffer && s.value.slot && is_ready(s.value)) return Operand(resolve(s.value));
  return s.value;
}

// Copies of views of one source value (a buffer: values never change) into whole
// storages of its device, in the order queued.
struct ViewCopies {
  struct Copy {
    StorageData* dst;  // null once it no longer applies (overwritten or freed)
    ir::Geometry view;  // of the source, in elements of `src_dtype`
    DType src_dtype, dtype;  // dtype: the destination's
    ir::Shape sizes;   // the destination's (src broadcast to them)
    ir::Type result;   // the destination storage's value
    Operand offset;    // view's offset as an i64 operand (offset_is_operand), else empty
  };
  Operand source;
  int device = 0;
  bool done = false;
  std::vector<Copy> copies;
};

namespace {
std::recursive_mutex g_copies_mu;  // ViewCopies are shared by storages any thread may touch
std::weak_ptr<ViewCopies> g_open_copies;  // the group new copies of its source join

void run_copies(const std::shared_ptr<ViewCopies>& group) {
  std::vector<ViewCopies::Copy> live;
  for (const auto& c : group->copies)
    if (c.dst) live.push_back(c);
  group->done = true;
  for (const auto& c : live) c.dst->copy_of.reset();
  if (live.empty()) return;
  FillingUnwritten filling;  // destinations no op wrote yet get their first values
  for (const auto& c : live) filling.add(*c.dst);
  ir::Type srct = group->source.type();
  std::string key = "viewcopies*" + std::to_string(live.size()) + ":" + srct.str();
  std::vector<Operand> args{group->source};
  for (const auto& c : live) {
    ir::Geometry kg = c.view;
    if (c.offset) {
      kg.offset = -1;  // an operand: one program for every offset
      args.push_back(c.offset);
    }
    key += ";" + std::string(mlir_name(c.src_dtype)) + kg.key() + "->" + c.result.str() + "/" +
           mlir_name(c.dtype) + ir::Type{c.dtype, c.sizes}.str();
  }
  ProgramPtr program = internal_program(key, [&](ir::Builder& b) -> std::vector<ir::Value> {
    ir::Value src = b.param(srct);
    std::vector<ir::Value> res;
    for (const auto& c : live) {  // as dense_value, then assign() would
      ir::Value whole = reinterpret_bytes(b, src, c.src_dtype);
      ir::Value v = c.offset ? ir::read_view_at(b, whole, c.view, b.param(ir::Type{DType::I64, {}}))
                             : ir::read_view(b, whole, c.view);
      v = lowering::coerce(b, v, c.dtype, c.sizes);
      if (c.result.dtype != c.dtype) v = reinterpret_bytes(b, v, c.result.dtype);
      res.push_back(b.reshape(v, c.result.shape));
    }
    return res;
  });
  // The destinations' old values are not read (x[:] = 2): their buffers go first where
  // nothing else holds them, so the copies need one buffer of each storage, not two.
  std::vector<StorageData*> dsts;
  for (const auto& c : live) dsts.push_back(c.dst);
  runtime::ExecutablePtr exe = guarded([&] { return program->executable(); });
  std::vector<StorageData*> dropped = drop_overwritten(dsts, group->device, exe->output_bytes() + exe->temp_bytes());
  Results outs;
  try {
    outs = guarded([&] { return run(program, args, group->device); });
  } catch (const std::exception& e) {
    fail_overwrite(dropped, e);
    throw;
  }
  finish_overwrite(dropped);
  for (size_t i = 0; i < live.size(); ++i) set_value(*live[i].dst, std::move(outs[i]));
}
}  // namespace

AllocatingForValue::AllocatingForValue() { t_allocating_for_value += 1; }
AllocatingForValue::~AllocatingForValue() { t_allocating_for_value -= 1; }

// Counts the storage's bytes as unwritten while it holds no value.
static void recount_unwritten(StorageData& s) {
  // Unreadable (donated, failed): it will never hold a buffer, so nothing is counted.
  const int64_t counted = s.value || !s.unreadable.empty() ? 0 : static_cast<int64_t>(s.nbytes);
  if (counted == s.unwritten_bytes) return;
  runtime::Client::get().stats(s.device).unwritten_bytes += counted - s.unwritten_bytes;
  s.unwritten_bytes = counted;
}

void set_value(StorageData& s, Operand value) {
  s.value = std::move(value);
  recount_unwritten(s);
}

void FillingUnwritten::add(StorageData& s) {
  if (s.unwritten_bytes == 0) return;
  runtime::Client::get().stats(s.device).unwritten_bytes -= s.unwritten_bytes;
  s.unwritten_bytes = 0;
  storages_.push_back(&s);
}

FillingUnwritten::~FillingUnwritten() {
  for (StorageData* s : storages_) recount_unwritten(*s);
}

StorageData::~StorageData() {
  tag = 0;  // no longer a record
  if (unwritten_bytes) runtime::Client::get().stats(device).unwritten_bytes -= unwritten_bytes;
  if (!copy_of) return;
  std::lock_guard<std::recursive_mutex> lock(g_copies_mu);
  for (auto& c : copy_of->copies)
    if (c.dst == this) c.dst = nullptr;
}

bool covers_storage(const at::Tensor& dst) {
  StorageData& s = storage_data(dst);
  const ir::Type& st = s.pending.empty() ? storage_type(dst) : s.pending_type;
  return itemsize(st.dtype) == itemsize(device_dtype(dst.scalar_type(), "write")) && geometry_of(dst).covers(st.shape);
}

bool copy_view_later(const at::Tensor& dst, const at::Tensor& src) {
  if (deferring() || src.is_conj() || src.is_neg() || dst.is_conj() || dst.is_neg()) return false;
  if (device_index(src) != device_index(dst) || src.is_same(dst)) return false;
  StorageData& d = storage_data(dst);
  StorageData& s = storage_of(src);
  Operand sv = ready_value(s);
  if (!sv.buffer || &d == &s) return false;  // zeros, or pending: read now
  DType sdt = device_dtype(src.scalar_type(), "copy_"), dt = device_dtype(dst.scalar_type(), "copy_");
  ir::Geometry g = geometry_of(src), dg = geometry_of(dst);
  ir::Type st = s.value.type();
  if (st.dtype == sdt && g.covers(st.shape) && st.shape == g.sizes) return false;  // no read needed
  // Only copies that rewrite the whole destination storage: its old value is not needed.
  if (!d.pending.empty()) return false;
  ir::Type dt_st = d.copy_of ? ir::Type{} : storage_type(dst);
  if (d.copy_of) {
    for (const auto& c : d.copy_of->copies)
      if (c.dst == &d) dt_st = c.result;
  }
  if (!dg.covers(dt_st.shape) || itemsize(dt_st.dtype) != itemsize(dt)) return false;
  ir::Type result = dt_st.dtype == dt ? ir::Type{dt, dg.sizes} : dt_st;
  std::lock_guard<std::recursive_mutex> lock(g_copies_mu);
  if (d.copy_of) {  // overwritten before it ran
    for (auto& c : d.copy_of->copies)
      if (c.dst == &d) c.dst = nullptr;
    d.copy_of.reset();
  }
  std::shared_ptr<ViewCopies> group = g_open_copies.lock();
  if (!group || group->done || group->source.buffer != sv.buffer ||
      group->copies.size() >= 256) {
    group = std::make_shared<ViewCopies>();
    group->source = sv;
    group->device = s.device;
    g_open_copies = group;
  }
  group->copies.push_back({&d, g, sdt, dt, dg.sizes, result,
                           offset_is_operand(src) ? Operand(view_offset_operand(src)) : Operand()});
  d.copy_of = group;
  return true;
}

void apply_pending(StorageData& s) {
  if (s.copy_of) {
    std::shared_ptr<ViewCopies> group = s.copy_of;
    std::lock_guard<std::recursive_mutex> lock(g_copies_mu);
    if (!group->done) run_copies(group);
    s.copy_of.reset();
  }
  if (s.pending.empty()) return;
  std::vector<PendingWrite> writes;
  writes.swap(s.pending);  // taken first: nothing here sees them again
  const ir::Type st = s.pending_type;
  bool has = static_cast<bool>(s.value);
  std::vector<Operand> args;
  if (has) args.push_back(s.value);
  std::string key = "assign*" + std::to_string(writes.size()) + ":" + st.str() + (has ? "" : "z");
  // A write's offset into the storage is an operand as a read's is (a loop filling the
  // rows of an output: one program); the storage's bytes seen as the write's dtype.
  auto at_operand = [&](const PendingWrite& w) {
    return offset_is_operand(w.view, st.numel() * itemsize(st.dtype) / itemsize(w.dtype));
  };
  for (const PendingWrite& w : writes) {
    args.push_back(w.value);
    ir::Geometry kg = w.view;
    if (at_operand(w)) {
      kg.offset = -1;
      args.push_back(view_offset_operand(w.view.offset, s.device));
    }
    key += ";" + w.value.type().str() + "->" + mlir_name(w.dtype) + kg.key();
    if (w.from_view) {
      ir::Geometry sg = w.source_view;
      if (w.source_offset) {
        sg.offset = -1;  // an operand: one program for every offset
        args.push_back(w.source_offset);
      }
      key += std::string("<") + mlir_name(w.source_dtype) + sg.key();
    }
  }
  // The writes in their order, each as assign() would run it alone: the same bytes.
  ProgramPtr program = guarded([&] {
    return internal_program(key, [&](ir::Builder& b) -> std::vector<ir::Value> {
      ir::Value cur = has ? b.param(st) : lowering::constant_any(b, 0, st.dtype, st.shape);
      for (const PendingWrite& w : writes) {
        ir::Value v = b.param(w.value.type());
        std::optional<ir::Value> offset;
        if (at_operand(w)) offset = b.param(ir::Type{DType::I64, {}});
        if (w.from_view) {
          ir::Value whole = reinterpret_bytes(b, v, w.source_dtype);
          v = w.source_offset ? ir::read_view_at(b, whole, w.source_view, b.param(ir::Type{DType::I64, {}}))
                              : ir::read_view(b, whole, w.source_view);
        }
        v = lowering::coerce(b, v, w.dtype, w.view.sizes);
        cur = write_storage_view(b, cur, st, w.view, v, offset ? &*offset : nullptr);
      }
      return {cur};
    });
  });
  FillingUnwritten filling(s);  // its first value (the pending writes over zeros)
  // The old value rewritten in place where nothing else holds it (inplace_donation.h).
  Results out = guarded([&] {
    if (!has || deferring() || !eager_donation()) return run(program, args, s.device);
    StorageRewrite rewrite{0, 0, &s};
    bool donated = false;
    return run_rewriting(program, args, s.device, &rewrite, 1, &donated);
  });
  set_value(s, std::move(out[0]));
}

int device_index(const at::Tensor& t) { return t.device().has_index() ? t.device().index() : 0; }

void check_same_device(std::initializer_list<std::reference_wrapper<const at::Tensor>> ts) {
  std::optional<at::Device> tpu, other;
  for (const at::Tensor& t : ts) {
    if (!t.defined()) continue;
    if (t.device().type() != c10::DeviceType::PrivateUse1) {
      if (!other) other = t.device();
      continue;
    }
    at::Device d(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_index(t)));
    if (!tpu) tpu = d;
    else if (d != *tpu && !other) other = d;
  }
  TORCH_CHECK(!tpu || !other, "Expected all tensors to be on the same device, but found at least two devices, ",
              *tpu, " and ", *other, "!");
}

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

void check_readable(const StorageData& s) { TORCH_CHECK(s.unreadable.empty(), s.unreadable); }

void make_unreadable(StorageData& s, std::string why) {
  if (!s.pending.empty() || s.copy_of) apply_pending(s);  // queued copies may name it
  s.unreadable = std::move(why);  // first: an unreadable storage counts no bytes
  set_value(s, Operand());
  s.host_copy.reset();
}

Operand storage_value(const at::Tensor& t) {
  StorageData& s = storage_of(t);
  if (s.value) return s.value;
  check_readable(s);
  ir::Type ty = storage_type(t);
  FillingUnwritten filling(s);
  set_value(s, run_internal("zeros:" + ty.str(), [&](ir::Builder& b) -> std::vector<ir::Value> {
    return {lowering::constant_any(b, 0, ty.dtype, ty.shape)};
  }, {}, s.device)[0]);
  return s.value;
}

void start_from_zeros(c10::ArrayRef<at::Tensor> ts) {
  std::vector<StorageData*> fresh;
  std::vector<ir::Type> types;
  std::string key = "zeros";
  int device = -1;
  for (const at::Tensor& t : ts) {
    StorageData& s = storage_of(t);
    if (s.value || std::find(fresh.begin(), fresh.end(), &s) != fresh.end()) continue;
    check_readable(s);
    if (device >= 0 && s.device != device) {  // one program runs on one device
      storage_value(t);
      continue;
    }
    device = s.device;
    fresh.push_back(&s);
    types.push_back(storage_type(t));
    key += ":" + types.back().str();
  }
  if (fresh.empty()) return;
  FillingUnwritten filling;
  for (StorageData* s : fresh) filling.add(*s);
  Results zeros = run_internal(key, [&](ir::Builder& b) {
    std::vector<ir::Value> out;
    for (const ir::Type& ty : types) out.push_back(lowering::constant_any(b, 0, ty.dtype, ty.shape));
    return out;
  }, {}, device);
  for (size_t i = 0; i < fresh.size(); ++i) set_value(*fresh[i], zeros[i]);
}

runtime::BufferPtr materialized(const at::Tensor& t) {
  StorageData& s = storage_of(t);
  runtime::BufferPtr b = resolve(storage_value(t));
  set_value(s, b);  // forget the slot: the storage now holds the buffer itself
  return b;
}

bool offset_is_operand(const ir::Geometry& g, int64_t storage_numel) {
  if (g.offset < 0 || g.numel() == 0) return false;
  return g.offset > 0 || (g.is_contiguous() && g.numel() < storage_numel);
}

bool offset_is_operand(const at::Tensor& t, bool written) {
  if (t.numel() == 0 || t.storage_offset() < 0) return false;
  const StorageData& s = storage_data(t);
  if (!written) {
    bool made = s.value.buffer || (s.value.slot && !s.value.slot->producer);
    if (!made || !s.pending.empty() || s.copy_of) return false;
  }
  // As offset_is_operand(geometry_of(t), ...), without building the geometry: every
  // lowered op asks this of each operand.
  if (t.storage_offset() > 0) return true;
  if (t.numel() >= static_cast<int64_t>(s.nbytes) / t.element_size()) return false;
  int64_t expected = 1;
  for (int64_t i = t.dim() - 1; i >= 0; --i) {
    if (t.sizes()[i] == 1) continue;
    if (t.strides()[i] != expected) return false;
    expected *= t.sizes()[i];
  }
  return true;
}

std::string view_key(const at::Tensor& t) {
  return mlir_name(device_dtype(t.scalar_type(), "copy")) + geometry_of(t).key() + storage_type(t).str() +
         (storage_of(t).value ? "" : "z");
}

// A dense value holding exactly `t`'s values (its own storage's value when that fits).
Operand dense_value(const at::Tensor& t) {
  StorageData& s = storage_of(t);
  check_readable(s);
  DType dt = device_dtype(t.scalar_type(), "read");
  ir::Geometry g = geometry_of(t);
  ir::Type st = storage_type(t);
  if (s.value && st.dtype == dt && g.covers(st.shape) && st.shape == g.sizes) return s.value;
  bool has = static_cast<bool>(s.value);
  std::vector<Operand> args;
  if (has) args.push_back(s.value);
  // A schedule entry's cast (timesteps[i].float()) or a row block's copy: one program
  // for every offset, as the lowered ops read such views.
  bool at = has && offset_is_operand(t);
  ir::Geometry kg = g;
  if (at) {
    kg.offset = -1;
    args.push_back(view_offset_operand(t));
  }
  std::string key = "dense:" + std::string(mlir_name(dt)) + kg.key() + st.str() + (has ? "" : "z");
  return run_internal(key, [&](ir::Builder& b) -> std::vector<ir::Value> {
    ir::Value src = has ? b.param(st) : lowering::constant_any(b, 0, st.dtype, st.shape);
    if (src.dtype() != dt) src = reinterpret_bytes(b, src, dt);
    if (at) return {ir::read_view_at(b, src, g, b.param(ir::Type{DType::I64, {}}))};
    return {ir::read_view(b, src, g)};
  }, args, s.device)[0];
}

runtime::BufferPtr dense_buffer(const at::Tensor& t) { return resolve(dense_value(t)); }

at::Tensor wrap_value(Operand value, c10::ScalarType dtype, at::IntArrayRef sizes, int device) {
  // Every op's result comes here: the storage is made directly on `device`, holding the
  // value from the start (no device switch, allocator call or lookup of what it made).
  caffe2::TypeMeta meta = c10::scalarTypeToTypeMeta(dtype);
  size_t nbytes = static_cast<size_t>(c10::multiply_integers(sizes)) * meta.itemsize();
  c10::Device dev(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  auto* s = new StorageData{device, nbytes, std::move(value)};
  report_to_profiler(s, static_cast<int64_t>(nbytes));
  auto storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, c10::DataPtr(s, s, &delete_storage, dev), &g_allocator,
      /*resizable=*/true);
  constexpr c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), ks, meta);
  if (sizes.size() != 1 || sizes[0] != 0) t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

at::Tensor wrap_value(Operand value, c10::ScalarType dtype, at::IntArrayRef sizes, at::IntArrayRef strides,
                      int device) {
  // The allocator places the storage on the current device: switch only if it differs.
  std::optional<c10::DeviceGuard> guard;
  if (current_device() != device) guard.emplace(c10::Device(c10::DeviceType::PrivateUse1, device));
  constexpr c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  at::Tensor t = [&] {
    AllocatingForValue computed;
    return at::detail::empty_strided_generic(sizes, strides, &g_allocator, ks, dtype);
  }();
  set_value(storage_of(t), std::move(value));
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

ir::Value write_storage_view(ir::Builder& b, const ir::Value& cur, const ir::Type& st, const ir::Geometry& g,
                             const ir::Value& v, const ir::Value* offset) {
  ir::Value val = v.dtype() == DType::Bool && st.dtype != DType::Bool ? b.convert(v, DType::U8) : v;
  ir::Value as_dt = reinterpret_bytes(b, cur, val.dtype());
  ir::Value written = offset ? ir::write_view_at(b, as_dt, g, val, *offset)
                             : ir::write_view(b, &as_dt, as_dt.type, g, val);
  return as_storage(b, written, st);
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
