// PJRT runtime: plugin, client, devices, buffers, executables, events.
// This layer knows nothing of PyTorch; it speaks only the PJRT C API.
#pragma once
#include <pjrt_c_api.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/compile_options.h"
#include "runtime/dtype.h"

namespace tpu::runtime {

// A PJRT error carried as an exception with the plugin's message and code.
class Error : public std::runtime_error {
 public:
  Error(const std::string& msg, int code) : std::runtime_error(msg), code_(code) {}
  int code() const { return code_; }
 private:
  int code_;
};

// Raised when an allocation or execution would exceed the device's memory.
class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(const std::string& msg) : Error(msg, PJRT_Error_Code_RESOURCE_EXHAUSTED) {}
};

class Client;

// A PJRT element type as ours (DType::Invalid when we have none).
DType dtype_from_pjrt(PJRT_Buffer_Type t);

// Per-device counters; memory figures are live device-buffer bytes we own. Buffers held
// by the runtime's own caches (cached scalars) count towards the capacity (live_bytes)
// but not as allocations: user_bytes(), the peaks and the counts are the user's tensors,
// as CUDA's memory_allocated() returns to its baseline once every tensor is freed.
struct DeviceStats {
  std::atomic<int64_t> live_bytes{0};
  std::atomic<int64_t> cache_bytes{0};  // part of live_bytes held by runtime caches
  std::atomic<int64_t> cache_buffers{0};
  std::atomic<int64_t> peak_bytes{0};
  std::atomic<int64_t> num_allocs{0};
  std::atomic<int64_t> num_frees{0};
  std::atomic<int64_t> live_buffers{0};
  std::atomic<int64_t> peak_buffers{0};
  std::atomic<int64_t> allocated_bytes{0};  // accumulated since the last reset
  std::atomic<int64_t> freed_bytes{0};
  std::atomic<int64_t> num_ooms{0};  // allocations refused for the limit
  // Storages no op has written yet (`empty`, zeros): their buffers are made lazily, but
  // their bytes count as allocated from the start, as CUDA's (backend/storage.cpp).
  std::atomic<int64_t> unwritten_bytes{0};
  int64_t allocated() const { return live_bytes.load() + unwritten_bytes.load(); }
  void add(int64_t bytes);
  void reset_accumulated();  // counts and byte totals since the last reset
  void reset_peaks();
  void bump_peak(int64_t bytes);
  // The user's tensors, written or not: memory_allocated() (allocated() is the capacity's
  // figure, runtime caches included).
  int64_t user_bytes() const { return live_bytes.load() - cache_bytes.load() + unwritten_bytes.load(); }
  // Moves a just-made buffer of `bytes` from the user's figures to the cache's.
  void move_to_cache(int64_t bytes);
};

struct Counters {
  std::atomic<int64_t> compiles{0};
  std::atomic<int64_t> compile_us{0};
  std::atomic<int64_t> load_us{0};  // deserializing cached executables
  std::atomic<int64_t> executions{0};
  std::atomic<int64_t> h2d_bytes{0};
  std::atomic<int64_t> h2d_transfers{0};
  std::atomic<int64_t> d2h_bytes{0};
  std::atomic<int64_t> d2h_transfers{0};
  std::atomic<int64_t> d2d_transfers{0};
};

// An owned device buffer. Destroying it frees device memory. Always held by a BufferPtr
// (a launch trace keeps the ones it names alive).
class Buffer : public std::enable_shared_from_this<Buffer> {
 public:
  Buffer(PJRT_Buffer* b, int device, DType dtype, std::vector<int64_t> dims);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  PJRT_Buffer* raw() const { return buf_; }
  int device() const { return device_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t nbytes() const { return nbytes_; }
  int64_t numel() const;
  // The op that produced this buffer, named in asynchronous error messages (shared:
  // every output of a launch names the same op, and copying the text per buffer costs
  // more than the launch's own bookkeeping).
  std::shared_ptr<const std::string> producer;
  // A read-only value shared by many operands (a cached scalar): a fused graph takes each
  // use as a parameter of its own, so that two operands that happen to be equal do not
  // change the graph's wiring (and compile it again).
  bool shared_constant = false;
  // Held by a runtime cache: counted in the capacity, not in memory_allocated().
  void mark_cached();
  // True once the plugin deleted it: a launch took it as a donated input.
  bool is_deleted() const;
  // A launch reused its memory for an output: its bytes are that output's from now on,
  // so it is no longer counted (nor again when it is destroyed).
  void mark_donated();
  bool donated() const { return donated_; }
 private:
  bool cached_ = false;
  bool donated_ = false;
  PJRT_Buffer* buf_;
  int device_;
  DType dtype_;
  std::vector<int64_t> dims_;
  int64_t nbytes_;
};
using BufferPtr = std::shared_ptr<Buffer>;

class Executable : public std::enable_shared_from_this<Executable> {
 public:
  Executable(PJRT_LoadedExecutable* e, size_t num_outputs, int64_t temp_bytes, int64_t output_bytes);
  ~Executable();
  PJRT_LoadedExecutable* raw() const { return exe_; }
  size_t num_outputs() const { return num_outputs_; }
  int64_t temp_bytes() const { return temp_bytes_; }
  int64_t output_bytes() const { return output_bytes_; }
  std::string name;  // what it computes, for errors
  int64_t alias_bytes = 0;  // outputs that reuse donated inputs' memory
  // Each output's element type and dimensions, read from the first execution's buffers
  // (shapes are static): later launches ask the plugin nothing per output.
  struct OutputType {
    DType dtype;
    std::vector<int64_t> dims;
  };
  const std::vector<OutputType>* output_types() const {
    return output_types_known_.load(std::memory_order_acquire) ? &output_types_ : nullptr;
  }
  void set_output_types(std::vector<OutputType> types) const;
 private:
  PJRT_LoadedExecutable* exe_;
  size_t num_outputs_;
  int64_t temp_bytes_;
  int64_t output_bytes_;
  mutable std::mutex output_types_mu_;
  mutable std::vector<OutputType> output_types_;  // written once, before the flag
  mutable std::atomic<bool> output_types_known_{false};
};
using ExecutablePtr = std::shared_ptr<Executable>;

// One launch as execute() saw it, kept by a launch trace: its program, inputs and outputs
// (held, so no buffer of the trace is freed and its address reused while it is kept).
struct TracedLaunch {
  std::shared_ptr<const Executable> exe;
  std::vector<BufferPtr> args;
  std::vector<BufferPtr> outs;
  int device;
};

// A buffer whose contents arrive later (an asynchronous host-to-device upload).
// Programs can consume `buffer()` at once; they run when the data lands, and fail
// asynchronously if the upload fails.
class PendingUpload {
 public:
  PendingUpload(PJRT_AsyncHostToDeviceTransferManager* m, BufferPtr b) : mgr_(m), buf_(std::move(b)) {}
  ~PendingUpload();
  const BufferPtr& buffer() const { return buf_; }
  void complete(const void* data, int64_t nbytes);
  void fail(const std::string& message);
 private:
  PJRT_AsyncHostToDeviceTransferManager* mgr_;
  BufferPtr buf_;
};

class Client {
 public:
  // The process-wide client, created on first use from the chosen plugin.
  static Client& get();
  static bool initialized();
  // True in a child forked after the client started: it holds a copy of the client
  // without its threads or device connection, so get() refuses (as CUDA does) and
  // buffers the child inherited are left alone rather than freed.
  static bool forked_after_init();
  // Throws that refusal when forked_after_init(): for paths that reach no get().
  static void check_not_forked();
  // Path of the plugin `get()` would load (or did), and how it was chosen.
  static std::string resolve_plugin_path(std::string* how = nullptr);

  int device_count() const { return static_cast<int>(devices_.size()); }
  // Devices the client sees across all its processes (addressable or not): more than
  // device_count() when one client spans processes and can run cross-process collectives.
  int global_device_count() const;
  const std::string& platform() const { return platform_; }
  // Whether a program may take a donated input's memory for its output. On the XLA CPU
  // plugin, XNNPACK dots keep the weights they packed, keyed by the operand's address:
  // a buffer rewritten in place at the same address made later programs read the old
  // weights (wrong gradients). So there donation is only safe with XNNPACK off, which
  // costs matmul speed: the client turns it off only when TPU_FUSE_DONATE=1 is set at
  // start. Other plugins: always safe.
  bool donation_safe() const { return donation_safe_; }
  // The serialized CompileOptionsProto programs are compiled with (CompileEffort::Full).
  const std::string& compile_options() const { return compile_options_; }
  const std::string& plugin_path() const { return plugin_path_; }
  std::pair<int, int> api_version() const;

  BufferPtr from_host(const void* data, DType dtype, const std::vector<int64_t>& dims, int device);
  // The same, letting the buffer alias `data` where the plugin can (host-memory devices):
  // `data` must stay alive and unchanged until `release` runs, which the plugin calls once
  // it no longer needs it (at once after copying, or when the buffer is freed).
  BufferPtr from_host_borrowed(const void* data, DType dtype, const std::vector<int64_t>& dims,
                               int device, std::function<void()> release);
  // Copies a whole buffer into `dst` (dense row-major); waits for completion.
  void to_host(const Buffer& b, void* dst, size_t nbytes);
  // Several such copies, all started before any is awaited: one wait for the lot where
  // each copy alone is a round trip (a sync's device-check flags, one byte each).
  struct HostCopy {
    const Buffer* buffer;
    void* dst;
    size_t nbytes;
  };
  void to_host_all(const std::vector<HostCopy>& copies);
  // Copies `size` bytes from `offset` of a dense buffer into `dst`; waits. False (nothing
  // copied) when the plugin does not offer raw copies: use to_host then.
  bool to_host_range(const Buffer& b, void* dst, int64_t offset, int64_t size);
  BufferPtr copy_to_device(const Buffer& b, int device);
  std::unique_ptr<PendingUpload> upload_later(DType dtype, const std::vector<int64_t>& dims, int device);
  // Kinds of the memories a device can address ("device", "pinned_host", ...).
  std::vector<std::string> memory_kinds(int device) const;
  // The plugin's name for the device model ("cpu", "TPU v4", ...).
  std::string device_kind(int device) const;
  // Registers host memory for direct transfers (PJRT_Client_DmaMap). False when the
  // plugin does not offer it; then the memory is ordinary host memory.
  bool dma_map(void* data, size_t size);
  void dma_unmap(void* data);

  // Fast effort falls back to Full, for good, on a plugin that rejects its option.
  ExecutablePtr compile(const std::string& mlir, const std::string& name,
                        CompileEffort effort = CompileEffort::Full, const ProgramTraits& traits = {});
  // The serialized CompileOptionsProto `compile` uses for such a program (a disk cache
  // keys executables by it).
  const std::string& compile_options_for(CompileEffort effort, const ProgramTraits& traits) const;
  // A compiled executable as bytes (for an on-disk cache), and back.
  std::string serialize(const Executable& exe);
  ExecutablePtr deserialize(const std::string& bytes, const std::string& name);
  // Launches asynchronously; returns the outputs. With `wait` it blocks until done
  // and raises any execution error here. Inputs marked in `donate` may have their memory
  // reused by an output the program aliases to them (the caller must not read them again).
  std::vector<BufferPtr> execute(const Executable& exe, const std::vector<Buffer*>& args,
                                 int device, bool wait, const std::vector<bool>& donate = {},
                                 const std::string& what = "");
  // Waits for every launched execution on `device` (-1: all) and raises the first error.
  void synchronize(int device = -1);
  // True when every launched execution on `device` has finished (does not wait).
  bool is_idle(int device);

  // Launch tracing, for benchmarks' floors: while on, every execute() is also kept (from
  // any thread, in launch order); take_launch_trace() turns it off and hands them over.
  void start_launch_trace();
  std::vector<TracedLaunch> take_launch_trace();

  DeviceStats& stats(int device) { return *stats_.at(device); }
  Counters& counters() { return counters_; }
  // Device memory capacity in bytes: TPU_MEMORY_LIMIT, else the plugin's figure, else host RAM.
  int64_t memory_capacity(int device) const { return capacity_.at(device); }
  // The limit allocations are checked against: a process-wide override, else the device's
  // own (a fraction of its capacity), else its capacity. 0 clears an override.
  int64_t memory_limit(int device);
  void set_memory_limit(int64_t bytes) { memory_limit_override_ = bytes; }
  void set_device_memory_limit(int device, int64_t bytes) { device_limit_.at(device) = bytes; }
  // Raises OutOfMemory (worded as CUDA's) when `extra` more bytes, beside those allocated
  // (live buffers and storages not written yet: DeviceStats::allocated()) and `reserved`
  // for launches not made yet, would pass the limit; `what` names the op.
  // Before raising, it empties the caches registered below and checks again: buffers a
  // cache holds (scalars, view offsets) give way to the user's, as a caching allocator's
  // free blocks do.
  void check_capacity(int device, int64_t extra, const std::string& what, int64_t reserved = 0);
  // Whether `extra` more bytes (beside `reserved` counted elsewhere) pass the limit now.
  bool over_limit(int device, int64_t extra, int64_t reserved = 0);
  // `release` empties a cache of device buffers (those still in use elsewhere stay).
  void on_memory_pressure(std::function<void()> release);

  // Raises Error carrying the plugin's message if `err` is non-null (and frees it).
  void check(PJRT_Error* err, const std::string& what) const;
  const PJRT_Api* api() const { return api_; }
  // For multi-device programs (runtime/multi_device.h): the raw client, an addressable
  // device, and a launch's completion event for synchronize() to wait on.
  PJRT_Client* raw_client() const { return client_; }
  PJRT_Device* device(int local) const { return devices_.at(local); }
  void track_launch(PJRT_Event* ev, int device, std::shared_ptr<const std::string> op) {
    track_event(ev, device, std::move(op));
  }

 private:
  Client();
  ExecutablePtr wrap_loaded(PJRT_LoadedExecutable* loaded, const std::string& name);
  PJRT_Client_BufferFromHostBuffer_Args host_copy_args(const void* data, DType dtype,
                                                       const std::vector<int64_t>& dims, int device,
                                                       PJRT_HostBufferSemantics semantics);
  void track_event(PJRT_Event* ev, int device, std::shared_ptr<const std::string> op);
  void reap(bool all, int device);
  void await_event(PJRT_Event* ev, const std::string& what);
  int64_t device_capacity(int device) const;

  const PJRT_Api* api_ = nullptr;
  PJRT_Client* client_ = nullptr;
  std::vector<PJRT_Device*> devices_;
  std::vector<std::unique_ptr<DeviceStats>> stats_;
  std::mutex releasers_mu_;
  std::vector<std::function<void()>> releasers_;
  std::string platform_;
  bool donation_safe_ = true;
  bool portable_ = true;  // more than one device: executables choose theirs per launch
  std::string compile_options_, compile_options_fast_;  // CompileEffort Full, Fast
  // The same with single-threaded contractions (XLA CPU plugin, small programs); empty elsewhere.
  std::string compile_options_one_thread_, compile_options_fast_one_thread_;
  // Fast compiles of small programs (cpu_small_program_elements), by one_thread; empty: none.
  std::string compile_options_fast_small_, compile_options_fast_small_one_thread_;
  std::string plugin_path_;
  Counters counters_;
  std::atomic<bool> fast_rejected_{false};
  std::atomic<bool> raw_copy_unsupported_{false};
  int64_t memory_limit_override_ = 0;
  std::vector<int64_t> capacity_;  // per device
  std::vector<int64_t> device_limit_;  // per device, 0: none

  struct Pending {
    PJRT_Event* event;
    int device;
    std::shared_ptr<const std::string> op;
  };
  std::mutex pending_mu_;
  std::vector<Pending> pending_;
  size_t reap_at_ = 256;  // pending_'s size that makes a launch drop finished events
  std::string deferred_error_;  // first asynchronous error not yet raised
  // Set with deferred_error_ (under pending_mu_): launches read it without the lock.
  std::atomic<bool> has_deferred_error_{false};

  std::atomic<bool> tracing_{false};
  std::mutex trace_mu_;
  std::vector<TracedLaunch> trace_;
  void trace_launch(const Executable& exe, const std::vector<Buffer*>& args,
                    const std::vector<BufferPtr>& outs, int device);
};

}  // namespace tpu::runtime
