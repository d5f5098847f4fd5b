// The Python module torch_tpu._C: setup, device queries, memory, metrics, modes.
#include <torch/csrc/Generator.h>
#include <torch/extension.h>

#include <set>

#include "backend/autograd_exit.h"
#include "backend/device.h"
#include "backend/device_checks.h"
#include "backend/executor.h"
#include "backend/kernel_checks.h"
#include "backend/memory_history.h"
#include "backend/shape_churn.h"
#include "backend/storage.h"
#include "backend/streams.h"
#include "backend/sync_debug.h"
#include "runtime/client.h"
#include "runtime/disk_cache.h"
#include "runtime/host_cpu.h"
#include "runtime/launch_probe.h"
#include "runtime/plugin_search.h"

namespace tpu::backend {
int register_lowered_kernels();
int64_t host_fill_count();  // constant_fill.cpp
std::vector<std::string> lowered_op_names();
void set_dispatch_floor_probe(int mode);  // lowered_kernel.cpp
float wait_chain_probe();                 // lowered_kernel.cpp
int64_t import_stablehlo(const std::string& text, const std::string& what,
                         const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
                         const std::vector<std::pair<std::string, std::vector<int64_t>>>& results);
void donate_storage(const at::Tensor& t, const std::string& what);
void bind_dlpack(pybind11::module_& m);    // dlpack.cpp
void bind_serialization(pybind11::module_& m);  // serialization.cpp
void bind_captured_graph(pybind11::module_& m);  // captured_graph.cpp
void bind_sparse_optim(pybind11::module_& m);    // sparse_optim.cpp
}  // namespace tpu::backend
namespace tpu::distributed {
void bind(pybind11::module_& m);  // csrc/distributed/python.cpp
}  // namespace tpu::distributed

namespace py = pybind11;
using namespace tpu;
using namespace tpu::backend;

static runtime::Client& client() {
  return guarded([]() -> runtime::Client& { return runtime::Client::get(); });
}

PYBIND11_MODULE(_C, m) {
  distributed::bind(m);
  bind_dlpack(m);
  bind_serialization(m);
  bind_captured_graph(m);
  bind_sparse_optim(m);
  bind_memory_history(m);
  m.def("_init", [](std::vector<std::pair<std::string, std::string>> candidates) {
    runtime::set_plugin_candidates(std::move(candidates));
    register_device_hooks();
    static int n = register_lowered_kernels();
    return n;
  });
  // Starts the client (plugin, devices); in a child forked after the parent started it,
  // raises "Cannot re-initialize TPU in forked subprocess" as CUDA does.
  m.def("init_client", [] { client(); });
  m.def("is_initialized", [] {
    return runtime::Client::initialized() && !runtime::Client::forked_after_init();
  });
  m.def("in_bad_fork", [] { return runtime::Client::forked_after_init(); });
  m.def("device_kind", [](int d) { return client().device_kind(d); });
  // torch.Event.elapsed_time refuses subclasses (torch.tpu.Event): the same, by event_id.
  // This thread's default stream on `device` (the main thread's is 0; streams.h).
  m.def("_default_stream_id", [](int device) { return default_stream(static_cast<c10::DeviceIndex>(device)).id(); });
  m.def("event_elapsed_ms", [](uintptr_t start, uintptr_t end) {
    return elapsed_ms(reinterpret_cast<void*>(start), reinterpret_cast<void*>(end));
  });
  m.def("plugin_path", [] { return runtime::Client::resolve_plugin_path(); });
  m.def("platform", [] { return client().platform(); });
  m.def("_host_cpu_signature", [] { return runtime::host_cpu_signature(); });
  m.def("api_version", [] { return client().api_version(); });
  m.def("device_count", [] { return device_count(); });
  m.def("current_device", [] { return current_device(); });
  m.def("set_device", [](int d) { guarded([&] { set_current_device(d); return 0; }); });
  m.def("synchronize", [](int d) {
    py::gil_scoped_release nogil;
    guarded([&] {
      flush("synchronize");
      wait_launched();
      client().synchronize(d);
      return 0;
    });
    verify_device_checks(d);  // -1: every device's
  });
  // At exit: launch what is pending and let it finish, ignoring errors nobody will read.
  m.def("_drain", [] {
    if (runtime::Client::forked_after_init()) return;  // the parent's work is not ours
    py::gil_scoped_release nogil;
    try {
      flush("exit");
      wait_launched();
    } catch (...) {
    }
    settle_autograd_threads();
  });
  m.def("_set_recording_state", [](bool on) { set_recording_state(on); });  // torch_tpu/_step_boundary.py
  m.def("_split_at_backward", [] { return split_at_backward(); });
  m.def("_set_split_at_backward", [](bool on) { set_split_at_backward(on); });
  m.def("_set_recording_role", &set_recording_role);
  m.def("_forget_shape_churn", [] { forget_shape_churn(); });  // tests/conftest.py
  m.def("_set_sync_debug_mode", [](int mode) { set_sync_debug_mode(static_cast<SyncDebugMode>(mode)); });
  m.def("_get_sync_debug_mode", [] { return static_cast<int>(sync_debug_mode()); });
  m.def("_mark_module_state", [](const at::Tensor& t) {  // torch_tpu/_module_state.py
    // (a tensor subclass's wrapper, DTensor's, holds no storage of ours)
    if (!t.defined() || !t.is_privateuseone() || !t.has_storage()) return;
    if (StorageData* s = storage_record(*t.storage().unsafeGetStorageImpl())) s->module_state = true;
  });
  // Runs the pending deferred graph without waiting for it (a training step's end).
  // Of this thread's graphs of `devices` only, when given (a training step's end).
  m.def("flush", [](const std::string& reason, std::optional<std::vector<int>> devices) {
    py::gil_scoped_release nogil;
    static std::mutex mu;
    static std::set<std::string> reasons;  // flush() keeps the pointer: intern the text
    const char* r;
    {
      std::lock_guard<std::mutex> lock(mu);
      r = reasons.insert(reason).first->c_str();
    }
    guarded([&] {
      if (devices) flush_devices(r, *devices);
      else flush(r);
      return 0;
    });
  }, py::arg("reason"), py::arg("devices") = py::none());
  m.def("_pending_graphs", [] { return guarded([] { return pending_graphs(); }); });
  m.def("memory_allocated", [](int d) { return settled_memory_stats(d).user_bytes(); });
  m.def("max_memory_allocated", [](int d) { return settled_memory_stats(d).peak_bytes.load(); });
  m.def("reset_peak_memory_stats", [](int d) { settled_memory_stats(d).reset_peaks(); });
  m.def("reset_accumulated_memory_stats", [](int d) { settled_memory_stats(d).reset_accumulated(); });
  m.def("num_allocs", [](int d) { return client().stats(d).num_allocs.load(); });
  m.def("memory_limit", [](int d) { return client().memory_limit(d); });
  m.def("memory_capacity", [](int d) { return client().memory_capacity(d); });
  m.def("set_device_memory_limit", [](int d, int64_t bytes) { client().set_device_memory_limit(d, bytes); });
  // Seconds per launch of a chained tiny program, PyTorch left out (benchmarks' floor).
  m.def("_launch_floor", [](int d, int n, int repeats) {
    return guarded([&] { return runtime::chained_launch_seconds(client(), d, n, repeats); });
  });
  // Benchmarks' floor of a Strict step: its launches traced, then replayed by the runtime
  // alone (runtime/launch_probe.h). The stopped trace is kept for replays until dropped.
  // (Never destroyed: its buffers must not be freed after the client at exit.)
  static auto* kept_trace = new std::vector<runtime::TracedLaunch>();
  m.def("_start_launch_trace", [] { guarded([] { client().start_launch_trace(); return 0; }); });
  m.def("_stop_launch_trace", [] {
    return guarded([] {
      *kept_trace = client().take_launch_trace();
      return static_cast<int64_t>(kept_trace->size());
    });
  });
  m.def("_replay_launch_trace", [](int repeats) {
    return guarded([&] { return runtime::replayed_trace_seconds(client(), *kept_trace, repeats); });
  });
  m.def("_replay_launch_trace_each", [](int repeats) {
    return guarded([&] { return runtime::replayed_launch_seconds(client(), *kept_trace, repeats); });
  });
  m.def("_drop_launch_trace", [] { guarded([] { kept_trace->clear(); return 0; }); });
  // Per traced launch, how many operands it took (tests of what an op's program reads).
  m.def("_launch_trace_operand_counts", [] {
    std::vector<int64_t> n;
    for (const runtime::TracedLaunch& l : *kept_trace) n.push_back(static_cast<int64_t>(l.args.size()));
    return n;
  });
  // Whether CPU's kernel of an op refuses complex values: 0 no, 1 NotImplementedError,
  // 2 RuntimeError (the decomposition kernels raise as the lowered ones do).
  m.def("_complex_refusal", [](const std::string& name, const std::string& base) {
    return static_cast<int>(complex_refusal_for(name, base));
  });
  // The same for a first tensor argument of ScalarType `dtype` (c10's numbering).
  m.def("_integral_refusal", [](const std::string& name, const std::string& base, int dtype) {
    return static_cast<int>(integral_refusal_for(name, base, static_cast<c10::ScalarType>(dtype)));
  });
  // Benchmarks' floor of recording: lowered ops hand back their first argument (1), and
  // each also makes one chained launch through the runtime alone (2: Strict's in place).
  m.def("_set_dispatch_floor_probe", [](int mode) { set_dispatch_floor_probe(mode); });
  m.def("_wait_chain_probe", [] {
    py::gil_scoped_release nogil;
    return wait_chain_probe();
  });
  m.def("set_memory_limit", [](int64_t bytes) { client().set_memory_limit(bytes); });
  m.def("manual_seed", [](int d, uint64_t seed) {
    at::Generator g = default_generator(d);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(seed);
  });
  m.def("default_generator", [](int d) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_generator(d)));
  });
  m.def("set_eager_mode", [](int mode) { set_eager_mode(static_cast<EagerMode>(mode)); });
  m.def("get_eager_mode", [] { return static_cast<int>(eager_mode()); });
  m.def("_set_thread_eager_mode", &set_thread_eager_mode);
  m.def("lowered_ops", [] { return lowered_op_names(); });
  m.def("_import_stablehlo", &import_stablehlo);  // torch_tpu/_internal/pallas.py
  m.def("_donate", &donate_storage);
  m.def("is_materialized", [](const at::Tensor& t) {
    void* ctx = t.storage().data_ptr().get_context();
    if (!ctx) return false;
    const StorageData& s = *static_cast<StorageData*>(ctx);
    return s.pending.empty() && !s.copy_of && is_ready(s.value);  // queued writes: not yet
  });
  m.def("compile_cache_dir", [] {
    runtime::DiskCache* disk = runtime::DiskCache::get();
    return disk ? disk->dir() : std::string();
  });
  m.def("memory_kinds", [](int d) { return client().memory_kinds(d); });
  // Fault injection through the real plugin: a float tensor whose upload has not landed,
  // and a function that makes that upload fail (programs reading it then fail
  // asynchronously, as after a failed DMA).
  m.def("_testing_failing_upload", [](std::vector<int64_t> sizes) {
    int dev = current_device();
    std::shared_ptr<runtime::PendingUpload> up =
        guarded([&] { return client().upload_later(DType::F32, sizes, dev); });
    at::Tensor t = wrap_value(up->buffer(), at::kFloat, sizes, dev);
    py::cpp_function fail([up](const std::string& msg) { up->fail(msg); });
    return py::make_tuple(t, fail);
  });
  m.def("metrics", [] {
    {
      // Flushed graphs compile and run on the launcher thread: count them all, so a
      // reading does not depend on how far that thread has got.
      py::gil_scoped_release nogil;
      settle_launched();
    }
    py::dict d;
    Metrics& mt = metrics();
    d["op_calls"] = mt.op_calls.load();
    d["signature_hits"] = mt.signature_hits.load();
    d["signature_misses"] = mt.signature_misses.load();
    d["program_cache_hits"] = mt.program_hits.load();
    d["programs_unloaded"] = mt.programs_unloaded.load();
    py::dict fb;
    {
      std::lock_guard<std::mutex> lock(mt.mu);
      for (auto& [k, v] : mt.fallbacks) fb[py::str(k)] = v;
    }
    d["fallbacks"] = fb;
    py::dict fl;
    {
      std::lock_guard<std::mutex> lock(mt.mu);
      for (auto& [k, v] : mt.flushes) fl[py::str(k)] = v;
    }
    d["flushes"] = fl;
    FuseStats& fs = fuse_stats();
    d["deferred_ops"] = fs.recorded.load();
    d["fused_graphs"] = fs.graphs.load();
    d["fused_graph_cache_hits"] = fs.graph_hits.load();
    d["fused_outputs"] = fs.outputs.load();
    d["elided_intermediates"] = fs.elided.load();
    d["dead_calls_dropped"] = fs.dead_calls.load();
    d["pending_graph_switches"] = fs.device_switches.load();
    d["hoisted_fills"] = fs.hoisted_fills.load();
    d["largest_graph_instructions"] = fs.largest_instructions.load();
    d["donated_buffers"] = fs.donated.load();
    d["fused_replays"] = fs.replays.load();
    d["fused_graphs_run_op_by_op"] = fs.op_by_op.load();
    d["recomputed_values"] = fs.recomputed.load();
    d["materialized_values"] = fs.materialized.load();
    d["fused_flush_seconds"] = fs.flush_us.load() * 1e-6;
    d["fused_flush_wait_seconds"] = fs.flush_wait_us.load() * 1e-6;
    d["fused_launch_seconds"] = fs.launch_us.load() * 1e-6;
    d["fused_execute_seconds"] = fs.execute_us.load() * 1e-6;
    d["fused_release_seconds"] = fs.release_us.load() * 1e-6;
    if (runtime::DiskCache* disk = runtime::DiskCache::get()) {
      auto& ds = disk->stats();
      d["disk_cache_hits"] = ds.hits.load();
      d["disk_cache_misses"] = ds.misses.load();
      d["disk_cache_writes"] = ds.writes.load();
      d["disk_cache_corrupt"] = ds.corrupt.load();
      d["disk_cache_evicted"] = ds.evicted.load();
      d["disk_cache_scans"] = ds.scans.load();
    }
    d["host_fills"] = host_fill_count();  // small fills made as transfers, not programs
    d["op_compiles"] = metrics().op_compiles.load();
    d["op_compile_seconds"] = metrics().op_compile_us.load() / 1e6;
    d["queued_launches"] = metrics().queued_launches.load();
    d["graph_compiles"] = metrics().graph_compiles.load();
    d["graph_compile_seconds"] = metrics().graph_compile_us.load() / 1e6;
    d["graph_loads"] = metrics().graph_loads.load();
    if (runtime::Client::initialized()) {
      auto& c = runtime::Client::get().counters();
      d["compiles"] = c.compiles.load();
      d["compile_seconds"] = c.compile_us.load() / 1e6;
      d["cache_load_seconds"] = c.load_us.load() / 1e6;
      d["executions"] = c.executions.load();
      d["h2d_transfers"] = c.h2d_transfers.load();
      d["h2d_bytes"] = c.h2d_bytes.load();
      d["d2h_transfers"] = c.d2h_transfers.load();
      d["d2h_bytes"] = c.d2h_bytes.load();
      // Cached scalar buffers: device memory that memory_allocated() leaves out.
      int64_t scalar_cache_bytes = 0;
      for (int dev = 0; dev < runtime::Client::get().device_count(); ++dev)
        scalar_cache_bytes += runtime::Client::get().stats(dev).cache_bytes.load();
      d["scalar_cache_bytes"] = scalar_cache_bytes;
      d["d2d_transfers"] = c.d2d_transfers.load();
    }
    return d;
  });
}
