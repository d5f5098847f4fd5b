#include "backend/device_checks.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

#include <c10/util/Exception.h>

#include <mutex>
#include <thread>
#include <vector>

#include "backend/captured_graph.h"
#include "backend/executor.h"
#include "backend/storage.h"

namespace tpu::backend {
namespace {

// An output of the checked op, held weakly (checks wait for a sync; memory must not).
struct Output {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  std::weak_ptr<runtime::Buffer> buffer;  // the value the op gave it
  std::weak_ptr<Slot> slot;
};

struct Check {
  Operand ok;
  std::string message;
  std::vector<Output> outputs;
  std::thread::id owner;  // the thread that ran the op: the failure is raised there
};

// A message asks for PyTorch's generic RuntimeError or LinAlgError with these prefixes
// (IndexError without).
const std::string kRuntimeTag = "RuntimeError: ", kLinAlgTag = "LinAlgError: ";
std::string without_tag(const std::string& m) {
  for (const std::string& tag : {kRuntimeTag, kLinAlgTag})
    if (m.rfind(tag, 0) == 0) return m.substr(tag.size());
  return m;
}

bool holds(const Operand& v, const Output& o) {
  if (v.buffer) {
    if (v.buffer == o.buffer.lock()) return true;
    SlotPtr slot = o.slot.lock();  // the slot's buffer, once it ran
    return slot && guarded([&] { return resolve(slot); }) == v.buffer;
  }
  return v.slot && v.slot == o.slot.lock();
}

// The failed op's outputs that still hold its values: reading them raises from now on.
void poison(const Check& c) {
  for (const Output& o : c.outputs) {
    c10::intrusive_ptr<c10::StorageImpl> impl = o.storage.lock();
    StorageData* s = impl ? storage_record(*impl) : nullptr;
    if (s && holds(s->value, o))
      make_unreadable(*s, "this tpu tensor holds the result of an op whose device-side check failed (" +
                              without_tag(c.message) + "); its values are not defined");
  }
}

std::mutex g_mu;
std::vector<Check> g_checks;
// Failed checks another thread read: raised at their own thread's next read (its first).
std::vector<std::pair<std::thread::id, std::string>> g_failed_elsewhere;

void keep_for_owner(const Check& c) {  // under g_mu
  for (const auto& [t, m] : g_failed_elsewhere)
    if (t == c.owner) return;
  g_failed_elsewhere.emplace_back(c.owner, c.message);
}

std::string take_own_failure() {  // under g_mu
  for (auto it = g_failed_elsewhere.begin(); it != g_failed_elsewhere.end(); ++it) {
    if (it->first != std::this_thread::get_id()) continue;
    std::string m = std::move(it->second);
    g_failed_elsewhere.erase(it);
    return m;
  }
  return {};
}

// Flags waiting to be read; past this many they are read at the next op that adds one.
constexpr size_t kMaxOutstanding = 256;

}  // namespace

void add_device_check(Operand ok, std::string message, const std::vector<c10::Storage>& outputs) {
  note_device_check(ok, message);
  std::vector<Output> held;
  for (const c10::Storage& st : outputs) {
    StorageData* s = st ? storage_record(*st.unsafeGetStorageImpl()) : nullptr;
    if (!s || !s->value) continue;
    held.push_back({c10::weak_intrusive_ptr<c10::StorageImpl>(st.getWeakStorageImpl()), s->value.buffer,
                    s->value.slot});
  }
  size_t n;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_checks.push_back({std::move(ok), std::move(message), std::move(held), std::this_thread::get_id()});
    n = g_checks.size();
  }
  if (eager_mode() == EagerMode::Debug || n > kMaxOutstanding) verify_device_checks();
}

void forget_device_checks(const std::vector<const void*>& oks) {
  if (oks.empty()) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_checks.erase(std::remove_if(g_checks.begin(), g_checks.end(),
                                [&](const Check& c) {
                                  return c.ok.slot && std::find(oks.begin(), oks.end(), c.ok.slot.get()) != oks.end();
                                }),
                 g_checks.end());
}

static int device_of(const Operand& v) {
  return v.slot ? v.slot->device : v.buffer ? v.buffer->device() : -1;
}

void verify_device_checks(int device) {
  std::vector<Check> checks;
  std::string earlier;  // this thread's failure another thread read
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_failed_elsewhere.empty()) earlier = take_own_failure();
    if (g_checks.empty() && earlier.empty()) return;
    checks.swap(g_checks);
    if (device >= 0) {  // the other devices' flags stay, in order
      auto other = std::stable_partition(checks.begin(), checks.end(),
                                         [&](const Check& c) { return device_of(c.ok) == device; });
      g_checks.assign(std::make_move_iterator(other), std::make_move_iterator(checks.end()));
      checks.erase(other, checks.end());
    }
  }
  if (launching_now()) {  // pending() takes the graph lock: not under g_mu
    auto waits = std::stable_partition(checks.begin(), checks.end(),
                                       [](const Check& c) { return !pending(c.ok); });
    std::lock_guard<std::mutex> lock(g_mu);  // ahead of flags added since, in order
    g_checks.insert(g_checks.begin(), std::make_move_iterator(waits),
                    std::make_move_iterator(checks.end()));
    checks.erase(waits, checks.end());
  }
  // Every flag is read (each failed one taints its op's outputs); this thread's first
  // failure is raised, other threads' wait for their own next read.
  // The flags are read together: copied one by one, each was a round trip to the device.
  std::vector<runtime::BufferPtr> flags;
  for (size_t i = 0; i < checks.size(); ++i) {
    try {
      flags.push_back(guarded([&] { return resolve_unless_reported(checks[i].ok); }));
    } catch (...) {  // a failure raised here (now reported): the unread flags stay, in order
      std::lock_guard<std::mutex> lock(g_mu);
      g_checks.insert(g_checks.begin(), std::make_move_iterator(checks.begin() + static_cast<std::ptrdiff_t>(i)),
                      std::make_move_iterator(checks.end()));
      throw;
    }
  }
  // A flag whose op never ran (it failed, and that failure was raised): nothing to check,
  // and raising its loss again would blame whatever reads next (a model's weight).
  size_t kept = 0;
  for (size_t i = 0; i < checks.size(); ++i)
    if (flags[i] && kept++ != i) {
      flags[kept - 1] = std::move(flags[i]);
      checks[kept - 1] = std::move(checks[i]);
    }
  flags.resize(kept);
  checks.erase(checks.begin() + static_cast<std::ptrdiff_t>(kept), checks.end());
  std::vector<uint8_t> ok(flags.size(), 1);
  std::vector<runtime::Client::HostCopy> copies;
  for (size_t i = 0; i < flags.size(); ++i) copies.push_back({flags[i].get(), &ok[i], 1});
  guarded([&] {
    runtime::Client::get().to_host_all(copies);
    return 0;
  });
  const Check* failed = nullptr;
  for (size_t i = 0; i < checks.size(); ++i) {
    const Check& c = checks[i];
    if (ok[i]) continue;
    poison(c);
    if (c.owner != std::this_thread::get_id()) {
      std::lock_guard<std::mutex> lock(g_mu);
      keep_for_owner(c);
    } else if (!failed) {
      failed = &c;
    }
  }
  if (!earlier.empty()) raise_check_message(earlier);
  if (failed) raise_check_message(failed->message);
}

void raise_check_message(const std::string& message) {
  if (message.rfind(kRuntimeTag, 0) == 0) TORCH_CHECK(false, without_tag(message));
  if (message.rfind(kLinAlgTag, 0) == 0) TORCH_CHECK_LINALG(false, without_tag(message));
  TORCH_CHECK_INDEX(false, message);
}

}  // namespace tpu::backend
