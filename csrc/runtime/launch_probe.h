#pragma once
// The runtime's own cost of one launch, with no PyTorch above it: the floor under
// Strict mode's per-op time (each Strict op is at least one launch).
#include "runtime/client.h"

namespace tpu::runtime {

// Seconds per launch of a 16-float `x + 1` program, each launch taking the previous
// one's output (as a chain of eager ops does); the median of `repeats` chains of `n`,
// each chain ended by waiting for its last value.
double chained_launch_seconds(Client& client, int device, int n, int repeats);

}  // namespace tpu::runtime
