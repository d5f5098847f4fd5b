// The PrivateUse1 profiler stubs: what PyTorch's profiler calls around each op when it
// times the device by events (torch.autograd.profiler.profile(use_device="tpu",
// use_kineto=False), state KINETO_PRIVATEUSE1_FALLBACK). Without them every op logs
// "PrivateUse1 used in profiler but not enabled" and times are garbage.
//
// A device has one in-order queue and PJRT gives no device timestamps, so an event is
// "all work launched so far has finished" taken on the host: in Strict mode recording
// one waits for the device (profiling by events is synchronous, as with
// CUDA_LAUNCH_BLOCKING), so an op's device time is its launch plus its execution. In
// DeferAndFuse nothing runs until a graph is cut, and waiting would cut one per op, so
// events there only take the time. Between two events that saw no program run and no
// transfer the device time is 0, not the host's time: a deferred op or a view did no
// device work (and PyTorch lists an op's calls with and without device time as two rows).
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <chrono>
#include <memory>

#include "backend/deferred.h"
#include "backend/device.h"
#include "backend/executor.h"
#include "runtime/client.h"

namespace tpu::backend {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

struct StubEvent {
  std::chrono::steady_clock::time_point when;
  int64_t device_work;  // programs run and transfers made before `when`
};

int64_t device_work() {
  if (!runtime::Client::initialized()) return 0;
  auto& c = runtime::Client::get().counters();
  return c.executions.load() + c.h2d_transfers.load() + c.d2h_transfers.load() + c.d2d_transfers.load();
}

void wait_for_device(int d) {
  guarded([&] {
    wait_launched();
    runtime::Client::get().synchronize(d);
    return 0;
  });
}

struct TpuProfilerStubs final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    int d = current_device();
    if (device) *device = static_cast<c10::DeviceIndex>(d);
    if (!deferring() && runtime::Client::initialized()) wait_for_device(d);
    auto e = std::make_shared<StubEvent>();
    e->when = std::chrono::steady_clock::now();
    e->device_work = device_work();
    if (cpu_ns) *cpu_ns = c10::getTime();
    *event = std::static_pointer_cast<void>(e);
  }
  float elapsed(const ProfilerVoidEventStub* a, const ProfilerVoidEventStub* b) const override {
    auto* x = static_cast<const StubEvent*>(a->get());
    auto* y = static_cast<const StubEvent*>(b->get());
    TORCH_CHECK(x && y, "tpu profiler: elapsed time of an event that was never recorded");
    if (x->device_work == y->device_work) return 0.f;
    return std::chrono::duration<float, std::micro>(y->when - x->when).count();  // µs, as PyTorch reads it
  }
  // Markers and ranges are for external tools (NVTX on CUDA): none here.
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    for (int d = 0; d < device_count(); ++d) op(d);
  }
  void synchronize() const override {
    if (!runtime::Client::initialized()) return;
    guarded([] { flush("profiler"); return 0; });
    for (int d = 0; d < device_count(); ++d) wait_for_device(d);
  }
};

struct Register {
  Register() {
    static TpuProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} g_register;

}  // namespace
}  // namespace tpu::backend
