#include "lowering/compensated_sum.h"

#include <optional>

#include "lowering/helpers.h"

namespace tpu::lowering {

// (s, c) pairs combine as s = s1 + s2 plus the exact error of that add (Knuth's TwoSum,
// branch-free), so any association order of a reduce is allowed: both sides may be
// partial sums, and a different reducer keeps XLA from merging it with another reduce.
static std::vector<Value> two_sum(Builder& b, const std::vector<Value>& a) {
  const Value &s1 = a[0], &c1 = a[1], &s2 = a[2], &c2 = a[3];
  Value s = add(b, s1, s2);
  Value t = sub(b, s, s1);
  Value e = add(b, sub(b, s1, sub(b, s, t)), sub(b, s2, t));
  return {s, add(b, add(b, c1, c2), e)};
}

// A row sum (the reduced dims trailing) in rows of 16 or 8 lanes: the (sum, error) pairs
// run down the rows with the lanes side by side, then a last reduce folds the lanes'
// pairs. Measured on XLA:CPU: a layer norm's backward over rows of 256 in half the time,
// rows of 3,000 and more alike; a batch norm's sums over N, H and W (C kept between) took
// twice the time this way, so they stay one variadic reduce. nullopt: rows too short.
static std::optional<Value> row_sum_by_lanes(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  int64_t kept = x.rank() - static_cast<int64_t>(dims.size()), len = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] != kept + static_cast<int64_t>(i)) return std::nullopt;
    len *= x.shape()[dims[i]];
  }
  int64_t lanes = len % 16 == 0 ? 16 : len % 8 == 0 ? 8 : 0;
  if (lanes == 0 || len < 2 * lanes) return std::nullopt;
  Shape split(x.shape().begin(), x.shape().begin() + kept);
  split.push_back(len / lanes);
  split.push_back(lanes);
  Value v = b.reshape(x, split), zero = b.constant(0, x.dtype());
  auto by_lane = b.reduce({v, full_like(b, v, 0)}, {zero, zero}, {kept}, two_sum);
  auto sc = b.reduce(by_lane, {zero, zero}, {kept}, two_sum);
  return add(b, sc[0], sc[1]);
}

Value compensated_sum(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  if (!is_float(x.dtype()) || dims.empty()) return reduce_sum(b, x, dims);
  if (auto rows = row_sum_by_lanes(b, x, dims)) return *rows;
  Value v = x;
  std::vector<int64_t> rest = dims;
  int64_t rest_count = 1;
  for (size_t i = 1; i < dims.size(); ++i) rest_count *= x.shape()[dims[i]];
  // A short leading reduced dim is summed plainly first: an add of whole slices (few
  // terms per element, vectorized) that halves the compensated work on XLA:CPU; the
  // partial sums' small errors then average out over the many terms left.
  if (dims[0] == 0 && dims.size() > 1 && x.shape()[0] <= 16 && rest_count >= 64) {
    v = reduce_sum(b, x, {0});
    rest.erase(rest.begin());
    for (auto& d : rest) --d;
  }
  Value zero = b.constant(0, v.dtype());
  auto sc = b.reduce({v, full_like(b, v, 0)}, {zero, zero}, rest, two_sum);
  return add(b, sc[0], sc[1]);
}

}  // namespace tpu::lowering
