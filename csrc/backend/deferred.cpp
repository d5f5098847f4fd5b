#include "backend/deferred.h"

#include <cstdlib>
#include <unordered_map>
#include <unordered_set>

#include "backend/executor.h"
#include "ir/fusion.h"

namespace tpu::backend {

// ---- programs ------------------------------------------------------------------------

Program::Program(const ir::Builder& b, const std::vector<ir::Value>& results, std::string name)
    : name_(std::move(name)), params_(b.params()) {
  static std::atomic<int64_t> next{0};
  id_ = next++;
  for (const ir::Value& v : results) results_.push_back(v.type);
  function_ = b.function(function_name(), results, false);
  module_ = "module @torch_tpu {\n" + b.function("main", results, true) + "}\n";
}

runtime::ExecutablePtr Program::executable() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!exe_) exe_ = guarded([&] { return compile_cached(module_, name_); });
  return exe_;
}

FuseStats& fuse_stats() {
  static FuseStats s;
  return s;
}

bool deferring() { return eager_mode() == EagerMode::DeferAndFuse; }

// ---- the pending graph -----------------------------------------------------------------

struct Node {
  ProgramPtr program;
  std::vector<Operand> inputs;
  std::vector<SlotPtr> outputs;
  int position = 0;
};

namespace {

struct Graph {
  std::vector<std::unique_ptr<Node>> nodes;
  int device = -1;
};

std::recursive_mutex g_mu;
Graph g_graph;

size_t max_graph_ops() {
  static const size_t n = [] {
    const char* s = std::getenv("TPU_FUSE_MAX_OPS");
    long v = s ? std::atol(s) : 0;
    return v > 0 ? static_cast<size_t>(v) : size_t{4096};
  }();
  return n;
}

void count_flush(const char* reason) {
  std::lock_guard<std::mutex> lock(metrics().mu);
  metrics().flushes[reason] += 1;
}

}  // namespace

std::unique_lock<std::recursive_mutex> graph_lock() { return std::unique_lock<std::recursive_mutex>(g_mu); }

std::vector<Operand> run(const ProgramPtr& program, const std::vector<Operand>& args, int device) {
  if (!deferring()) {
    std::vector<runtime::BufferPtr> keep;
    std::vector<runtime::Buffer*> raw;
    for (const Operand& a : args) {
      keep.push_back(resolve(a));
      raw.push_back(keep.back().get());
    }
    std::vector<runtime::BufferPtr> outs = launch(*program->executable(), raw, device);
    return std::vector<Operand>(outs.begin(), outs.end());
  }
  auto lock = graph_lock();
  if (g_graph.device >= 0 && g_graph.device != device) flush("another device");
  if (g_graph.nodes.size() >= max_graph_ops()) flush("graph size bound");
  auto node = std::make_unique<Node>();
  node->program = program;
  node->inputs = args;
  node->position = static_cast<int>(g_graph.nodes.size());
  std::vector<Operand> out;
  for (size_t i = 0; i < program->results().size(); ++i) {
    auto s = std::make_shared<Slot>();
    s->type = program->results()[i];
    s->device = device;
    s->producer = node.get();
    s->index = static_cast<int>(i);
    node->outputs.push_back(s);
    out.emplace_back(std::move(s));
  }
  g_graph.device = device;
  g_graph.nodes.push_back(std::move(node));
  fuse_stats().recorded += 1;
  return out;
}

runtime::BufferPtr resolve(const Operand& v) {
  if (v.buffer) return v.buffer;
  TORCH_INTERNAL_ASSERT(v.slot, "resolving an empty operand");
  if (!v.slot->buffer && v.slot->error.empty()) {
    flush("value needed");
  }
  TORCH_CHECK(v.slot->error.empty(), v.slot->error);
  TORCH_INTERNAL_ASSERT(v.slot->buffer, "a pending value was not produced by its graph");
  return v.slot->buffer;
}

std::vector<Operand> run_internal(const std::string& key,
                                  const std::function<std::vector<ir::Value>(ir::Builder&)>& build,
                                  const std::vector<Operand>& args, int device) {
  static std::mutex mu;
  static std::unordered_map<std::string, ProgramPtr> cache;
  ProgramPtr p;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) p = it->second;
  }
  if (!p) {
    ir::Builder b;
    std::vector<ir::Value> results = build(b);
    p = std::make_shared<Program>(b, results, key);
    std::lock_guard<std::mutex> lock(mu);
    cache.emplace(key, p);
  }
  return run(p, args, device);
}

// ---- flushing: one program per graph -------------------------------------------------------

namespace {

// Where a call's argument comes from: main's parameter `index` (node < 0) or output
// `index` of an earlier call.
struct Wire {
  int node, index;
};
struct Call {
  ProgramPtr program;
  std::vector<Wire> args;
};

std::string describe_graph(const std::vector<Call>& calls) {
  return "fused graph of " + std::to_string(calls.size()) + " ops (" + calls.front().program->name() +
         " ... " + calls.back().program->name() + ")";
}

std::string fused_text(const std::vector<Call>& calls, const std::vector<ir::Type>& param_types,
                       const std::vector<Wire>& results, const std::vector<int>& aliases) {
  ir::FusedModule m;
  std::vector<ir::Value> params;
  for (const ir::Type& t : param_types) params.push_back(m.param(t));
  std::unordered_set<int64_t> added;
  std::vector<std::vector<ir::Value>> values;
  for (const Call& c : calls) {
    if (added.insert(c.program->id()).second) m.add_function(c.program->function_text());
    std::vector<ir::Value> args;
    for (const Wire& w : c.args) args.push_back(w.node < 0 ? params[w.index] : values[w.node][w.index]);
    values.push_back(m.call(c.program->function_name(), args, c.program->results()));
  }
  std::vector<ir::Value> outs;
  for (const Wire& w : results) outs.push_back(values[w.node][w.index]);
  return m.finish(outs, aliases);
}

// After a failed fused launch: runs the calls one by one, so the error names the op
// that failed and the values before it survive.
void replay(const std::vector<Call>& calls, const std::vector<runtime::BufferPtr>& params,
            const std::vector<std::vector<SlotPtr>>& outs, int device) {
  fuse_stats().replays += 1;
  std::vector<std::vector<runtime::BufferPtr>> values;
  for (size_t n = 0; n < calls.size(); ++n) {
    try {
      std::vector<runtime::Buffer*> raw;
      for (const Wire& w : calls[n].args)
        raw.push_back(w.node < 0 ? params[w.index].get() : values[w.node][w.index].get());
      values.push_back(launch(*calls[n].program->executable(), raw, device));
      for (size_t i = 0; i < outs[n].size(); ++i) outs[n][i]->buffer = values[n][i];
    } catch (const std::exception& e) {
      for (size_t m = n; m < calls.size(); ++m)
        for (const SlotPtr& s : outs[m])
          s->error = std::string("a deferred op failed: ") + calls[n].program->name() + ": " + e.what();
      throw;
    }
  }
}

}  // namespace

void flush(const char* reason) {
  auto lock = graph_lock();
  if (g_graph.nodes.empty()) return;
  Graph g = std::move(g_graph);
  g_graph = Graph{};
  count_flush(reason);
  const int device = g.device;

  // Wiring, external inputs, and how often the graph itself references each slot.
  std::string key;
  std::vector<Call> calls;
  std::vector<Operand> ext;
  std::unordered_map<const void*, int> ext_index;
  std::unordered_map<const Slot*, long> graph_refs;
  for (const auto& node : g.nodes) {
    Call c{node->program, {}};
    key += std::to_string(node->program->id()) + "(";
    for (const Operand& in : node->inputs) {
      if (in.slot) graph_refs[in.slot.get()] += 1;
      if (in.slot && in.slot->producer) {
        c.args.push_back({in.slot->producer->position, in.slot->index});
      } else {
        const void* id = in.slot ? static_cast<const void*>(in.slot.get()) : in.buffer.get();
        auto [it, fresh] = ext_index.emplace(id, static_cast<int>(ext.size()));
        if (fresh) ext.push_back(in);
        c.args.push_back({-1, it->second});
      }
      key += (c.args.back().node < 0 ? "e" : "n" + std::to_string(c.args.back().node) + ".") +
             std::to_string(c.args.back().index) + ",";
    }
    key += ")";
    calls.push_back(std::move(c));
  }
  // A slot is an output when something besides the graph holds it (a storage, a caller).
  std::vector<Wire> results;
  std::vector<SlotPtr> result_slots;
  std::vector<std::vector<SlotPtr>> outs;
  key += "->";
  for (const auto& node : g.nodes) {
    for (const SlotPtr& s : node->outputs) {
      auto it = graph_refs.find(s.get());
      long inside = 1 + (it == graph_refs.end() ? 0 : it->second);
      bool live = s.use_count() > inside;
      key += live ? "1" : "0";
      if (live) results.push_back({node->position, s->index});
    }
  }
  for (auto& node : g.nodes) {
    for (const SlotPtr& s : node->outputs) s->producer = nullptr;
    outs.push_back(std::move(node->outputs));
  }
  for (const Wire& w : results) result_slots.push_back(outs[w.node][w.index]);
  fuse_stats().outputs += static_cast<int64_t>(results.size());
  int64_t total = 0;
  for (auto& o : outs) total += static_cast<int64_t>(o.size());
  fuse_stats().elided += total - static_cast<int64_t>(results.size());
  g.nodes.clear();  // drops the graph's references to its inputs

  // External inputs as buffers; those nobody else holds are donated to an output of
  // the same type (an optimizer's in-place update reuses the parameter's memory).
  std::vector<runtime::BufferPtr> params;
  std::vector<ir::Type> param_types;
  for (Operand& e : ext) {
    if (e.slot && e.slot->buffer == nullptr) {
      std::string why = e.slot->error.empty() ? "internal: an input of the graph was never produced"
                                              : e.slot->error;
      for (auto& o : outs)
        for (const SlotPtr& s : o) s->error = why;
      TORCH_CHECK(false, why);
    }
    params.push_back(e.slot ? e.slot->buffer : e.buffer);
    param_types.push_back(ir::Type{params.back()->dtype(), params.back()->dims()});
  }
  std::vector<int> aliases(params.size(), -1);
  std::vector<bool> donate(params.size(), false);
  {
    std::vector<bool> taken(results.size(), false);
    for (size_t i = 0; i < params.size(); ++i) {
      bool sole = ext[i].slot ? (ext[i].slot.use_count() == 1 && params[i].use_count() == 2)
                              : params[i].use_count() == 2;
      if (!sole) continue;
      for (size_t j = 0; j < results.size(); ++j) {
        if (taken[j] || !(result_slots[j]->type.dtype == param_types[i].dtype && result_slots[j]->type.shape == param_types[i].shape)) continue;
        taken[j] = true;
        aliases[i] = static_cast<int>(j);
        donate[i] = true;
        key += "a" + std::to_string(i) + ":" + std::to_string(j);
        break;
      }
    }
  }
  ext.clear();

  static std::mutex cache_mu;
  static std::unordered_map<std::string, runtime::ExecutablePtr> cache;
  runtime::ExecutablePtr exe;
  {
    std::lock_guard<std::mutex> l(cache_mu);
    auto it = cache.find(key);
    if (it != cache.end()) exe = it->second;
  }
  std::vector<runtime::BufferPtr> produced;
  try {
    if (exe) {
      fuse_stats().graph_hits += 1;
    } else {
      std::string text = fused_text(calls, param_types, results, aliases);
      exe = guarded([&] { return compile_cached(text, describe_graph(calls)); });
      std::lock_guard<std::mutex> l(cache_mu);
      cache.emplace(key, exe);
    }
    std::vector<runtime::Buffer*> raw;
    for (auto& p : params) raw.push_back(p.get());
    produced = guarded([&] {
      return runtime::Client::get().execute(*exe, raw, device, eager_mode() == EagerMode::Debug, donate);
    });
  } catch (const std::exception&) {
    // Run op by op instead (nothing was donated: the launch did not start).
    replay(calls, params, outs, device);
    return;
  }
  fuse_stats().graphs += 1;
  for (size_t d = 0; d < donate.size(); ++d) fuse_stats().donated += donate[d] ? 1 : 0;
  for (size_t j = 0; j < result_slots.size(); ++j) result_slots[j]->buffer = produced[j];
}

}  // namespace tpu::backend
