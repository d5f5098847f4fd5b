#include "backend/memory_history.h"

#include <pybind11/stl.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <chrono>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/storage.h"

namespace py = pybind11;

// libtorch_python's (torch/csrc/profiler/python/combined_traceback.h, whose header needs
// nlohmann/json, which torch's installed headers lack).
namespace torch {
std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
void installCapturedTracebackPython();
}  // namespace torch

namespace tpu::backend {

std::atomic<bool> g_memory_history_on{false};

namespace {

struct Entry {
  bool alloc;
  uintptr_t addr;
  int device;
  int64_t size;
  int64_t time_us;
  std::shared_ptr<torch::CapturedTraceback> frames;
};

struct Live {
  int device;
  int64_t size;
  std::shared_ptr<torch::CapturedTraceback> frames;
};

std::mutex g_mu;
bool g_trace = false;  // "all": keep the trace of entries; "state": live storages only
size_t g_max_entries = 0;
std::deque<Entry> g_entries;
std::unordered_map<uintptr_t, Live> g_live;  // storages made while recording

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

py::list symbolized(const std::vector<torch::CapturedTraceback*>& tbs) {
  std::vector<torch::CapturedTraceback*> in(tbs);
  py::list out;
  for (py::object& frames : torch::py_symbolize(in)) out.append(frames);
  return out;
}

py::dict snapshot() {
  std::vector<Entry> entries;
  std::vector<std::pair<uintptr_t, Live>> live;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    entries.assign(g_entries.begin(), g_entries.end());
    live.assign(g_live.begin(), g_live.end());
  }
  std::vector<torch::CapturedTraceback*> tbs;
  for (auto& [a, l] : live) tbs.push_back(l.frames.get());
  for (Entry& e : entries) tbs.push_back(e.frames.get());
  std::vector<torch::CapturedTraceback*> present;
  for (auto* t : tbs) if (t) present.push_back(t);
  py::list frames = symbolized(present);
  size_t next = 0;
  auto frames_of = [&](torch::CapturedTraceback* t) -> py::object {
    return t ? py::object(frames[next++]) : py::object(py::list());
  };

  // One segment per live storage: tpu storages are the device's allocations (buffers are
  // the runtime's; nothing is cached or split).
  py::list segments;
  for (auto& [addr, l] : live) {
    py::dict block;
    block["address"] = addr;
    block["size"] = l.size;
    block["requested_size"] = l.size;
    block["state"] = "active_allocated";
    block["frames"] = frames_of(l.frames.get());
    py::dict seg;
    seg["device"] = l.device;
    seg["address"] = addr;
    seg["total_size"] = l.size;
    seg["allocated_size"] = l.size;
    seg["active_size"] = l.size;
    seg["requested_size"] = l.size;
    seg["stream"] = 0;
    seg["segment_type"] = "large";
    seg["segment_pool_id"] = py::make_tuple(0, 0);
    seg["is_expandable"] = false;
    seg["frames"] = py::list();
    seg["blocks"] = py::list(py::make_tuple(block));
    segments.append(seg);
  }
  int devices = 1;
  for (const Entry& e : entries) devices = std::max(devices, e.device + 1);
  for (auto& [addr, l] : live) devices = std::max(devices, l.device + 1);
  std::vector<py::list> traces(devices);
  for (const Entry& e : entries) {
    py::dict d;
    d["action"] = e.alloc ? "alloc" : "free_completed";
    d["addr"] = e.addr;
    d["size"] = e.size;
    d["stream"] = 0;
    d["time_us"] = e.time_us;
    d["device_free"] = 0;
    d["frames"] = frames_of(e.frames.get());
    traces[e.device].append(d);
  }
  py::dict out;
  out["segments"] = segments;
  py::list device_traces;
  for (auto& t : traces) device_traces.append(t);
  out["device_traces"] = device_traces;
  out["allocator_settings"] = py::dict();
  return out;
}

}  // namespace

void record_storage_event(const StorageData* s, int64_t bytes) {
  auto addr = reinterpret_cast<uintptr_t>(s);
  // Frees need no stack (the allocation's is kept); Python frames only from a thread
  // that holds the GIL (the autograd engine's device threads record without).
  std::shared_ptr<torch::CapturedTraceback> frames;
  if (bytes > 0) frames = torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_memory_history_on.load(std::memory_order_relaxed)) return;
  if (bytes > 0) {
    g_live[addr] = Live{s->device, bytes, frames};
  } else if (g_live.erase(addr) == 0) {
    return;  // made before recording began
  }
  if (!g_trace) return;
  g_entries.push_back(Entry{bytes > 0, addr, s->device, bytes > 0 ? bytes : -bytes, now_us(), frames});
  while (g_entries.size() > g_max_entries) g_entries.pop_front();
}

void bind_memory_history(py::module_& m) {
  // enabled: None (stop), "state" (live storages) or "all" (also the trace of entries).
  m.def("_record_memory_history", [](std::optional<std::string> enabled, size_t max_entries) {
    TORCH_CHECK(!enabled || *enabled == "state" || *enabled == "all",
                "_record_memory_history: enabled must be None, 'state' or 'all', got '", *enabled, "'");
    torch::installCapturedTracebackPython();
    std::lock_guard<std::mutex> lock(g_mu);
    if (!enabled) {
      g_memory_history_on = false;
      g_live.clear();
      g_entries.clear();
      return;
    }
    g_trace = *enabled == "all";
    g_max_entries = max_entries;
    if (!g_trace) g_entries.clear();
    g_memory_history_on = true;
  }, py::arg("enabled"), py::arg("max_entries") = std::numeric_limits<size_t>::max());
  m.def("_memory_snapshot", &snapshot);
}

}  // namespace tpu::backend
