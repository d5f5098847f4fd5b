// Histograms as CPU computes them (histc, histogram, histogramdd), shared by the histc
// rule and the backend kernels of the histogram ops, which have no meta kernels.
#pragma once
#include <optional>

#include "lowering/helpers.h"

namespace tpu::lowering::hist {

// How an element finds its bin (CPU's three algorithms): linear interpolation
// (histc), the same corrected against the neighbouring edges (histogram with a bin
// count), or a search over the edges (histogram with given edges).
enum class Find { Linear, LinearLocal, Search };

// Leftmost and rightmost edges per dim of x [M, D] from its data (f64 [D] each):
// min and max, (0, 1) when M is 0, widened by 0.5 each way when equal. `ok` is false
// when one is not finite.
struct Outer {
  Value left, right, ok;
};
Outer outer_from_data(Builder& b, const Value& x);

// (Edges over [left, right]: linspace_values, lowering/factory.h.)

// The D-dim histogram of the rows of x [M, D] over `edges` (1-D, dtype of x), with
// optional weights [M], divided by total and bin volume when `density`.
Value histogram(Builder& b, const Value& x, const std::vector<Value>& edges,
                const std::optional<Value>& weight, bool density, Find find);

}  // namespace tpu::lowering::hist
