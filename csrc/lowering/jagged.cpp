// Jagged nested tensors' layout changes (torch.nested's layout=torch.jagged keeps a
// [total, *] values tensor and [B + 1] offsets): padded dense <-> jagged values. Their
// shapes come from sizes the caller passes (max length, total), not from the offsets'
// values, so each is one gather.
#include <string>

#include "lowering/search_util.h"

namespace tpu::lowering {

using ir::Cmp;

// The offsets ([B + 1], int64) of the one ragged dimension these rules take.
static Value only_offsets(Ctx& ctx, int at) {
  std::vector<Value> offs = ctx.list(at);
  if (offs.size() != 1) throw Unsupported(ctx.op() + " with more than one ragged dimension");
  return ctx.b.convert(offs[0], DType::I64);
}

// _jagged_to_padded_dense_forward(values, offsets, max_lengths, padding_value):
// out[b, i] = values[offsets[b] + i] for i below b's length, else the padding value.
TPU_LOWER(jagged_to_padded_dense, "_jagged_to_padded_dense_forward") {
  Builder& b = ctx.b;
  Value values = ctx.in(0), off = only_offsets(ctx, 1);
  Type o = ctx.out(0);
  int64_t batch = o.shape[0], len = o.shape[1], n = values.shape()[0];
  Value pad = constant_any(b, ctx.f_or(3, 0.0), o.dtype, o.shape);
  // Offsets past the values would read clamped rows (CPU's kernel fails on them).
  Value last = b.reshape(b.slice(off, {batch}, {batch + 1}, {1}), {});
  ctx.check(b.compare(last, b.constant(static_cast<double>(n), DType::I64), Cmp::LE),
            "RuntimeError: _jagged_to_padded_dense_forward(): the final offset is past the " + std::to_string(n) +
                " values");
  if (batch == 0 || len == 0 || n == 0) return {pad};
  Value start = b.slice(off, {0}, {batch}, {1}), end = b.slice(off, {1}, {batch + 1}, {1});
  Shape bl = {batch, len};
  Value i = b.iota(Type{DType::I64, bl}, 1);
  Value src = add(b, b.broadcast_in_dim(start, bl, {0}), i);
  Value valid = b.compare(src, b.broadcast_in_dim(end, bl, {0}), Cmp::LT);
  src = b.clamp(b.constant(0, DType::I64, bl), src, b.constant(double(n - 1), DType::I64, bl));
  Shape rest(values.shape().begin() + 1, values.shape().end());
  Shape slice = {1};
  slice.insert(slice.end(), rest.begin(), rest.end());
  std::vector<int64_t> offset_dims;
  for (size_t d = 0; d < rest.size(); ++d) offset_dims.push_back(static_cast<int64_t>(d) + 2);
  Shape idx_shape = {batch, len, 1};
  Value rows = b.gather(b.convert(values, o.dtype), b.reshape(src, idx_shape), offset_dims, {0}, {0}, 2, slice,
                        o.shape);
  std::vector<int64_t> lead = {0, 1};
  return {b.select(b.broadcast_in_dim(valid, o.shape, lead), rows, pad)};
}

// _padded_dense_to_jagged_forward(dense, offsets, total_L): values[t] = dense[b, t -
// offsets[b]] for the sequence b that holds t (the number of offsets[1:] <= t).
TPU_LOWER(padded_dense_to_jagged, "_padded_dense_to_jagged_forward") {
  Builder& b = ctx.b;
  Value dense = ctx.in(0), off = only_offsets(ctx, 1);
  Type o = ctx.out(0);
  int64_t total = o.shape[0], batch = dense.shape()[0], len = dense.shape()[1];
  // CPU's checks: no sequence longer than the padded length, and total_L the last offset
  // (positions were clamped instead).
  Value lengths = sub(b, b.slice(off, {1}, {batch + 1}, {1}), b.slice(off, {0}, {batch}, {1}));
  ctx.check(all_true(b, b.compare(lengths, b.constant(static_cast<double>(len), DType::I64, {batch}), Cmp::LE)),
            "RuntimeError: _padded_dense_to_jagged_forward(): found a batch item longer than the max length "
            "specified by padded input, " + std::to_string(len));
  ctx.check(b.compare(b.reshape(b.slice(off, {batch}, {batch + 1}, {1}), {}),
                      b.constant(static_cast<double>(total), DType::I64), Cmp::EQ),
            "RuntimeError: _padded_dense_to_jagged_forward(): final offset should match total_L value");
  if (total == 0 || batch == 0 || len == 0) return {constant_any(b, 0, o.dtype, o.shape)};
  Shape tb = {total, batch};
  Value t = b.iota(Type{DType::I64, tb}, 0);
  Value ends = b.broadcast_in_dim(b.slice(off, {1}, {batch + 1}, {1}), tb, {1});
  Value seq = reduce_sum(b, b.convert(b.compare(ends, t, Cmp::LE), DType::I64), {1});  // [total]
  seq = b.clamp(b.constant(0, DType::I64, {total}), seq, b.constant(double(batch - 1), DType::I64, {total}));
  Value first = search::gather_flat(b, off, seq);
  Value pos = b.clamp(b.constant(0, DType::I64, {total}), sub(b, b.iota(Type{DType::I64, {total}}, 0), first),
                      b.constant(double(len - 1), DType::I64, {total}));
  Value idx = b.concatenate({b.reshape(seq, {total, 1}), b.reshape(pos, {total, 1})}, 1);
  Shape rest(dense.shape().begin() + 2, dense.shape().end());
  Shape slice = {1, 1};
  slice.insert(slice.end(), rest.begin(), rest.end());
  std::vector<int64_t> offset_dims;
  for (size_t d = 0; d < rest.size(); ++d) offset_dims.push_back(static_cast<int64_t>(d) + 1);
  return {b.gather(b.convert(dense, o.dtype), idx, offset_dims, {0, 1}, {0, 1}, 1, slice, o.shape)};
}

}  // namespace tpu::lowering
