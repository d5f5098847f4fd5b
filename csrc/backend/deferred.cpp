#include "backend/deferred.h"

#include <chrono>
#include <algorithm>
#include <cstring>
#include <ctime>
#include <condition_variable>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <optional>
#include <deque>
#include <thread>

#include <pthread.h>

#include <c10/util/SmallVector.h>
#include <unordered_map>
#include <unordered_set>

#include <torch/csrc/autograd/graph_task.h>

#include "backend/compile_ahead.h"
#include "backend/shape_churn.h"
#include "backend/executor.h"
#include "backend/inplace_donation.h"
#include "backend/streams.h"
#include "backend/profiler.h"
#include "ir/fusion.h"
#include "ir/remat.h"

namespace tpu::backend {

namespace {
// Adds the microseconds since it was made to `counter` when it goes: the calling thread's
// CPU time (what the work costs, whatever else shares the cores), or wall time for waits.
class ScopedMicros {
 public:
  enum Clock { ThreadCpu, Wall };
  explicit ScopedMicros(std::atomic<int64_t>& counter, Clock clock = ThreadCpu)
      : counter_(counter), clock_(clock), t0_(now()) {}
  ~ScopedMicros() { counter_ += (now() - t0_) / 1000; }
 private:
  int64_t now() const {
    timespec ts;
    clock_gettime(clock_ == ThreadCpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }
  std::atomic<int64_t>& counter_;
  Clock clock_;
  int64_t t0_;
};
}  // namespace

// ---- programs ------------------------------------------------------------------------

namespace {
std::atomic<int64_t> g_next_program{0};
}  // namespace

// Operations in StableHLO text: one per result assignment (" = "), regions' included.
static int64_t count_instructions(const std::string& text) {
  int64_t n = 0;
  for (size_t at = text.find(" = "); at != std::string::npos; at = text.find(" = ", at + 3)) ++n;
  return n;
}

static bool has_slice_write(const std::string& function) {
  return function.find("stablehlo.dynamic_update_slice") != std::string::npos ||
         function.find("stablehlo.scatter") != std::string::npos;
}

static int64_t count_instructions(const std::string& function, const std::map<std::string, std::string>& called) {
  int64_t n = count_instructions(function);
  for (const auto& [symbol, text] : called) n += count_instructions(text);
  return n;
}

Program::Program(const ir::Builder& b, const std::vector<ir::Value>& results, std::string name)
    : name_(std::move(name)), params_(b.params()) {
  id_ = g_next_program++;
  for (const ir::Value& v : results) results_.push_back(v.type);
  function_ = b.function(function_name(), results, false);
  recompute_cost_ = ir::recompute_cost(function_);
  functions_ = b.functions();
  instructions_ = count_instructions(function_, functions_);
  recurrent_step_ = b.recurrent_step();
  writes_slices_ = has_slice_write(function_);
  module_ = "module @torch_tpu {\n";
  for (auto& [symbol, text] : functions_) module_ += text;
  module_ += b.function("main", results, true) + "}\n";
}

Program::Program(std::vector<ir::Type> params, std::vector<ir::Type> results, std::string name, const Emit& emit)
    : name_(std::move(name)), params_(std::move(params)), results_(std::move(results)) {
  id_ = g_next_program++;
  emit(function_name(), &function_, &functions_, &module_);
  instructions_ = count_instructions(function_, functions_);
  writes_slices_ = has_slice_write(function_);
}

runtime::ExecutablePtr Program::executable() {
  std::lock_guard<std::mutex> lock(mu_);
  if (runtime::ExecutablePtr exe = exe_.lock()) return exe;
  runtime::ExecutablePtr exe = guarded([&] { return compile_cached(module_, name_); });
  exe_ = exe;
  return exe;
}

bool Program::loaded() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  return lock.owns_lock() && !exe_.expired();
}

FuseStats& fuse_stats() {
  static FuseStats s;
  return s;
}

namespace {
thread_local int t_launch_now = 0;  // LaunchNow scopes alive on this thread
}  // namespace

LaunchNow::LaunchNow() { t_launch_now += 1; }
LaunchNow::~LaunchNow() { t_launch_now -= 1; }

bool launching_now() { return t_launch_now > 0 && eager_mode() == EagerMode::DeferAndFuse; }

namespace {
thread_local bool t_recording_state = false;
}  // namespace
bool recording_state() { return t_recording_state; }
void set_recording_state(bool on) { t_recording_state = on; }

bool deferring() {
  EagerMode m = eager_mode();
  if (t_launch_now > 0 && m == EagerMode::DeferAndFuse) return false;
  return m == EagerMode::DeferAndFuse || m == EagerMode::DeferAll;
}


// ---- the pending graph -----------------------------------------------------------------

// A call's outputs: most calls have one (inline, no allocation per recorded op).
using SlotList = c10::SmallVector<SlotPtr, 1>;

struct Node {
  ProgramPtr program;
  c10::SmallVector<Operand, 3> inputs;  // most calls read at most three values
  SlotList outputs;
  int position = 0;
  int chain = 0;  // cheap calls (elementwise, reductions, data movement) in a row ending here
  bool backward = false;  // recorded by an autograd backward
  bool compiled = false;  // a compiled graph's replay
  // Recorded for a compiled backward: one of its ops, or its recomputation of a forward value.
  RecordingRole role = RecordingRole::None;
  bool fill = false;      // a constant recorded as state (hoist_fills runs it before its graph)
  // Reads no value, only numbers (a fill, arange, an unwritten storage's zeros): the value
  // a storage first made in a failed graph goes back to (restore_seeded_values).
  bool constant = false;
  uint64_t serial = 0;    // which recorded call it is (nodes are reused)
  std::thread::id owner;  // the thread that recorded it: its failure is raised there
  int64_t lane = 0;       // the recording lane of its graph (recording_lane)
};

namespace {

struct Graph {
  std::vector<std::unique_ptr<Node>> nodes;
  int device = -1;
  int64_t lane = 0;  // recording_lane: a thread's work on the device
  int64_t instructions = 0;  // its calls' Program::instructions, summed
  int recurrent_steps = 0;   // its calls of recurrent-step programs
  // Gradient accumulation's cuts (cut_at_micro_step): where its latest backward ended
  // (0: none yet), the program its forward began with, and whether a cut began it.
  size_t backward_end = 0;
  ProgramPtr forward_start;
  bool micro_step = false;
};

std::recursive_mutex g_mu;
Graph g_graph;  // the pending graph ops are recorded into: that of the last op's device and lane
// The other devices' and lanes' pending graphs, set aside (under g_mu): threads driving
// different devices (nn.DataParallel, the autograd engine's device threads), or serving
// requests on one device, interleave their ops, and a graph cut wherever they did would
// cut at points that depend on timing (new programs to compile at every step). A read of
// another graph's pending value runs that graph first.
using GraphKey = std::pair<int, int64_t>;  // device, lane
std::map<GraphKey, Graph> g_parked;

// A compiled graph's first call recorded apart (begin_side_recording), under g_mu.
struct SideRecording {
  bool active = false;
  Graph stashed;  // the pending graph set aside
  // The set-aside graph's values the recording reads as made: their producers, cleared
  // while it records (a flush wires them as inputs), restored at its end.
  std::vector<std::pair<SlotPtr, Node*>> unlinked;
  std::unordered_set<const Slot*> unlinked_ids;
  bool reads_unlinked = false;  // a recorded op read one of them
  bool holding = false;         // the next submitted job is held, not run
  bool held = false;
};
SideRecording g_side;
void spoil_side_recording();
bool in_pending_graph(const Node* n) {
  return n->position >= 0 && static_cast<size_t>(n->position) < g_graph.nodes.size() &&
         g_graph.nodes[n->position].get() == n;
}

// Slots outlive their graph (storages hold them) and are mostly freed on the launcher
// thread, so the recording thread's allocations never find them cached: freed slots'
// memory is kept on a free list for the next slots.
class SlotMemory {
 public:
  // Neither waits: while another thread holds the list, memory comes from (and goes
  // to) the allocator instead, so nothing can block here (not even a forked child whose
  // parent held the list).
  void* take(size_t n) {
    if (n == kSize && try_lock()) {
      Free* f = free_;
      if (f) {
        free_ = f->next;
        --count_;
      }
      unlock();
      if (f) return f;
    }
    return ::operator new(n);
  }
  void give(void* p, size_t n) {
    if (n == kSize && try_lock()) {
      bool kept = count_ < kMax;
      if (kept) {
        static_cast<Free*>(p)->next = free_;
        free_ = static_cast<Free*>(p);
        ++count_;
      }
      unlock();
      if (kept) return;
    }
    ::operator delete(p);
  }
  static constexpr size_t kSize = 128;  // a slot with its reference counts (checked below)

 private:
  struct Free {
    Free* next;
  };
  bool try_lock() { return !busy_.test_and_set(std::memory_order_acquire); }
  void unlock() { busy_.clear(std::memory_order_release); }
  static constexpr size_t kMax = 1 << 16;
  std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
  Free* free_ = nullptr;
  size_t count_ = 0;
};

SlotMemory& slot_memory() {
  static SlotMemory* m = new SlotMemory;  // never destroyed: slots may be freed at exit
  return *m;
}

template <class T>
struct SlotAllocator {
  using value_type = T;
  SlotAllocator() = default;
  template <class U>
  SlotAllocator(const SlotAllocator<U>&) {}  // NOLINT
  T* allocate(size_t n) {
    return static_cast<T*>(slot_memory().take(std::max(n * sizeof(T), SlotMemory::kSize)));
  }
  void deallocate(T* p, size_t n) { slot_memory().give(p, std::max(n * sizeof(T), SlotMemory::kSize)); }
  template <class U>
  bool operator==(const SlotAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const SlotAllocator<U>&) const { return false; }
};

// The shared block holds the slot and two reference counts beside a vtable pointer.
static_assert(sizeof(Slot) + 24 <= SlotMemory::kSize, "a slot's block no longer fits the pooled size");

SlotPtr new_slot() { return std::allocate_shared<Slot>(SlotAllocator<Slot>()); }

// Nodes of flushed graphs, emptied, for the next ones to reuse (under g_mu): a graph
// records thousands of nodes and frees them together, which the allocator serves slowly.
std::vector<std::unique_ptr<Node>> g_spare_nodes;

std::unique_ptr<Node> new_node() {
  if (g_spare_nodes.empty()) return std::make_unique<Node>();
  std::unique_ptr<Node> n = std::move(g_spare_nodes.back());
  g_spare_nodes.pop_back();
  return n;
}

// A positive count from the environment variable `name`, else `fallback`.
size_t env_count(const char* name, size_t fallback) {
  const char* s = std::getenv(name);
  long v = s ? std::atol(s) : 0;
  return v > 0 ? static_cast<size_t>(v) : fallback;
}

size_t max_graph_ops() {
  static const size_t n = env_count("TPU_FUSE_MAX_OPS", 4096);
  return n;
}

// XLA's compile time grows faster than a program's size once it holds more than about
// 10^5 operations (1,600 randn calls of about 250 operations each: 82 s and 8 GB; a quarter of
// them: 4.3 s), and cheap per-op limits do not see it: one call can be an elementwise op
// or a whole random-number generator. A graph about to pass this many operations is cut
// (where its calls start to repeat, so the pieces share one compile). The 4-layer GPT
// training step of benchmarks/run.py holds about 8,700.
size_t max_graph_instructions() {
  static const size_t n = env_count("TPU_FUSE_MAX_INSTRUCTIONS", 100000);
  return n;
}

void count_flush(const char* reason) {
  std::lock_guard<std::mutex> lock(metrics().mu);
  metrics().flushes[reason] += 1;
}

// Buffers uploaded from the host while a device's graph records (under g_mu), by
// address, with how many of its calls read each: one nothing but those calls holds is
// kept alive by the pending graph alone (before_upload). Cleared when the graph flushes.
struct Upload {
  std::weak_ptr<runtime::Buffer> buffer;
  int reads = 0;
};
std::map<int, std::unordered_map<const runtime::Buffer*, Upload>> g_uploads;

void count_upload_reads(int device, const Operands& args) {
  auto d = g_uploads.find(device);
  if (d == g_uploads.end()) return;
  for (const Operand& in : args) {
    if (!in.buffer) continue;
    auto u = d->second.find(in.buffer.get());
    if (u != d->second.end() && u->second.buffer.lock() == in.buffer) u->second.reads += 1;
  }
}

size_t max_held_upload_bytes() {
  static const size_t n = env_count("TPU_FUSE_MAX_HELD_UPLOADS", size_t{1} << 20);
  return n;
}

}  // namespace

void flush_prefix(const char* reason, size_t count);
void flush_bounded(const char* reason);
void switch_pending_graph(int device, int64_t lane);  // parks the pending graph, resumes that lane's
void flush_pending_graph_of(int device, int64_t lane, const char* reason);

// XLA fuses a chain of cheap ops into one kernel, and its CPU compiler's time grows much
// faster than the chain (1,000 elementwise ops in a row: 4.5 s, 2,000: 28 s, 4,096:
// about 150 s). A model's chains end at its contractions (a 12-layer GPT step's longest
// is under 50); a loop of elementwise updates is cut into graphs of this many, which
// repeat (one compile).
constexpr int kMaxCheapChain = 256;

// An RNN's steps unrolled into one graph compile in time that grows faster than the
// sequence (a 2-layer LSTM's train step over 64 steps: 155 s, against 1.7 s for Strict's
// programs), while its graphs cut every few steps repeat (one compile each kind, and they
// run faster than Strict's op by op). A graph holds at most this many recurrent steps.
constexpr int kMaxRecurrentSteps = 8;

int chain_after(const Operands& args) {  // the chain a cheap call would end
  int chain = 0;
  for (const Operand& in : args)
    if (in.slot && in.slot->producer) chain = std::max(chain, in.slot->producer->chain);
  return chain + 1;
}

// A child forked after the runtime started has the parent's graph and queues but not
// the launcher thread that drains them: it must fail before waiting on either.
static void check_not_forked() { guarded([] { runtime::Client::check_not_forked(); return 0; }); }

std::unique_lock<std::recursive_mutex> graph_lock() {
  check_not_forked();
  return std::unique_lock<std::recursive_mutex>(g_mu);
}

Results run_queued(const ProgramPtr& program, std::vector<Operand> args, int device);

// Strict compiles a program it has not loaded yet ahead, on the compile pool, and queues
// its launch (and that of any op reading a queued op's outputs) for the launcher thread,
// which runs them in order: the caller goes on to the next op with pending outputs.
static bool queue_in_strict(const Program& program, Operands args) {
  if (eager_mode() != EagerMode::Strict || compile_threads() == 0) return false;
  if (!const_cast<Program&>(program).loaded()) return true;
  for (const Operand& a : args)
    if (!a.buffer && !is_ready(a)) return true;
  return false;
}

std::atomic<bool>& split_at_backward_flag() {
  static std::atomic<bool> on{[] {
    const char* s = std::getenv("TPU_SPLIT_AT_BACKWARD");
    return !(s && std::string(s) == "0");
  }()};
  return on;
}
bool split_at_backward() { return split_at_backward_flag().load(std::memory_order_relaxed); }
void set_split_at_backward(bool on) { split_at_backward_flag().store(on); }

thread_local RecordingRole t_recording_role = RecordingRole::None;
int set_recording_role(int role) {
  TORCH_CHECK(role >= 0 && role <= 2, "set_recording_role: ", role, " is not a RecordingRole");
  const int was = static_cast<int>(t_recording_role);
  t_recording_role = static_cast<RecordingRole>(role);
  return was;
}

static void check_inputs_not_lost(const Program& program, const Operands& args);

// Gradient accumulation records forward, backward, forward, backward..., then the update:
// as one graph, XLA inlines and compiles every micro-step's copy (compile time grows with
// their count). Cut where a backward ended once the next forward starts, and the micro-steps'
// graphs repeat: the 2nd..last hit the fused-graph cache. A forward starts with a call that
// reads values none of which is pending (a parameter, the data), not only numbers (a fill);
// another call of that program after the backward, reading no pending value, starts the
// next. An update or a gradient clip reads the gradients, pending: a step without
// accumulation keeps its backward and update together. Called for eager calls outside a
// backward once a backward ended in the pending graph (under g_mu).
bool reads_a_value_none_pending(const Operands& args) {
  bool value = false;
  for (const Operand& in : args) {
    if (in.slot && in.slot->producer) return false;
    value = value || in.slot || (in.buffer && !in.buffer->shared_constant);
  }
  return value;
}

void cut_at_micro_step(const ProgramPtr& program, const Operands& args) {
  Graph& g = g_graph;
  if (g.nodes.back()->backward) {
    g.backward_end = g.nodes.size();
    for (size_t i = 0; !g.forward_start && i < g.nodes.size() && !g.nodes[i]->backward; ++i)
      if (reads_a_value_none_pending(g.nodes[i]->inputs)) g.forward_start = g.nodes[i]->program;
  }
  if (program != g.forward_start || g_side.active || !reads_a_value_none_pending(args)) return;
  flush_prefix("micro-step", g.backward_end);
  g_graph.forward_start = program;
  g_graph.micro_step = true;
}

// The last micro-step's graph, flushed with the update after it: its forward and backward
// run as the earlier micro-steps' graph (cached), the update as a graph of its own.
static void cut_last_micro_step() {
  Graph& g = g_graph;
  if (g.micro_step && g.backward_end > 0 && g.backward_end < g.nodes.size() && !g_side.active)
    flush_prefix("micro-step", g.backward_end);
}

namespace {
thread_local std::string (*t_describe_call)(const void*) = nullptr;
thread_local const void* t_call = nullptr;

// The op call this thread runs `program` for, as an error at the call names it.
std::string call_name(const Program& program) { return t_describe_call ? t_describe_call(t_call) : program.name(); }
}  // namespace

std::string op_call_name(const Program& program) { return call_name(program); }

NamingCall::NamingCall(std::string (*describe)(const void*), const void* call)
    : prev_describe_(t_describe_call), prev_call_(t_call) {
  t_describe_call = describe;
  t_call = call;
}
NamingCall::~NamingCall() {
  t_describe_call = prev_describe_;
  t_call = prev_call_;
}

Results run(const ProgramPtr& program, Operands args, int device, bool eager, bool graph_locked) {
  check_inputs_not_lost(*program, args);
  const bool defer = deferring();
  if (!defer && queue_in_strict(*program, args))
    return run_queued(program, std::vector<Operand>(std::make_move_iterator(args.begin()), std::make_move_iterator(args.end())), device);
  if (!defer) {
    // Pending operands are resolved in place: `args` keeps their buffers alive.
    for (Operand& a : args)
      if (!a.buffer) a = resolve(a);
    // One list per thread, reused (no allocation per launch): nothing between here and
    // the launch runs another op on this thread.
    thread_local std::vector<runtime::Buffer*> raw;
    raw.clear();
    for (const Operand& a : args) raw.push_back(a.buffer.get());
    runtime::Executable& exe = *program->executable();
    std::string named;  // over the limit: the error names this call
    if (runtime::Client::get().over_limit(device, exe.output_bytes() + exe.temp_bytes())) named = call_name(*program);
    std::vector<runtime::BufferPtr> outs = launch(exe, raw, device, named.empty() ? program->name() : named);
    Results results;
    for (runtime::BufferPtr& b : outs) results.emplace_back(std::move(b));
    return results;
  }
  std::unique_lock<std::recursive_mutex> lock;
  if (!graph_locked) lock = graph_lock();
  const int64_t lane = recording_lane(device);
  if ((g_graph.device != device || g_graph.lane != lane) && (g_graph.device >= 0 || !g_parked.empty())) {
    if (g_side.active) flush("another device");  // a compiled graph's recording stays one graph
    else switch_pending_graph(device, lane);
  }
  if (!g_parked.empty())
    for (const Operand& in : args)  // another graph makes it: that graph runs first
      if (in.slot && in.slot->producer && !in_pending_graph(in.slot->producer))
        flush_pending_graph_of(in.slot->device, in.slot->producer->lane,
                               in.slot->device != device ? "another device's value" : "another thread's value");

  if (g_graph.nodes.size() >= max_graph_ops() && eager_mode() != EagerMode::DeferAll) flush_bounded("graph size bound");
  if (eager_mode() != EagerMode::DeferAll && !g_graph.nodes.empty() &&
      g_graph.instructions + program->instructions() > max_graph_instructions())
    flush_bounded("graph instruction bound");
  if (eager_mode() != EagerMode::DeferAll && program->recompute_cost() == ir::RecomputeCost::Cheap &&
      chain_after(args) > kMaxCheapChain)
    flush_bounded("cheap chain bound");
  if (eager_mode() != EagerMode::DeferAll && program->recurrent_step() && g_graph.recurrent_steps >= kMaxRecurrentSteps)
    flush_bounded("recurrent step bound");
  if (g_side.active) {
    for (const Operand& in : args) {
      if (!in.slot) continue;
      if (in.slot->producer && !in_pending_graph(in.slot->producer)) spoil_side_recording();  // another pending value
      else if (g_side.unlinked_ids.count(in.slot.get())) g_side.reads_unlinked = true;
      if (!g_side.active) break;
    }
  }
  // Ops an autograd backward records (eager ones: a compiled graph keeps its own cuts).
  const bool backward = eager && eager_mode() == EagerMode::DeferAndFuse && split_at_backward() &&
                        torch::autograd::get_current_graph_task_id() != -1;
  if (!backward && eager && !g_graph.nodes.empty() && (g_graph.backward_end || g_graph.nodes.back()->backward))
    cut_at_micro_step(program, args);
  if (!g_uploads.empty()) count_upload_reads(device, args);
  std::unique_ptr<Node> node = new_node();
  node->program = program;
  node->inputs.assign(std::make_move_iterator(args.begin()), std::make_move_iterator(args.end()));
  for (const Operand& in : node->inputs)
    if (in.slot && in.slot->producer) {
      in.slot->graph_uses += 1;
      node->chain = std::max(node->chain, in.slot->producer->chain);
    }
  node->chain = program->recompute_cost() == ir::RecomputeCost::Cheap ? node->chain + 1 : 0;
  node->position = static_cast<int>(g_graph.nodes.size());
  if (program->recurrent_step()) g_graph.recurrent_steps += 1;
  node->backward = backward;
  node->compiled = !eager;
  node->role = eager ? t_recording_role : RecordingRole::None;
  node->owner = std::this_thread::get_id();
  node->lane = lane;
  static uint64_t serials = 0;  // under the graph lock
  node->serial = ++serials;
  node->constant = std::all_of(node->inputs.begin(), node->inputs.end(),
                               [](const Operand& in) { return !in.slot && in.buffer && in.buffer->shared_constant; });
  node->fill = recording_state() && node->constant;
  Results out;
  node->outputs.reserve(program->results().size());
  for (size_t i = 0; i < program->results().size(); ++i) {
    auto s = new_slot();
    s->set_type(program, i);
    s->device = device;
    s->producer = node.get();
    s->index = static_cast<int>(i);
    node->outputs.push_back(s);
    out.emplace_back(std::move(s));
  }
  g_graph.device = device;
  g_graph.lane = lane;
  g_graph.instructions += program->instructions();
  g_graph.nodes.push_back(std::move(node));
  fuse_stats().recorded += 1;
  return out;
}

namespace {
std::mutex g_slot_mu;               // guards Slot::buffer / Slot::error

}  // namespace

void note_replacement(const Operand& fresh, const Operand& old) {
  if (!fresh.slot || !old) return;
  const void* r = old.slot && old.slot->producer ? old.slot->replaces  // same graph
                  : old.slot                        ? static_cast<const void*>(old.slot.get())
                                                    : old.buffer.get();
  if (fresh.slot->producer) {
    fresh.slot->replaces = r;
    if (old.slot && old.slot->producer) {  // the storage's value was made in this graph
      const Slot& o = *old.slot;
      Node* seed = o.seed ? o.seed : o.producer->constant ? o.producer : nullptr;
      fresh.slot->seed = seed;
      fresh.slot->seed_serial = o.seed ? o.seed_serial : seed ? seed->serial : 0;
    }
    return;
  }
  std::lock_guard<std::mutex> lock(g_slot_mu);  // a queued launch's: its failure reads it
  fresh.slot->replaces = r;
  // Its launch failed already (keep_replaced_values ran before this): the same, now.
  Slot& f = *fresh.slot;
  const runtime::BufferPtr& before = old.buffer ? old.buffer : old.slot->buffer;
  if (f.error && !f.buffer && before && before->dtype() == f.type().dtype && before->dims() == f.type().shape) {
    f.buffer = before;
    f.error = nullptr;
  }
}

namespace {
std::condition_variable g_slot_cv;  // a graph finished
void forget_launch_error(const std::exception_ptr& e);  // raised here: not again at sync
void raise_launch_error();                              // a recorded error, once
void record_launch_error(const std::exception_ptr& e, std::thread::id owner, uint64_t job);  // for its next sync
bool launch_error_raised(const std::exception_ptr& e);  // reported to the user already
std::atomic<bool> g_values_lost{false};  // some slot holds an error: inputs are checked per call
}  // namespace

namespace {
std::string error_text(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& c) {
    return c.what_without_backtrace();
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

// A value lost to an error the user was told of already: raising that error again would
// report a failure that is not this call's (and retry loops would take it for a new
// out-of-memory), so it is named as the earlier error it is.
[[noreturn]] void raise_lost(const std::exception_ptr& e, const std::string& what) {
  if (!launch_error_raised(e)) {
    forget_launch_error(e);  // reported here, not again at the next sync
    std::rethrow_exception(e);
  }
  // Quoted without CUDA's " out of memory.", which retry loops match (accelerate's batch
  // size finder): a smaller size does not cure this, recreating the lost state does.
  std::string earlier = error_text(e);
  const std::string oom = "out of memory. ";
  if (size_t at = earlier.find(oom); at != std::string::npos) earlier.replace(at, oom.size(), "out of memory: ");
  TORCH_CHECK(false, what, " an input's value was lost to an earlier error, so it cannot be used (the tensor was made ",
              "by work that failed; recreate it). The earlier error: ", earlier);
}
}  // namespace

namespace {
std::string call_name(const Program& program);
}  // namespace

// An op reading a value an earlier failed launch lost raises at its call, before anything
// is written or launched: running it would drop its write or spread the failure silently.
static void check_inputs_not_lost(const Program& program, const Operands& args) {
  if (!g_values_lost.load(std::memory_order_acquire)) return;
  for (const Operand& a : args) {
    if (!a.slot) continue;
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(g_slot_mu);
      if (!a.slot->buffer) e = a.slot->error;
    }
    if (e) raise_lost(e, call_name(program) + ":");
  }
}

bool is_ready(const Operand& v) {
  if (v.buffer) return true;
  std::lock_guard<std::mutex> lock(g_slot_mu);
  return v.slot && v.slot->buffer;
}

bool pending(const Operand& v) {
  if (!v.slot) return false;
  auto lock = graph_lock();
  return v.slot->producer != nullptr;
}

namespace {
runtime::BufferPtr resolve_value(const Operand& v, bool reported_is_null) {
  raise_launch_error();  // a failed launch's error reaches the next value read, as a sync's
  if (v.buffer) return v.buffer;
  TORCH_INTERNAL_ASSERT(v.slot, "resolving an empty operand");
  {
    auto lock = graph_lock();
    if (!v.slot->producer && g_side.active && g_side.unlinked_ids.count(v.slot.get())) spoil_side_recording();
    if (v.slot->producer) flush_pending_graph_of(v.slot->device, v.slot->producer->lane, "value needed");
  }
  std::unique_lock<std::mutex> lock(g_slot_mu);
  g_slot_cv.wait(lock, [&] { return v.slot->buffer || v.slot->error; });
  if (v.slot->error) {
    std::exception_ptr e = v.slot->error;
    lock.unlock();
    if (reported_is_null && launch_error_raised(e)) return nullptr;
    raise_lost(e, "reading a tpu tensor:");
  }
  runtime::BufferPtr b = v.slot->buffer;
  lock.unlock();
  raise_launch_error();  // a job before this value's failed (jobs run in order)
  return b;
}
}  // namespace

runtime::BufferPtr resolve(const Operand& v) { return resolve_value(v, false); }
runtime::BufferPtr resolve_unless_reported(const Operand& v) { return resolve_value(v, true); }

ProgramPtr internal_program(const std::string& key,
                            const std::function<std::vector<ir::Value>(ir::Builder&)>& build) {
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
  return p;
}

Results run_internal(const std::string& key,
                     const std::function<std::vector<ir::Value>(ir::Builder&)>& build,
                     const std::vector<Operand>& args, int device) {
  std::vector<Operand> operands = args;
  return run(internal_program(key, build), operands, device);
}

// ---- flushing: one program per graph -------------------------------------------------------

namespace {

using Wire = ir::GraphRef;
struct Call {
  ProgramPtr program;
  c10::SmallVector<Wire, 4> args;  // inline: one Call per op flushed or queued, no allocation
  std::thread::id owner;  // the thread that issued it
  bool backward = false;  // recorded by an autograd backward
  bool repeats = false;   // ... and runs a forward call again: same program, same inputs
};

std::string describe_graph(const std::vector<Call>& calls) {
  return "fused graph of " + std::to_string(calls.size()) + " ops (" + calls.front().program->name() +
         " ... " + calls.back().program->name() + ")";
}

// What a fused graph may compute twice for a late reader (TPU_FUSE_REMAT): "matmul"
// (the default) recomputes cheap ops (elementwise, normalization, data movement) and
// also contractions whose output is larger than their computed inputs (projections up:
// qkv, MLP in) when it would otherwise stay live across more than half the graph:
// those values set a training step's peak. "cheap" leaves contractions alone; "off".
enum class RematPolicy { Off, Cheap, Matmul };
RematPolicy remat_policy() {
  static const RematPolicy p = [] {
    const char* s = std::getenv("TPU_FUSE_REMAT");
    std::string v = s ? s : "matmul";
    if (v == "off" || v == "0") return RematPolicy::Off;
    if (v == "cheap") return RematPolicy::Cheap;
    if (v != "matmul" && !v.empty())
      TORCH_WARN("TPU_FUSE_REMAT=", v, " is not one of off, cheap, matmul: using matmul");
    return RematPolicy::Matmul;
  }();
  return p;
}
// Readers more than this many calls after a value's earlier readers get a recomputation.
constexpr int kRematGap = 4;

// A backward that runs forward calls again (activation checkpointing's recomputation)
// calls the same programs on the same values: in one program XLA merges the two copies
// and keeps the forward's activations live until the backward, so checkpointing saved
// nothing. Such a call reads one argument through after() on the backward's latest value
// made before it (not itself such a call): the copies differ, and the recomputation
// waits until the backward gets there. The argument is its smallest computed one (after()
// may copy it), or, reading only the graph's inputs, its largest (what its costly part,
// a matmul, surely reads; a scalar would leave that part mergeable). Fenced calls are not
// recomputed again.
void fence_recomputations(const std::vector<Call>& calls, std::vector<ir::GraphCall>& graph,
                          const std::vector<int64_t>& param_bytes) {
  auto bytes = [&](const Wire& w) { return w.node < 0 ? param_bytes[w.index] : graph[w.node].out_bytes[w.index]; };
  Wire anchor{-1, 0};  // the backward's latest value
  for (size_t n = 0; n < calls.size(); ++n) {
    if (!calls[n].backward) continue;
    if (!calls[n].repeats) {
      if (!graph[n].out_bytes.empty() && graph[n].out_bytes[0] > 0) anchor = {static_cast<int>(n), 0};
      continue;
    }
    int computed = -1, input = -1;
    for (size_t i = 0; i < calls[n].args.size(); ++i) {
      const Wire& w = calls[n].args[i];
      int& best = w.node >= 0 ? computed : input;
      if (bytes(w) > 0 && (best < 0 || (w.node >= 0 ? bytes(w) < bytes(calls[n].args[best])
                                                     : bytes(w) > bytes(calls[n].args[best]))))
        best = static_cast<int>(i);
    }
    int k = computed >= 0 ? computed : input;
    if (k < 0 || anchor.node < 0) continue;
    graph[n].after_arg = k;
    graph[n].after = anchor;
    graph[n].recomputable = false;
  }
}

// The calls of a graph in the order they run, with the recomputations rematerialization adds.
ir::Rematerialized remat_plan(const std::vector<Call>& calls, const std::vector<ir::Type>& param_types) {
  auto bytes = [](const ir::Type& t) { return t.numel() * static_cast<int64_t>(itemsize(t.dtype)); };
  std::vector<ir::GraphCall> graph;
  for (size_t n = 0; n < calls.size(); ++n) {
    ir::GraphCall g;
    g.fn = static_cast<int>(n);
    g.args.assign(calls[n].args.begin(), calls[n].args.end());
    for (const ir::Type& t : calls[n].program->results()) g.out_bytes.push_back(bytes(t));
    ir::RecomputeCost cost = calls[n].program->recompute_cost();
    if (remat_policy() == RematPolicy::Off) {
      g.recomputable = false;
    } else if (cost == ir::RecomputeCost::Contraction && remat_policy() == RematPolicy::Matmul) {
      int64_t computed_in = 0, out = 0;
      for (const Wire& w : g.args)
        if (w.node >= 0) computed_in += graph[w.node].out_bytes[w.index];
      for (int64_t b : g.out_bytes) out += b;
      g.recomputable = out > 2 * computed_in;
      g.gap = std::max<int>(kRematGap, static_cast<int>(calls.size() / 2));
    } else {
      g.recomputable = cost == ir::RecomputeCost::Cheap;
    }
    graph.push_back(std::move(g));
  }
  std::vector<int64_t> param_bytes;
  for (const ir::Type& t : param_types) param_bytes.push_back(bytes(t));
  fence_recomputations(calls, graph, param_bytes);
  ir::Rematerialized plan = ir::rematerialize(graph, param_bytes, kRematGap);
  fuse_stats().recomputed += plan.recomputed;
  return plan;
}

// A recurrence written into slices of a buffer (`last = f(last, x[t]); out[t] = last`)
// gives each slice write an update whose producers are the whole recurrence so far, all
// cheap. XLA copies cheap producers into every reader's fusion, so each of the T writes
// computed the recurrence again: the optimized program, and its compile time, grew with
// T² (a GAE loop over T=64: 60 s). Such an update (made by a cheap call, read by a slice
// write not as the buffer it writes, and by another cheap call: the recurrence goes on
// from it) is kept whole (ir::Builder::materialized), and all its readers read that.
// Returns, per call of `plan`, which outputs are.
std::vector<std::vector<bool>> recurrence_writes(const std::vector<Call>& calls, const ir::Rematerialized& plan) {
  const size_t n = plan.calls.size();
  std::vector<std::vector<bool>> written(n), read_cheap(n), keep(n);
  auto program = [&](size_t node) -> const Program& { return *calls[plan.calls[node].fn].program; };
  for (size_t c = 0; c < n; ++c) {
    const size_t outs = program(c).results().size();
    written[c].assign(outs, false);
    read_cheap[c].assign(outs, false);
    keep[c].assign(outs, false);
  }
  for (size_t c = 0; c < n; ++c) {
    const Program& p = program(c);
    for (const Wire& w : plan.calls[c].args) {
      if (w.node < 0) continue;
      const ir::Type& t = program(w.node).results()[w.index];
      bool buffer = std::any_of(p.results().begin(), p.results().end(), [&](const ir::Type& r) {
        return r.dtype == t.dtype && r.shape == t.shape;
      });
      if (p.writes_slices() && !buffer) written[w.node][w.index] = true;
      else if (p.recompute_cost() == ir::RecomputeCost::Cheap) read_cheap[w.node][w.index] = true;
    }
  }
  int64_t kept = 0;
  for (size_t c = 0; c < n; ++c) {
    if (program(c).recompute_cost() != ir::RecomputeCost::Cheap) continue;
    for (size_t i = 0; i < keep[c].size(); ++i) {
      keep[c][i] = written[c][i] && read_cheap[c][i];
      kept += keep[c][i] ? 1 : 0;
    }
  }
  fuse_stats().materialized += kept;
  return keep;
}

void add_functions(const Program& p, std::unordered_set<int64_t>& added,
                   const std::function<void(const std::string&, const std::string&)>& add) {
  if (!added.insert(p.id()).second) return;
  add(p.function_name(), p.function_text());
  for (auto& [symbol, text] : p.functions()) add(symbol, text);  // imported modules
}

// Emits `calls` into `m` (functions they need go to `add(symbol, text)`); returns `results`.
std::vector<ir::Value> emit_calls(ir::FusedModule& m, const std::vector<Call>& calls,
                                  const std::vector<ir::Type>& param_types, const std::vector<Wire>& results,
                                  const std::function<void(const std::string&, const std::string&)>& add) {
  ir::Rematerialized plan = remat_plan(calls, param_types);
  const std::vector<std::vector<bool>> kept = recurrence_writes(calls, plan);
  std::vector<ir::Value> params;
  for (const ir::Type& t : param_types) params.push_back(m.param(t));
  std::unordered_set<int64_t> added;
  std::vector<std::vector<ir::Value>> values;
  auto value = [&](const Wire& w) { return w.node < 0 ? params[w.index] : values[w.node][w.index]; };
  for (const ir::GraphCall& g : plan.calls) {
    const Program& p = *calls[g.fn].program;
    add_functions(p, added, add);
    std::vector<ir::Value> args;
    for (const Wire& w : g.args) args.push_back(value(w));
    if (g.after_arg >= 0) args[g.after_arg] = m.after(args[g.after_arg], value(g.after));
    values.push_back(m.call(p.function_name(), args, p.results()));
    for (size_t i = 0; i < values.back().size(); ++i)
      if (kept[values.size() - 1][i]) values.back()[i] = m.materialized(values.back()[i]);
  }
  std::vector<ir::Value> outs;
  for (const Wire& w : results) outs.push_back(values[plan.position[w.node]][w.index]);
  return outs;
}

std::string fused_text(const std::vector<Call>& calls, const std::vector<ir::Type>& param_types,
                       const std::vector<Wire>& results, const std::vector<int>& aliases) {
  ir::FusedModule m;
  std::unordered_set<std::string> imported;  // each function once per graph
  auto add = [&](const std::string& symbol, const std::string& text) {
    if (imported.insert(symbol).second) m.add_function(text);
  };
  std::vector<ir::Value> outs = emit_calls(m, calls, param_types, results, add);
  return m.finish(outs, aliases);
}

// A step's graph as two programs, cut where its backward starts, after rematerialization
// (so what the backward recomputes is not kept from the forward). The first returns its
// results and the values the second reads; the second takes the graph's parameters, then
// those values. `first_results` / `second_results`: the graph results each returns, in order.
struct SplitTexts {
  std::string first, second;
  std::vector<int> first_results, second_results;  // indexes into the graph's results
  // Each program's inputs, in its parameters' order: the graph parameters it reads (their
  // indexes), and for the second also the values the first hands it (-1 - k: crossing k).
  std::vector<int> first_params, second_inputs;
  std::vector<int> crossing_from;  // per value the first hands the second: its result index there
  int64_t crossing_bytes = 0;       // of those it returns for the second only
};

SplitTexts split_texts(const std::vector<Call>& calls, const std::vector<ir::Type>& param_types,
                       const std::vector<Wire>& results, const std::vector<int>& aliases, int split) {
  ir::Rematerialized plan = remat_plan(calls, param_types);
  const std::vector<std::vector<bool>> kept = recurrence_writes(calls, plan);
  // Recomputations placed just before the backward's first op are the backward's.
  const int cut = plan.position[split - 1] + 1;
  const int total = static_cast<int>(plan.calls.size());
  // The first program's values the second reads. A cheap one is made again in the second
  // instead when what it is made from (parameters, values that cross anyway, or new ones
  // that take fewer bytes than it) costs less memory to keep than it does.
  std::set<std::pair<int, int>> read;
  for (int n = cut; n < total; ++n) {
    for (const Wire& w : plan.calls[n].args)
      if (w.node >= 0 && w.node < cut) read.insert({w.node, w.index});
    const ir::GraphCall& g = plan.calls[n];
    if (g.after_arg >= 0 && g.after.node >= 0 && g.after.node < cut) read.insert({g.after.node, g.after.index});
  }
  std::vector<bool> again(cut, false);  // made again in the second program
  for (int node = cut - 1; node >= 0; --node) {  // the later first: its inputs come earlier
    const ir::GraphCall& g = plan.calls[node];
    if (!g.recomputable || g.after_arg >= 0) continue;
    int64_t saved = 0, added = 0;
    for (size_t i = 0; i < g.out_bytes.size(); ++i)
      if (read.count({node, static_cast<int>(i)})) saved += g.out_bytes[i];
    std::set<std::pair<int, int>> fresh;
    for (const Wire& w : g.args)
      if (w.node >= 0 && !read.count({w.node, w.index}) && fresh.insert({w.node, w.index}).second)
        added += plan.calls[w.node].out_bytes[w.index];
    if (saved == 0 || added >= saved) continue;
    again[node] = true;
    for (size_t i = 0; i < g.out_bytes.size(); ++i) read.erase({node, static_cast<int>(i)});
    read.insert(fresh.begin(), fresh.end());
  }

  ir::FusedModule a, b;
  std::unordered_set<std::string> imported_a, imported_b;
  std::unordered_set<int64_t> added_a, added_b;
  using Add = std::function<void(const std::string&, const std::string&)>;
  Add add_a = [&](const std::string& sym, const std::string& text) {
    if (imported_a.insert(sym).second) a.add_function(text);
  };
  Add add_b = [&](const std::string& sym, const std::string& text) {
    if (imported_b.insert(sym).second) b.add_function(text);
  };
  SplitTexts out;
  // Each program takes only the graph parameters it reads, in the order it first reads
  // them: the forward's text then does not depend on what the rest reads (an optimizer's
  // state, which the first step creates), so the next step's forward is the same program.
  std::vector<std::optional<ir::Value>> params_a(param_types.size()), params_b(param_types.size());
  std::vector<int> position_b(param_types.size(), -1);
  auto param_a = [&](int i) -> ir::Value {
    if (!params_a[i]) {
      params_a[i] = a.param(param_types[i]);
      out.first_params.push_back(i);
    }
    return *params_a[i];
  };
  auto param_b = [&](int i) -> ir::Value {
    if (!params_b[i]) {
      position_b[i] = static_cast<int>(out.second_inputs.size());
      params_b[i] = b.param(param_types[i]);
      out.second_inputs.push_back(i);
    }
    return *params_b[i];
  };
  // A donated parameter stays the second's input even if nothing reads it (a storage
  // overwritten whole): its buffer is where the new value goes.
  for (size_t i = 0; i < aliases.size(); ++i)
    if (aliases[i] >= 0 && plan.position[results[aliases[i]].node] >= cut) param_b(static_cast<int>(i));
  std::vector<std::vector<ir::Value>> values(total), remade(cut);
  std::vector<std::pair<int, int>> crossing_out;         // in the first: (call, output)
  std::map<std::pair<int, int>, ir::Value> crossing_in;  // the second's parameters for them
  std::function<ir::Value(const Wire&)> in_b = [&](const Wire& w) -> ir::Value {
    if (w.node < 0) return param_b(w.index);
    if (w.node >= cut) return values[w.node][w.index];
    if (again[w.node]) {
      if (remade[w.node].empty()) {
        const ir::GraphCall& g = plan.calls[w.node];
        const Program& p = *calls[g.fn].program;
        add_functions(p, added_b, add_b);
        std::vector<ir::Value> args;
        for (const Wire& x : g.args) args.push_back(in_b(x));
        remade[w.node] = b.call(p.function_name(), args, p.results());
      }
      return remade[w.node][w.index];
    }
    auto [it, fresh] = crossing_in.try_emplace({w.node, w.index});
    if (fresh) {
      crossing_out.push_back({w.node, w.index});
      it->second = b.param(values[w.node][w.index].type);
      out.second_inputs.push_back(-static_cast<int>(crossing_out.size()));
    }
    return it->second;
  };
  for (int n = 0; n < total; ++n) {
    const ir::GraphCall& g = plan.calls[n];
    const Program& p = *calls[g.fn].program;
    const bool first = n < cut;
    add_functions(p, first ? added_a : added_b, first ? add_a : add_b);
    std::vector<ir::Value> args;
    for (const Wire& w : g.args) args.push_back(first ? (w.node < 0 ? param_a(w.index) : values[w.node][w.index]) : in_b(w));
    // A recomputation ordered after a value of the first program already runs after it.
    if (g.after_arg >= 0 && (first || g.after.node < 0 || g.after.node >= cut))
      args[g.after_arg] = (first ? a : b).after(args[g.after_arg], first ? values[g.after.node][g.after.index] : in_b(g.after));
    values[n] = (first ? a : b).call(p.function_name(), args, p.results());
    for (size_t i = 0; i < values[n].size(); ++i)
      if (kept[n][i]) values[n][i] = (first ? a : b).materialized(values[n][i]);
  }
  std::vector<ir::Value> outs_a, outs_b;
  std::vector<int> index_in(results.size(), -1);  // a graph result's index in its program's results
  for (size_t j = 0; j < results.size(); ++j) {
    int at = plan.position[results[j].node];
    if (at < cut) {
      index_in[j] = static_cast<int>(outs_a.size());
      outs_a.push_back(values[at][results[j].index]);
      out.first_results.push_back(static_cast<int>(j));
    } else {
      index_in[j] = static_cast<int>(outs_b.size());
      outs_b.push_back(values[at][results[j].index]);
      out.second_results.push_back(static_cast<int>(j));
    }
  }
  // A value the second reads that the first returns anyway is handed over as that result.
  std::map<std::pair<int, int>, int> returned;
  for (size_t k = 0; k < out.first_results.size(); ++k) {
    const Wire& r = results[out.first_results[k]];
    returned.emplace(std::make_pair(plan.position[r.node], r.index), static_cast<int>(k));
  }
  for (const auto& c : crossing_out) {
    auto it = returned.find(c);
    if (it != returned.end()) {
      out.crossing_from.push_back(it->second);
      continue;
    }
    const ir::Value& v = values[c.first][c.second];
    out.crossing_from.push_back(static_cast<int>(outs_a.size()));
    outs_a.push_back(v);
    out.crossing_bytes += v.type.numel() * static_cast<int64_t>(itemsize(v.dtype()));
  }
  // Donated parameters alias results of the second program only (the first reads them).
  std::vector<int> aliases_b(out.second_inputs.size(), -1);
  for (size_t i = 0; i < aliases.size(); ++i) {
    int j = aliases[i];
    if (j >= 0 && plan.position[results[j].node] >= cut) aliases_b[position_b[i]] = index_in[j];
  }
  out.first = a.finish(outs_a, {});
  out.second = b.finish(outs_b, aliases_b);
  return out;
}

// Whether graphs donate (TPU_FUSE_DONATE, read per graph: "0" off; otherwise on where the
// runtime says donation is safe, which on the XLA CPU plugin takes TPU_FUSE_DONATE=1 at
// process start: see runtime::Client::donation_safe).
bool donation_enabled() {
  const char* env = std::getenv("TPU_FUSE_DONATE");
  std::string v = env ? env : "";
  if (v == "0") return false;
  if (runtime::Client::get().donation_safe()) return true;
  if (v == "1")
    TORCH_WARN_ONCE("TPU_FUSE_DONATE=1 was set after the ", runtime::Client::get().platform(),
                    " client started: on this plugin donation needs it at process start; not donating");
  return false;
}

// A flushed graph, everything the launcher thread needs.
struct Job {
  std::string key;
  int device = 0;
  std::vector<Call> calls;
  std::vector<Operand> params;  // buffers, or slots of earlier jobs
  std::vector<const void*> param_ids;  // ... each one's identity (what Slot::replaces names)
  std::vector<ir::Type> param_types;
  std::vector<Wire> results;
  std::vector<SlotPtr> result_slots;
  std::vector<SlotList> outs;  // every call's outputs
  std::vector<int> aliases;
  std::vector<bool> donate;
  std::vector<std::exception_ptr> param_errors;  // inputs earlier jobs failed to make (or empty)
  // Per result (or empty): the constant call whose value its storage held first in this
  // graph (zeros_like then updated in place), {-1, 0} if none (restore_seeded_values).
  std::vector<Wire> result_seeds;
  bool each_call = false;  // Strict's queued launches: each call its own program, no graph
  uint64_t correlation = 0;  // ... the op that queued it, for torch.profiler
  int64_t reserved = 0;      // ... its outputs' bytes, counted at its call (reserve_queued)
  int split = 0;  // > 0: the calls from here on (a backward) run as a second program
  uint64_t serial = 0;  // its place in the launch order (set at submit)
  bool compiled = false;  // a compiled graph's: always compiled (see run_job)
};

std::optional<Job> g_held_job;  // a side recording's final flush (under g_mu)

}  // namespace

bool donation_allowed() { return donation_enabled(); }

struct FlushedGraph {
  std::string key;  // the graph's wiring and outputs, without its donations
  int device = 0;
  std::vector<Call> calls;
  std::vector<ir::Type> param_types;
  std::vector<Wire> results;
  std::vector<int> replaces;  // per result: the input it replaces in its storage, or -1
};

bool sole_holder(const Operand& v) {
  if (!v.slot) return v.buffer.use_count() == 1;
  std::lock_guard<std::mutex> l(g_slot_mu);
  return v.slot.use_count() == 1 && !v.slot->error && (!v.slot->buffer || v.slot->buffer.use_count() == 1);
}

namespace {

std::function<void(const FlushReport&)> g_flush_observer;  // guarded by g_mu

// Inputs nobody else holds are donated to an output of the same type: first to the
// output that replaced the input in its storage (its own update: no copy needed), then
// to any output of its type. Extends `key` with the donations (they shape the program).
void assign_donations(Job& job, const std::vector<bool>& sole, const std::vector<int>& replaces) {
  job.aliases.assign(job.param_types.size(), -1);
  job.donate.assign(job.param_types.size(), false);
  std::vector<bool> taken(job.results.size(), false);
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < job.param_types.size(); ++i) {
      if (!sole[i] || job.donate[i]) continue;
      const ir::Type& pt = job.param_types[i];
      for (size_t j = 0; j < job.results.size(); ++j) {
        const Slot& r = *job.result_slots[j];
        if (taken[j] || r.type().dtype != pt.dtype || r.type().shape != pt.shape) continue;
        if (pass == 0 && replaces[j] != static_cast<int>(i)) continue;
        taken[j] = true;
        job.aliases[i] = static_cast<int>(j);
        job.donate[i] = true;
        job.key += "a" + std::to_string(i) + ":" + std::to_string(j);
        break;
      }
    }
  }
}

void release_queued(int device, int64_t bytes);

// The calls' outputs not yet made hold `e`. It is recorded for the next sync of each
// thread whose call it fails, before any reader can see it (a reader retires it).
void fail_calls(const Job& job, size_t from, size_t to, const std::exception_ptr& e) {
  std::vector<std::thread::id> owners;
  {
    std::lock_guard<std::mutex> lock(g_slot_mu);
    for (size_t n = from; n < to; ++n)
      for (const SlotPtr& s : job.outs[n])
        if (!s->buffer && std::find(owners.begin(), owners.end(), job.calls[n].owner) == owners.end())
          owners.push_back(job.calls[n].owner);
  }
  for (std::thread::id t : owners) record_launch_error(e, t, job.serial);
  g_values_lost.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(g_slot_mu);
  for (size_t n = from; n < to; ++n)
    for (const SlotPtr& s : job.outs[n])
      if (!s->buffer) s->error = e;
}

// The last value a replay made for the storage whose value before the graph was `id`
// (its in-place writes' outputs name it) and still holds, or null.
runtime::BufferPtr last_value_made(const Job& job, const void* id) {  // under g_slot_mu
  for (size_t n = job.outs.size(); n-- > 0;)
    for (const SlotPtr& s : job.outs[n])
      if (s->replaces == id && s->buffer && !s->buffer->is_deleted()) return s->buffer;
  return nullptr;
}

// After a failed launch (a device OOM, say), an in-place result it did not produce
// leaves its storage with the value it had, as on CUDA, where the op never ran: that
// input is still held here. Where a replay donated it (only to fit an op that did not fit
// otherwise: see replay_aliases), the storage keeps the value of its last write that ran,
// as CUDA's eager ops leave it; where none is left, its reads name the error. The error
// stays recorded: the next value read raises it (resolve), and the other results keep it.
void keep_replaced_values(const Job& job, const std::vector<runtime::BufferPtr>& params) {
  std::lock_guard<std::mutex> lock(g_slot_mu);
  for (const SlotPtr& r : job.result_slots) {
    if (r->buffer || !r->error || !r->replaces) continue;
    auto it = std::find(job.param_ids.begin(), job.param_ids.end(), r->replaces);
    size_t i = static_cast<size_t>(it - job.param_ids.begin());
    if (it == job.param_ids.end() || i >= params.size() || !params[i]) continue;
    runtime::BufferPtr kept = params[i];
    if (kept->is_deleted()) kept = last_value_made(job, r->replaces);  // donated by the replay
    if (!kept || kept->dtype() != r->type().dtype || kept->dims() != r->type().shape) continue;
    r->buffer = std::move(kept);
    r->error = nullptr;
  }
}

// After a failed launch, a storage first made in the graph by a constant (zeros_like,
// full, an unwritten storage's zeros) and then written goes back to that constant, as a
// storage made before the graph goes back to its value (keep_replaced_values): a retry
// finds an optimizer's new state as it was made, not lost. `values`: the replay's.
void restore_seeded_values(const Job& job, const std::vector<std::vector<runtime::BufferPtr>>& values) {
  std::lock_guard<std::mutex> lock(g_slot_mu);
  for (size_t j = 0; j < job.result_seeds.size() && j < job.result_slots.size(); ++j) {
    const SlotPtr& r = job.result_slots[j];
    const Wire& w = job.result_seeds[j];
    if (r->buffer || !r->error || w.node < 0 || static_cast<size_t>(w.node) >= values.size()) continue;
    const std::vector<runtime::BufferPtr>& made = values[w.node];
    if (static_cast<size_t>(w.index) >= made.size() || !made[w.index]) continue;
    const runtime::BufferPtr& v = made[w.index];
    if (v->dtype() != r->type().dtype || v->dims() != r->type().shape) continue;
    r->buffer = v;
    r->error = nullptr;
  }
}

// Each value a replay's calls read (a graph input: {-1, i}): its last reader; and the
// values held after the replay (results, seeds).
struct ReplayReads {
  std::map<std::pair<int, int>, size_t> last;
  std::set<std::pair<int, int>> kept;
};

ReplayReads replay_reads(const Job& job) {
  ReplayReads r;
  for (size_t n = 0; n < job.calls.size(); ++n)
    for (const Wire& w : job.calls[n].args) r.last[{w.node, w.index}] = n;
  for (const Wire& w : job.results) r.kept.insert({w.node, w.index});
  for (const Wire& w : job.result_seeds) r.kept.insert({w.node, w.index});
  return r;
}

// What call n of a replay may donate, as aliased_executable_of's aliases (empty: none): a
// graph input nothing outside the graph holds (assign_donations marked it) or a value no
// result or seed is, at its last reader, to an output of its type: first the one that
// replaces it in its storage. One the call reads twice is passed once (PJRT cannot take a
// buffer that the same launch also reads undonated). Used only where the launch does not fit otherwise (a
// graph's first run, op by op, of x.add_(1) on a nearly full device), so replays that fit
// compile no second program.
std::vector<int> replay_aliases(const Job& job, const ReplayReads& reads, size_t n,
                                const std::vector<runtime::Buffer*>& raw) {
  const Call& c = job.calls[n];
  const std::vector<ir::Type>& outs = c.program->results();
  std::vector<int> aliases(raw.size(), -1);
  std::vector<bool> taken(outs.size(), false);
  bool any = false;
  for (size_t k = 0; k < c.args.size(); ++k) {
    const Wire& w = c.args[k];
    size_t j = 0;  // read again (x.add_(x)): passed once, through its first operand
    while (j < k && (c.args[j].node != w.node || c.args[j].index != w.index)) ++j;
    if (j < k) {
      if (aliases[j] >= 0) aliases[k] = -2 - static_cast<int>(j);
      continue;
    }
    const bool input = w.node < 0;
    if (input ? static_cast<size_t>(w.index) >= job.donate.size() || !job.donate[w.index]
              : reads.kept.count({w.node, w.index}) > 0)
      continue;
    auto it = reads.last.find({w.node, w.index});
    if (it == reads.last.end() || it->second != n || !raw[k] || !worth_donating(*raw[k])) continue;
    const void* id = input ? job.param_ids[w.index] : job.outs[w.node][w.index]->replaces;
    int pick = -1;
    for (size_t o = 0; o < outs.size(); ++o) {
      if (taken[o] || outs[o].dtype != raw[k]->dtype() || outs[o].shape != raw[k]->dims()) continue;
      if (pick < 0) pick = static_cast<int>(o);
      if (id && job.outs[n][o]->replaces == id) {
        pick = static_cast<int>(o);
        break;
      }
    }
    if (pick < 0) continue;
    aliases[k] = pick;
    taken[pick] = true;
    any = true;
  }
  if (!any) aliases.clear();
  return aliases;
}

// Launches call n of a replay: donating what replay_aliases allows where `reads` is given
// (found at the first launch that needs them) and the plain launch would not fit.
std::vector<runtime::BufferPtr> launch_replayed(const Job& job, std::optional<ReplayReads>* reads, size_t n,
                                                const std::vector<runtime::Buffer*>& raw) {
  const ProgramPtr& program = job.calls[n].program;
  runtime::ExecutablePtr exe = program->executable();
  if (reads && runtime::Client::get().over_limit(job.device, exe->output_bytes() + exe->temp_bytes())) {
    if (!*reads) *reads = replay_reads(job);
    std::vector<int> aliases = replay_aliases(job, **reads, n, raw);
    runtime::ExecutablePtr aliased = aliases.empty() ? nullptr : aliased_executable_of(*program, aliases);
    if (aliased) {
      std::vector<runtime::Buffer*> passed;  // a buffer read twice, once
      std::vector<bool> donate;
      for (size_t k = 0; k < aliases.size(); ++k)
        if (aliases[k] > -2) {
          passed.push_back(raw[k]);
          donate.push_back(aliases[k] >= 0);
        }
      std::vector<runtime::BufferPtr> made = launch(*aliased, passed, job.device, program->name(), donate);
      for (size_t k = 0; k < passed.size(); ++k) fuse_stats().donated += donate[k] && passed[k]->donated() ? 1 : 0;
      return made;
    }
  }
  return launch(*exe, raw, job.device, program->name());
}

// After a failed fused launch (or with an input that failed): runs the calls one by
// one, so the error names the op that failed. A call that reads a failed value fails
// with it; the others run (a graph may hold several threads' independent ops).
// `donating`: `params` are the only holders of the inputs the job donates (not so while
// the job still holds them).
void replay(const Job& job, const std::vector<runtime::BufferPtr>& params, bool count = true, bool donating = true) {
  if (count) fuse_stats().replays += 1;
  std::optional<ReplayReads> reads;
  const bool donates = donating && !job.donate.empty();
  std::vector<std::vector<runtime::BufferPtr>> values(job.calls.size());
  std::vector<std::exception_ptr> failed(job.calls.size());  // per call: why it did not run
  std::exception_ptr first;
  for (size_t n = 0; n < job.calls.size(); ++n) {
    // A queued launch's outputs, counted since its call, are live (or never made) after it.
    struct Unreserve {
      const Job& job;
      ~Unreserve() { release_queued(job.device, job.reserved); }
    } unreserve{job};
    std::exception_ptr e;
    for (const Wire& w : job.calls[n].args) {
      if (w.node >= 0) e = failed[w.node];
      else if (static_cast<size_t>(w.index) < job.param_errors.size()) e = job.param_errors[w.index];
      if (e) break;
    }
    if (!e) {
      try {
        std::vector<runtime::Buffer*> raw;
        for (const Wire& w : job.calls[n].args)
          raw.push_back(w.node < 0 ? params[w.index].get() : values[w.node][w.index].get());
        values[n] = launch_replayed(job, donates ? &reads : nullptr, n, raw);
        std::lock_guard<std::mutex> lock(g_slot_mu);
        for (size_t i = 0; i < job.outs[n].size(); ++i) job.outs[n][i]->buffer = values[n][i];
        continue;
      } catch (...) {
        e = std::current_exception();
      }
    }
    failed[n] = e;
    if (!first) first = e;
    fail_calls(job, n, n + 1, e);
  }
  if (!first) return;
  keep_replaced_values(job, params);
  restore_seeded_values(job, values);
  std::rethrow_exception(first);
}

// Runs a graph that shape churn sent op by op (run_op_by_op): its programs compile side by
// side on the compile pool while the first ones run.
void run_calls_op_by_op(const Job& job, const std::vector<runtime::BufferPtr>& params) {
  std::unordered_set<const Program*> queued;
  for (const Call& c : job.calls)
    if (compile_threads() > 0 && queued.insert(c.program.get()).second && !c.program->loaded())
      compile_ahead(c.program);
  fuse_stats().op_by_op += 1;
  replay(job, params, false);
}

// A split graph's two executables and how their results map to the graph's.
struct SplitPrograms {
  bool split = false;  // false: the graph runs whole
  std::weak_ptr<runtime::Executable> first, second;
  std::vector<int> first_results, second_results;
  std::vector<int> crossing_from;
  std::vector<int> first_params, second_inputs;  // as SplitTexts'
};

// The split pays where recording bounds the step: small ops, whose forward leaves the
// backward few bytes per op. Where the ops are large, the device bounds the step, and
// the values handed over (in the plain layout, kept through the backward) cost more
// than the overlap gains (benchmarks/RESULTS.md, session 36: a small CNN's step, 250 KiB
// per op, ran 12 % slower split; the small GPT's, 2.4 KiB per op, 11 % faster).
constexpr int64_t kSplitMaxBytesPerCall = 16 << 10;

// Runs a job whose graph has a backward as its forward and the rest; false when the
// graph is better run whole (the caller runs it).
bool run_split(Job& job, const std::vector<runtime::BufferPtr>& params) {
  static std::mutex cache_mu;
  static std::unordered_map<std::string, SplitPrograms> cache;
  const std::string name = describe_graph(job.calls);
  runtime::ExecutablePtr first, second;
  SplitPrograms layout;
  bool known = false;
  std::vector<runtime::BufferPtr> produced;
  try {
    {
      std::lock_guard<std::mutex> l(cache_mu);
      auto it = cache.find(job.key);
      if (it != cache.end()) {
        known = true;
        layout = it->second;
        first = layout.first.lock();
        second = layout.second.lock();
      }
    }
    if (known && !layout.split) return false;
    if (first && second) {
      fuse_stats().graph_hits += 2;
    } else {
      SplitTexts t = split_texts(job.calls, job.param_types, job.results, job.aliases, job.split);
      if (t.crossing_bytes > kSplitMaxBytesPerCall * static_cast<int64_t>(job.calls.size())) {
        std::lock_guard<std::mutex> l(cache_mu);
        cache[job.key] = SplitPrograms{};
        return false;
      }
      // A step whose shapes change from step to step (data-dependent sizes) is a new
      // split graph each time: the same choice as a whole graph's, op by op or compile.
      GraphStructure structure;
      for (const Call& c : job.calls) structure.add(*c.program, c.args);
      bool compiles = !compiled_before(t.first) || !compiled_before(t.second);
      if (compiles && !job.compiled && run_op_by_op(structure)) {
        run_calls_op_by_op(job, params);
        return true;
      }
      auto t0 = std::chrono::steady_clock::now();
      first = guarded([&] { return compile_cached(t.first, name + ", its forward"); });
      second = guarded([&] { return compile_cached(t.second, name + ", after its forward"); });
      std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
      if (compiles) note_graph_compiled(structure, took.count());
      layout = SplitPrograms{true, first, second, std::move(t.first_results), std::move(t.second_results),
                             std::move(t.crossing_from), std::move(t.first_params), std::move(t.second_inputs)};
      std::lock_guard<std::mutex> l(cache_mu);
      cache[job.key] = layout;
    }
    std::vector<runtime::Buffer*> raw;
    for (int i : layout.first_params) raw.push_back(params[i].get());
    ScopedMicros timed_execute(fuse_stats().execute_us);
    produced = guarded([&] { return runtime::Client::get().execute(*first, raw, job.device, false, {}, name); });
  } catch (...) {
    replay(job, params);  // op by op (nothing launched, nothing donated)
    return true;
  }
  note_launch(name + ", its forward", job.device, produced);
  {
    std::lock_guard<std::mutex> lock(g_slot_mu);
    for (size_t k = 0; k < layout.first_results.size(); ++k)
      job.result_slots[layout.first_results[k]]->buffer = produced[k];
  }
  g_slot_cv.notify_all();  // the forward's results (a loss) are readable now

  bool donates = false;  // the second's inputs it was to consume (they are not held here then)
  try {
    std::vector<bool> in_second(job.results.size(), false);
    for (int j : layout.second_results) in_second[j] = true;
    std::vector<runtime::Buffer*> raw;
    std::vector<bool> donate;
    for (int i : layout.second_inputs) {
      if (i < 0) {  // a value the first handed over
        raw.push_back(produced[layout.crossing_from[-1 - i]].get());
        donate.push_back(false);
        continue;
      }
      raw.push_back(params[i].get());
      donate.push_back(static_cast<size_t>(i) < job.donate.size() && job.donate[i] && job.aliases[i] >= 0 &&
                       in_second[job.aliases[i]]);
    }
    donates = std::find(donate.begin(), donate.end(), true) != donate.end();
    ScopedMicros timed_execute(fuse_stats().execute_us);
    std::vector<runtime::BufferPtr> rest = guarded([&] {
      return runtime::Client::get().execute(*second, raw, job.device, false, donate, name);
    });
    note_launch(name + ", after its forward", job.device, rest);
    fuse_stats().graphs += 2;
    for (bool d : donate) fuse_stats().donated += d ? 1 : 0;
    std::lock_guard<std::mutex> lock(g_slot_mu);
    for (size_t k = 0; k < layout.second_results.size(); ++k)
      job.result_slots[layout.second_results[k]]->buffer = rest[k];
  } catch (...) {
    fail_calls(job, 0, job.calls.size(), std::current_exception());  // the second's results (the first's are set)
    if (!donates) keep_replaced_values(job, params);  // an optimizer's in-place updates: as before the step
    throw;
  }
  return true;
}

void run_job(Job& job) {
  ScopedMicros timed(fuse_stats().launch_us);
  std::vector<runtime::BufferPtr> params;
  job.param_ids.clear();
  for (const Operand& p : job.params)
    job.param_ids.push_back(p.slot ? static_cast<const void*>(p.slot.get()) : p.buffer.get());
  bool failed = false;  // an input an earlier job failed to make (the others are held)
  for (size_t i = 0; i < job.params.size(); ++i) {
    const Operand& p = job.params[i];
    if (p.buffer) {
      params.push_back(p.buffer);
      continue;
    }
    std::lock_guard<std::mutex> lock(g_slot_mu);  // an earlier job set it (or failed)
    TORCH_INTERNAL_ASSERT(p.slot->buffer || p.slot->error, "a graph input was never produced");
    params.push_back(p.slot->buffer);
    if (p.slot->error) {
      job.param_errors.resize(job.params.size());
      job.param_errors[i] = p.slot->error;
      failed = true;
    }
  }
  if (failed) {  // the calls that do not read it still run (another thread's, say)
    replay(job, params, false, false);
    return;
  }
  job.params.clear();  // donated buffers are now held only by `params`
  if (job.each_call) {
    CorrelationScope op(job.correlation);
    replay(job, params, false);
    return;
  }
  if (job.split > 0 && run_split(job, params)) return;

  static std::mutex cache_mu;
  static std::unordered_map<std::string, std::weak_ptr<runtime::Executable>> cache;
  runtime::ExecutablePtr exe;
  {
    std::lock_guard<std::mutex> l(cache_mu);
    auto it = cache.find(job.key);
    if (it != cache.end()) exe = it->second.lock();
  }
  std::vector<runtime::BufferPtr> produced;
  bool op_by_op = false;
  try {
    if (exe) {
      fuse_stats().graph_hits += 1;
    } else {
      std::string text = fused_text(job.calls, job.param_types, job.results, job.aliases);
      GraphStructure structure;
      for (const Call& c : job.calls) structure.add(*c.program, c.args);
      bool compiles = !compiled_before(text);
      // Not a compiled graph's (recorded, or holding its replay): Dynamo specialized it
      // to this shape already, and a replay's calls are whole graphs compiling as well.
      op_by_op = compiles && !job.compiled && run_op_by_op(structure);
      if (!op_by_op) {
        auto t0 = std::chrono::steady_clock::now();
        exe = guarded([&] { return compile_cached(text, describe_graph(job.calls)); });
        std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
        if (compiles) note_graph_compiled(structure, took.count());
        std::lock_guard<std::mutex> l(cache_mu);
        cache[job.key] = exe;
      }
    }
    std::vector<runtime::Buffer*> raw;
    for (auto& p : params) raw.push_back(p.get());
    ScopedMicros timed_execute(fuse_stats().execute_us);
    if (!op_by_op)
      produced = guarded([&] { return runtime::Client::get().execute(*exe, raw, job.device, false, job.donate,
                                                          describe_graph(job.calls)); });
  } catch (...) {
    // Run op by op instead (nothing was donated: the launch did not start).
    replay(job, params);
    return;
  }
  if (op_by_op) {
    run_calls_op_by_op(job, params);
    return;
  }
  note_launch(describe_graph(job.calls), job.device, produced);  // a device event for torch.profiler
  fuse_stats().graphs += 1;
  for (bool d : job.donate) fuse_stats().donated += d ? 1 : 0;
  std::lock_guard<std::mutex> lock(g_slot_mu);
  for (size_t j = 0; j < job.result_slots.size(); ++j) job.result_slots[j]->buffer = produced[j];
}

// The launcher thread: runs jobs in flush order, so a job's inputs from earlier jobs
// exist by the time it runs.
class Launcher {
 public:
  void submit(Job job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_) {
        std::thread([this] { loop(); }).detach();  // lives as long as the process
        started_ = true;
      }
      job.serial = ++submitted_;
      queue_.push_back(std::move(job));
      ++pending_;
    }
    cv_.notify_all();
  }

  // A thread's failed launch is raised at its next sync or value read, not another
  // thread's: as on CUDA, where the op's own thread sees its out-of-memory.
  void record(const std::exception_ptr& e, std::thread::id owner, uint64_t job) {
    std::lock_guard<std::mutex> lock(mu_);
    // Later jobs failing on the same input: raised already.
    if (was_raised_locked(e)) return;
    // Work the thread queued before it was told of a failure failed with it (a replayed
    // graph's other ops, a flush's hoisted fills, a job still in flight then).
    if (auto it = told_through_.find(owner); it != told_through_.end() && job <= it->second) {
      note_raised(e);
      drop(e);
      return;
    }
    for (const RecordedError& r : errors_)
      if (r.owner == owner && r.error == e) return;
    errors_.push_back({owner, e});
    has_error_.store(true, std::memory_order_release);
  }

  // `e` was raised to the user (reading a value it lost): not again at a sync.
  void forget(const std::exception_ptr& e) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto self = std::this_thread::get_id();
    bool own = std::any_of(errors_.begin(), errors_.end(),
                           [&](const RecordedError& r) { return r.owner == self && r.error == e; });
    note_raised(e);
    drop(e);
    if (own) tell_failure();
    has_error_.store(!errors_.empty(), std::memory_order_release);
  }

  // This thread's recorded error, raised once (a value read after a failed launch).
  void raise_recorded() {
    if (!has_error_.load(std::memory_order_acquire)) return;
    std::unique_lock<std::mutex> lock(mu_);
    std::exception_ptr e = take_own();
    lock.unlock();
    if (e) std::rethrow_exception(e);
  }

  // Waits for every submitted job to finish and release what it holds; errors stay recorded.
  void wait_quiet() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_ == 0; });
  }

  bool idle() {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_ == 0;
  }

  bool was_raised(const std::exception_ptr& e) {
    std::lock_guard<std::mutex> lock(mu_);
    return was_raised_locked(e);
  }

  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_ == 0; });
    std::exception_ptr e = take_own();
    lock.unlock();
    if (e) std::rethrow_exception(e);
  }

 private:
  std::exception_ptr take_own() {  // under mu_
    auto it = std::find_if(errors_.begin(), errors_.end(),
                           [](const RecordedError& r) { return r.owner == std::this_thread::get_id(); });
    if (it == errors_.end()) return nullptr;
    std::exception_ptr e = it->error;
    tell_failure();
    has_error_.store(!errors_.empty(), std::memory_order_release);
    return e;
  }

  // This thread is being told its queued work failed. One failure is reported once, as on
  // CUDA, where the failing op raises and nothing after it runs: a graph replayed op by
  // op fails in several independent calls, each with its own error, and a flush's fills
  // run as a job of their own, so whichever of them is raised reports them all. Each is
  // retired (values it lost are named as an earlier error) and so is any that work queued
  // until now still brings; work queued later reports its own failure.  Under mu_.
  void tell_failure() {
    const auto self = std::this_thread::get_id();
    told_through_[self] = submitted_;
    std::vector<std::exception_ptr> told;
    for (const RecordedError& r : errors_)
      if (r.owner == self) told.push_back(r.error);
    for (const std::exception_ptr& e : told) {
      note_raised(e);
      drop(e);
    }
  }

  void drop(const std::exception_ptr& e) {  // under mu_; every thread's record of it
    errors_.erase(std::remove_if(errors_.begin(), errors_.end(), [&](const RecordedError& r) { return r.error == e; }),
                  errors_.end());
  }

  bool was_raised_locked(const std::exception_ptr& e) {  // under mu_
    return std::find(raised_list_.begin(), raised_list_.end(), e) != raised_list_.end();
  }

  void note_raised(const std::exception_ptr& e) {  // under mu_
    if (was_raised_locked(e)) return;
    if (raised_list_.size() >= kRaisedKept) raised_list_.pop_front();
    raised_list_.push_back(e);
  }

  void loop() {
    pthread_setname_np(pthread_self(), "tpu-launcher");  // for profilers and top -H
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        run_job(job);
      } catch (...) {
        // fail_calls recorded it for readers and for the next sync
      }
      {
        ScopedMicros timed(fuse_stats().release_us);
        job = Job{};  // release buffers before reporting idle (memory figures)
      }
      g_slot_cv.notify_all();  // slots were written under g_slot_mu
      {
        std::lock_guard<std::mutex> lock(mu_);
        --pending_;
      }
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  int pending_ = 0;
  bool started_ = false;
  uint64_t submitted_ = 0;  // jobs submitted so far (the latest one's serial)
  struct RecordedError {
    std::thread::id owner;
    std::exception_ptr error;
  };
  std::vector<RecordedError> errors_;  // not raised yet, per thread in the order found
  std::atomic<bool> has_error_{false};  // errors_ is not empty: read without the lock per value read
  // Per thread: the last job submitted when it was last told of a failure.
  std::unordered_map<std::thread::id, uint64_t> told_through_;
  // The latest errors raised (or retired) to the user: values they lost are named as
  // earlier errors. A replay's many independent failures fit.
  static constexpr size_t kRaisedKept = 1024;
  std::deque<std::exception_ptr> raised_list_;
};

Launcher& launcher() {
  static Launcher* l = new Launcher();  // never destroyed: its thread may outlive statics
  return *l;
}

void forget_launch_error(const std::exception_ptr& e) { launcher().forget(e); }
void raise_launch_error() { launcher().raise_recorded(); }
void record_launch_error(const std::exception_ptr& e, std::thread::id owner, uint64_t job) {
  launcher().record(e, owner, job);
}
bool launch_error_raised(const std::exception_ptr& e) { return launcher().was_raised(e); }

}  // namespace

namespace {
// Output bytes of Strict's queued launches not made yet, per device: counted at the op's
// call, where its out-of-memory is raised (as Debug's and CUDA's), not at the launch.
constexpr int kMaxDevices = 64;
std::atomic<int64_t> g_queued_bytes[kMaxDevices];

void release_queued(int device, int64_t bytes) {
  if (bytes > 0 && device >= 0 && device < kMaxDevices) g_queued_bytes[device] -= bytes;
}

// Raises torch.OutOfMemoryError at the call when the op's outputs would pass the limit,
// else counts them until the launch makes them. Launches queued before it may still free
// buffers (their inputs the caller dropped): it waits for them before giving up.
int64_t reserve_queued(const Program& program, int device) {
  int64_t bytes = 0;
  for (const ir::Type& t : program.results()) bytes += t.numel() * static_cast<int64_t>(itemsize(t.dtype));
  if (device < 0 || device >= kMaxDevices) return 0;
  runtime::Client& c = runtime::Client::get();
  auto over = [&] {
    return c.stats(device).allocated() + g_queued_bytes[device].load() + bytes > c.memory_limit(device);
  };
  if (over() && !launcher().idle()) launcher().wait_quiet();
  std::string named;  // over the limit: the error names this call
  if (c.over_limit(device, bytes, g_queued_bytes[device].load())) named = call_name(program);
  guarded([&] {
    c.check_capacity(device, bytes, named.empty() ? program.name() : named, g_queued_bytes[device].load());
    return 0;
  });
  g_queued_bytes[device] += bytes;
  return bytes;
}
}  // namespace

Results run_queued(const ProgramPtr& program, std::vector<Operand> args, int device) {
  const int64_t reserved = reserve_queued(*program, device);
  if (!program->loaded()) compile_ahead(program);
  metrics().queued_launches += 1;
  {
    auto lock = graph_lock();  // an input still pending in a recorded graph runs first
    for (const Operand& a : args)
      if (a.slot && a.slot->producer) {
        flush("value needed");
        break;
      }
  }
  Job job;
  job.device = device;
  job.each_call = true;
  job.reserved = reserved;
  job.correlation = current_correlation();
  Call call{program, {}, std::this_thread::get_id()};
  for (size_t i = 0; i < args.size(); ++i) {
    call.args.push_back({-1, static_cast<int>(i)});
    job.param_types.push_back(args[i].type());
  }
  job.calls.push_back(std::move(call));
  SlotList outs;
  Results results;
  for (size_t i = 0; i < program->results().size(); ++i) {
    auto s = new_slot();
    s->set_type(program, i);
    s->device = device;
    s->index = static_cast<int>(i);
    job.results.push_back({0, static_cast<int>(i)});
    job.result_slots.push_back(s);
    outs.push_back(s);
    results.emplace_back(std::move(s));
  }
  job.outs.push_back(std::move(outs));
  job.params = std::move(args);
  launcher().submit(std::move(job));
  return results;
}

void wait_launched() {
  check_not_forked();
  launcher().wait_idle();
}
bool all_launched() {
  check_not_forked();
  return launcher().idle();
}
void settle_launched() {
  check_not_forked();
  launcher().wait_quiet();
}

namespace {
void flush_active(const char* reason) {
  cut_last_micro_step();
  flush_prefix(reason, std::numeric_limits<size_t>::max());
}

void flush_parked(std::map<GraphKey, Graph>::iterator it, const char* reason) {
  Graph active = std::move(g_graph);
  g_graph = std::move(it->second);
  g_parked.erase(it);
  flush_active(reason);
  g_graph = std::move(active);
}
}  // namespace

void switch_pending_graph(int device, int64_t lane) {
  // (a graph leaves the set-aside ones when it becomes active; an empty one in no
  // micro-step is dropped: threads come and go)
  const Graph& g = g_graph;
  if (g.device >= 0 && (!g.nodes.empty() || g.micro_step || g.forward_start || g.backward_end)) {
    GraphKey key{g.device, g.lane};
    TORCH_INTERNAL_ASSERT(!g_parked.count(key), "two pending graphs for tpu:", g.device, " lane ", g.lane);
    g_parked[key] = std::move(g_graph);
  }
  auto it = g_parked.find({device, lane});
  if (it != g_parked.end()) {
    g_graph = std::move(it->second);
    g_parked.erase(it);
  } else {
    g_graph = Graph{};
  }
  g_graph.device = device;
  g_graph.lane = lane;
  fuse_stats().device_switches += 1;
}

void flush_pending_graph_of(int device, int64_t lane, const char* reason) {
  auto it = g_parked.find({device, lane});
  if (it != g_parked.end()) flush_parked(it, reason);
  else if (g_graph.device == device && g_graph.lane == lane) flush_active(reason);
}

void before_upload(int device) {
  if (!deferring()) return;
  auto lock = graph_lock();
  if (g_side.active) return;  // a compiled graph's recording stays one graph
  auto d = g_uploads.find(device);
  if (d == g_uploads.end()) return;
  size_t held = 0;
  for (auto u = d->second.begin(); u != d->second.end();) {
    runtime::BufferPtr b = u->second.buffer.lock();
    if (!b) {
      u = d->second.erase(u);
      continue;
    }
    // Held by this lock and by the calls reading it only: its tensor is gone.
    if (u->second.reads > 0 && b.use_count() == 1 + u->second.reads) held += static_cast<size_t>(b->nbytes());
    ++u;
  }
  if (held < max_held_upload_bytes()) return;
  // Graphs flushed here before are waited for (their uploads are freed once they ran):
  // recording on while the launcher lags piled them up again (the peak then depended on
  // timing). This one runs while the next is recorded.
  launcher().wait_quiet();
  flush_pending_graph_of(device, recording_lane(device), "held uploads bound");
}

void note_upload(const runtime::BufferPtr& buffer, int device) {
  if (!deferring()) return;
  auto lock = graph_lock();
  g_uploads[device][buffer.get()] = Upload{buffer, 0};
}

void flush(const char* reason) {
  auto lock = graph_lock();
  flush_active(reason);
  while (!g_parked.empty()) flush_parked(g_parked.begin(), reason);
}

void flush_devices(const char* reason, const std::vector<int>& devices) {
  auto lock = graph_lock();
  for (int d : devices) flush_pending_graph_of(d, recording_lane(d), reason);
}

size_t pending_graphs() {
  auto lock = graph_lock();
  size_t n = g_graph.nodes.empty() ? 0 : 1;
  for (const auto& [key, g] : g_parked) n += g.nodes.empty() ? 0 : 1;
  return n;
}

// A full graph is cut where its first op recurs last (in its second half): a loop body
// that starts a graph then starts the next one too, so the cut points, and with them
// the programs, repeat from iteration to iteration instead of drifting.
void flush_bounded(const char* reason) {
  const auto& nodes = g_graph.nodes;
  size_t n = nodes.size(), cut = n;
  for (size_t p = n - 1; p >= n / 2 && p > 0; --p) {
    if (nodes[p]->program == nodes[0]->program) {
      cut = p;
      break;
    }
  }
  flush_prefix(reason, cut);
}

// Leaves out the calls nothing reads: a temporary freed before the flush, a value
// autograd computed and dropped. XLA would skip their work anyway, but their inputs
// would stay parameters of the graph (passed and held at every launch), and whether a
// temporary was still referenced when the graph flushed (the garbage collector's timing)
// would change the graph's key. Values leave a graph only as outputs (collectives and
// device checks read theirs), so a call without a referenced result has no effect.
// Returns how many calls were dropped.
size_t drop_dead_calls(Graph& g) {
  std::vector<char> needed(g.nodes.size(), 0);
  for (size_t n = g.nodes.size(); n-- > 0;) {
    const Node& node = *g.nodes[n];
    for (const SlotPtr& s : node.outputs)
      if (s.use_count() > 1 + s->graph_uses) needed[n] = 1;
    if (!needed[n]) continue;
    for (const Operand& in : node.inputs)
      if (in.slot && in.slot->producer) needed[in.slot->producer->position] = 1;
  }
  size_t kept = 0;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    std::unique_ptr<Node>& node = g.nodes[n];
    if (!needed[n]) {
      // Its reads no longer count as the graph's: the values it read keep their liveness.
      for (const Operand& in : node->inputs)
        if (in.slot && in.slot->producer) in.slot->graph_uses -= 1;
      g.instructions -= node->program->instructions();
      *node = Node{};
      if (g_spare_nodes.size() < max_graph_ops()) g_spare_nodes.push_back(std::move(node));
      continue;
    }
    node->position = static_cast<int>(kept);
    if (kept != n) g.nodes[kept] = std::move(node);
    ++kept;
  }
  size_t dropped = g.nodes.size() - kept;
  g.nodes.resize(kept);
  return dropped;
}

// The fills a graph's outputs start from run before the graph, each as its own program:
// an optimizer's state (zeros_like, then updated in place) is then a parameter of the
// first step's graph, as the state it leaves is of the next step's, and the two steps
// are one graph (compiled once on a cold start, not twice). A fill whose value is an
// output as it is goes too. Only fills recorded as state (recording_state: an optimizer's
// step, a GradScaler's first scale): hoisting a fill made every step (a backward's zeros
// for an index's gradient) would cost a launch and a buffer per step and save nothing.
// Not in a capture (compiled mode keeps its graph whole).
// Returns the fills' graph (empty: nothing to hoist, or the graph is only fills).
Graph hoist_fills(Graph& g) {
  Graph fills;
  if (eager_mode() != EagerMode::DeferAndFuse || g_flush_observer || g.nodes.size() < 2) return fills;
  std::unordered_set<const Node*> in_graph;  // made at the first seed met (a step without fills makes none)
  auto pending_here = [&](const Node* n) {
    if (in_graph.empty())
      for (const auto& node : g.nodes) in_graph.insert(node.get());
    return in_graph.count(n) > 0;
  };
  std::vector<char> hoist(g.nodes.size(), 0);
  size_t count = 0;
  for (const auto& node : g.nodes) {
    for (const SlotPtr& s : node->outputs) {
      if (s.use_count() <= 1 + s->graph_uses) continue;  // not an output
      const Node* seed = node->fill ? node.get() : nullptr;
      // (the pointer is compared before the node is read: a seed flushed before may be freed)
      if (!seed && s->seed && pending_here(s->seed) && s->seed->serial == s->seed_serial && s->seed->fill) {
        seed = s->seed;
        // Its storage's value before this graph is now the fill's: a failure restores it.
        if (!s->replaces && seed->outputs.size() == 1) s->replaces = seed->outputs[0].get();
      }
      if (seed && !hoist[seed->position]) {
        hoist[seed->position] = 1;
        ++count;
      }
    }
  }
  if (count == 0 || count == g.nodes.size()) return fills;
  // The graph's reads of the fills' values become external: they keep those live.
  for (const auto& node : g.nodes)
    if (!hoist[node->position])
      for (const Operand& in : node->inputs)
        if (in.slot && in.slot->producer && hoist[in.slot->producer->position]) in.slot->graph_uses -= 1;
  fills.device = g.device;
  size_t kept = 0;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    std::unique_ptr<Node>& node = g.nodes[n];
    if (hoist[n]) {
      node->position = static_cast<int>(fills.nodes.size());
      fills.instructions += node->program->instructions();
      g.instructions -= node->program->instructions();
      fills.nodes.push_back(std::move(node));
      continue;
    }
    node->position = static_cast<int>(kept);
    if (kept != n) g.nodes[kept] = std::move(node);
    ++kept;
  }
  g.nodes.resize(kept);
  fuse_stats().hoisted_fills += static_cast<int64_t>(count);
  return fills;
}

// Per node: recorded by a backward that runs a forward node again (the same program on
// the same inputs: activation checkpointing's recomputation), for fence_recomputations.
// Compared by a hash of the program and the inputs' identities (run at every flush: no
// strings); a collision only fences a call, which changes no value.
std::vector<bool> backward_repeats(const Graph& g) {
  std::vector<bool> repeats(g.nodes.size(), false);
  if (std::none_of(g.nodes.begin(), g.nodes.end(), [](const auto& n) { return n->backward; })) return repeats;
  auto signature = [](const Node& node) {
    uint64_t h = std::hash<uint64_t>()(static_cast<uint64_t>(node.program->id()));
    auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    for (const Operand& in : node.inputs) {
      if (in.slot && in.slot->producer)  // a value of the graph: its node and output
        mix((static_cast<uint64_t>(in.slot->producer->position) << 20) ^ static_cast<uint64_t>(in.slot->index) ^ 1);
      else  // an input: the same storage (equal scalars share one buffer)
        mix(reinterpret_cast<uintptr_t>(in.slot ? static_cast<const void*>(in.slot.get()) : in.buffer.get()));
    }
    return h;
  };
  std::unordered_set<uint64_t> forward;
  for (const auto& node : g.nodes) {
    if (!node->backward) forward.insert(signature(*node));
    else repeats[node->position] = forward.count(signature(*node)) > 0;
  }
  return repeats;
}

// Keys a flushed graph, marks its outputs and donations, and hands it to the launcher.
// `each_call`: its calls run as their own programs, not as one graph.
void submit_graph(Graph g, bool each_call) {
  int64_t largest = fuse_stats().largest_instructions.load();
  while (g.instructions > largest && !fuse_stats().largest_instructions.compare_exchange_weak(largest, g.instructions)) {
  }
  Job job;
  job.device = g.device;
  job.each_call = each_call;

  // Wiring and external inputs. The key is binary (raw integers, no formatting): per
  // call its program's id, its argument count and each argument's source (a node and
  // output, or -1 and an external input), then one byte per output (live or elided).
  // Written through a pointer into a buffer sized for it (appends cost a call each).
  std::string& key = job.key;
  size_t key_bytes = sizeof(int32_t) + 1;
  for (const auto& node : g.nodes)
    key_bytes += sizeof(int64_t) + 1 + sizeof(int32_t) + node->inputs.size() * 2 * sizeof(int32_t) +
                 node->outputs.size();
  key.resize(key_bytes);
  char* at = key.data();
  auto put = [&at](auto v) {
    std::memcpy(at, &v, sizeof v);
    at += sizeof v;
  };
  auto put_char = [&at](char c) { *at++ = c; };
  std::vector<Operand> ext;
  ext.reserve(g.nodes.size());
  std::unordered_map<const void*, int> ext_index;
  job.calls.reserve(g.nodes.size());
  job.outs.reserve(g.nodes.size());
  std::vector<bool> repeats = backward_repeats(g);
  for (const auto& node : g.nodes) {
    // A compiled backward's ops are fenced as an eager backward's: its partition names
    // the recomputations (the same program again need not be in this graph).
    Call& c = job.calls.emplace_back(Call{node->program, {}, node->owner,
                                          node->backward || node->role != RecordingRole::None,
                                          repeats[node->position] || node->role == RecordingRole::Recomputation});
    put(static_cast<int64_t>(node->program->id()));
    put_char(c.repeats ? 'r' : node->backward ? 'b' : 'f');
    put(static_cast<int32_t>(node->inputs.size()));
    for (const Operand& in : node->inputs) {
      if (in.slot && in.slot->producer) {
        c.args.push_back({in.slot->producer->position, in.slot->index});
      } else {
        const void* id = in.slot ? static_cast<const void*>(in.slot.get()) : in.buffer.get();
        if (!in.slot && in.buffer && in.buffer->shared_constant) {  // one parameter per use
          ext.push_back(in);
          c.args.push_back({-1, static_cast<int>(ext.size()) - 1});
        } else {
          auto [it, fresh] = ext_index.emplace(id, static_cast<int>(ext.size()));
          if (fresh) ext.push_back(in);
          c.args.push_back({-1, it->second});
        }
      }
      put(static_cast<int32_t>(c.args.back().node));
      put(static_cast<int32_t>(c.args.back().index));
    }
  }
  // A slot is an output when something besides the graph holds it (a storage, a caller):
  // more references than its node's and its readers' in this graph.
  // A step's graph runs as two programs, its forward and the rest: a loss (a forward
  // value) is read when the forward is done, while the backward and the update still run
  // and the host records the next step.
  // (Not a graph with compiled graphs in it: their forward and backward join on purpose.)
  for (size_t n = 1; n < g.nodes.size(); ++n) {
    if (g.nodes[n]->backward) {
      if (!g.nodes[n - 1]->backward) job.split = static_cast<int>(n);
      break;
    }
  }
  // A compiled graph's recording (its thread records in DeferAll) or a graph joining a
  // compiled graph's replay.
  job.compiled = eager_mode() == EagerMode::DeferAll;
  for (const auto& node : g.nodes)
    if (node->compiled) {
      job.split = 0;
      job.compiled = true;
    }
  put(static_cast<int32_t>(job.split));
  put_char('>');
  for (const auto& node : g.nodes) {
    for (const SlotPtr& s : node->outputs) {
      bool live = s.use_count() > 1 + s->graph_uses;
      put_char(live ? '1' : '0');
      if (live) job.results.push_back({node->position, s->index});
    }
  }
  key.resize(static_cast<size_t>(at - key.data()));
  {
    std::unordered_set<const Node*> here;  // made at the first seed met (most graphs have none)
    for (const Wire& w : job.results) {
      const Slot& r = *g.nodes[w.node]->outputs[w.index];
      if (!r.seed || r.replaces) continue;
      if (here.empty())
        for (const auto& node : g.nodes) here.insert(node.get());
      // (the pointer is compared before the node is read: a seed flushed before may be freed)
      bool seeded = here.count(r.seed) && r.seed->serial == r.seed_serial;
      if (seeded && job.result_seeds.empty()) job.result_seeds.assign(job.results.size(), Wire{-1, 0});
      if (seeded) job.result_seeds[static_cast<size_t>(&w - job.results.data())] = Wire{r.seed->position, 0};
    }
  }
  for (auto& node : g.nodes) {
    for (const SlotPtr& s : node->outputs) s->producer = nullptr;
    job.outs.push_back(std::move(node->outputs));
  }
  for (const Wire& w : job.results) job.result_slots.push_back(job.outs[w.node][w.index]);
  fuse_stats().outputs += static_cast<int64_t>(job.results.size());
  int64_t total = 0;
  for (auto& o : job.outs) total += static_cast<int64_t>(o.size());
  fuse_stats().elided += total - static_cast<int64_t>(job.results.size());
  // Drops the graph's references to its inputs; the emptied nodes are kept for reuse.
  for (auto& node : g.nodes) {
    if (g_spare_nodes.size() >= max_graph_ops()) break;
    *node = Node{};
    g_spare_nodes.push_back(std::move(node));
  }
  g.nodes.clear();

  // Inputs nobody else holds are donated (an optimizer's in-place update reuses the
  // parameter's memory). Reference counts are only the users' once earlier jobs are
  // done: a job in flight holds its inputs and outputs, and donating by a count it
  // inflates would make the program (whose key names the donations) depend on the
  // launcher's timing.
  const bool donate = donation_enabled();
  if (donate && !ext.empty()) {
    ScopedMicros timed_wait(fuse_stats().flush_wait_us, ScopedMicros::Wall);
    launcher().wait_quiet();
  }
  for (Operand& e : ext) job.param_types.push_back(e.type());
  std::vector<const void*> ids;
  for (const Operand& e : ext) ids.push_back(e.slot ? static_cast<const void*>(e.slot.get()) : e.buffer.get());
  std::vector<int> replaces;
  for (const SlotPtr& r : job.result_slots) {
    auto it = std::find(ids.begin(), ids.end(), r->replaces);
    replaces.push_back(r->replaces && it != ids.end() ? static_cast<int>(it - ids.begin()) : -1);
  }
  std::vector<bool> sole(ext.size(), false);
  for (size_t i = 0; i < ext.size() && donate; ++i) sole[i] = sole_holder(ext[i]);
  if (g_flush_observer) {
    auto fg = std::make_shared<FlushedGraph>();
    fg->key = job.key;
    fg->device = job.device;
    fg->calls = job.calls;
    fg->param_types = job.param_types;
    fg->results = job.results;
    fg->replaces = replaces;
    FlushReport report{fg, job.device, ids, job.param_types, {}, {}};
    for (const SlotPtr& r : job.result_slots) {
      report.results.push_back(r.get());
      report.result_types.push_back(r->type());
    }
    g_flush_observer(report);
  }
  assign_donations(job, sole, replaces);
  job.params = std::move(ext);
  if (g_side.holding) {  // a side recording's final flush: explained, not run (yet)
    g_side.holding = false;
    g_side.held = true;
    g_held_job = std::move(job);
    return;
  }
  launcher().submit(std::move(job));
}

void flush_prefix(const char* reason, size_t count) {
  auto lock = graph_lock();
  // A side recording's graph reading values the set-aside graph has not made: that
  // graph runs first.
  if (g_side.active && !g_side.holding && g_side.reads_unlinked) spoil_side_recording();
  if (g_graph.nodes.empty()) return;
  ScopedMicros timed(fuse_stats().flush_us);
  Graph g = std::move(g_graph);
  g_graph = Graph{};
  g_uploads.erase(g.device);  // its calls' reads end with it (the rest's are not counted)
  g_graph.nodes.reserve(std::min(g.nodes.size(), max_graph_ops()));  // the next graph is alike, mostly
  if (count < g.nodes.size()) {  // the rest stays pending, as a graph of its own
    // Its reads of the flushed part's values become external: they keep those live.
    for (size_t i = count; i < g.nodes.size(); ++i)
      for (const Operand& in : g.nodes[i]->inputs)
        if (in.slot && in.slot->producer && in.slot->producer->position < static_cast<int>(count))
          in.slot->graph_uses -= 1;
    g_graph.device = g.device;
    g_graph.lane = g.lane;
    for (size_t i = count; i < g.nodes.size(); ++i) {
      g.nodes[i]->position = static_cast<int>(i - count);
      g_graph.instructions += g.nodes[i]->program->instructions();
      g.instructions -= g.nodes[i]->program->instructions();
      if (g.nodes[i]->program->recurrent_step()) g_graph.recurrent_steps += 1;
      g_graph.nodes.push_back(std::move(g.nodes[i]));
    }
    g.nodes.resize(count);
  }
  count_flush(reason);
  fuse_stats().dead_calls += static_cast<int64_t>(drop_dead_calls(g));
  if (g.nodes.empty()) return;
  Graph fills = hoist_fills(g);
  if (!fills.nodes.empty()) submit_graph(std::move(fills), true);
  submit_graph(std::move(g), false);
  // The part left pending starts its chains afresh (their flushed links are values now).
  for (auto& node : g_graph.nodes) {
    int chain = 0;
    for (const Operand& in : node->inputs)
      if (in.slot && in.slot->producer) chain = std::max(chain, in.slot->producer->chain);
    node->chain = node->program->recompute_cost() == ir::RecomputeCost::Cheap ? chain + 1 : 0;
  }
}

}  // namespace tpu::backend

namespace tpu::backend {

void set_flush_observer(std::function<void(const FlushReport&)> fn) {
  auto lock = graph_lock();
  g_flush_observer = std::move(fn);
}

ProgramPtr graph_program(const FlushedGraphPtr& graph) {
  std::vector<ir::Type> results;
  for (const Wire& w : graph->results) results.push_back(graph->calls[w.node].program->results()[w.index]);
  auto emit = [&](const std::string& name, std::string* function, std::map<std::string, std::string>* functions,
                  std::string* module) {
    // Its calls' functions are shared with the graphs it joins (by symbol); its helpers
    // are its own (prefixed by its name).
    ir::FusedModule m(name + "_");
    std::vector<const std::string*> first_use;  // the module lists them so: the same in every process
    auto add = [&](const std::string& symbol, const std::string& text) {
      auto [it, fresh] = functions->emplace(symbol, text);
      if (fresh) first_use.push_back(&it->second);
    };
    std::vector<ir::Value> outs = emit_calls(m, graph->calls, graph->param_types, graph->results, add);
    *function = m.private_function(name, outs);
    *module = "module @torch_tpu {\n";
    for (const std::string* text : first_use) *module += *text;
    ir::Builder main;  // launched alone (a failed fused launch replays call by call)
    std::vector<ir::Value> args;
    for (const ir::Type& t : graph->param_types) args.push_back(main.param(t));
    *module += *function + main.function("main", main.call(name, args, results), true) + "}\n";
  };
  return std::make_shared<Program>(graph->param_types, results,
                                   "compiled graph of " + std::to_string(graph->calls.size()) + " ops", emit);
}

size_t pending_ops() {
  auto lock = graph_lock();
  size_t n = g_graph.nodes.size();
  for (const auto& [key, g] : g_parked) n += g.nodes.size();
  return n;
}

namespace {
// Gives the set-aside values their producers back (under g_mu).
void relink_side_inputs() {
  for (auto& [slot, producer] : g_side.unlinked) slot->producer = producer;
  g_side.unlinked.clear();
  g_side.unlinked_ids.clear();
}

// Ends a side recording: the set-aside graph is pending again, with the side graph's
// remaining calls after it (under g_mu).
Graph rejoin_side_recording() {
  relink_side_inputs();
  g_side.active = false;
  g_side.reads_unlinked = false;
  Graph side = std::move(g_graph);
  g_graph = std::move(g_side.stashed);
  g_side.stashed = Graph{};
  return side;
}

// Flushes the pending graph unobserved (a capture explains only its own call's graph).
void flush_unobserved(const char* reason) {
  auto observer = std::move(g_flush_observer);
  g_flush_observer = nullptr;
  flush_prefix(reason, std::numeric_limits<size_t>::max());
  g_flush_observer = std::move(observer);
}

void spoil_side_recording() {
  if (!g_side.active) return;
  Graph side = rejoin_side_recording();
  flush_unobserved("compiled graph reads a pending value");
  // The side graph's reads of those values are now reads of made values (external).
  g_graph = std::move(side);
}

}  // namespace

void begin_side_recording(const std::vector<Operand>& inputs) {
  auto lock = graph_lock();
  TORCH_INTERNAL_ASSERT(!g_side.active && !g_held_job, "a side recording inside another");
  while (!g_parked.empty()) flush_parked(g_parked.begin(), "compiled graph");  // it records one graph
  g_side = SideRecording{};
  g_side.active = true;
  g_side.stashed = std::move(g_graph);
  g_graph = Graph{};
  for (const Operand& in : inputs) {
    if (!in.slot || !in.slot->producer || !g_side.unlinked_ids.insert(in.slot.get()).second) continue;
    g_side.unlinked.push_back({in.slot, in.slot->producer});
    in.slot->producer = nullptr;
  }
}

bool side_recording() {
  auto lock = graph_lock();
  return g_side.active;
}

void flush_held(const char* reason) {
  auto lock = graph_lock();
  g_side.holding = g_side.active;
  flush(reason);
  g_side.holding = false;
}

bool held_calls_own() {
  auto lock = graph_lock();
  if (!g_held_job) return true;
  for (const Call& c : g_held_job->calls)
    if (c.owner != std::this_thread::get_id()) return false;
  return true;
}

void end_side_recording(bool drop) {
  auto lock = graph_lock();
  std::optional<Job> held = std::move(g_held_job);
  g_held_job.reset();
  g_side.held = false;
  // Calls recorded after the held flush (none, unless another thread's): they read the
  // set-aside graph's values as made, so that graph runs first and they stay pending.
  if (g_side.active && !g_graph.nodes.empty()) spoil_side_recording();
  if (g_side.active) {
    Graph side = rejoin_side_recording();  // empty
    if (!drop && held) flush_unobserved("compiled graph recorded apart");  // the held job reads its values
  }
  if (!held) return;
  if (!drop) {
    launcher().submit(std::move(*held));
    return;
  }
  // Discarded: its values are never made. Nothing should read them (the caller restores
  // what the recording wrote); one that does raises instead of waiting forever.
  auto e = std::make_exception_ptr(std::runtime_error(
      "torch_tpu internal error: a value of a compiled graph's discarded first recording was read"));
  std::lock_guard<std::mutex> l(g_slot_mu);
  for (SlotList& outs : held->outs)
    for (SlotPtr& sl : outs)
      if (!sl->buffer) sl->error = e;
}

std::vector<SlotPtr> relaunch(const FlushedGraphPtr& graph, std::vector<Operand> params,
                              const std::function<void(const std::vector<SlotPtr>&)>& bind) {
  auto lock = graph_lock();
  for (const Operand& p : params)  // an input still pending in this thread's graph
    if (p.slot && p.slot->producer) {
      flush("compiled graph input");
      break;
    }
  Job job;
  job.key = graph->key;
  job.device = graph->device;
  job.calls = graph->calls;
  job.param_types = graph->param_types;
  job.results = graph->results;
  for (const Call& c : job.calls) {
    SlotList outs;
    for (size_t i = 0; i < c.program->results().size(); ++i) {
      auto s = new_slot();
      s->set_type(c.program, i);
      s->device = job.device;
      s->index = static_cast<int>(i);
      outs.push_back(std::move(s));
    }
    job.outs.push_back(std::move(outs));
  }
  for (const Wire& w : job.results) job.result_slots.push_back(job.outs[w.node][w.index]);
  bind(job.result_slots);
  std::vector<bool> sole(params.size(), false);
  if (donation_enabled()) {
    launcher().wait_quiet();  // as a flush: donation by the users' reference counts only
    for (size_t i = 0; i < params.size(); ++i) sole[i] = sole_holder(params[i]);
  }
  assign_donations(job, sole, graph->replaces);
  fuse_stats().outputs += static_cast<int64_t>(job.results.size());
  std::vector<SlotPtr> results = job.result_slots;
  job.params = std::move(params);
  launcher().submit(std::move(job));
  return results;
}

}  // namespace tpu::backend
