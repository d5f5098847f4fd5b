// A Kineto child profiler for `tpu` (PyTorch's PrivateUse1ProfilerRegistry): with
// torch.profiler.profile(activities=[..., ProfilerActivity.PrivateUse1]) every program
// launched inside an op becomes a device event linked to that op, so key_averages()
// reports device time per op. PJRT reports no device timestamps: an event ends when the
// program's outputs are ready (PJRT_Buffer_ReadyEvent) and starts at its launch or when
// the program before it on that device finished, whichever is later (one in-order
// queue per device), so it measures the execution as the host sees it. Programs are
// noted where Strict/Debug launch them (executor.cpp); DeferAndFuse's fused graphs run
// on its launcher thread without that hook (deferred.cpp), so they show no device time.
#define USE_KINETO 1  // the registry's header is compiled only for Kineto builds (torch is one)
#include <IActivityProfiler.h>
#include <c10/util/ApproximateClock.h>
#include <libkineto.h>
#include <pjrt_c_api.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/profiler.h"

namespace tpu::backend {

std::atomic<bool> g_device_tracing{false};

namespace {

struct Launch {
  std::string name;
  int device = 0;
  uint64_t correlation = 0;
  int64_t start_ns = 0;
  std::atomic<int64_t> end_ns{0};
  PJRT_Event* event = nullptr;
};

std::mutex g_mu;
std::vector<std::unique_ptr<Launch>> g_launches;  // of the recording session
thread_local std::vector<uint64_t> t_correlation;  // the op being dispatched on this thread

const PJRT_Api* pjrt() { return runtime::Client::get().api(); }

void on_ready(PJRT_Error* error, void* arg) {
  static_cast<Launch*>(arg)->end_ns = c10::getTime();
  if (error) {  // the error itself surfaces through the backend's own tracking
    PJRT_Error_Destroy_Args d{PJRT_Error_Destroy_Args_STRUCT_SIZE, nullptr, error};
    pjrt()->PJRT_Error_Destroy(&d);
  }
}

// Waits for every noted launch to finish, then frees their events.
void settle(std::vector<std::unique_ptr<Launch>>& launches) {
  for (auto& l : launches) {
    if (!l->event) continue;
    PJRT_Event_Await_Args a{PJRT_Event_Await_Args_STRUCT_SIZE, nullptr, l->event};
    if (PJRT_Error* e = pjrt()->PJRT_Event_Await(&a)) {
      PJRT_Error_Destroy_Args d{PJRT_Error_Destroy_Args_STRUCT_SIZE, nullptr, e};
      pjrt()->PJRT_Error_Destroy(&d);
    }
    // The callback may still be running after Await returns: its timestamp is written
    // before anything else, so wait for it.
    while (l->end_ns.load() == 0) std::this_thread::yield();
    PJRT_Event_Destroy_Args d{PJRT_Event_Destroy_Args_STRUCT_SIZE, nullptr, l->event};
    pjrt()->PJRT_Event_Destroy(&d);
    l->event = nullptr;
  }
}

class Session final : public libkineto::IActivityProfilerSession {
 public:
  // Kineto configures registered child profilers for every session once one has asked
  // for device activities: a session without them records nothing here.
  explicit Session(bool device_activities) : record_(device_activities) {}
  void start() override {
    if (!record_) {
      status_ = libkineto::TraceStatus::RECORDING;
      return;
    }
    std::vector<std::unique_ptr<Launch>> stale;  // launched after an earlier session stopped
    {
      std::lock_guard<std::mutex> lock(g_mu);
      stale.swap(g_launches);
    }
    settle(stale);
    start_ns_ = c10::getTime();
    g_device_tracing = true;
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    if (!record_) {
      status_ = libkineto::TraceStatus::PROCESSING;
      return;
    }
    g_device_tracing = false;
    end_ns_ = c10::getTime();
    {
      std::lock_guard<std::mutex> lock(g_mu);
      launches_.swap(g_launches);
      g_launches.clear();
    }
    settle(launches_);
    status_ = libkineto::TraceStatus::PROCESSING;
  }
  std::vector<std::string> errors() override { return {}; }
  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }
  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t,
                    int64_t) override {
    buffer_.span = libkineto::TraceSpan(start_ns_, end_ns_, "tpu");
    std::map<int, int64_t> busy_until;  // each device runs its programs in launch order
    for (auto& l : launches_) {
      int64_t end = std::max(l->end_ns.load(), l->start_ns);
      int64_t start = std::min(std::max(l->start_ns, busy_until[l->device]), end);
      busy_until[l->device] = end;
      buffer_.emplace_activity(buffer_.span, libkineto::ActivityType::CONCURRENT_KERNEL, l->name);
      auto& a = libkineto::CpuTraceBuffer::toRef(buffer_.activities.back());
      a.startTime = start;
      a.endTime = end;
      a.id = static_cast<int32_t>(++next_id_);
      a.device = l->device;
      a.resource = 0;  // the device's one queue
      if (l->correlation) a.linked = linked(static_cast<int32_t>(l->correlation));
      // Logged here; the buffer handed over by getTraceBuffer() keeps the activity alive.
      a.log(logger);
    }
    launches_.clear();
  }
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{0, 0, "tpu", "tpu"});
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::make_unique<libkineto::CpuTraceBuffer>(std::move(buffer_));
  }
  void pushCorrelationId(uint64_t id) override { t_correlation.push_back(id); }
  void popCorrelationId() override {
    if (!t_correlation.empty()) t_correlation.pop_back();
  }

 private:
  bool record_;
  int64_t start_ns_ = 0, end_ns_ = 0;
  int64_t next_id_ = 0;
  std::vector<std::unique_ptr<Launch>> launches_;
  libkineto::CpuTraceBuffer buffer_;
};

class TpuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return activities_; }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config&) override {
    // (A CPU-only session asks for the runtime activity too; device kernels it does not.)
    return std::make_unique<Session>(types.count(libkineto::ActivityType::CONCURRENT_KERNEL) > 0);
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_ = "tpu";
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL,
                                                libkineto::ActivityType::PRIVATEUSE1_RUNTIME};
};

REGISTER_PRIVATEUSE1_PROFILER(TpuActivityProfiler);

}  // namespace

uint64_t current_correlation() {
  if (!g_device_tracing.load(std::memory_order_relaxed) || t_correlation.empty()) return 0;
  return t_correlation.back();
}

CorrelationScope::CorrelationScope(uint64_t correlation) : pushed_(correlation != 0) {
  if (pushed_) t_correlation.push_back(correlation);
}

CorrelationScope::~CorrelationScope() {
  if (pushed_ && !t_correlation.empty()) t_correlation.pop_back();
}

void note_launch(const std::string& name, int device, const std::vector<runtime::BufferPtr>& outputs) {
  if (!g_device_tracing.load(std::memory_order_relaxed) || outputs.empty()) return;
  auto l = std::make_unique<Launch>();
  l->name = name;
  l->device = device;
  l->correlation = t_correlation.empty() ? 0 : t_correlation.back();
  l->start_ns = c10::getTime();
  PJRT_Buffer_ReadyEvent_Args r{PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE, nullptr, outputs.back()->raw(), nullptr};
  if (PJRT_Error* e = pjrt()->PJRT_Buffer_ReadyEvent(&r)) {  // no event: no device time for it
    PJRT_Error_Destroy_Args d{PJRT_Error_Destroy_Args_STRUCT_SIZE, nullptr, e};
    pjrt()->PJRT_Error_Destroy(&d);
    return;
  }
  l->event = r.event;
  Launch* raw = l.get();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_launches.push_back(std::move(l));
  }
  PJRT_Event_OnReady_Args o{PJRT_Event_OnReady_Args_STRUCT_SIZE, nullptr, raw->event, &on_ready, raw};
  if (PJRT_Error* e = pjrt()->PJRT_Event_OnReady(&o)) {
    raw->end_ns = raw->start_ns;  // cannot time it: a zero-length event
    PJRT_Error_Destroy_Args d{PJRT_Error_Destroy_Args_STRUCT_SIZE, nullptr, e};
    pjrt()->PJRT_Error_Destroy(&d);
  }
}

}  // namespace tpu::backend
