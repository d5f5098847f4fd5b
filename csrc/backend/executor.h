// Compiling and launching programs for the backend: the executable cache, the eager
// mode, and the counters `torch_tpu.metrics()` reports.
#pragma once
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "ir/builder.h"
#include "runtime/client.h"

namespace tpu::backend {

// Programs name their private functions this stem and a process-wide number
// (Program::function_name); the compile cache renames them by first appearance.
inline constexpr char kProgramSymbolStem[] = "p";

// DeferAll records like DeferAndFuse but never cuts the graph by size: compiled mode
// records one FX graph and flushes it whole, so one graph is one program.
enum class EagerMode { Strict = 0, Debug = 1, DeferAndFuse = 2, DeferAll = 3 };
EagerMode eager_mode();
void set_eager_mode(EagerMode m);
// This thread's mode in place of the process's (-1: none); returns the previous override.
int set_thread_eager_mode(int m);

struct Metrics {
  std::atomic<int64_t> op_calls{0};          // lowered op calls
  std::atomic<int64_t> signature_hits{0};    // op signature found: nothing emitted
  std::atomic<int64_t> signature_misses{0};  // program emitted for a new signature
  std::atomic<int64_t> program_hits{0};      // emitted text already compiled
  std::atomic<int64_t> programs_unloaded{0};  // executables dropped at the loaded-programs bound
  std::mutex mu;
  std::map<std::string, int64_t> fallbacks;  // op -> count
  std::map<std::string, int64_t> flushes;    // why deferred graphs ran -> count
  // Compiles (not disk-cache loads) by program kind: one op's program (Strict, Debug,
  // a fused graph's replay) compiled with Fast effort, fused and compiled-mode graphs
  // with Full effort.
  std::atomic<int64_t> op_compiles{0};
  std::atomic<int64_t> op_compile_us{0};
  std::atomic<int64_t> graph_compiles{0};
  std::atomic<int64_t> graph_compile_us{0};
  std::atomic<int64_t> graph_loads{0};  // graphs another process compiled, from the disk cache
  // Strict launches queued behind a compile running ahead on the compile pool.
  std::atomic<int64_t> queued_launches{0};
};
Metrics& metrics();

// The executable for `text`, compiled once per distinct program text while loaded (see
// TPU_MAX_LOADED_PROGRAMS); callers keep only weak references between uses.
runtime::ExecutablePtr compile_cached(const std::string& text, const std::string& name);

// Whether compile_cached(text) would find it loaded or on disk (not compile it).
bool compiled_before(const std::string& text);

// Launches `exe` on `device`; waits in Debug mode.
// `what` names the op in errors (the executable may be shared with other ops).
// `donate`: inputs whose memory an output the program aliases to them may take.
std::vector<runtime::BufferPtr> launch(const runtime::Executable& exe,
                                       const std::vector<runtime::Buffer*>& args, int device,
                                       const std::string& what = "", const std::vector<bool>& donate = {});

// Runs `fn`, turning runtime errors into PyTorch's: device OOM becomes
// torch.OutOfMemoryError, other PJRT errors RuntimeError with the plugin's message.
template <typename F>
auto guarded(F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const runtime::OutOfMemory& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  } catch (const runtime::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace tpu::backend
