#include "backend/inplace_donation.h"

#include <algorithm>
#include <map>
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

// `program`'s module with parameter i aliased to result aliases[i]: its main calls the
// program's own function (as a fused graph calls its programs), so the program's text is
// kept as it is and the compiler inlines the call.
std::string aliased_module(const Program& p, const std::vector<int>& aliases) {
  std::string m = "module @torch_tpu {\n";
  for (const auto& [symbol, text] : p.functions()) m += text;
  m += p.function_text() + "  func.func public @main(";
  std::string args;
  for (size_t i = 0; i < p.params().size(); ++i) {
    m += (i ? ", " : "") + std::string("%arg") + std::to_string(i) + ": " + p.params()[i].str();
    if (aliases[i] >= 0) m += " {tf.aliasing_output = " + std::to_string(aliases[i]) + " : i32}";
    args += (i ? ", %arg" : "%arg") + std::to_string(i);
  }
  const size_t n = p.results().size();
  const std::string results = joined(p.results());
  m += ") -> (" + results + ") {\n    %r" + (n > 1 ? ":" + std::to_string(n) : "") + " = \"func.call\"(" + args +
       ") {callee = @" + p.function_name() + "} : (" + joined(p.params()) + ") -> (" + results + ")\n";
  std::string outs;
  for (size_t j = 0; j < n; ++j) outs += (j ? ", %r" : "%r") + (n > 1 ? "#" + std::to_string(j) : "");
  return m + "    \"func.return\"(" + outs + ") : (" + results + ") -> ()\n  }\n}\n";
}

// Per program and aliasing: its module text and the executable while loaded (the loaded
// programs' bound owns it, as Program::executable's).
struct Aliased {
  std::string text;
  std::weak_ptr<runtime::Executable> exe;
};
std::mutex g_aliased_mu;
std::map<std::pair<int64_t, std::vector<int>>, Aliased> g_aliased;

runtime::ExecutablePtr aliased_executable(const Program& p, const std::vector<int>& aliases) {
  std::unique_lock<std::mutex> lock(g_aliased_mu);
  Aliased& a = g_aliased[{p.id(), aliases}];
  if (runtime::ExecutablePtr exe = a.exe.lock()) return exe;
  if (a.text.empty()) a.text = aliased_module(p, aliases);
  std::string text = a.text;
  lock.unlock();  // compiling takes long: other threads' launches go on
  runtime::ExecutablePtr exe = guarded([&] { return compile_cached(text, p.name()); });
  lock.lock();
  g_aliased[{p.id(), aliases}].exe = exe;
  return exe;
}

// Whether the buffer `a` holds is held by nothing but `a` and the storage (its value, or
// the finished launch's slot that is its value).
bool held_only_by(const Operand& a, const StorageData& s) {
  const Operand& v = s.value;
  long expected = 1;
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

Results run_rewriting(const ProgramPtr& program, Operands args, int device,
                      const StorageRewrite* rewrites, size_t count, bool* donated) {
  *donated = false;
  // Pending operands are resolved in place, as run() does: which buffers they hold decides.
  for (Operand& a : args)
    if (!a.buffer) a = resolve(a);
  std::vector<int> aliases(args.size(), -1);
  std::vector<bool> donate(args.size(), false);
  std::vector<bool> taken(program->results().size(), false);
  for (size_t w = 0; w < count; ++w) {
    const StorageRewrite& r = rewrites[w];
    const Operand& a = args.first[r.param];
    const ir::Type& rt = program->results()[r.result];
    if (taken[r.result] || donate[r.param] || !a.buffer || a.buffer->shared_constant) continue;
    if (a.buffer->dtype() != rt.dtype || a.buffer->dims() != rt.shape || !held_only_by(a, *r.storage)) continue;
    aliases[r.param] = r.result;
    donate[r.param] = true;
    taken[r.result] = true;
  }
  if (std::find(donate.begin(), donate.end(), true) == donate.end()) return run(program, args, device);

  runtime::ExecutablePtr exe = aliased_executable(*program, aliases);
  std::vector<runtime::Buffer*> raw;
  raw.reserve(args.size());
  for (Operand& a : args) raw.push_back(a.buffer.get());
  std::string named;  // over the limit: the error names this call
  if (runtime::Client::get().over_limit(device, exe->output_bytes() + exe->temp_bytes() - exe->alias_bytes))
    named = op_call_name(*program);
  std::vector<runtime::BufferPtr> outs;
  try {
    outs = launch(*exe, raw, device, named.empty() ? program->name() : named, donate);
  } catch (const std::exception& e) {
    // Taken before it failed (Debug waits for the launch): the old value is gone.
    const auto* c = dynamic_cast<const c10::Error*>(&e);
    const std::string why = c ? c->what_without_backtrace() : e.what();
    for (size_t w = 0; w < count; ++w) {
      const StorageRewrite& r = rewrites[w];
      if (donate[r.param] && args.first[r.param].buffer->is_deleted())
        make_unreadable(*r.storage, "its buffer was given to an in-place write that failed: " + why);
    }
    throw;
  }
  for (size_t i = 0; i < args.size(); ++i)
    if (donate[i] && args.first[i].buffer->is_deleted()) {
      fuse_stats().donated += 1;
      *donated = true;
    }
  Results results;
  for (runtime::BufferPtr& b : outs) results.emplace_back(std::move(b));
  return results;
}

bool upload_replacing(const at::Tensor& dst, const at::Tensor& host, DType dtype) {
  StorageData& s = storage_data(dst);
  if (!s.pending.empty() || s.copy_of || s.loaded_bytes.defined() || !s.unreadable.empty()) return false;
  const Operand& v = s.value;
  // Nothing else holds the buffer: no other storage, queued launch or pending graph.
  if (!(v.buffer ? v.buffer.use_count() == 1 : v.slot && is_ready(v) && sole_holder(v))) return false;
  const ir::Type st = v.type();
  const ir::Geometry g = geometry_of(dst);
  std::vector<int64_t> dims(host.sizes().begin(), host.sizes().end());
  if (st.dtype != dtype || !g.covers(st.shape) || (dims != st.shape && dims != g.sizes)) return false;
  runtime::Client& c = runtime::Client::get();
  const int64_t old_bytes = v.buffer ? v.buffer->nbytes() : v.slot->buffer->nbytes();
  guarded([&] {
    c.check_capacity(s.device, static_cast<int64_t>(host.nbytes()), "host-to-device copy", -old_bytes);
    return 0;
  });
  // Dropped as unreadable for the moment, so its bytes are not counted as unwritten ones.
  s.unreadable = "its value was dropped for a copy_ from the CPU that did not finish";
  set_value(s, Operand());
  runtime::BufferPtr buf;
  try {
    buf = guarded([&] { return c.from_host(host.data_ptr(), dtype, dims, s.device); });
  } catch (const c10::Error& e) {
    make_unreadable(s, std::string("its value was dropped for a copy_ from the CPU that failed: ") +
                           e.what_without_backtrace());
    throw;
  }
  note_upload(buf, s.device);
  s.unreadable.clear();
  set_value(s, std::move(buf));
  return true;
}

}  // namespace tpu::backend
