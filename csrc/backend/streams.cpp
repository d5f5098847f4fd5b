#include "backend/streams.h"

#include <torch/library.h>

#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <torch/csrc/autograd/graph_task.h>

#include "backend/deferred.h"
#include "backend/device.h"
#include "backend/device_checks.h"
#include "backend/executor.h"

namespace tpu::backend {
namespace {

constexpr int kMaxDevices = 64;
// Per device, the current stream's id + 1 and its lane + 1 (0: this thread's default).
thread_local std::array<c10::StreamId, kMaxDevices> t_current{};
thread_local std::array<c10::StreamId, kMaxDevices> t_lane{};
thread_local c10::StreamId t_default = -1;  // this thread's default stream (-1: not yet given)
std::atomic<c10::StreamId> g_next_id{1};
const std::thread::id g_main_thread = std::this_thread::get_id();  // the one loading the module

// The lanes of streams made by threads: a stream made by a thread is in that thread's
// lane (a side stream does not split its thread's graph). A thread's default stream is
// its own lane, not kept here (nn.DataParallel makes threads at every forward).
std::mutex g_lanes_mu;
std::unordered_map<c10::StreamId, c10::StreamId> g_lanes;

c10::StreamId lane_of(c10::StreamId id) {
  std::lock_guard<std::mutex> lock(g_lanes_mu);
  auto it = g_lanes.find(id);
  return it == g_lanes.end() ? id : it->second;
}

c10::StreamId thread_default() {
  if (t_default < 0) {
    // Autograd's device threads run backwards on their forwards' streams: whatever they
    // record outside a node's stream belongs with the main thread's work.
    bool shared = std::this_thread::get_id() == g_main_thread ||
                  torch::autograd::get_current_graph_task_id() != -1;
    t_default = shared ? 0 : g_next_id++;  // (its own lane: not kept in g_lanes)
  }
  return t_default;
}

c10::DeviceIndex resolve(c10::DeviceIndex d) {
  if (d < 0) d = static_cast<c10::DeviceIndex>(current_device());
  TORCH_CHECK(d < kMaxDevices, "tpu:", static_cast<int>(d), ": at most ", kMaxDevices, " devices");
  return d;
}

c10::Stream make(c10::DeviceIndex d, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, d), id);
}

// Launches the pending deferred graph and waits for everything launched on `d`.
void drain(c10::DeviceIndex d) {
  guarded([&] {
    flush("synchronize");
    wait_launched();
    runtime::Client::get().synchronize(d);
    return 0;
  });
  verify_device_checks();
}

// An event marks "all work launched on its device so far". A timing event waits for
// that work when recorded and keeps the time, so elapsed_time measures the device
// work between two records (the host is held at each timing record).
struct TpuEvent {
  c10::DeviceIndex device = -1;  // -1: never recorded
  bool timing = false;
  std::chrono::steady_clock::time_point when;
};

}  // namespace

c10::Stream current_stream(c10::DeviceIndex device) {
  c10::DeviceIndex d = resolve(device);
  return make(d, t_current[d] ? t_current[d] - 1 : thread_default());
}

c10::Stream default_stream(c10::DeviceIndex device) { return make(resolve(device), thread_default()); }

c10::Stream exchange_stream(const c10::Stream& s) {
  c10::DeviceIndex d = resolve(s.device_index());
  c10::Stream old = make(d, t_current[d] ? t_current[d] - 1 : thread_default());
  t_current[d] = s.id() + 1;
  t_lane[d] = lane_of(s.id()) + 1;
  return old;
}

c10::Stream new_stream(c10::DeviceIndex device) {
  c10::StreamId id = g_next_id++;
  c10::StreamId lane = thread_default();
  std::lock_guard<std::mutex> lock(g_lanes_mu);
  g_lanes[id] = lane;
  return make(resolve(device), id);
}

int64_t recording_lane(int device) {
  if (device < 0 || device >= kMaxDevices) return thread_default();
  return t_lane[device] ? t_lane[device] - 1 : thread_default();
}

void record_event(void** event, const c10::Stream& s, c10::EventFlag flag) {
  auto* e = static_cast<TpuEvent*>(*event);
  if (!e) {
    e = new TpuEvent();
    e->timing = flag == c10::EventFlag::BACKEND_DEFAULT;
    *event = e;
  }
  e->device = resolve(s.device_index());
  // No flush here: query/synchronize launch the pending graph anyway, and waiting for
  // work recorded after the event too is only conservative. (The autograd engine
  // records events between streams; a cut there would split fused graphs.)
  if (e->timing) {
    drain(e->device);
    e->when = std::chrono::steady_clock::now();
  }
}

bool query_event(void* event) {
  auto* e = static_cast<TpuEvent*>(event);
  if (!e || e->device < 0) return true;  // never recorded: nothing to wait for
  return guarded([&] {
    flush("event query");
    // Work the launcher thread has not launched yet (a flushed graph, a Strict launch
    // queued behind its compile) is work before the event too.
    return all_launched() && runtime::Client::get().is_idle(e->device);
  });
}

void synchronize_event(void* event) {
  auto* e = static_cast<TpuEvent*>(event);
  if (e && e->device >= 0) drain(e->device);
}

void destroy_event(void* event) noexcept { delete static_cast<TpuEvent*>(event); }

double elapsed_ms(void* start, void* end) {
  auto* a = static_cast<TpuEvent*>(start);
  auto* b = static_cast<TpuEvent*>(end);
  // (An event gets its state at its first record.)
  TORCH_CHECK(a && b && a->device >= 0 && b->device >= 0,
              "Both events must be recorded before calculating elapsed time.");
  TORCH_CHECK(a->timing && b->timing,
              "Both events must be created with argument 'enable_timing=True'.");
  return std::chrono::duration<double, std::milli>(b->when - a->when).count();
}

namespace {

// Buffers stay alive while a launched program reads them (PJRT holds them), so a
// tensor used on another stream needs no bookkeeping: record_stream has nothing to do.
void record_stream(at::Tensor&, at::Stream) {}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("record_stream", record_stream); }

}  // namespace
}  // namespace tpu::backend
