// Replays of the CPU sorting algorithms whose order among equal values PyTorch's CPU
// kernels expose (kthvalue's and mode's returned index), computed data-parallel: each
// partition step of the CPU algorithm is one pass over the row (prefix counts pair the
// scans' stops), so a row of n takes O(log n) passes instead of O(n) scalar steps.
#pragma once
#include "lowering/helpers.h"

namespace tpu::lowering::replay {

// ATen's quick_select_template (kthvalue on CPU: median of three, Sedgewick's scans,
// NaN sorting last) on each row of x [rows, n] for the 0-based k: the k-th value and
// its index in the row, each [rows].
std::pair<Value, Value> quickselect_rows(Builder& b, const Value& x, int64_t k);

// libstdc++'s std::sort on (value, index) pairs compared by `value <` (mode on CPU):
// introsort loop, its heapsort fallback, then the final insertion sort. x is [rows, n];
// returns the sorted values and the indices they came from, each [rows, n].
std::pair<Value, Value> std_sort_rows(Builder& b, const Value& x);

}  // namespace tpu::lowering::replay
