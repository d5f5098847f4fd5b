#include "runtime/launch_probe.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <vector>

namespace tpu::runtime {

namespace {
// Written out here: the runtime sits below the IR builder.
const char* kAddOne = R"(module @launch_probe {
  func.func public @main(%x: tensor<16xf32>) -> tensor<16xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<16xf32>
    %y = stablehlo.add %x, %one : tensor<16xf32>
    return %y : tensor<16xf32>
  }
}
)";
}  // namespace

double chained_launch_seconds(Client& client, int device, int n, int repeats) {
  ExecutablePtr exe = client.compile(kAddOne, "launch probe");
  std::vector<float> zeros(16, 0.0f);
  std::vector<double> per_launch;
  for (int r = 0; r <= repeats; ++r) {  // the first chain warms up
    BufferPtr x = client.from_host(zeros.data(), DType::F32, {16}, device);
    client.synchronize(device);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) x = client.execute(*exe, {x.get()}, device, false).at(0);
    float last[16];
    client.to_host(*x, last, sizeof(last));
    auto t1 = std::chrono::steady_clock::now();
    if (last[0] != static_cast<float>(n)) throw Error("launch probe computed a wrong chain", 0);
    if (r > 0) per_launch.push_back(std::chrono::duration<double>(t1 - t0).count() / n);
  }
  std::sort(per_launch.begin(), per_launch.end());
  return per_launch[per_launch.size() / 2];
}

ChainProbe::ChainProbe(Client& client, int device)
    : client_(client), device_(device), exe_(client.compile(kAddOne, "launch probe")) {
  std::vector<float> zeros(16, 0.0f);
  x_ = client.from_host(zeros.data(), DType::F32, {16}, device);
}

void ChainProbe::step() { x_ = client_.execute(*exe_, {x_.get()}, device_, false).at(0); }

float ChainProbe::wait() {
  float last[16];
  client_.to_host(*x_, last, sizeof(last));
  return last[0];
}

namespace {
// Per launch, the traced outputs it is the last to read: the replay frees its copies of
// them there, as the traced step freed its tensors (its peak memory, not the sum).
std::vector<std::vector<const Buffer*>> last_reads(const std::vector<TracedLaunch>& trace) {
  std::unordered_map<const Buffer*, size_t> produced_at, last;
  for (size_t n = 0; n < trace.size(); ++n) {
    for (const BufferPtr& a : trace[n].args)
      if (produced_at.count(a.get())) last[a.get()] = n;
    for (const BufferPtr& o : trace[n].outs) produced_at[o.get()] = n;
  }
  std::vector<std::vector<const Buffer*>> dead(trace.size());
  for (const auto& [b, n] : last) dead[n].push_back(b);
  return dead;
}

// Launches `l` with the replay's outputs standing in for the traced ones it read.
void replay_one(Client& client, const TracedLaunch& l, std::unordered_map<const Buffer*, BufferPtr>& made,
                std::vector<Buffer*>& raw, bool wait) {
  raw.clear();
  for (const BufferPtr& a : l.args) {
    auto it = made.find(a.get());
    raw.push_back(it != made.end() ? it->second.get() : a.get());
  }
  std::vector<BufferPtr> outs = client.execute(*l.exe, raw, l.device, wait);
  for (size_t i = 0; i < outs.size() && i < l.outs.size(); ++i) made[l.outs[i].get()] = std::move(outs[i]);
}
}  // namespace

double replayed_trace_seconds(Client& client, const std::vector<TracedLaunch>& trace, int repeats) {
  std::vector<std::vector<const Buffer*>> dead = last_reads(trace);
  std::vector<double> times;
  for (int r = 0; r <= repeats; ++r) {
    std::unordered_map<const Buffer*, BufferPtr> made;  // traced output -> replayed one
    made.reserve(trace.size() * 2);
    std::vector<Buffer*> raw;
    client.synchronize();
    auto t0 = std::chrono::steady_clock::now();
    for (size_t n = 0; n < trace.size(); ++n) {
      replay_one(client, trace[n], made, raw, false);
      for (const Buffer* b : dead[n]) made.erase(b);
    }
    client.synchronize();
    auto t1 = std::chrono::steady_clock::now();
    if (r > 0) times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times.empty() ? 0.0 : times[times.size() / 2];
}

std::vector<std::pair<std::string, double>> replayed_launch_seconds(
    Client& client, const std::vector<TracedLaunch>& trace, int repeats) {
  std::vector<std::vector<const Buffer*>> dead = last_reads(trace);
  std::vector<std::vector<double>> times(trace.size());
  for (int r = 0; r <= repeats; ++r) {
    std::unordered_map<const Buffer*, BufferPtr> made;
    std::vector<Buffer*> raw;
    client.synchronize();
    for (size_t n = 0; n < trace.size(); ++n) {
      auto t0 = std::chrono::steady_clock::now();
      replay_one(client, trace[n], made, raw, true);
      auto t1 = std::chrono::steady_clock::now();
      if (r > 0) times[n].push_back(std::chrono::duration<double>(t1 - t0).count());
      for (const Buffer* b : dead[n]) made.erase(b);
    }
  }
  std::vector<std::pair<std::string, double>> out;
  for (size_t n = 0; n < trace.size(); ++n) {
    std::sort(times[n].begin(), times[n].end());
    out.emplace_back(trace[n].exe->name, times[n].empty() ? 0.0 : times[n][times[n].size() / 2]);
  }
  return out;
}

}  // namespace tpu::runtime
