// Accurate float sums for the normalization rules (batch, layer norm) and the
// convolution's bias gradient, and accurate float32 products for prod and cumprod.
#pragma once
#include "lowering/registry.h"

namespace tpu::lowering {

// Float sum over dims that keeps each add's rounding error beside the running sum
// (TwoSum), so it stays within about an ulp of the exact sum in whatever order the
// compiler adds: XLA:CPU adds a reduce's elements one by one into one accumulator, whose
// error grows with the count, where CPU PyTorch's norms accumulate in double.
Value compensated_sum(Builder& b, const Value& x, const std::vector<int64_t>& dims);

// Float sum over leading dims (the kept dims trailing: a layer norm's weight and bias
// gradients) in blocks of about sqrt(rows) rows: each block's sum a matmul with ones, then
// a plain sum over the blocks. Each result is about 2 sqrt(rows) adds deep instead of rows,
// below CPU's float error (tests/test_norm_accuracy.py), where XLA:CPU runs both a plain and
// a compensated column sum as a slow loop down the columns. Other dims, fewer than 256
// rows, or rows with no divisor from 8 to their square root: compensated_sum.
Value blocked_sum(Builder& b, const Value& x, const std::vector<int64_t>& dims);

// Float32 products kept as (product, error) pairs: each multiply's rounding error is
// recovered exactly (Dekker's product) and carried beside it. A float32 product of 1e6
// values near 1 taken as a tree (XLA's reduce, our blocked scan) drifted 2e-4 from the
// exact one, where CPU's cumprod accumulates in double. combine_products is the pairs'
// combine (associative to within the error terms), products_result their rounded sum;
// non-finite products and values past the split's range (1e35) keep the plain product.
std::vector<Value> combine_products(Builder& b, const std::vector<Value>& x, const std::vector<Value>& y);
Value products_result(Builder& b, const Value& p, const Value& e);
// The product over dims, compensated (float32 x, at least kCompensatedProductCount terms) or plain.
constexpr int64_t kCompensatedProductCount = 1024;
Value accurate_prod(Builder& b, const Value& x, const std::vector<int64_t>& dims);

}  // namespace tpu::lowering
