#include "backend/executor.h"

#include <cstdlib>
#include <unordered_map>

namespace tpu::backend {

static EagerMode initial_mode() {
  const char* s = std::getenv("TPU_LAUNCH_BLOCKING");
  return (s && std::string(s) == "1") ? EagerMode::Debug : EagerMode::Strict;
}
static std::atomic<int> g_mode{static_cast<int>(initial_mode())};

EagerMode eager_mode() { return static_cast<EagerMode>(g_mode.load()); }
void set_eager_mode(EagerMode m) { g_mode = static_cast<int>(m); }

Metrics& metrics() {
  static Metrics m;
  return m;
}

runtime::ExecutablePtr compile_cached(const std::string& text, const std::string& name) {
  static std::mutex mu;
  static std::unordered_map<std::string, runtime::ExecutablePtr> by_text;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = by_text.find(text);
    if (it != by_text.end()) {
      metrics().program_hits += 1;
      return it->second;
    }
  }
  auto exe = runtime::Client::get().compile(text, name);
  std::lock_guard<std::mutex> lock(mu);
  by_text.emplace(text, exe);
  return exe;
}

std::vector<runtime::BufferPtr> launch(const runtime::Executable& exe,
                                       const std::vector<runtime::Buffer*>& args, int device) {
  return guarded([&] {
    return runtime::Client::get().execute(exe, args, device, eager_mode() == EagerMode::Debug);
  });
}

std::vector<runtime::BufferPtr> run_internal(
    const std::string& key, const std::function<std::string(ir::Builder&)>& build,
    const std::vector<runtime::Buffer*>& args, int device) {
  static std::mutex mu;
  static std::unordered_map<std::string, runtime::ExecutablePtr> cache;
  runtime::ExecutablePtr exe;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) exe = it->second;
  }
  if (!exe) {
    ir::Builder b;
    std::string text = build(b);
    exe = guarded([&] { return compile_cached(text, key); });
    std::lock_guard<std::mutex> lock(mu);
    cache.emplace(key, exe);
  }
  return launch(*exe, args, device);
}

}  // namespace tpu::backend
