// Inclusive scans along a dim (scan.cpp), shared by the scan rules, the sort replays and
// the value-shaped ops' prefix sums.
#pragma once
#include <functional>

#include "lowering/registry.h"

namespace tpu::lowering {

// Combines two partial results (one value per operand). It must be associative and
// commutative: a scan's window reductions take pairs in any order.
using ScanCombine = std::function<std::vector<Value>(Builder&, const std::vector<Value>& x,
                                                     const std::vector<Value>& y)>;

// Inclusive scan of xs (one shape) along dim; `ids` are the combine's identities
// (scalars). Computed in blocks of `block` (see scan.cpp); costly combines take smaller ones.
std::vector<Value> inclusive_scan(Builder& b, std::vector<Value> xs, const std::vector<Value>& ids, int64_t dim,
                                  const ScanCombine& f, int64_t block = 16);

// The same for one operand and a StableHLO binary op: "stablehlo.add", "stablehlo.multiply",
// "stablehlo.maximum" or "stablehlo.minimum".
Value inclusive_scan(Builder& b, const Value& x, const std::string& op, int64_t dim);

}  // namespace tpu::lowering
