#include "runtime/client.h"
#include "runtime/pjrt_args.h"

#include <algorithm>

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "runtime/compile_clock.h"
#include "runtime/compile_options.h"
#include "runtime/plugin_search.h"

namespace tpu::runtime {
namespace {

int64_t micros_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
}

// A fixed-size array kept on the stack when small (an op's operands and results),
// so a launch allocates nothing for them.
template <typename T, size_t N = 8>
class InlineArray {
 public:
  InlineArray(size_t n, T fill) : n_(n) {
    if (n > N) heap_.assign(n, fill);
    else std::fill(small_, small_ + n, fill);
  }
  T* data() { return n_ > N ? heap_.data() : small_; }
  T& operator[](size_t i) { return data()[i]; }
  size_t size() const { return n_; }

 private:
  size_t n_;
  T small_[N];
  std::vector<T> heap_;
};

PJRT_Buffer_Type to_pjrt(DType t) {
  switch (t) {
    case DType::Bool: return PJRT_Buffer_Type_PRED;
    case DType::I8: return PJRT_Buffer_Type_S8;
    case DType::I16: return PJRT_Buffer_Type_S16;
    case DType::I32: return PJRT_Buffer_Type_S32;
    case DType::I64: return PJRT_Buffer_Type_S64;
    case DType::U8: return PJRT_Buffer_Type_U8;
    case DType::U16: return PJRT_Buffer_Type_U16;
    case DType::U32: return PJRT_Buffer_Type_U32;
    case DType::U64: return PJRT_Buffer_Type_U64;
    case DType::F16: return PJRT_Buffer_Type_F16;
    case DType::BF16: return PJRT_Buffer_Type_BF16;
    case DType::F32: return PJRT_Buffer_Type_F32;
    case DType::F64: return PJRT_Buffer_Type_F64;
    case DType::C64: return PJRT_Buffer_Type_C64;
    case DType::C128: return PJRT_Buffer_Type_C128;
    case DType::F8E4M3FN: return PJRT_Buffer_Type_F8E4M3FN;
    case DType::F8E5M2: return PJRT_Buffer_Type_F8E5M2;
    case DType::F8E4M3FNUZ: return PJRT_Buffer_Type_F8E4M3FNUZ;
    case DType::F8E5M2FNUZ: return PJRT_Buffer_Type_F8E5M2FNUZ;
    default: return PJRT_Buffer_Type_INVALID;
  }
}

DType from_pjrt(PJRT_Buffer_Type t) {
  switch (t) {
    case PJRT_Buffer_Type_PRED: return DType::Bool;
    case PJRT_Buffer_Type_S8: return DType::I8;
    case PJRT_Buffer_Type_S16: return DType::I16;
    case PJRT_Buffer_Type_S32: return DType::I32;
    case PJRT_Buffer_Type_S64: return DType::I64;
    case PJRT_Buffer_Type_U8: return DType::U8;
    case PJRT_Buffer_Type_U16: return DType::U16;
    case PJRT_Buffer_Type_U32: return DType::U32;
    case PJRT_Buffer_Type_U64: return DType::U64;
    case PJRT_Buffer_Type_F16: return DType::F16;
    case PJRT_Buffer_Type_BF16: return DType::BF16;
    case PJRT_Buffer_Type_F32: return DType::F32;
    case PJRT_Buffer_Type_F64: return DType::F64;
    case PJRT_Buffer_Type_C64: return DType::C64;
    case PJRT_Buffer_Type_C128: return DType::C128;
    case PJRT_Buffer_Type_F8E4M3FN: return DType::F8E4M3FN;
    case PJRT_Buffer_Type_F8E5M2: return DType::F8E5M2;
    case PJRT_Buffer_Type_F8E4M3FNUZ: return DType::F8E4M3FNUZ;
    case PJRT_Buffer_Type_F8E5M2FNUZ: return DType::F8E5M2FNUZ;
    default: return DType::Invalid;
  }
}


Client* g_client = nullptr;
std::mutex g_client_mu;
bool g_forked_after_init = false;

void on_fork_child() { g_forked_after_init = g_client != nullptr; }
const int g_atfork = pthread_atfork(nullptr, nullptr, &on_fork_child);

}  // namespace

DType dtype_from_pjrt(PJRT_Buffer_Type t) { return from_pjrt(t); }

void DeviceStats::bump_peak(int64_t bytes) {
  int64_t prev = peak_bytes.load();
  while (bytes > prev && !peak_bytes.compare_exchange_weak(prev, bytes)) {}
}

void DeviceStats::reset_accumulated() {
  num_allocs = 0;
  num_frees = 0;
  allocated_bytes = 0;
  freed_bytes = 0;
  num_ooms = 0;
}
void DeviceStats::reset_peaks() {
  peak_bytes = user_bytes();
  peak_buffers = live_buffers.load();
}

void DeviceStats::move_to_cache(int64_t bytes) {
  cache_bytes.fetch_add(bytes);
  cache_buffers.fetch_add(1);
  num_allocs.fetch_sub(1);
  allocated_bytes.fetch_sub(bytes);
  live_buffers.fetch_sub(1);
}

void DeviceStats::add(int64_t bytes) {
  live_bytes.fetch_add(bytes);
  int64_t now = user_bytes();
  if (bytes > 0) {
    num_allocs.fetch_add(1);
    allocated_bytes.fetch_add(bytes);
    bump_peak(now);
    int64_t n = live_buffers.fetch_add(1) + 1, prev = peak_buffers.load();
    while (n > prev && !peak_buffers.compare_exchange_weak(prev, n)) {}
  } else if (bytes < 0) {
    num_frees.fetch_add(1);
    freed_bytes.fetch_add(-bytes);
    live_buffers.fetch_sub(1);
  }
}

Buffer::Buffer(PJRT_Buffer* b, int device, DType dtype, std::vector<int64_t> dims)
    : buf_(b), device_(device), dtype_(dtype), dims_(std::move(dims)) {
  nbytes_ = numel() * itemsize(dtype_);
  Client::get().stats(device_).add(nbytes_);
}

int64_t Buffer::numel() const {
  int64_t n = 1;
  for (auto d : dims_) n *= d;
  return n;
}

Buffer::~Buffer() {
  if (!buf_ || g_forked_after_init) return;
  Client& c = Client::get();
  auto a = ARGS(PJRT_Buffer_Destroy_Args);
  a.buffer = buf_;
  PJRT_Error* err = c.api()->PJRT_Buffer_Destroy(&a);
  if (err) {
    auto d = ARGS(PJRT_Error_Destroy_Args);
    d.error = err;
    c.api()->PJRT_Error_Destroy(&d);
  }
  DeviceStats& st = c.stats(device_);
  if (donated_) return;  // its bytes left the counts at the launch that took it
  if (cached_) {
    st.live_bytes.fetch_sub(nbytes_);
    st.cache_bytes.fetch_sub(nbytes_);
    st.cache_buffers.fetch_sub(1);
  } else {
    st.add(-nbytes_);
  }
}

bool Buffer::is_deleted() const {
  Client& c = Client::get();
  auto a = ARGS(PJRT_Buffer_IsDeleted_Args);
  a.buffer = buf_;
  if (PJRT_Error* err = c.api()->PJRT_Buffer_IsDeleted(&a)) {
    auto d = ARGS(PJRT_Error_Destroy_Args);
    d.error = err;
    c.api()->PJRT_Error_Destroy(&d);
    return false;
  }
  return a.is_deleted;
}

void Buffer::mark_donated() {
  if (donated_ || cached_) return;
  donated_ = true;
  Client::get().stats(device_).add(-nbytes_);
}

void Buffer::mark_cached() {
  if (cached_) return;
  cached_ = true;
  Client::get().stats(device_).move_to_cache(nbytes_);
}

Executable::Executable(PJRT_LoadedExecutable* e, size_t num_outputs, int64_t temp_bytes,
                       int64_t output_bytes)
    : exe_(e), num_outputs_(num_outputs), temp_bytes_(temp_bytes), output_bytes_(output_bytes) {}

void Executable::set_output_types(std::vector<OutputType> types) const {
  std::lock_guard<std::mutex> lock(output_types_mu_);
  if (output_types_known_.load(std::memory_order_relaxed)) return;
  output_types_ = std::move(types);
  output_types_known_.store(true, std::memory_order_release);
}

Executable::~Executable() {
  if (!exe_ || !g_client || g_forked_after_init) return;
  auto a = ARGS(PJRT_LoadedExecutable_Destroy_Args);
  a.executable = exe_;
  g_client->check(g_client->api()->PJRT_LoadedExecutable_Destroy(&a), "destroy executable");
}

void Client::check(PJRT_Error* err, const std::string& what) const {
  if (!err) return;
  auto m = ARGS(PJRT_Error_Message_Args);
  m.error = err;
  api_->PJRT_Error_Message(&m);
  std::string msg(m.message, m.message_size);
  auto g = ARGS(PJRT_Error_GetCode_Args);
  g.error = err;
  int code = PJRT_Error_Code_UNKNOWN;
  if (!api_->PJRT_Error_GetCode(&g)) code = g.code;
  auto d = ARGS(PJRT_Error_Destroy_Args);
  d.error = err;
  api_->PJRT_Error_Destroy(&d);
  std::string full = what + ": " + msg;
  if (code == PJRT_Error_Code_RESOURCE_EXHAUSTED) throw OutOfMemory(full);
  throw Error(full, code);
}

bool Client::initialized() { return g_client != nullptr; }
bool Client::forked_after_init() { return g_forked_after_init; }

void Client::check_not_forked() {
  if (g_forked_after_init)
    throw Error(
        "Cannot re-initialize TPU in forked subprocess. To use TPU with multiprocessing, you "
        "must use the 'spawn' start method",
        PJRT_Error_Code_FAILED_PRECONDITION);
}

Client& Client::get() {
  check_not_forked();
  if (g_client) return *g_client;
  std::lock_guard<std::mutex> lock(g_client_mu);
  if (!g_client) g_client = new Client();  // lives for the process: buffers outlive statics
  return *g_client;
}

Client::Client() {
  std::string how;
  plugin_path_ = resolve_plugin_path(&how);
  if (plugin_path_.empty()) {
    throw Error(
        "torch_tpu: no PJRT plugin found. Install one into this environment: "
        "`pip install xla-cpu-pjrt` (XLA CPU), `pip install libtpu` (TPU), or set "
        "TPU_PJRT_PLUGIN=/path/to/plugin.so",
        PJRT_Error_Code_NOT_FOUND);
  }
  void* handle = dlopen(plugin_path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    throw Error("torch_tpu: cannot load PJRT plugin " + plugin_path_ + " (" + how + "): " +
                    dlerror(),
                PJRT_Error_Code_NOT_FOUND);
  }
  using GetApi = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetApi>(dlsym(handle, "GetPjrtApi"));
  if (!get_api) {
    throw Error("torch_tpu: " + plugin_path_ + " exports no GetPjrtApi; not a PJRT plugin",
                PJRT_Error_Code_NOT_FOUND);
  }
  api_ = get_api();
  if (api_->pjrt_api_version.major_version != PJRT_API_MAJOR) {
    throw Error("torch_tpu: PJRT plugin " + plugin_path_ + " speaks C API major version " +
                    std::to_string(api_->pjrt_api_version.major_version) + ", we were built for " +
                    std::to_string(PJRT_API_MAJOR),
                PJRT_Error_Code_FAILED_PRECONDITION);
  }
  auto init = ARGS(PJRT_Plugin_Initialize_Args);
  check(api_->PJRT_Plugin_Initialize(&init), "PJRT_Plugin_Initialize");

  // Options the XLA CPU plugin reads; other plugins ignore names they do not know.
  int64_t ndev = 1;
  if (const char* s = std::getenv("TPU_NUM_DEVICES")) ndev = std::max<int64_t>(1, std::atoll(s));
  std::vector<PJRT_NamedValue> opts;
  auto named = [&](const char* name) {
    PJRT_NamedValue v;
    std::memset(&v, 0, sizeof(v));
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = name;
    v.name_size = std::strlen(name);
    return v;
  };
  bool is_cpu_plugin = plugin_path_.find("cpu") != std::string::npos;
  if (is_cpu_plugin) {
    auto v = named("cpu_device_count");
    v.type = PJRT_NamedValue_kInt64;
    v.int64_value = ndev;
    v.value_size = 1;
    opts.push_back(v);
    auto a = named("asynchronous");
    a.type = PJRT_NamedValue_kBool;
    a.bool_value = true;
    a.value_size = 1;
    opts.push_back(a);
  }
  auto create = ARGS(PJRT_Client_Create_Args);
  create.create_options = opts.data();
  create.num_options = opts.size();
  check(api_->PJRT_Client_Create(&create), "PJRT_Client_Create");
  client_ = create.client;

  auto pn = ARGS(PJRT_Client_PlatformName_Args);
  pn.client = client_;
  check(api_->PJRT_Client_PlatformName(&pn), "PJRT_Client_PlatformName");
  platform_.assign(pn.platform_name, pn.platform_name_size);
  auto dev = ARGS(PJRT_Client_AddressableDevices_Args);
  dev.client = client_;
  check(api_->PJRT_Client_AddressableDevices(&dev), "PJRT_Client_AddressableDevices");
  for (size_t i = 0; i < dev.num_addressable_devices; ++i) {
    devices_.push_back(dev.addressable_devices[i]);
    stats_.push_back(std::make_unique<DeviceStats>());
  }
  if (devices_.empty()) throw Error("torch_tpu: the PJRT plugin exposes no devices", 5);
  // With one device, programs are bound to it: an executable that may run on any device
  // costs every launch a look at its compile options in the C API (about 8 % of a tiny
  // launch's execute on the XLA CPU plugin).
  portable_ = devices_.size() > 1;
  std::vector<CompileOverride> overrides;
  if (platform_ == "cpu") {
    const char* donate = std::getenv("TPU_FUSE_DONATE");
    donation_safe_ = donate != nullptr && std::string(donate) == "1";
    if (donation_safe_) overrides.push_back({"xla_cpu_use_xnnpack", false});
  }
  compile_options_ = portable_compile_options(CompileEffort::Full, overrides, portable_);
  compile_options_fast_ = portable_compile_options(CompileEffort::Fast, overrides, portable_);
  if (platform_ == "cpu" && cpu_small_program_elements() > 0) {
    auto small = overrides;
    small.push_back({"xla_cpu_use_fusion_emitters", false});
    compile_options_fast_small_ = portable_compile_options(CompileEffort::Fast, small, portable_);
    if (cpu_threaded_macs() > 0) {
      small.push_back({"xla_cpu_multi_thread_eigen", false});
      compile_options_fast_small_one_thread_ = portable_compile_options(CompileEffort::Fast, small, portable_);
    }
  }
  if (platform_ == "cpu" && cpu_threaded_macs() > 0) {
    overrides.push_back({"xla_cpu_multi_thread_eigen", false});
    compile_options_one_thread_ = portable_compile_options(CompileEffort::Full, overrides, portable_);
    compile_options_fast_one_thread_ = portable_compile_options(CompileEffort::Fast, overrides, portable_);
  }

  for (size_t i = 0; i < devices_.size(); ++i) capacity_.push_back(device_capacity(static_cast<int>(i)));
  device_limit_.assign(devices_.size(), 0);
}

int Client::global_device_count() const {
  auto a = ARGS(PJRT_Client_Devices_Args);
  a.client = client_;
  check(api_->PJRT_Client_Devices(&a), "PJRT_Client_Devices");
  return static_cast<int>(a.num_devices);
}

std::pair<int, int> Client::api_version() const {
  return {api_->pjrt_api_version.major_version, api_->pjrt_api_version.minor_version};
}

// Read once per device at start-up: the limit is checked on every launch.
int64_t Client::device_capacity(int device) const {
  if (const char* s = std::getenv("TPU_MEMORY_LIMIT")) {
    int64_t v = std::atoll(s);
    if (v > 0) return v;
  }
  auto a = ARGS(PJRT_Device_MemoryStats_Args);
  a.device = devices_.at(device);
  PJRT_Error* err = api_->PJRT_Device_MemoryStats(&a);
  if (!err && a.bytes_limit_is_set && a.bytes_limit > 0) return a.bytes_limit;
  if (err) {
    auto d = ARGS(PJRT_Error_Destroy_Args);
    d.error = err;
    api_->PJRT_Error_Destroy(&d);
  }
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
}

int64_t Client::memory_limit(int device) {
  if (memory_limit_override_ > 0) return memory_limit_override_;
  if (device_limit_.at(device) > 0) return device_limit_[device];
  return capacity_.at(device);
}

void Client::on_memory_pressure(std::function<void()> release) {
  std::lock_guard<std::mutex> lock(releasers_mu_);
  releasers_.push_back(std::move(release));
}

bool Client::over_limit(int device, int64_t extra, int64_t reserved) {
  return stats(device).allocated() + reserved + extra > memory_limit(device);
}

void Client::check_capacity(int device, int64_t extra, const std::string& what, int64_t reserved) {
  Client& c = *this;
  if (over_limit(device, extra, reserved) && stats(device).cache_bytes.load() > 0) {
    std::vector<std::function<void()>> releasers;
    {
      std::lock_guard<std::mutex> lock(releasers_mu_);
      releasers = releasers_;
    }
    for (auto& release : releasers) release();
  }
  int64_t limit = c.memory_limit(device);
  int64_t live = c.stats(device).allocated() + reserved;  // storages not written yet included
  if (live + extra > limit) {
    c.stats(device).num_ooms.fetch_add(1);
    // Worded as CUDA's ("... out of memory. Tried to allocate"), which tools match on
    // (accelerate's find_executable_batch_size).
    throw OutOfMemory("TPU out of memory. Tried to allocate " + std::to_string(extra) + " bytes on tpu:" +
                      std::to_string(device) + " in " + what + ", with " + std::to_string(live) +
                      " bytes in use and a limit of " + std::to_string(limit) + " bytes (torch_tpu)");
  }
}

static int64_t dense_bytes(DType dtype, const std::vector<int64_t>& dims) {
  int64_t n = itemsize(dtype);
  for (auto d : dims) n *= d;
  return n;
}

// The arguments of a host-to-device copy of a dense array, after the capacity check.
PJRT_Client_BufferFromHostBuffer_Args Client::host_copy_args(const void* data, DType dtype,
                                                             const std::vector<int64_t>& dims,
                                                             int device,
                                                             PJRT_HostBufferSemantics semantics) {
  check_capacity(device, dense_bytes(dtype, dims), "host-to-device copy");
  auto a = ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  a.client = client_;
  a.data = data;
  a.type = to_pjrt(dtype);
  a.dims = dims.data();
  a.num_dims = dims.size();
  a.host_buffer_semantics = semantics;
  a.device = devices_.at(device);
  return a;
}

BufferPtr Client::from_host(const void* data, DType dtype, const std::vector<int64_t>& dims,
                            int device) {
  const int64_t n = dense_bytes(dtype, dims);
  auto a = host_copy_args(data, dtype, dims, device, PJRT_HostBufferSemantics_kImmutableOnlyDuringCall);
  check(api_->PJRT_Client_BufferFromHostBuffer(&a), "host-to-device copy");
  if (a.done_with_host_buffer) await_event(a.done_with_host_buffer, "host-to-device copy");
  counters_.h2d_bytes += n;
  counters_.h2d_transfers += 1;
  return std::make_shared<Buffer>(a.buffer, device, dtype, dims);
}

BufferPtr Client::from_host_borrowed(const void* data, DType dtype, const std::vector<int64_t>& dims,
                                     int device, std::function<void()> release) {
  auto a = host_copy_args(data, dtype, dims, device, PJRT_HostBufferSemantics_kImmutableZeroCopy);
  const int64_t n = dense_bytes(dtype, dims);
  PJRT_Error* err = api_->PJRT_Client_BufferFromHostBuffer(&a);
  if (err) {
    release();
    check(err, "host-to-device copy");
  }
  if (!a.done_with_host_buffer) {
    release();
  } else {
    // The event outlives this call: its callback releases the memory, then destroys it.
    struct Pending {
      const PJRT_Api* api;
      PJRT_Event* event;
      std::function<void()> release;
    };
    auto* p = new Pending{api_, a.done_with_host_buffer, std::move(release)};
    auto on = ARGS(PJRT_Event_OnReady_Args);
    on.event = p->event;
    on.user_arg = p;
    on.callback = [](PJRT_Error* e, void* arg) {
      auto* p = static_cast<Pending*>(arg);
      if (e) {
        auto d = ARGS(PJRT_Error_Destroy_Args);
        d.error = e;
        p->api->PJRT_Error_Destroy(&d);
      }
      p->release();
      auto d = ARGS(PJRT_Event_Destroy_Args);
      d.event = p->event;
      p->api->PJRT_Event_Destroy(&d);
      delete p;
    };
    if (PJRT_Error* oe = api_->PJRT_Event_OnReady(&on)) {
      // No callback: wait here instead (the plugin then copied, or we keep `data` pinned).
      auto d = ARGS(PJRT_Error_Destroy_Args);
      d.error = oe;
      api_->PJRT_Error_Destroy(&d);
      std::unique_ptr<Pending> own(p);
      try {
        await_event(p->event, "host-to-device copy");
      } catch (...) {
        p->release();
        throw;
      }
      p->release();
    }
  }
  counters_.h2d_bytes += n;
  counters_.h2d_transfers += 1;
  return std::make_shared<Buffer>(a.buffer, device, dtype, dims);
}

void Client::to_host(const Buffer& b, void* dst, size_t nbytes) {
  auto a = ARGS(PJRT_Buffer_ToHostBuffer_Args);
  a.src = b.raw();
  a.dst = dst;
  a.dst_size = nbytes;
  std::string what = "device-to-host copy";
  if (b.producer) what += " of the result of " + *b.producer;
  check(api_->PJRT_Buffer_ToHostBuffer(&a), what);
  await_event(a.event, what);
  counters_.d2h_bytes += static_cast<int64_t>(nbytes);
  counters_.d2h_transfers += 1;
}

void Client::to_host_all(const std::vector<HostCopy>& copies) {
  std::vector<PJRT_Event*> events;
  PJRT_Error* failed = nullptr;
  std::string what = "device-to-host copy";
  for (const HostCopy& c : copies) {
    auto a = ARGS(PJRT_Buffer_ToHostBuffer_Args);
    a.src = c.buffer->raw();
    a.dst = c.dst;
    a.dst_size = c.nbytes;
    failed = api_->PJRT_Buffer_ToHostBuffer(&a);
    if (failed) {
      if (c.buffer->producer) what += " of the result of " + *c.buffer->producer;
      break;
    }
    events.push_back(a.event);
    counters_.d2h_bytes += static_cast<int64_t>(c.nbytes);
    counters_.d2h_transfers += 1;
  }
  // Every started copy is awaited (its destination must outlive it) before any error.
  std::exception_ptr first;
  for (PJRT_Event* ev : events) {
    try {
      await_event(ev, "device-to-host copy");
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  check(failed, what);
  if (first) std::rethrow_exception(first);
}

bool Client::to_host_range(const Buffer& b, void* dst, int64_t offset, int64_t size) {
  if (api_->struct_size <= offsetof(PJRT_Api, PJRT_Buffer_CopyRawToHost) ||
      !api_->PJRT_Buffer_CopyRawToHost || raw_copy_unsupported_.load())
    return false;
  // The XLA CPU plugin's raw copy reads the buffer's memory without waiting for the
  // program that writes it (and crashes while that memory is not allocated yet): wait.
  auto r = ARGS(PJRT_Buffer_ReadyEvent_Args);
  r.buffer = b.raw();
  check(api_->PJRT_Buffer_ReadyEvent(&r), "device-to-host copy");
  await_event(r.event, "device-to-host copy");
  auto a = ARGS(PJRT_Buffer_CopyRawToHost_Args);
  a.buffer = b.raw();
  a.dst = dst;
  a.offset = offset;
  a.transfer_size = size;
  if (PJRT_Error* err = api_->PJRT_Buffer_CopyRawToHost(&a)) {
    auto c = ARGS(PJRT_Error_GetCode_Args);
    c.error = err;
    api_->PJRT_Error_GetCode(&c);
    if (c.code == PJRT_Error_Code_UNIMPLEMENTED) {
      auto d = ARGS(PJRT_Error_Destroy_Args);
      d.error = err;
      api_->PJRT_Error_Destroy(&d);
      raw_copy_unsupported_ = true;
      return false;
    }
    check(err, "device-to-host copy");
  }
  if (a.event) await_event(a.event, "device-to-host copy");
  counters_.d2h_bytes += size;
  counters_.d2h_transfers += 1;
  return true;
}

BufferPtr Client::copy_to_device(const Buffer& b, int device) {
  check_capacity(device, b.nbytes(), "device-to-device copy");
  auto a = ARGS(PJRT_Buffer_CopyToDevice_Args);
  a.buffer = b.raw();
  a.dst_device = devices_.at(device);
  check(api_->PJRT_Buffer_CopyToDevice(&a), "device-to-device copy");
  counters_.d2d_transfers += 1;
  return std::make_shared<Buffer>(a.dst_buffer, device, b.dtype(), b.dims());
}

std::unique_ptr<PendingUpload> Client::upload_later(DType dtype, const std::vector<int64_t>& dims,
                                                   int device) {
  auto spec = ARGS(PJRT_ShapeSpec);
  spec.dims = dims.data();
  spec.num_dims = dims.size();
  spec.element_type = to_pjrt(dtype);
  auto mem = ARGS(PJRT_Device_DefaultMemory_Args);
  mem.device = devices_.at(device);
  check(api_->PJRT_Device_DefaultMemory(&mem), "PJRT_Device_DefaultMemory");
  auto a = ARGS(PJRT_Client_CreateBuffersForAsyncHostToDevice_Args);
  a.client = client_;
  a.shape_specs = &spec;
  a.num_shape_specs = 1;
  a.memory = mem.memory;
  check(api_->PJRT_Client_CreateBuffersForAsyncHostToDevice(&a), "asynchronous upload");
  auto r = ARGS(PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args);
  r.transfer_manager = a.transfer_manager;
  r.buffer_index = 0;
  check(api_->PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer(&r), "asynchronous upload");
  auto b = std::make_shared<Buffer>(r.buffer_out, device, dtype, dims);
  static const auto upload = std::make_shared<const std::string>("an asynchronous host-to-device upload");
  b->producer = upload;
  return std::make_unique<PendingUpload>(a.transfer_manager, std::move(b));
}

void PendingUpload::complete(const void* data, int64_t nbytes) {
  Client& c = Client::get();
  auto a = ARGS(PJRT_AsyncHostToDeviceTransferManager_TransferData_Args);
  a.transfer_manager = mgr_;
  a.data = data;
  a.transfer_size = nbytes;
  a.is_last_transfer = true;
  c.check(c.api()->PJRT_AsyncHostToDeviceTransferManager_TransferData(&a), "asynchronous upload");
  if (a.done_with_h2d_transfer) {
    auto w = ARGS(PJRT_Event_Await_Args);
    w.event = a.done_with_h2d_transfer;
    PJRT_Error* err = c.api()->PJRT_Event_Await(&w);
    auto d = ARGS(PJRT_Event_Destroy_Args);
    d.event = a.done_with_h2d_transfer;
    c.api()->PJRT_Event_Destroy(&d);
    c.check(err, "asynchronous upload");
  }
  c.counters().h2d_bytes += nbytes;
  c.counters().h2d_transfers += 1;
}

void PendingUpload::fail(const std::string& message) {
  Client& c = Client::get();
  auto a = ARGS(PJRT_AsyncHostToDeviceTransferManager_SetBufferError_Args);
  a.transfer_manager = mgr_;
  a.error_code = PJRT_Error_Code_INTERNAL;
  a.error_message = message.data();
  a.error_message_size = message.size();
  c.check(c.api()->PJRT_AsyncHostToDeviceTransferManager_SetBufferError(&a), "failing an upload");
}

PendingUpload::~PendingUpload() {
  auto a = ARGS(PJRT_AsyncHostToDeviceTransferManager_Destroy_Args);
  a.transfer_manager = mgr_;
  Client& c = Client::get();
  if (PJRT_Error* err = c.api()->PJRT_AsyncHostToDeviceTransferManager_Destroy(&a)) {
    auto d = ARGS(PJRT_Error_Destroy_Args);
    d.error = err;
    c.api()->PJRT_Error_Destroy(&d);
  }
}

std::vector<std::string> Client::memory_kinds(int device) const {
  auto a = ARGS(PJRT_Device_AddressableMemories_Args);
  a.device = devices_.at(device);
  check(api_->PJRT_Device_AddressableMemories(&a), "PJRT_Device_AddressableMemories");
  std::vector<std::string> kinds;
  for (size_t i = 0; i < a.num_memories; ++i) {
    auto k = ARGS(PJRT_Memory_Kind_Args);
    k.memory = a.memories[i];
    check(api_->PJRT_Memory_Kind(&k), "PJRT_Memory_Kind");
    kinds.emplace_back(k.kind, k.kind_size);
  }
  return kinds;
}

std::string Client::device_kind(int device) const {
  auto d = ARGS(PJRT_Device_GetDescription_Args);
  d.device = devices_.at(device);
  check(api_->PJRT_Device_GetDescription(&d), "PJRT_Device_GetDescription");
  auto k = ARGS(PJRT_DeviceDescription_Kind_Args);
  k.device_description = d.device_description;
  check(api_->PJRT_DeviceDescription_Kind(&k), "PJRT_DeviceDescription_Kind");
  return std::string(k.device_kind, k.device_kind_size);
}

// (Plugins older than the DmaMap entries have a shorter PJRT_Api: check its size.)
bool Client::dma_map(void* data, size_t size) {
  if (api_->struct_size < PJRT_STRUCT_SIZE(PJRT_Api, PJRT_Client_DmaMap) || !api_->PJRT_Client_DmaMap)
    return false;
  auto a = ARGS(PJRT_Client_DmaMap_Args);
  a.client = client_;
  a.data = data;
  a.size = size;
  PJRT_Error* err = api_->PJRT_Client_DmaMap(&a);
  if (!err) return true;
  auto d = ARGS(PJRT_Error_Destroy_Args);
  d.error = err;
  api_->PJRT_Error_Destroy(&d);
  return false;
}

void Client::dma_unmap(void* data) {
  auto a = ARGS(PJRT_Client_DmaUnmap_Args);
  a.client = client_;
  a.data = data;
  PJRT_Error* err = api_->PJRT_Client_DmaUnmap(&a);
  if (err) {
    auto d = ARGS(PJRT_Error_Destroy_Args);
    d.error = err;
    api_->PJRT_Error_Destroy(&d);
  }
}

void Client::await_event(PJRT_Event* ev, const std::string& what) {
  auto a = ARGS(PJRT_Event_Await_Args);
  a.event = ev;
  PJRT_Error* err = api_->PJRT_Event_Await(&a);
  auto d = ARGS(PJRT_Event_Destroy_Args);
  d.event = ev;
  api_->PJRT_Event_Destroy(&d);
  check(err, what);
}

const std::string& Client::compile_options_for(CompileEffort effort, const ProgramTraits& traits) const {
  bool one_thread = !compile_options_one_thread_.empty() && !traits.fused_graph &&
                    traits.largest_contraction_macs >= 0 && traits.largest_contraction_macs < cpu_threaded_macs();
  bool fast = effort == CompileEffort::Fast && !fast_rejected_;
  bool small = fast && !compile_options_fast_small_.empty() && traits.largest_tensor_elements >= 0 &&
               traits.largest_tensor_elements <= cpu_small_program_elements() && !traits.uses_float8;
  if (small) return one_thread ? compile_options_fast_small_one_thread_ : compile_options_fast_small_;
  if (one_thread) return fast ? compile_options_fast_one_thread_ : compile_options_one_thread_;
  return fast ? compile_options_fast_ : compile_options_;
}

ExecutablePtr Client::compile(const std::string& mlir, const std::string& name,
                              CompileEffort effort, const ProgramTraits& traits) {
  auto t0 = std::chrono::steady_clock::now();
  CompileClock::Span compiling;
  const std::string& full = compile_options_for(CompileEffort::Full, traits);
  const std::string& fast = compile_options_for(CompileEffort::Fast, traits);
  static const char kFormat[] = "mlir";
  auto prog = ARGS(PJRT_Program);
  prog.code = const_cast<char*>(mlir.data());
  prog.code_size = mlir.size();
  prog.format = kFormat;
  prog.format_size = 4;
  auto a = ARGS(PJRT_Client_Compile_Args);
  a.client = client_;
  a.program = &prog;
  bool use_fast = effort == CompileEffort::Fast && fast != full && !fast_rejected_;
  const std::string& options = use_fast ? fast : full;
  a.compile_options = options.data();
  a.compile_options_size = options.size();
  PJRT_Error* err = api_->PJRT_Client_Compile(&a);
  if (err && use_fast) {
    // A plugin that does not know the Fast option: compile as Full; if that works,
    // the option was the problem, so stop asking for it.
    auto d = ARGS(PJRT_Error_Destroy_Args);
    d.error = err;
    api_->PJRT_Error_Destroy(&d);
    a.compile_options = full.data();
    a.compile_options_size = full.size();
    check(api_->PJRT_Client_Compile(&a), "compiling " + name);
    fast_rejected_ = true;
  } else {
    check(err, "compiling " + name);
  }
  ExecutablePtr exe = wrap_loaded(a.executable, name);
  counters_.compiles += 1;
  counters_.compile_us += micros_since(t0);
  return exe;
}

// Owns `loaded` and reads what launches need to know: output count, memory sizes.
ExecutablePtr Client::wrap_loaded(PJRT_LoadedExecutable* loaded, const std::string& name) {
  auto ge = ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  ge.loaded_executable = loaded;
  check(api_->PJRT_LoadedExecutable_GetExecutable(&ge), "GetExecutable");
  auto no = ARGS(PJRT_Executable_NumOutputs_Args);
  no.executable = ge.executable;
  check(api_->PJRT_Executable_NumOutputs(&no), "NumOutputs");
  int64_t temp = 0, out_bytes = 0, alias = 0;
  auto ms = ARGS(PJRT_Executable_GetCompiledMemoryStats_Args);
  ms.executable = ge.executable;
  if (PJRT_Error* err = api_->PJRT_Executable_GetCompiledMemoryStats(&ms)) {
    auto d = ARGS(PJRT_Error_Destroy_Args);
    d.error = err;
    api_->PJRT_Error_Destroy(&d);
  } else {
    temp = ms.temp_size_in_bytes;
    out_bytes = ms.output_size_in_bytes;
    alias = ms.alias_size_in_bytes;
  }
  auto de = ARGS(PJRT_Executable_Destroy_Args);
  de.executable = ge.executable;
  check(api_->PJRT_Executable_Destroy(&de), "Executable_Destroy");
  auto exe = std::make_shared<Executable>(loaded, no.num_outputs, temp, out_bytes);
  exe->alias_bytes = alias;
  exe->name = name;
  return exe;
}

std::string Client::serialize(const Executable& exe) {
  auto ge = ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  ge.loaded_executable = exe.raw();
  check(api_->PJRT_LoadedExecutable_GetExecutable(&ge), "GetExecutable");
  auto s = ARGS(PJRT_Executable_Serialize_Args);
  s.executable = ge.executable;
  PJRT_Error* err = api_->PJRT_Executable_Serialize(&s);
  std::string bytes;
  if (!err) {
    bytes.assign(s.serialized_bytes, s.serialized_bytes_size);
    if (s.serialized_executable_deleter) s.serialized_executable_deleter(s.serialized_executable);
  }
  auto de = ARGS(PJRT_Executable_Destroy_Args);
  de.executable = ge.executable;
  api_->PJRT_Executable_Destroy(&de);
  check(err, "serializing " + exe.name);
  return bytes;
}

ExecutablePtr Client::deserialize(const std::string& bytes, const std::string& name) {
  auto t0 = std::chrono::steady_clock::now();
  auto a = ARGS(PJRT_Executable_DeserializeAndLoad_Args);
  a.client = client_;
  a.serialized_executable = bytes.data();
  a.serialized_executable_size = bytes.size();
  check(api_->PJRT_Executable_DeserializeAndLoad(&a), "loading the cached executable of " + name);
  ExecutablePtr exe = wrap_loaded(a.loaded_executable, name);
  counters_.load_us += micros_since(t0);
  return exe;
}

std::vector<BufferPtr> Client::execute(const Executable& exe, const std::vector<Buffer*>& args,
                                       int device, bool wait, const std::vector<bool>& donate,
                                       const std::string& what) {
  // Executables are shared by identical programs: name the caller's op in errors.
  const std::string& name = what.empty() ? exe.name : what;
  if (has_deferred_error_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (!deferred_error_.empty()) {
      std::string e = std::move(deferred_error_);
      deferred_error_.clear();
      has_deferred_error_ = false;
      throw Error(e, PJRT_Error_Code_INTERNAL);
    }
  }
  // Outputs aliased to donated inputs take no new memory.
  bool donating = std::find(donate.begin(), donate.end(), true) != donate.end();
  int64_t fresh = exe.output_bytes() + exe.temp_bytes() - (donating ? exe.alias_bytes : 0);
  check_capacity(device, fresh, name);
  DeviceStats& st = stats(device);
  st.bump_peak(st.user_bytes() + fresh);

  InlineArray<PJRT_Buffer*> raw(args.size(), nullptr);
  for (size_t i = 0; i < args.size(); ++i) raw[i] = args[i]->raw();
  InlineArray<int64_t> keep(args.size(), 0);  // inputs the program may not reuse
  size_t num_keep = 0;
  for (size_t i = 0; i < args.size(); ++i)
    if (i >= donate.size() || !donate[i]) keep[num_keep++] = static_cast<int64_t>(i);
  InlineArray<PJRT_Buffer*> outs(exe.num_outputs(), nullptr);
  PJRT_Buffer* const* arg_lists[1] = {raw.data()};
  PJRT_Buffer** out_lists[1] = {outs.data()};
  PJRT_Event* done[1] = {nullptr};

  auto opts = ARGS(PJRT_ExecuteOptions);
  opts.non_donatable_input_indices = keep.data();
  opts.num_non_donatable_input_indices = num_keep;
  auto a = ARGS(PJRT_LoadedExecutable_Execute_Args);
  a.executable = exe.raw();
  a.options = &opts;
  a.argument_lists = arg_lists;
  a.num_devices = 1;
  a.num_args = raw.size();
  a.output_lists = out_lists;
  a.device_complete_events = done;
  a.execute_device = portable_ ? devices_.at(device) : nullptr;
  // Messages are built only on failure: this is every op's path.
  if (PJRT_Error* e = api_->PJRT_LoadedExecutable_Execute(&a)) check(e, "executing " + name);
  counters_.executions += 1;
  // A donated input the program took is its aliased output's memory now: uncounted before
  // the outputs are, so the peak sees one buffer, not both.
  if (donating)
    for (size_t i = 0; i < args.size() && i < donate.size(); ++i)
      if (donate[i] && args[i]->is_deleted()) args[i]->mark_donated();

  // A chain of launches of one op names it once (a per-thread last-used copy).
  thread_local std::shared_ptr<const std::string> last_name;
  if (!last_name || *last_name != name) last_name = std::make_shared<const std::string>(name);
  std::shared_ptr<const std::string> shared_name = last_name;
  std::vector<BufferPtr> result;
  result.reserve(outs.size());
  if (const std::vector<Executable::OutputType>* known = exe.output_types()) {
    for (size_t i = 0; i < outs.size(); ++i) {
      auto b = std::make_shared<Buffer>(outs[i], device, (*known)[i].dtype, (*known)[i].dims);
      b->producer = shared_name;
      result.push_back(std::move(b));
    }
  } else {
    std::vector<Executable::OutputType> types;
    for (size_t i = 0; i < outs.size(); ++i) {
      PJRT_Buffer* o = outs[i];
      auto et = ARGS(PJRT_Buffer_ElementType_Args);
      et.buffer = o;
      if (PJRT_Error* e = api_->PJRT_Buffer_ElementType(&et)) check(e, "Buffer_ElementType");
      auto dm = ARGS(PJRT_Buffer_Dimensions_Args);
      dm.buffer = o;
      if (PJRT_Error* e = api_->PJRT_Buffer_Dimensions(&dm)) check(e, "Buffer_Dimensions");
      types.push_back({from_pjrt(et.type), std::vector<int64_t>(dm.dims, dm.dims + dm.num_dims)});
      auto b = std::make_shared<Buffer>(o, device, types.back().dtype, types.back().dims);
      b->producer = shared_name;
      result.push_back(std::move(b));
    }
    exe.set_output_types(std::move(types));
  }
  if (tracing_.load(std::memory_order_relaxed)) trace_launch(exe, args, result, device);
  if (done[0]) {
    if (wait) await_event(done[0], "executing " + name);
    else track_event(done[0], device, std::move(shared_name));
  }
  return result;
}

void Client::start_launch_trace() {
  std::lock_guard<std::mutex> lock(trace_mu_);
  trace_.clear();
  tracing_ = true;
}

std::vector<TracedLaunch> Client::take_launch_trace() {
  std::lock_guard<std::mutex> lock(trace_mu_);
  tracing_ = false;
  return std::move(trace_);
}

void Client::trace_launch(const Executable& exe, const std::vector<Buffer*>& args,
                          const std::vector<BufferPtr>& outs, int device) {
  TracedLaunch t{exe.shared_from_this(), {}, outs, device};
  for (Buffer* a : args) t.args.push_back(a->shared_from_this());
  std::lock_guard<std::mutex> lock(trace_mu_);
  if (tracing_) trace_.push_back(std::move(t));
}

void Client::track_event(PJRT_Event* ev, int device, std::shared_ptr<const std::string> op) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  pending_.push_back({ev, device, std::move(op)});
  // Dropping finished events scans them all: while launches run ahead of the device,
  // the next scan waits until the list has doubled (amortized O(1) per launch).
  if (pending_.size() >= reap_at_) {
    reap(false, -1);
    reap_at_ = std::max<size_t>(256, 2 * pending_.size());
  }
}

// Drops finished events (all of `device`'s, waiting, when `all`), keeping the first error.
void Client::reap(bool all, int device) {
  size_t kept = 0;  // compacted in place: the vector keeps its capacity
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    bool mine = device < 0 || p.device == device;
    if (!all || !mine) {
      auto r = ARGS(PJRT_Event_IsReady_Args);
      r.event = p.event;
      bool ready = !api_->PJRT_Event_IsReady(&r) && r.is_ready;
      if (!ready) {
        if (kept != i) pending_[kept] = std::move(p);
        ++kept;
        continue;
      }
    }
    auto w = ARGS(PJRT_Event_Await_Args);
    w.event = p.event;
    PJRT_Error* err = api_->PJRT_Event_Await(&w);
    if (err) {
      try {
        check(err, "asynchronous execution of " + (p.op ? *p.op : std::string("a program")));
      } catch (const Error& e) {
        if (deferred_error_.empty()) {
          deferred_error_ = e.what();
          has_deferred_error_ = true;
        }
      }
    }
    auto d = ARGS(PJRT_Event_Destroy_Args);
    d.event = p.event;
    api_->PJRT_Event_Destroy(&d);
  }
  pending_.resize(kept);
}

bool Client::is_idle(int device) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  reap(false, device);
  for (auto& p : pending_)
    if (p.device == device) return false;
  return true;
}

void Client::synchronize(int device) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  reap(true, device);
  reap_at_ = std::max<size_t>(256, 2 * pending_.size());
  if (!deferred_error_.empty()) {
    std::string e = std::move(deferred_error_);
    deferred_error_.clear();
    has_deferred_error_ = false;
    throw Error(e, PJRT_Error_Code_INTERNAL);
  }
}

}  // namespace tpu::runtime
