// Fused graphs whose ops repeat while their shapes change from flush to flush: a decode
// loop (Hugging Face generate()) records the same step with one more position each time,
// so every step is a new graph to compile. Most of the step's ops keep their shapes, and
// their own one-op programs, once compiled, serve every later step; only the few whose
// shapes grow compile again. This decides, per new graph, which costs less to compile:
// the whole graph, as its earlier variants did, or the op programs it still lacks (run
// op by op). Graphs that repeat exactly never get here (the fused-graph cache has them).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <c10/util/ArrayRef.h>

#include "backend/deferred.h"
#include "ir/builder.h"

namespace tpu::backend {

// A graph's structure: its ops' names with every number dropped (the shapes and sizes
// they carry) and how they are wired. Variants of one structure differ only in those.
class GraphStructure {
 public:
  void add(Program& program, c10::ArrayRef<ir::GraphRef> args);
  uint64_t hash() const;
  const std::vector<Program*>& programs() const { return programs_; }

 private:
  std::string text_;
  std::vector<Program*> programs_;
};

// For a graph that would compile (in no cache): true when it should run op by op.
bool run_op_by_op(const GraphStructure& graph);

// A compiled (not loaded) variant of `graph` took `seconds`.
void note_graph_compiled(const GraphStructure& graph, double seconds);

// Forgets every structure's variants (tests start from none, as a fresh process does).
void forget_shape_churn();

}  // namespace tpu::backend
