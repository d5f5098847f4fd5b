#include "backend/inplace_donation.h"

#include <algorithm>
#include <unordered_map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/storage.h"

namespace tpu::backend {

bool eager_donation() {
  // Most processes on the XLA CPU plugin never donate: no environment read per op there.
  static const bool safe = runtime::Client::get().donation_safe();
  return safe && donation_allowed();
}

namespace {

std::string joined(const std::vector<ir::Type>& types) {
  std::string s;
  for (size_t i = 0; i < types.size(); ++i) s += (i ? ", " : "") + types[i].str();
  return s;
}

// `program`'s module with parameter i aliased to result aliases[i] (-1: not aliased; -2 - j:
// not a parameter of main, which passes its parameter j there: a buffer an op reads twice,
// x.add_(x), is passed once, as PJRT cannot take a buffer the same launch also reads
// undonated): its main calls the program's own function (as a fused graph calls its
// programs), so the program's text is kept as it is and the compiler inlines the call.
std::string aliased_module(const Program& p, const std::vector<int>& aliases) {
  std::string m = "module @torch_tpu {\n";
  for (const auto& [symbol, text] : p.functions()) m += text;
  m += p.function_text() + "  func.func public @main(";
  std::string args;
  bool first = true;
  for (size_t i = 0; i < p.params().size(); ++i) {
    args += (i ? ", %arg" : "%arg") + std::to_string(aliases[i] <= -2 ? -2 - aliases[i] : static_cast<int>(i));
    if (aliases[i] <= -2) continue;
    m += (first ? "" : ", ") + std::string("%arg") + std::to_string(i) + ": " + p.params()[i].str();
    first = false;
    if (aliases[i] >= 0) m += " {tf.aliasing_output = " + std::to_string(aliases[i]) + " : i32}";
  }
  const size_t n = p.results().size();
  const std::string results = joined(p.results());
  m += ") -> (" + results + ") {\n    %r" + (n > 1 ? ":" + std::to_string(n) : "") + " = \"func.call\"(" + args +
       ") {callee = @" + p.function_name() + "} : (" + joined(p.params()) + ") -> (" + results + ")\n";
  std::string outs;
  for (size_t j = 0; j < n; ++j) outs += (j ? ", %r" : "%r") + (n > 1 ? "#" + std::to_string(j) : "");
  return m + "    \"func.return\"(" + outs + ") : (" + results + ") -> ()\n  }\n}\n";
}

// Per program, per aliasing (nearly always one): its module text and the executable while
// loaded (the loaded programs' bound owns it, as Program::executable's).
struct Aliased {
  std::vector<int> aliases;
  std::string text;
  std::weak_ptr<runtime::Executable> exe;
};
std::mutex g_aliased_mu;
std::unordered_map<int64_t, std::vector<Aliased>> g_aliased;

Aliased& aliased_entry(const Program& p, const std::vector<int>& aliases) {  // under g_aliased_mu
  std::vector<Aliased>& known = g_aliased[p.id()];
  for (Aliased& a : known)
    if (a.aliases == aliases) return a;
  known.push_back({aliases, aliased_module(p, aliases), {}});
  return known.back();
}

runtime::ExecutablePtr aliased_executable(const Program& p, const std::vector<int>& aliases) {
  std::string text;
  {
    std::lock_guard<std::mutex> lock(g_aliased_mu);
    Aliased& a = aliased_entry(p, aliases);
    if (runtime::ExecutablePtr exe = a.exe.lock()) return exe;
    text = a.text;
  }
  // Compiled unlocked (it takes long: other threads' launches go on).
  runtime::ExecutablePtr exe = guarded([&] { return compile_cached(text, p.name()); });
  std::lock_guard<std::mutex> lock(g_aliased_mu);
  aliased_entry(p, aliases).exe = exe;
  return exe;
}

// Smaller buffers are not donated: they save little memory, and on the XLA CPU plugin a
// donated launch waits for the one before it (a 4 KiB x.add_(1): 8 us per op without
// donation, 22 us with; 16 MiB: 6.9 ms without, 0.66 ms with).
constexpr int64_t kMinDonatedBytes = 1 << 20;

// Whether the buffer `a` holds is held by nothing but `a` (and `also` more operands of the
// call) and the storage (its value, or the finished launch's slot that is its value).
bool held_only_by(const Operand& a, const StorageData& s, long also) {
  const Operand& v = s.value;
  long expected = 1 + also;
  if (v.buffer) {
    if (v.buffer != a.buffer) return false;
    expected += 1;
  } else if (v.slot) {
    // (a finished launch's slot: its buffer is set once, read after is_ready's lock)
    if (v.slot.use_count() != 1 || !is_ready(v) || v.slot->buffer != a.buffer) return false;
    expected += 1;
  } else {
    return false;
  }
  return a.buffer.use_count() == expected;
}

}  // namespace

runtime::ExecutablePtr aliased_executable_of(const Program& program, const std::vector<int>& aliases) {
  if (program.module_text().rfind("module @torch_tpu {\n", 0) != 0) return nullptr;
  return aliased_executable(program, aliases);
}

bool worth_donating(const runtime::Buffer& b) { return !b.shared_constant && b.nbytes() >= kMinDonatedBytes; }

namespace {
const char* const kDropped = "its value was dropped for an overwrite that did not finish";

// The buffer of the value only `s` holds (no other storage, queued launch or pending
// graph), or null.
runtime::Buffer* sole_buffer(const StorageData& s) {
  const Operand& v = s.value;
  if (v.buffer) return v.buffer.use_count() == 1 && !v.buffer->shared_constant ? v.buffer.get() : nullptr;
  return v.slot && is_ready(v) && sole_holder(v) ? v.slot->buffer.get() : nullptr;
}

std::string message_of(const std::exception& e) {
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  return c ? c->what_without_backtrace() : e.what();
}
}  // namespace

Results run_rewriting(const ProgramPtr& program, Operands args, int device,
                      const StorageRewrite* rewrites, size_t count, bool* donated) {
  *donated = false;
  // Only an op's own module (not an imported one, whose module may carry attributes the
  // wrapper would drop) is wrapped.
  if (program->module_text().rfind("module @torch_tpu {\n", 0) != 0) return run(program, args, device);
  // Pending operands are resolved in place, as run() does: which buffers they hold decides.
  for (Operand& a : args)
    if (!a.buffer) a = resolve(a);
  std::vector<int> aliases(args.size(), -1);
  std::vector<bool> donate(args.size(), false);
  std::vector<bool> taken(program->results().size(), false);
  bool repeated = false;  // a donated buffer the call also reads through another operand
  for (size_t w = 0; w < count; ++w) {
    const StorageRewrite& r = rewrites[w];
    const Operand& a = args.first[r.param];
    const ir::Type& rt = program->results()[r.result];
    if (taken[r.result] || donate[r.param] || !a.buffer || a.buffer->shared_constant) continue;
    if (a.buffer->nbytes() < kMinDonatedBytes) continue;
    if (a.buffer->dtype() != rt.dtype || a.buffer->dims() != rt.shape) continue;
    long also = 0;
    bool first = true;
    for (size_t i = 0; i < args.size(); ++i)
      if (i != static_cast<size_t>(r.param) && args.first[i].buffer == a.buffer) {
        also += 1;
        first = first && i > static_cast<size_t>(r.param);
      }
    if (!first || !held_only_by(a, *r.storage, also)) continue;  // (donated through its first operand)
    aliases[r.param] = r.result;
    donate[r.param] = true;
    taken[r.result] = true;
    repeated = repeated || also > 0;
  }
  if (std::find(donate.begin(), donate.end(), true) == donate.end()) return run(program, args, device);
  // Its later operands are passed once, through the first (aliased_module).
  if (repeated)
    for (size_t i = 0; i < args.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (donate[j] && args.first[j].buffer == args.first[i].buffer) aliases[i] = -2 - static_cast<int>(j);

  runtime::ExecutablePtr exe = aliased_executable(*program, aliases);
  std::vector<runtime::Buffer*> raw;
  raw.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i)
    if (aliases[i] > -2) raw.push_back(args.first[i].buffer.get());
  std::vector<bool> passed_donate;  // per buffer passed
  for (size_t i = 0; i < args.size(); ++i)
    if (aliases[i] > -2) passed_donate.push_back(donate[i]);
  std::string named;  // over the limit: the error names this call
  if (runtime::Client::get().over_limit(device, exe->output_bytes() + exe->temp_bytes() - exe->alias_bytes))
    named = op_call_name(*program);
  std::vector<runtime::BufferPtr> outs;
  try {
    outs = launch(*exe, raw, device, named.empty() ? program->name() : named, passed_donate);
  } catch (const std::exception& e) {
    // Taken before it failed (Debug waits for the launch): the old value is gone.
    const std::string why = message_of(e);
    for (size_t w = 0; w < count; ++w) {
      const StorageRewrite& r = rewrites[w];
      if (donate[r.param] && args.first[r.param].buffer->is_deleted())
        make_unreadable(*r.storage, "its buffer was given to an in-place write that failed: " + why);
    }
    throw;
  }
  for (size_t i = 0; i < args.size(); ++i)
    if (donate[i] && args.first[i].buffer->donated()) {  // (execute marked the ones it took)
      fuse_stats().donated += 1;
      *donated = true;
    }
  Results results;
  for (runtime::BufferPtr& b : outs) results.emplace_back(std::move(b));
  return results;
}


std::vector<StorageData*> drop_overwritten(const std::vector<StorageData*>& storages, int device, int64_t need) {
  std::vector<StorageData*> dropped;
  int64_t freed = 0;
  for (StorageData* s : storages) {
    if (!s->pending.empty() || s->copy_of || s->loaded_bytes.defined() || !s->unreadable.empty()) continue;
    if (std::find(dropped.begin(), dropped.end(), s) != dropped.end()) continue;
    if (runtime::Buffer* b = sole_buffer(*s)) {
      dropped.push_back(s);
      freed += b->nbytes();
    }
  }
  if (dropped.empty() || runtime::Client::get().over_limit(device, need - freed)) return {};
  for (StorageData* s : dropped) {
    s->unreadable = kDropped;  // first: its bytes are not counted as unwritten ones
    set_value(*s, Operand());
  }
  return dropped;
}

void finish_overwrite(const std::vector<StorageData*>& dropped) {
  for (StorageData* s : dropped)
    if (s->unreadable == kDropped) s->unreadable.clear();
}

void fail_overwrite(const std::vector<StorageData*>& dropped, const std::exception& e) {
  for (StorageData* s : dropped)
    if (s->unreadable == kDropped) make_unreadable(*s, "its value was dropped for an overwrite that failed: " + message_of(e));
}

bool upload_replacing(const at::Tensor& dst, const at::Tensor& host, DType dtype) {
  StorageData& s = storage_data(dst);
  if (!s.value) return false;
  const ir::Type st = s.value.type();
  const ir::Geometry g = geometry_of(dst);
  std::vector<int64_t> dims(host.sizes().begin(), host.sizes().end());
  if (st.dtype != dtype || !g.covers(st.shape) || (dims != st.shape && dims != g.sizes)) return false;
  std::vector<StorageData*> dropped = drop_overwritten({&s}, s.device, static_cast<int64_t>(host.nbytes()));
  if (dropped.empty()) return false;
  runtime::BufferPtr buf;
  try {
    buf = guarded([&] { return runtime::Client::get().from_host(host.data_ptr(), dtype, dims, s.device); });
  } catch (const std::exception& e) {
    fail_overwrite(dropped, e);
    throw;
  }
  note_upload(buf, s.device);
  finish_overwrite(dropped);
  set_value(s, std::move(buf));
  return true;
}

}  // namespace tpu::backend
