// Accurate float sums for the normalization rules (batch, layer norm) and the
// convolution's bias gradient.
#pragma once
#include "lowering/registry.h"

namespace tpu::lowering {

// Float sum over dims that keeps each add's rounding error beside the running sum
// (TwoSum), so it stays within about an ulp of the exact sum in whatever order the
// compiler adds: XLA:CPU adds a reduce's elements one by one into one accumulator, whose
// error grows with the count, where CPU PyTorch's norms accumulate in double.
Value compensated_sum(Builder& b, const Value& x, const std::vector<int64_t>& dims);

}  // namespace tpu::lowering
