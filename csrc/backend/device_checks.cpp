#include "backend/device_checks.h"

#include <algorithm>
#include <iterator>

#include <c10/util/Exception.h>

#include <mutex>
#include <vector>

#include "backend/captured_graph.h"
#include "backend/executor.h"

namespace tpu::backend {
namespace {

struct Check {
  Operand ok;
  std::string message;
};

std::mutex g_mu;
std::vector<Check> g_checks;

// Flags waiting to be read; past this many they are read at the next op that adds one.
constexpr size_t kMaxOutstanding = 256;

}  // namespace

void add_device_check(Operand ok, std::string message) {
  note_device_check(ok, message);
  size_t n;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_checks.push_back({std::move(ok), std::move(message)});
    n = g_checks.size();
  }
  if (eager_mode() == EagerMode::Debug || n > kMaxOutstanding) verify_device_checks();
}

void verify_device_checks() {
  std::vector<Check> checks;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_checks.empty()) return;
    checks.swap(g_checks);
  }
  if (launching_now()) {  // pending() takes the graph lock: not under g_mu
    auto waits = std::stable_partition(checks.begin(), checks.end(),
                                       [](const Check& c) { return !pending(c.ok); });
    std::lock_guard<std::mutex> lock(g_mu);  // ahead of flags added since, in order
    g_checks.insert(g_checks.begin(), std::make_move_iterator(waits),
                    std::make_move_iterator(checks.end()));
    checks.erase(waits, checks.end());
  }
  for (const Check& c : checks) {
    runtime::BufferPtr b = guarded([&] { return resolve(c.ok); });
    bool ok = true;
    guarded([&] {
      runtime::Client::get().to_host(*b, &ok, 1);
      return 0;
    });
    // IndexError by default (out-of-range indices); a "RuntimeError: " prefix asks for
    // PyTorch's generic error instead (invalid values, like CPU's TORCH_CHECK).
    const std::string tag = "RuntimeError: ";
    if (c.message.rfind(tag, 0) == 0) TORCH_CHECK(ok, c.message.substr(tag.size()));
    TORCH_CHECK_INDEX(ok, c.message);
  }
}

}  // namespace tpu::backend
