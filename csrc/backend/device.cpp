#include "backend/device.h"
#include "backend/deferred.h"
#include "backend/device_checks.h"

#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <random>

#include "backend/pinned.h"
#include "backend/storage.h"
#include "backend/streams.h"
#include "runtime/client.h"

namespace tpu::backend {

static thread_local int t_device = 0;

int device_count() {
  static int n = [] {
    try {
      return runtime::Client::get().device_count();
    } catch (const std::exception&) {
      return 0;
    }
  }();
  return n;
}

int current_device() { return t_device; }

void check_device(int d) {
  if (d < 0) return;
  int n = device_count();
  if (n == 0) runtime::Client::get();  // raises the plugin's own error
  TORCH_CHECK(d < n, "tpu:", d, " does not exist: this process has ", n,
              " tpu device(s) (set TPU_NUM_DEVICES before the first use to expose more on the "
              "CPU plugin)");
}

void set_current_device(int d) {
  check_device(d);
  t_device = d;
}

namespace {

using c10::DeviceType;

struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (d.index() != old.index()) set_current_device(d.index());
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(DeviceType::PrivateUse1, t_device); }
  void setDevice(c10::Device d) const override { set_current_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { t_device = d.index(); }
  c10::Stream getStream(c10::Device d) const override { return current_stream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override {
    if (!d.has_index()) d = getDevice();
    return default_stream(d.index());
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return exchange_stream(s); }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  // Streams and events: backend/streams.cpp (every stream is the device's one queue).
  c10::Stream getNewStream(c10::Device d, int) const override { return new_stream(d.index()); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return new_stream(d.index());
  }
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex,
              const c10::EventFlag flag) const override {
    record_event(event, s, flag);
  }
  void block(void*, const c10::Stream&) const override {}  // same queue: already ordered
  bool queryEvent(void* event) const override { return query_event(event); }
  void synchronizeEvent(void* event) const override { synchronize_event(event); }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    destroy_event(event);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    return elapsed_ms(start, end);
  }
  bool queryStream(const c10::Stream& s) const override {  // as an event recorded now
    flush("stream query");
    return all_launched() && runtime::Client::get().is_idle(s.device_index());
  }
  void synchronizeStream(const c10::Stream& s) const override {
    flush("synchronize");
    wait_launched();
    runtime::Client::get().synchronize(s.device_index());
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override {
    flush("synchronize");
    wait_launched();
    runtime::Client::get().synchronize(d);
    verify_device_checks(d);
  }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

constexpr uint64_t kDefaultSeed = 67280421310721ULL;

class TpuGenerator : public c10::GeneratorImpl {
 public:
  explicit TpuGenerator(c10::DeviceIndex d)
      : c10::GeneratorImpl(c10::Device(DeviceType::PrivateUse1, d),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    counter_ = 0;
  }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    std::random_device rd;
    set_current_seed((static_cast<uint64_t>(rd()) << 32) | rd());
    return seed_;
  }
  void set_offset(uint64_t offset) override { counter_ = offset; }
  uint64_t get_offset() const override { return counter_; }
  // State: 16 bytes, seed then counter, as a CPU uint8 tensor.
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    uint64_t v[2] = {seed_, counter_};
    std::memcpy(t.data_ptr(), v, 16);
    return t.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& s) override {
    // CPU's and CUDA's checks: a state on the device would be read as its storage handle.
    TORCH_CHECK_TYPE(s.layout() == at::kStrided && s.device_type() == c10::DeviceType::CPU && s.dtype() == at::kByte,
                     "RNG state must be a torch.ByteTensor");
    TORCH_CHECK(s.is_contiguous(), "RNG state must be contiguous");
    TORCH_CHECK(s.numel() == 16, "tpu generator state must be 16 uint8 values, got ", s.numel());
    uint64_t v[2];
    std::memcpy(v, s.data(), 16);
    seed_ = v[0];
    counter_ = v[1];
  }
  std::pair<uint64_t, uint64_t> next() { return {seed_, counter_++}; }
  static c10::DeviceType device_type() { return DeviceType::PrivateUse1; }

 private:
  TpuGenerator* clone_impl() const override {
    auto* g = new TpuGenerator(device().index());
    g->seed_ = seed_;
    g->counter_ = counter_;
    return g;
  }
  uint64_t seed_ = kDefaultSeed;
  uint64_t counter_ = 0;
};

std::vector<at::Generator>& generators() {
  static std::vector<at::Generator> gens = [] {
    std::vector<at::Generator> g;
    for (int i = 0; i < std::max(device_count(), 1); ++i)
      g.push_back(at::make_generator<TpuGenerator>(static_cast<c10::DeviceIndex>(i)));
    return g;
  }();
  return gens;
}

struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    return default_generator(d < 0 ? t_device : d);
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    if (d >= 0) check_device(d);
    return at::make_generator<TpuGenerator>(d < 0 ? static_cast<c10::DeviceIndex>(t_device) : d);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    // Our data pointers are the storages' promises themselves.
    return at::Device(DeviceType::PrivateUse1, static_cast<StorageData*>(data)->device);
  }
  bool isPinnedPtr(const void* p) const override { return is_pinned_ptr(p); }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(device_count()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return static_cast<c10::DeviceIndex>(t_device); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = t_device;
    set_current_device(d);
    return static_cast<c10::DeviceIndex>(old);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  // untyped_storage().resize_(n): FSDP2 frees an unsharded parameter's memory (to 0
  // bytes) and later allocates it again before writing it. Either way the storage is
  // fresh (unwritten); keeping values across other sizes is not supported.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    size_t old = storage.nbytes();
    if (old == nbytes) return;
    TORCH_CHECK(old == 0 || nbytes == 0, "untyped_storage().resize_(): a tpu storage resizes "
                "in place only to or from 0 bytes (free, then allocate again); got ", old,
                " -> ", nbytes, " bytes");
    c10::DeviceGuard guard(storage.device());
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(tpu_allocator()->allocate(nbytes));
    impl->set_nbytes(nbytes);
  }
};

}  // namespace

const at::Generator& default_generator(int device) {
  check_device(device);
  return generators().at(device);
}

std::pair<uint64_t, uint64_t> next_rng_state(const std::optional<at::Generator>& gen, int device) {
  at::Generator g = gen.has_value() && gen->defined() ? *gen : default_generator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  return at::check_generator<TpuGenerator>(g)->next();
}

void register_device_hooks() {
  static bool done = [] {
    at::RegisterPrivateUse1HooksInterface(new TpuHooks());
    return true;
  }();
  (void)done;
}

}  // namespace tpu::backend
