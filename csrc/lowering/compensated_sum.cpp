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

// A sum over the leading dims (the kept ones trailing: a layer norm's weight and bias
// gradients over its batch rows, a batch norm's statistics of (N, C)) as a tree of halves: each level adds the top half of the rows to the
// bottom half with TwoSum, elementwise along the kept dims, and carries the errors
// beside; a last reduce folds the (at most 8) rows left. XLA:CPU runs a variadic reduce
// over a major dim as a scalar loop: on a layer norm's 8x256x256 backward the weight and
// bias gradients took 0.54-0.56 ms this way against 2.7-4.3 ms. The barrier between
// levels keeps XLA from fusing all of them into one loop that recomputes each level; the
// fused GPT step's peak stayed within 0.05 MiB (175.8 MiB).
// nullopt: not leading dims, or fewer than 32 rows.
static std::optional<Value> column_sum_pairwise(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  int64_t k = static_cast<int64_t>(dims.size());
  if (k == 0 || k >= x.rank()) return std::nullopt;
  for (int64_t i = 0; i < k; ++i)
    if (dims[i] != i) return std::nullopt;
  Shape s{1};
  for (int64_t i = 0; i < k; ++i) s[0] *= x.shape()[i];
  for (int64_t i = k; i < x.rank(); ++i) s.push_back(x.shape()[i]);
  int64_t rows = s[0], levels = 0;
  if (rows < 32) return std::nullopt;
  auto ceil_shift = [](int64_t n, int64_t l) { return (n + (int64_t{1} << l) - 1) >> l; };
  while (ceil_shift(rows, levels) > 8) ++levels;
  int64_t padded = ceil_shift(rows, levels) << levels;  // zero rows add nothing, exactly
  Value v = b.reshape(x, s), zero = b.constant(0, x.dtype());
  if (padded != rows) {
    Shape lo(s.size(), 0), hi(s.size(), 0);
    hi[0] = padded - rows;
    v = b.pad(v, zero, lo, hi, lo);
  }
  std::optional<Value> err;
  for (int64_t n = padded; n > 8 && n % 2 == 0; n /= 2) {
    Shape top(s.size(), 0), half(s), bottom(s.size(), 0), end(s), step(s.size(), 1);
    half[0] = bottom[0] = n / 2;
    end[0] = n;
    Value a1 = b.slice(v, top, half, step), a2 = b.slice(v, bottom, end, step);
    Value sum = add(b, a1, a2), t = sub(b, sum, a1);
    Value e = add(b, sub(b, a1, sub(b, sum, t)), sub(b, a2, t));
    if (err) e = add(b, e, add(b, b.slice(*err, top, half, step), b.slice(*err, bottom, end, step)));
    auto held = b.optimization_barrier({sum, e});
    v = held[0];
    err = held[1];
  }
  auto sc = b.reduce({v, err ? *err : full_like(b, v, 0)}, {zero, zero}, {0}, two_sum);
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
  if (auto cols = column_sum_pairwise(b, v, rest)) return *cols;
  Value zero = b.constant(0, v.dtype());
  auto sc = b.reduce({v, full_like(b, v, 0)}, {zero, zero}, rest, two_sum);
  return add(b, sc[0], sc[1]);
}

}  // namespace tpu::lowering
