#pragma once
// The runtime's own cost of one launch, with no PyTorch above it: the floor under
// Strict mode's per-op time (each Strict op is at least one launch).
#include "runtime/client.h"

namespace tpu::runtime {

// Seconds per launch of a 16-float `x + 1` program, each launch taking the previous
// one's output (as a chain of eager ops does); the median of `repeats` chains of `n`,
// each chain ended by waiting for its last value.
double chained_launch_seconds(Client& client, int device, int n, int repeats);

// The same chained launch one at a time, for a loop that does other work between launches
// (the benchmarks' in-situ floor of Strict: each PyTorch call's own cost with one launch).
class ChainProbe {
 public:
  ChainProbe(Client& client, int device);
  void step();  // launches `x + 1` on the previous launch's output
  // Waits for the last launch; returns its value's first element (the launches so far).
  float wait();

 private:
  Client& client_;
  int device_;
  ExecutablePtr exe_;
  BufferPtr x_;
};

// Seconds to run a traced sequence of launches again through the runtime alone, back to
// back, to the last one's completion: the floor of the step it was traced from under its
// host work. A launch reads the replay's own output where the traced one read an earlier
// traced launch's output, else the traced input itself. Median of `repeats`, after one
// warm-up; the replayed outputs are freed after each timing.
double replayed_trace_seconds(Client& client, const std::vector<TracedLaunch>& trace, int repeats);

// The same replay with each launch waited for: per launch, its program's name and its
// median seconds (launch to completion) over `repeats`, after one warm-up.
std::vector<std::pair<std::string, double>> replayed_launch_seconds(
    Client& client, const std::vector<TracedLaunch>& trace, int repeats);

}  // namespace tpu::runtime
