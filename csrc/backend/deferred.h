// Programs, and the values they produce: the promise behind every tpu storage.
//
// Every op runs as a Program. In Strict and Debug mode `run` launches it at once and
// returns buffers. In DeferAndFuse mode `run` records the call in the pending graph and
// returns Slots, promises of values; `flush` turns the whole pending graph into one
// program (each recorded program a function that `main` calls), compiles it once per
// graph shape, and launches it. Only slots some storage still holds become outputs:
// intermediates nobody references are never materialized, and input buffers nobody else
// holds are donated to same-shaped outputs (in-place updates reuse their memory).
#pragma once
#include <atomic>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <c10/util/SmallVector.h>

#include "ir/builder.h"
#include "ir/remat.h"
#include "backend/executor.h"
#include "runtime/client.h"

namespace tpu::backend {

// A program over buffers; compiled on its first eager launch, while fused graphs use
// its text as a function.
class Program {
 public:
  Program(const ir::Builder& b, const std::vector<ir::Value>& results, std::string name);
  // A program whose text `emit` writes, given its function name: its own function, the
  // functions it calls (by symbol) and its module (a flushed graph as one call).
  using Emit = std::function<void(const std::string& function_name, std::string* function,
                                  std::map<std::string, std::string>* functions, std::string* module)>;
  Program(std::vector<ir::Type> params, std::vector<ir::Type> results, std::string name, const Emit& emit);
  int64_t id() const { return id_; }
  const std::string& name() const { return name_; }
  const std::string& function_text() const { return function_; }
  std::string function_name() const { return kProgramSymbolStem + std::to_string(id_); }
  const std::vector<ir::Type>& params() const { return params_; }
  const std::vector<ir::Type>& results() const { return results_; }
  const std::string& module_text() const { return module_; }
  // Functions it calls besides its own (imported modules), by symbol.
  const std::map<std::string, std::string>& functions() const { return functions_; }
  runtime::ExecutablePtr executable();  // compiles on first use
  // Compiled and still loaded; false while another thread compiles it.
  bool loaded();
  // What running it again for a late reader in a fused graph would cost.
  ir::RecomputeCost recompute_cost() const { return recompute_cost_; }
  // Its size to the compiler: the operations its text holds (its own function's and
  // those it calls), which a fused graph inlines once per call.
  int64_t instructions() const { return instructions_; }
  // One step of a recurrence (an RNN cell's rule says so): see kMaxRecurrentSteps.
  bool recurrent_step() const { return recurrent_step_; }
  // It writes into part of an operand (dynamic_update_slice or scatter): see
  // recurrence_writes in deferred.cpp.
  bool writes_slices() const { return writes_slices_; }

 private:
  int64_t id_;
  std::string name_, module_, function_;
  std::vector<ir::Type> params_, results_;
  std::map<std::string, std::string> functions_;
  ir::RecomputeCost recompute_cost_ = ir::RecomputeCost::Never;
  int64_t instructions_ = 0;
  bool recurrent_step_ = false;
  bool writes_slices_ = false;
  std::mutex mu_;
  std::weak_ptr<runtime::Executable> exe_;  // the loaded programs' bound owns it
};
using ProgramPtr = std::shared_ptr<Program>;

struct Node;

// One output of a recorded program: pending until its graph runs.
struct Slot {
  // Its type, shared with the program that makes it (one reference, no copy per op).
  std::shared_ptr<const ir::Type> type_of;
  const ir::Type& type() const { return *type_of; }
  void set_type(const ProgramPtr& program, size_t result) {
    type_of = std::shared_ptr<const ir::Type>(program, &program->results()[result]);
  }
  int device = 0;
  Node* producer = nullptr;  // while pending: the node, owned by the pending graph
  int index = 0;             // which output of the producer
  int graph_uses = 0;        // while pending: inputs of the pending graph's nodes that read it
  // For a value an in-place op wrote into a storage: the value that storage held before
  // the current graph (a buffer or an earlier graph's slot), so a donated input is
  // aliased to its own update.
  const void* replaces = nullptr;
  // For a value an in-place op wrote into a storage whose first value in this graph a
  // fill made (zeros_like, then updated in place): that fill's node, while pending, and
  // the node's serial (nodes are reused: the pointer alone may name a later one).
  Node* seed = nullptr;
  uint64_t seed_serial = 0;
  // Set by the launcher thread once the graph ran (or failed); read under slot_mutex().
  runtime::BufferPtr buffer;
  std::exception_ptr error;
};
using SlotPtr = std::shared_ptr<Slot>;

// A program operand or result: a buffer, or a slot of the pending graph.
struct Operand {
  runtime::BufferPtr buffer;
  SlotPtr slot;
  Operand() = default;
  Operand(runtime::BufferPtr b) : buffer(std::move(b)) {}  // NOLINT: implicit by design
  Operand(SlotPtr s) : slot(std::move(s)) {}               // NOLINT
  explicit operator bool() const { return buffer || slot; }
  ir::Type type() const {
    return buffer ? ir::Type{buffer->dtype(), buffer->dims()} : slot->type();
  }
};

bool deferring();  // DeferAndFuse is the current mode
// While on (this thread), the fills recorded are state that outlives its step (an
// optimizer's, a GradScaler's): hoist_fills runs them before their graph. Fills made
// every step (a backward's zeros) stay in their graph, folded as constants.
bool recording_state();
void set_recording_state(bool on);

// Records that `fresh` (an in-place op's result) replaces `old` in a storage.
void note_replacement(const Operand& fresh, const Operand& old);

// Runs `program` on `device` (launches, or records while deferring).
// `args` are consumed (moved from): callers pass operands they are done with, from a
// list of their own (inline on the stack for an op's few operands).
// `eager`: an op's call (not a compiled graph's replay, which keeps its own boundaries).
// Most programs have one or two results: they come back inline (no allocation per op).
using Results = c10::SmallVector<Operand, 2>;
// A view of a caller's operands, which the call may move from.
struct Operands {
  Operand* first;
  size_t count;
  Operands(std::vector<Operand>& v) : first(v.data()), count(v.size()) {}           // NOLINT
  Operands(c10::SmallVectorImpl<Operand>& v) : first(v.data()), count(v.size()) {}  // NOLINT
  Operand* begin() const { return first; }
  Operand* end() const { return first + count; }
  size_t size() const { return count; }
};
// While one lives, this thread's op call names itself on demand: a program a cached plan
// runs is named by its first call (its scalars then), so an error raised at this call
// (out of memory, a lost input) names the op with this call's own arguments.
class NamingCall {
 public:
  NamingCall(std::string (*describe)(const void*), const void* call);
  ~NamingCall();
  NamingCall(const NamingCall&) = delete;
  NamingCall& operator=(const NamingCall&) = delete;

 private:
  std::string (*prev_describe_)(const void*);
  const void* prev_call_;
};
// `graph_locked`: the caller holds graph_lock() (it read the operands under it).
Results run(const ProgramPtr& program, Operands args, int device, bool eager = true,
            bool graph_locked = false);

// Whether launches may donate inputs (TPU_FUSE_DONATE, "0" off; on where the runtime says
// donation is safe): the rule fused graphs and Strict's in-place writes share.
bool donation_allowed();
// The op call this thread runs `program` for, as errors at the call name it.
std::string op_call_name(const Program& program);
// The internal program made once per `key` (run_internal's).
ProgramPtr internal_program(const std::string& key,
                            const std::function<std::vector<ir::Value>(ir::Builder&)>& build);
// A small internal program (zero fill, relayout...) made once per `key`, then run.
Results run_internal(const std::string& key,
                     const std::function<std::vector<ir::Value>(ir::Builder&)>& build,
                     const std::vector<Operand>& args, int device);

// The buffer behind `v`, running the pending graph if it is still pending.
runtime::BufferPtr resolve(const Operand& v);
// The same, but nullptr where `v` was lost to a failure the user was told of already (a
// device-side check's flag whose op never ran: there is nothing to check). A failure not
// reported yet is raised, as resolve raises it.
runtime::BufferPtr resolve_unless_reported(const Operand& v);
// True when `v` has its buffer (does not wait).
bool is_ready(const Operand& v);
// True while `v` waits in the pending graph: reading it flushes that graph.
bool pending(const Operand& v);
// Whether nobody but `v` holds its value (no other storage, pending op or collective;
// a finished graph's slot counts as `v`'s own).
bool sole_holder(const Operand& v);

// While one lives, this thread's programs launch at once instead of joining the pending
// graph (DeferAndFuse only). For reads of values already computed (a view's values read
// back, the count of selected entries): their small programs run beside the graph being
// recorded instead of cutting it, as the same read of a computed value does on CUDA.
class LaunchNow {
 public:
  LaunchNow();
  ~LaunchNow();
  LaunchNow(const LaunchNow&) = delete;
  LaunchNow& operator=(const LaunchNow&) = delete;
};
// True on a thread inside a LaunchNow scope while DeferAndFuse is the mode.
bool launching_now();

// Hands the pending graphs (if any; one per device and recording lane: streams.h) to
// the launcher thread, which compiles (once per graph shape) and launches each as one
// program. `reason` is counted in the metrics.
void flush(const char* reason);
// The same for this thread's lanes of `devices` only (a training step's end: another
// thread's graph, or another device's, is cut where that one ends its steps).
void flush_devices(const char* reason, const std::vector<int>& devices);
// How many pending graphs hold calls.
size_t pending_graphs();

// Host-to-device uploads while deferring (a copy from the CPU). Activation offloading
// (save_on_cpu) uploads each saved value just before autograd's backward reads it and
// drops it right after: Strict frees each once its op ran, but a pending graph holds
// them all until it runs, so the backward peaked at every offloaded value at once.
// `before_upload` runs `device`'s pending graph first when it alone holds at least
// TPU_FUSE_MAX_HELD_UPLOADS bytes (default 1 MiB) of earlier uploads nothing else
// references (after the graphs it flushed before have run, which frees theirs);
// `note_upload` records an upload for that count.
void before_upload(int device);
void note_upload(const runtime::BufferPtr& buffer, int device);

// Whether DeferAndFuse runs a graph with a backward as two programs, its forward and the
// rest (where its ops are small; default on, TPU_SPLIT_AT_BACKWARD=0 turns it off).
bool split_at_backward();
void set_split_at_backward(bool on);

// What the ops this thread records for a compiled backward graph are, so its flush fences
// the recomputations of forward values (activation checkpointing) as an eager backward's
// are: set by torch_tpu/_internal/compile.py while it records such a graph.
enum class RecordingRole : int { None = 0, Backward = 1, Recomputation = 2 };
// Sets this thread's role; returns the one it had.
int set_recording_role(int role);
// Waits until every flushed graph has been launched; raises the first failure since the
// last call.
void wait_launched();
// True when no flushed graph or queued Strict launch waits for the launcher (does not wait).
bool all_launched();
// Waits the same way but leaves failures for the next sync (for readers of counters).
void settle_launched();

// Held while gathering operands and recording, so other threads (autograd's) cannot
// flush the graph in between.
std::unique_lock<std::recursive_mutex> graph_lock();

struct FuseStats {
  std::atomic<int64_t> recorded{0};      // program calls recorded
  std::atomic<int64_t> graphs{0};        // fused graphs launched
  std::atomic<int64_t> graph_hits{0};    // ... whose executable was already built
  std::atomic<int64_t> outputs{0};       // values materialized by graphs
  std::atomic<int64_t> elided{0};        // values no one referenced: never materialized
  std::atomic<int64_t> dead_calls{0};    // recorded calls no one read a result of: left out
  std::atomic<int64_t> device_switches{0};  // ops on another device than the last: graphs set aside, not cut
  std::atomic<int64_t> hoisted_fills{0}; // fills run before their graph (hoist_fills)
  std::atomic<int64_t> donated{0};       // input buffers reused for outputs
  std::atomic<int64_t> replays{0};       // graphs re-run op by op after a failure
  std::atomic<int64_t> op_by_op{0};      // new graphs run op by op: shapes churn (shape_churn.h)
  std::atomic<int64_t> recomputed{0};    // values compiled graphs compute again for late readers
  std::atomic<int64_t> materialized{0};  // ... and keep whole: a recurrence's updates written into slices
  std::atomic<int64_t> largest_instructions{0};  // the largest graph flushed, in its calls' instructions
  // Host cost of the flush path, microseconds of the working thread's CPU time: the
  // recording thread's flushes, and the launcher's work per graph (of which the plugin's
  // launch call, and dropping the graph's buffers and slots afterwards); and the wall
  // time flushes spent waiting for earlier graphs' launches.
  std::atomic<int64_t> flush_us{0};
  std::atomic<int64_t> flush_wait_us{0};
  std::atomic<int64_t> launch_us{0};
  std::atomic<int64_t> execute_us{0};
  std::atomic<int64_t> release_us{0};
};
FuseStats& fuse_stats();

// ---- a flushed graph launched again on new inputs (compiled mode: captured_graph.cpp) ----

struct FlushedGraph;  // what the launcher needs to run a graph's program again
using FlushedGraphPtr = std::shared_ptr<const FlushedGraph>;
struct FlushReport {
  FlushedGraphPtr graph;
  int device = 0;
  std::vector<const void*> params;   // each input's identity: its buffer or its slot
  std::vector<ir::Type> param_types;
  std::vector<const Slot*> results;  // the slots that became outputs, in order
  std::vector<ir::Type> result_types;
};
// While set, every flush reports its graph to `fn` (called under the graph lock).
void set_flush_observer(std::function<void(const FlushReport&)> fn);
// `graph` as one program: recorded as one call while deferring (compiled mode joins a
// training step's forward, backward and update into one pending graph this way).
ProgramPtr graph_program(const FlushedGraphPtr& graph);
// Calls recorded in the pending graph and not flushed yet.
size_t pending_ops();

// A compiled graph's first call inside a training step (captured_graph.cpp) is recorded
// apart: the pending graph (the step's earlier calls) is set aside and the call's ops
// record into a graph of their own, reading `inputs` (values pending in the set-aside
// graph) as if they were made. Its final flush (flush_held) is explained by the capture
// but not run: the call is then replayed as one call of the pending graph, so the step's
// first program is the one its later steps run (compiled once, not once per graph and
// then again joined). Whatever needs a value the set-aside graph has not made (a host
// read of an input, a flush that reads one, an op reading another pending value) first
// flushes the set-aside graph, and the call goes on recorded as usual ("spoiled").
void begin_side_recording(const std::vector<Operand>& inputs);
// Whether a side recording is on (not spoiled, not ended).
bool side_recording();
// Flushes the side recording, holding its job (explained, not run).
void flush_held(const char* reason);
// Whether the held job's calls are all this thread's (another thread's ops joined it).
bool held_calls_own();
// Ends a side recording. `drop`: the held job is discarded (its values are never made;
// the caller restores what it wrote) and the set-aside graph is pending again; else the
// set-aside graph is flushed, then the held job runs after it. No-op when none is on.
void end_side_recording(bool drop);
// Launches `graph` again on `params` (same types as its first inputs; buffers or slots
// of flushed graphs). `bind` sees the fresh result slots before donation is decided, as
// a flush would (a caller writes them into storages there). Inputs nobody else holds
// are donated by the same rule as a flush; the executable comes from the graph cache.
std::vector<SlotPtr> relaunch(const FlushedGraphPtr& graph, std::vector<Operand> params,
                              const std::function<void(const std::vector<SlotPtr>&)>& bind);

}  // namespace tpu::backend
