#include "backend/shape_churn.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "backend/compile_ahead.h"
#include "backend/executor.h"

namespace tpu::backend {

void GraphStructure::add(Program& program, c10::ArrayRef<ir::GraphRef> args) {
  for (char c : program.name())
    if (!std::isdigit(static_cast<unsigned char>(c))) text_ += c;
  text_ += '(';
  for (const ir::GraphRef& a : args) {
    text_ += std::to_string(a.node);
    text_ += '.';
    text_ += std::to_string(a.index);
    text_ += ',';
  }
  text_ += ')';
  programs_.push_back(&program);
}

uint64_t GraphStructure::hash() const { return std::hash<std::string>()(text_); }

namespace {

struct Variants {
  int compiled = 0;             // graphs of this structure compiled (not loaded)
  double compile_seconds = 0;   // ... their compiles' sum
  int op_by_op = 0;             // variants run op by op instead
  std::unordered_set<int64_t> last;  // the latest variant's programs
  // Programs of any earlier variant: sizes that recur (a mixture of experts' tokens per
  // expert, drawn from a small range), so their one-op programs serve later variants.
  std::unordered_set<int64_t> earlier;

  void remember(const std::unordered_set<int64_t>& ids) {
    if (earlier.size() > kMaxRemembered) earlier.clear();  // a bound, not a cache: forget and relearn
    earlier.insert(ids.begin(), ids.end());
    last = ids;
  }
  static constexpr size_t kMaxRemembered = 1 << 16;
  // Variants (their programs, in order) run op by op, and how often each came back.
  std::unordered_map<uint64_t, int> returns;
};

uint64_t variant_of(const GraphStructure& g) {
  uint64_t h = 1469598103934665603ULL;
  for (Program* p : g.programs()) h = (h ^ static_cast<uint64_t>(p->id())) * 1099511628211ULL;
  return h;
}

std::mutex g_mu;
std::unordered_map<uint64_t, Variants> g_structures;

std::unordered_set<int64_t> ids_of(const GraphStructure& g) {
  std::unordered_set<int64_t> ids;
  for (Program* p : g.programs()) ids.insert(p->id());
  return ids;
}

// Seconds one op's program takes to compile: this process's mean once a few have
// compiled; before that, an estimate of five times a fused graph's seconds per op (on
// XLA CPU one-op programs took 31-41 ms, graphs 6-17 ms per op: session 43's notes).
double op_compile_seconds(double graph_seconds_per_op) {
  int64_t n = metrics().op_compiles.load();
  if (n >= 4) return static_cast<double>(metrics().op_compile_us.load()) / 1e6 / static_cast<double>(n);
  return 5 * graph_seconds_per_op;
}

}  // namespace

bool run_op_by_op(const GraphStructure& graph) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_structures.find(graph.hash());
  if (it == g_structures.end() || it->second.compiled < 2) return false;  // no churn seen yet
  Variants& v = it->second;
  // What running op by op would compile: the programs neither loaded nor on disk. Those
  // an earlier variant had too (the latest's, whose shapes stay from step to step, or
  // any's, whose sizes recur): compiled once, they serve the variants still to come
  // (expected: as many as have been). Only those never seen are paid for whole.
  int growing = 0, steady = 0, reshaped = 0;
  std::unordered_set<int64_t> seen;
  for (Program* p : graph.programs()) {
    if (!seen.insert(p->id()).second) continue;
    bool kept = v.last.count(p->id()) > 0;
    reshaped += kept ? 0 : 1;
    if (p->loaded() || compiled_before(p->module_text())) continue;
    (kept || v.earlier.count(p->id()) > 0 ? steady : growing) += 1;
  }
  v.remember(seen);
  // The same programs as the last variant: what changed is not a shape (which values
  // are kept or donated), and such a graph settles and repeats.
  if (reshaped == 0) return false;
  double graph_seconds = v.compile_seconds / v.compiled;
  double per_op = op_compile_seconds(graph_seconds / static_cast<double>(graph.programs().size()));
  int variants = v.compiled + v.op_by_op;
  double predicted = (growing + static_cast<double>(steady) / variants) * per_op / std::max(1, compile_threads());
  if (predicted >= graph_seconds) return false;
  // A variant that comes back compiles once it has come back as often as a quarter of the
  // variants run op by op: a few bucketed lengths cycling compile at their first return
  // (each then worth its fused program), while a decode loop's many lengths, each back
  // once per generate() call, keep running op by op (their one-op programs loaded) rather
  // than compiling a graph per length at the second call.
  if (v.returns.size() > Variants::kMaxRemembered) v.returns.clear();
  auto [seen_before, first_time] = v.returns.try_emplace(variant_of(graph), 0);
  if (!first_time && ++seen_before->second >= static_cast<int>((v.returns.size() + 3) / 4)) return false;
  v.op_by_op += 1;
  return true;
}

void note_graph_compiled(const GraphStructure& graph, double seconds) {
  std::lock_guard<std::mutex> lock(g_mu);
  Variants& v = g_structures[graph.hash()];
  v.compiled += 1;
  v.compile_seconds += seconds;
  v.remember(ids_of(graph));
}

void forget_shape_churn() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_structures.clear();
}

}  // namespace tpu::backend
