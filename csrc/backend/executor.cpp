#include "backend/executor.h"

#include "backend/profiler.h"
#include "ir/contraction_size.h"
#include "ir/fusion.h"
#include "runtime/disk_cache.h"
#include "runtime/host_cpu.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <cstdlib>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace tpu::backend {

static EagerMode initial_mode() {
  auto on = [](const char* name) {
    const char* s = std::getenv(name);
    return s && std::string(s) == "1";
  };
  if (on("TPU_LAUNCH_BLOCKING")) return EagerMode::Debug;
  if (on("TPU_DEFER_AND_FUSE")) return EagerMode::DeferAndFuse;
  return EagerMode::Strict;
}
static std::atomic<int> g_mode{static_cast<int>(initial_mode())};
// A compiled graph's call records in DeferAll on its own thread only: a process-wide
// switch, saved and restored by concurrent calls, could be left in DeferAll for good.
// Threads that hold no override (nearly always all of them) skip the thread-local read.
static std::atomic<int> g_overrides{0};
static thread_local int t_override = -1;

EagerMode eager_mode() {
  if (g_overrides.load(std::memory_order_relaxed) != 0 && t_override >= 0) return static_cast<EagerMode>(t_override);
  return static_cast<EagerMode>(g_mode.load());
}
void set_eager_mode(EagerMode m) { g_mode = static_cast<int>(m); }
int set_thread_eager_mode(int m) {
  int prev = t_override;
  if ((prev >= 0) != (m >= 0)) g_overrides.fetch_add(m >= 0 ? 1 : -1);
  t_override = m;
  return prev;
}

Metrics& metrics() {
  static Metrics m;
  return m;
}

// What makes a compiled executable reusable by another process: the plugin binary, the
// API it speaks and the host CPU's features (a plugin generating host code targets them;
// a cache directory shared by machines must not hand one another's executables)
// (compile options are fixed by runtime/compile_options.cpp).
static const std::string& cache_identity() {
  static const std::string id = [] {
    auto& c = runtime::Client::get();
    std::string s = "torch_tpu executable v1|" + c.plugin_path() + "|" + c.platform() + "|" +
                    runtime::host_cpu_signature();
    struct stat st;
    if (::stat(c.plugin_path().c_str(), &st) == 0)
      s += "|" + std::to_string(st.st_size) + "|" + std::to_string(st.st_mtime);
    auto [major, minor] = c.api_version();
    // XLA_FLAGS change what the compiler makes of the same program (so do the compile
    // options, which each key names: compile_persistent).
    const char* flags = std::getenv("XLA_FLAGS");
    return s + "|" + std::to_string(major) + "." + std::to_string(minor) + "|" + (flags ? flags : "") + "\n";
  }();
  return id;
}

// A fused graph (DeferAndFuse, compiled mode) is a module of many functions built by
// ir::FusedModule; anything else is one op's program.
static bool is_graph(const std::string& text) { return text.rfind("module @torch_tpu_fused", 0) == 0; }

// One op's program compiles with Fast effort, a graph with Full; a one-op program's
// contraction size picks how they use threads (runtime::cpu_threaded_macs).
static runtime::CompileEffort effort_of(const std::string& text) {
  return is_graph(text) ? runtime::CompileEffort::Full : runtime::CompileEffort::Fast;
}

static runtime::ProgramTraits traits_of(const std::string& text) {
  runtime::ProgramTraits t;
  t.largest_contraction_macs = ir::largest_contraction_macs(text);
  t.largest_tensor_elements = ir::largest_tensor_elements(text);
  t.uses_float8 = ir::uses_float8(text);
  t.fused_graph = is_graph(text);
  return t;
}

// Compiles, counting the seconds per kind.
static runtime::ExecutablePtr compile_by_kind(const std::string& text, const std::string& name,
                                              const runtime::ProgramTraits& traits) {
  bool graph = is_graph(text);
  auto t0 = std::chrono::steady_clock::now();
  runtime::ExecutablePtr exe = runtime::Client::get().compile(text, name, effort_of(text), traits);
  int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  (graph ? metrics().graph_compiles : metrics().op_compiles) += 1;
  (graph ? metrics().graph_compile_us : metrics().op_compile_us) += us;
  return exe;
}

// The on-disk cache's key for a program's canonical text.
static std::string disk_key(const std::string& text, const runtime::ProgramTraits& traits) {
  const std::string& options = runtime::Client::get().compile_options_for(effort_of(text), traits);
  return cache_identity() + "options " + std::to_string(std::hash<std::string>()(options)) + "\n" + text;
}

// Compiles, or loads what an earlier process compiled from the on-disk cache.
static runtime::ExecutablePtr compile_persistent(const std::string& process_text, const std::string& name) {
  // A graph's functions keep the numbers its programs got in this process; the key (and
  // the program compiled) names them by first appearance, so another process finds it.
  const std::string text = ir::canonical_symbols(process_text, kProgramSymbolStem, "tpu_fn");
  auto& client = runtime::Client::get();
  runtime::DiskCache* disk = runtime::DiskCache::get();
  runtime::ProgramTraits traits = traits_of(text);
  if (!disk) return compile_by_kind(text, name, traits);
  std::string key = disk_key(text, traits);
  if (std::optional<std::string> bytes = disk->load(key)) {
    try {
      runtime::ExecutablePtr exe = client.deserialize(*bytes, name);
      if (is_graph(text)) metrics().graph_loads += 1;
      return exe;
    } catch (const runtime::Error&) {
      disk->remove(key);  // the plugin rejected it: compile afresh
    }
  }
  runtime::ExecutablePtr exe = compile_by_kind(text, name, traits);
  try {
    disk->store(key, client.serialize(*exe));
  } catch (const runtime::Error&) {
    // A plugin that cannot serialize just runs without persistence.
  }
  return exe;
}

// Loaded executables are bounded (TPU_MAX_LOADED_PROGRAMS, default 2048): each holds JIT
// code and data mappings (about 4 on the XLA CPU plugin), and a process that keeps meeting
// new shapes would otherwise reach the kernel's limit on mappings (65,530) and crash, as
// long conformance workers did. The least recently compiled or looked up goes first;
// holders keep only weak references, so an evicted program is reloaded from the disk
// cache (or recompiled) on its next use, and one still running stays alive until done.
static size_t max_loaded_programs() {
  static const size_t n = [] {
    const char* s = std::getenv("TPU_MAX_LOADED_PROGRAMS");
    long v = s && *s ? std::atol(s) : 0;
    return v > 0 ? static_cast<size_t>(v) : size_t{2048};
  }();
  return n;
}

// Programs differ in how many mappings they hold (an unrolled RNN graph about 580, a
// pointwise op about 4), so the count bound alone let a DeferAndFuse run of many RNN
// shapes reach the kernel's limit ("LLVM compilation error: Cannot allocate memory").
// Every 16 loads the process's mappings are counted (/proc/self/maps, where it exists);
// past TPU_MAX_MAPPINGS (default: 60 % of vm.max_map_count) the older half is unloaded.
static size_t count_lines(const char* path) {
  std::ifstream f(path);
  if (!f) return 0;
  return static_cast<size_t>(std::count(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>(), '\n'));
}
static size_t mapping_budget() {
  static const size_t n = [] {
    const char* s = std::getenv("TPU_MAX_MAPPINGS");
    long v = s && *s ? std::atol(s) : 0;
    if (v > 0) return static_cast<size_t>(v);
    std::ifstream f("/proc/sys/vm/max_map_count");
    long limit = 0;
    if (!(f >> limit) || limit <= 0) limit = 65530;
    return static_cast<size_t>(limit) * 6 / 10;
  }();
  return n;
}

namespace {
// The loaded executables, by program text.
std::mutex g_loaded_mu;
std::list<const std::string*> g_loaded_order;  // front: most recent
std::unordered_map<std::string, std::pair<runtime::ExecutablePtr, std::list<const std::string*>::iterator>> g_loaded;
}  // namespace

bool compiled_before(const std::string& process_text) {
  {
    std::lock_guard<std::mutex> lock(g_loaded_mu);
    if (g_loaded.count(process_text)) return true;
  }
  runtime::DiskCache* disk = runtime::DiskCache::get();
  if (!disk) return false;
  const std::string text = ir::canonical_symbols(process_text, kProgramSymbolStem, "tpu_fn");
  return disk->contains(disk_key(text, traits_of(text)));
}

runtime::ExecutablePtr compile_cached(const std::string& text, const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(g_loaded_mu);
    auto it = g_loaded.find(text);
    if (it != g_loaded.end()) {
      metrics().program_hits += 1;
      g_loaded_order.splice(g_loaded_order.begin(), g_loaded_order, it->second.second);
      return it->second.first;
    }
  }
  auto exe = compile_persistent(text, name);
  std::lock_guard<std::mutex> lock(g_loaded_mu);
  auto [it, fresh] = g_loaded.try_emplace(text, exe, g_loaded_order.end());
  if (!fresh) return it->second.first;  // another thread compiled it meanwhile
  g_loaded_order.push_front(&it->first);
  it->second.second = g_loaded_order.begin();
  auto unload_oldest = [] {
    g_loaded.erase(*g_loaded_order.back());
    g_loaded_order.pop_back();
    metrics().programs_unloaded += 1;
  };
  while (g_loaded.size() > max_loaded_programs()) unload_oldest();
  static size_t loads = 0;
  if (++loads % 16 == 0 && count_lines("/proc/self/maps") > mapping_budget())
    for (size_t keep = g_loaded.size() / 2; g_loaded.size() > std::max<size_t>(keep, 1);) unload_oldest();
  return exe;
}

std::vector<runtime::BufferPtr> launch(const runtime::Executable& exe,
                                       const std::vector<runtime::Buffer*>& args, int device,
                                       const std::string& what, const std::vector<bool>& donate) {
  auto outputs = guarded([&] {
    return runtime::Client::get().execute(exe, args, device, eager_mode() == EagerMode::Debug, donate, what);
  });
  note_launch(what.empty() ? exe.name : what, device, outputs);
  return outputs;
}

}  // namespace tpu::backend
