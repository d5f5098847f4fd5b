// Rematerialization for fused graphs: a cheap value that a late consumer (a backward
// op) reads long after it was made is computed again just before that consumer, so the
// first copy dies after its early readers instead of staying live across the graph.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tpu::ir {

// Where a call's argument comes from: main's parameter `index` (node < 0) or output
// `index` of call `node`.
struct GraphRef {
  int node = -1, index = 0;
};

struct GraphCall {
  int fn = 0;  // the caller's name for the function this call runs
  std::vector<GraphRef> args;
  std::vector<int64_t> out_bytes;
  bool recomputable = false;  // cheap and deterministic: may run twice
  int gap = 0;                // readers this many calls after the earlier ones get a
                              // recomputation (0: rematerialize's `gap`)
  // Set on a recomputation (or by the caller, on a call it fences): args[after_arg] is
  // read through Builder::after(., after), which keeps it apart from the original and
  // after `after` exists.
  int after_arg = -1;
  GraphRef after;
};

struct Rematerialized {
  std::vector<GraphCall> calls;
  std::vector<int> position;  // where each original call went
  int recomputed = 0;
};

// Recomputes call p for a group of its consumers when they come more than `gap` calls
// after its earlier ones, when the original would otherwise be live where the graph
// holds the most, when p's inputs are live there anyway (or small, or recomputed too),
// and when the group's first consumer reads a value made after p's earlier consumers,
// to depend on. Groups whose first consumers are at most `gap` calls apart share one
// recomputation of a call both would run again (the earlier placed one).
Rematerialized rematerialize(const std::vector<GraphCall>& calls, const std::vector<int64_t>& param_bytes,
                             int gap);

// What running a program (its StableHLO text) again costs: nothing much (elementwise
// work, reductions, data movement), a contraction (dot_general and cheap work), or too
// much or something nondeterministic (convolution, loops, sorts, scatter/gather, random bits).
enum class RecomputeCost { Cheap, Contraction, Never };
RecomputeCost recompute_cost(const std::string& function_text);

}  // namespace tpu::ir
