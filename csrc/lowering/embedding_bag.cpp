// embedding_bag: rows of `weight` at `indices`, reduced per bag (sum, mean or max), the
// bags given by `offsets`. Bag membership is a (bags x indices) mask, so sums are one
// matmul and max a masked reduction; no data-dependent shapes.
#include <limits>

#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

// _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse,
//                per_sample_weights, include_last_offset, padding_idx)
//   -> (output, offset2bag, bag_size, max_indices)
TPU_LOWER(embedding_bag, "_embedding_bag", "_embedding_bag_forward_only") {
  Builder& b = ctx.b;
  Value w = ctx.in(0);
  Value idx = b.convert(ctx.in(1), DType::I64), off = b.convert(ctx.in(2), DType::I64);
  if (idx.rank() != 1 || off.rank() != 1) throw Unsupported("embedding_bag: 1-D indices and offsets");
  const int64_t mode = ctx.i(4), pad = ctx.i_or(8, -1);
  const bool last = ctx.flag_or(7, false);
  const int64_t n = idx.type.numel(), v = w.shape()[0], d = w.shape()[1], nb = ctx.out(0).shape[0];
  if (n == 0 || nb == 0 || mode < 0 || mode > 2) throw Unsupported("embedding_bag: empty bags or mode");
  ctx.check(all_in_range(b, idx, 0, v), "aten::_embedding_bag: index out of range: valid indices are 0 to " +
                                            std::to_string(v - 1));
  DType acc = acc_type(w.dtype());
  const Type i64n{DType::I64, {n}};

  // Bag of index i: how many of the bags' start offsets are <= i, minus one.
  Value starts = b.slice(off, {0}, {nb}, {1});
  Value pos_nb = b.iota(Type{DType::I64, {n, nb}}, 0);
  Value started = b.convert(b.compare(b.broadcast_in_dim(starts, {n, nb}, {1}), pos_nb, Cmp::LE), DType::I64);
  Value bag = sub(b, reduce_sum(b, started, {1}), b.constant(1, DType::I64, {n}));
  // Indices equal to padding_idx count nowhere. With include_last_offset, CPU sums the
  // last bag up to offsets[-1] but sizes it (and takes its max) up to the last index;
  // the two agree when offsets[-1] == len(indices), as documented.
  Value valid = b.constant(1, DType::Bool, {n});
  if (pad >= 0) valid = b.compare(idx, b.constant(static_cast<double>(pad), DType::I64, {n}), Cmp::NE);
  Value same_bag = b.compare(b.broadcast_in_dim(bag, {nb, n}, {1}), b.iota(Type{DType::I64, {nb, n}}, 0), Cmp::EQ);
  Value member = b.binary("stablehlo.and", same_bag, b.broadcast_in_dim(valid, {nb, n}, {1}));
  Value summed = member;
  if (last) {
    Value end = b.broadcast_in_dim(b.reshape(b.slice(off, {nb}, {nb + 1}, {1}), {}), {n}, {});
    Value before_end = b.compare(b.iota(i64n, 0), end, Cmp::LT);
    summed = b.binary("stablehlo.and", member, b.broadcast_in_dim(before_end, {nb, n}, {1}));
  }
  Value count = reduce_sum(b, b.convert(member, DType::I64), {1});  // [nb]

  Value rows = b.gather(w, b.reshape(idx, {n, 1}), {1}, {0}, {0}, 1, {1, d}, {n, d});
  rows = b.convert(rows, acc);
  if (!ctx.is_none(6))
    rows = mul(b, rows, b.broadcast_in_dim(b.convert(ctx.in(6), acc), {n, d}, {0}));

  Value out, max_indices;
  Value nonempty = b.compare(count, b.constant(0, DType::I64, {nb}), Cmp::GT);
  if (mode != 2) {
    out = matmul2d(b, b.convert(summed, acc), rows, acc);
    if (mode == 1) {
      Value denom = b.convert(b.select(nonempty, count, b.constant(1, DType::I64, {nb})), acc);
      out = div(b, out, b.broadcast_in_dim(denom, {nb, d}, {0}));
    }
    max_indices = b.constant(0, ctx.out(3).dtype, ctx.out(3).shape);
  } else {
    Value in_bag = b.broadcast_in_dim(member, {nb, n, d}, {0, 1});
    Value lowest = b.constant(-std::numeric_limits<double>::infinity(), acc, {nb, n, d});
    Value masked = b.select(in_bag, b.broadcast_in_dim(rows, {nb, n, d}, {1, 2}), lowest);
    Value best = reduce_max(b, masked, {1});  // [nb, d]
    // The first position holding the maximum, as CPU's strict-greater scan keeps.
    Value hit = b.binary("stablehlo.and", in_bag,
                         b.compare(masked, b.broadcast_in_dim(best, {nb, n, d}, {0, 2}), Cmp::EQ));
    Value pos = b.iota(Type{DType::I64, {nb, n, d}}, 1);
    Value first = reduce_min(b, b.select(hit, pos, b.constant(static_cast<double>(n), DType::I64, {nb, n, d})), {1});
    Value at = b.compare(pos, b.broadcast_in_dim(first, {nb, n, d}, {0, 2}), Cmp::EQ);
    Value which = reduce_sum(b, b.select(at, b.broadcast_in_dim(idx, {nb, n, d}, {1}),
                                         b.constant(0, DType::I64, {nb, n, d})), {1});
    Value empty_d = b.broadcast_in_dim(nonempty, {nb, d}, {0});
    out = b.select(empty_d, best, b.constant(0, acc, {nb, d}));
    max_indices = b.select(empty_d, which, b.constant(-1, DType::I64, {nb, d}));
  }
  // bag_size has one entry per offset (include_last_offset's extra one is zero).
  Value bag_size = count;
  int64_t nsize = ctx.out(2).shape.empty() ? 0 : ctx.out(2).shape[0];
  if (nsize > nb) bag_size = b.pad(count, b.constant(0, DType::I64), {0}, {nsize - nb}, {0});
  return {b.convert(out, ctx.out(0).dtype), b.convert(bag, ctx.out(1).dtype),
          b.convert(bag_size, ctx.out(2).dtype), b.convert(max_indices, ctx.out(3).dtype)};
}

}  // namespace tpu::lowering
