#include "lowering/compensated_sum.h"

#include <optional>

#include "lowering/helpers.h"
#include "lowering/special_util.h"

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
// pairs. Rows longer than 16 such steps widen the lanes instead (rows of 768: 48 lanes,
// 16 steps): XLA:CPU runs the long walk down a row element by element. Measured on
// XLA:CPU: a layer norm's backward over rows of 256 in half the time, over rows of 768 in
// half again with the wider lanes; a batch norm's sums over N, H and W (C kept between)
// took twice the time this way, so they stay one variadic reduce. nullopt: rows too short.
static std::optional<Value> row_sum_by_lanes(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  int64_t kept = x.rank() - static_cast<int64_t>(dims.size()), len = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] != kept + static_cast<int64_t>(i)) return std::nullopt;
    len *= x.shape()[dims[i]];
  }
  int64_t lanes = len % 16 == 0 ? 16 : len % 8 == 0 ? 8 : 0;
  if (lanes == 0 || len < 2 * lanes) return std::nullopt;
  if (len / lanes > 16) lanes = len / (len % 16 == 0 ? 16 : 8);
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

Value blocked_sum(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  bool leading = !dims.empty();
  int64_t rows = 1, cols = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    leading = leading && dims[i] == static_cast<int64_t>(i);
    rows *= x.shape()[i];
  }
  if (!is_float(x.dtype()) || !leading || rows < 256) return compensated_sum(b, x, dims);
  // The divisor of rows nearest below their square root: both sums about equally deep.
  // (A small one, as for twice a prime, would leave the sum over the blocks long.)
  int64_t block = 1;
  for (int64_t d = 2; d * d <= rows; ++d)
    if (rows % d == 0) block = d;
  if (block < 8) return compensated_sum(b, x, dims);  // rows with no divisor to split them evenly
  Shape kept(x.shape().begin() + static_cast<int64_t>(dims.size()), x.shape().end());
  for (int64_t c : kept) cols *= c;
  // Each block's sum as a product with ones, its products exact (Highest precision on every
  // device): XLA would fuse a reduce here into the reduce over the blocks, one loop down
  // the columns.
  Value m = b.reshape(x, {rows / block, block, cols});
  Value ones = b.constant(1, x.dtype(), Shape{rows / block, block});
  Value per_block = b.dot_general(ones, m, {0}, {0}, {1}, {1}, x.dtype(), ir::DotPrecision::Highest);
  return b.reshape(reduce_sum(b, per_block, {0}), kept);
}

static Value finite(Builder& b, const Value& x) {
  return b.raw("stablehlo.is_finite", {x}, "", Type{DType::Bool, x.shape()});
}

std::vector<Value> combine_products(Builder& b, const std::vector<Value>& x, const std::vector<Value>& y) {
  const Value &p1 = x[0], &e1 = x[1], &p2 = y[0], &e2 = y[1];
  auto [p, e] = sp::two_product(b, p1, p2);
  // An overflowing split (or an infinite product) makes the error NaN: drop it there.
  e = b.select(finite(b, e), e, full_like(b, e, 0));
  return {p, add(b, e, add(b, mul(b, p1, e2), mul(b, p2, e1)))};
}

Value products_result(Builder& b, const Value& p, const Value& e) {
  // p alone where the error is 0 or not finite: keeps -0.0, inf and NaN as they are.
  Value keep = b.binary("stablehlo.or", b.unary("stablehlo.not", finite(b, e)),
                        b.compare(e, full_like(b, e, 0), ir::Cmp::EQ));
  return b.select(keep, p, add(b, p, e));
}

Value accurate_prod(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= x.shape()[d];
  if (x.dtype() != DType::F32 || n < kCompensatedProductCount)
    return b.reduce(x, b.constant(1, x.dtype()), dims, "stablehlo.multiply");
  Value one = b.constant(1, x.dtype()), zero = b.constant(0, x.dtype());
  auto pe = b.reduce({x, full_like(b, x, 0)}, {one, zero}, dims, [](Builder& r, const std::vector<Value>& a) {
    return combine_products(r, {a[0], a[1]}, {a[2], a[3]});
  });
  return products_result(b, pe[0], pe[1]);
}

}  // namespace tpu::lowering
