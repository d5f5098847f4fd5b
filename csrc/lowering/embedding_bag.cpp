// embedding_bag: rows of `weight` at `indices`, reduced per bag (sum, mean or max), the
// bags given by `offsets`. Sums are a scatter-add of the rows into their bags and max a
// masked reduction over a (bags x indices) membership mask; no data-dependent shapes.
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
  check_in_range(ctx, idx, 0, v, "RuntimeError: aten::_embedding_bag: index out of range: valid indices are 0 to " +
                                            std::to_string(v - 1));
  // CPU's checks of the offsets: bags start at 0 and end within the indices.
  const int64_t no = off.type.numel();
  if (no > 0) {
    Value first = b.reshape(b.slice(off, {0}, {1}, {1}), {}), lastv = b.reshape(b.slice(off, {no - 1}, {no}, {1}), {});
    ctx.check(b.compare(first, b.constant(0, DType::I64), Cmp::EQ),
              "RuntimeError: offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
              "position 0");
    ctx.check(b.compare(lastv, b.constant(static_cast<double>(n), DType::I64), Cmp::LE),
              "RuntimeError: offsets[-1] can not be greater than input's length " + std::to_string(n));
    if (no > 1) {  // offsets going down give bags of negative size (CPU refuses them)
      Value up = b.compare(b.slice(off, {1}, {no}, {1}), b.slice(off, {0}, {no - 1}, {1}), Cmp::GE);
      ctx.check(all_true(b, up), "RuntimeError: embedding_bag: offsets must be non-decreasing (a bag cannot end "
                                 "before it starts)");
    }
  }
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
  Value count = reduce_sum(b, b.convert(member, DType::I64), {1});  // [nb]

  Value rows = b.gather(w, b.reshape(idx, {n, 1}), {1}, {0}, {0}, 1, {1, d}, {n, d});
  rows = b.convert(rows, acc);
  if (!ctx.is_none(6))
    rows = mul(b, rows, b.broadcast_in_dim(b.convert(ctx.in(6), acc), {n, d}, {0}));

  Value out, max_indices;
  Value nonempty = b.compare(count, b.constant(0, DType::I64, {nb}), Cmp::GT);
  if (mode != 2) {
    // A scatter-add of each row into its bag; rows left out (padding_idx, past the last
    // offset) are dropped by a select: a 0/1 matmul spread 0 * inf = NaN into every bag.
    Value keep = valid;
    if (last) {
      Value end = b.broadcast_in_dim(b.reshape(b.slice(off, {nb}, {nb + 1}, {1}), {}), {n}, {});
      keep = b.binary("stablehlo.and", keep, b.compare(b.iota(i64n, 0), end, Cmp::LT));
    }
    Value kept = b.select(b.broadcast_in_dim(keep, {n, d}, {0}), rows, b.constant(0, acc, {n, d}));
    auto sum = [](Builder& b, const std::vector<Value>& a) { return std::vector<Value>{add(b, a[0], a[1])}; };
    out = b.scatter(b.constant(0, acc, {nb, d}), b.reshape(bag, {n, 1}), kept, {1}, {0}, {0}, 1, sum);
    if (mode == 1) {
      Value denom = b.convert(b.select(nonempty, count, b.constant(1, DType::I64, {nb})), acc);
      out = div(b, out, b.broadcast_in_dim(denom, {nb, d}, {0}));
    }
    max_indices = b.constant(0, ctx.out(3).dtype, ctx.out(3).shape);
  } else {
    // CPU's scan keeps a row's value when it is first in its bag or strictly greater:
    // a NaN first wins, a NaN later is passed over, and of equal maxima the first stays.
    Value in_bag = b.broadcast_in_dim(member, {nb, n, d}, {0, 1});
    Value vals = b.broadcast_in_dim(rows, {nb, n, d}, {1, 2});
    Value pos = b.iota(Type{DType::I64, {nb, n, d}}, 1);
    Value none = b.constant(static_cast<double>(n), DType::I64, {nb, n, d});
    auto at_pos = [&](const Value& p) { return b.compare(pos, b.broadcast_in_dim(p, {nb, n, d}, {0, 2}), Cmp::EQ); };
    Value first = reduce_min(b, b.select(in_bag, pos, none), {1});  // [nb, d]
    Value first_val = masked_pick(b, vals, at_pos(first), 1);
    Value nan_first = b.compare(first_val, first_val, Cmp::NE);
    Value number = b.binary("stablehlo.and", in_bag, b.compare(vals, vals, Cmp::EQ));
    Value masked = b.select(number, vals, b.constant(-std::numeric_limits<double>::infinity(), acc, {nb, n, d}));
    Value best = reduce_max(b, masked, {1});
    Value hit = b.binary("stablehlo.and", number, b.compare(masked, b.broadcast_in_dim(best, {nb, n, d}, {0, 2}), Cmp::EQ));
    Value win = b.select(nan_first, first, reduce_min(b, b.select(hit, pos, none), {1}));
    Value at = at_pos(win);
    best = masked_pick(b, vals, at, 1);
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

namespace tpu::lowering {

// Dense weight gradient: sum / mean add each bag's grad (times the sample weight, over the
// bag size for mean) into the rows its indices name, padding_idx excluded; max adds it at
// the index that won each (bag, column).
static std::vector<Value> embedding_bag_grad(Ctx& ctx, int g_i, int idx_i, int o2b_i, int size_i, int max_i,
                                             int num_i, int freq_i, int mode_i, int psw_i, int pad_i) {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  DType acc = acc_type(o.dtype);
  Value g = b.convert(ctx.in(g_i), acc);
  Value idx = b.convert(ctx.in(idx_i), DType::I64);
  const int64_t mode = ctx.i(mode_i), pad = ctx.i_or(pad_i, -1), v = ctx.i(num_i);
  if (ctx.flag(freq_i)) throw Unsupported("embedding_bag backward: scale_grad_by_freq");
  if (g.rank() != 2 || idx.rank() != 1 || o.shape != Shape{v, g.shape()[1]}) throw Unsupported("embedding_bag backward: shapes");
  const int64_t n = idx.type.numel(), nb = g.shape()[0], d = g.shape()[1];
  auto sum = [](Builder& b, const std::vector<Value>& a) { return std::vector<Value>{add(b, a[0], a[1])}; };
  Value zero = b.constant(0, acc, {v, d});
  if (n == 0 || nb == 0 || d == 0) return {b.convert(zero, o.dtype)};
  if (mode == 2) {
    Value mi = b.convert(ctx.in(max_i), DType::I64);
    if (mi.shape() != Shape{nb, d}) throw Unsupported("embedding_bag backward: max_indices");
    Value ok = b.compare(mi, b.constant(0, DType::I64, {nb, d}), Cmp::GE);
    Value u = b.select(ok, g, b.constant(0, acc, {nb, d}));
    Value row = b.reshape(b.select(ok, mi, b.constant(0, DType::I64, {nb, d})), {nb, d, 1});
    Value col = b.iota(Type{DType::I64, {nb, d, 1}}, 1);
    return {b.convert(b.scatter(zero, b.concatenate({row, col}, 2), u, {}, {0, 1}, {0, 1}, 2, sum), o.dtype)};
  }
  if (mode != 0 && mode != 1) throw Unsupported("embedding_bag backward: mode");
  Value o2b = b.convert(ctx.in(o2b_i), DType::I64);
  if (o2b.type.numel() != n) throw Unsupported("embedding_bag backward: offset2bag");
  o2b = b.reshape(o2b, {n});
  Value rows = b.gather(g, b.reshape(o2b, {n, 1}), {1}, {0}, {0}, 1, {1, d}, {n, d});
  Value scale = b.constant(1, acc, {n});
  if (!ctx.is_none(psw_i)) scale = b.convert(ctx.in(psw_i), acc);
  if (mode == 1) {
    Value bs = b.convert(ctx.in(size_i), acc);
    Value per = b.gather(bs, b.reshape(o2b, {n, 1}), {}, {0}, {0}, 1, {1}, {n});
    scale = div(b, scale, per);
  }
  Value keep = b.constant(1, DType::Bool, {n});
  if (pad >= 0) keep = b.compare(idx, b.constant(static_cast<double>(pad), DType::I64, {n}), Cmp::NE);
  scale = b.select(keep, scale, b.constant(0, acc, {n}));
  Value u = mul(b, rows, b.broadcast_in_dim(scale, {n, d}, {0}));
  u = b.select(b.broadcast_in_dim(keep, {n, d}, {0}), u, b.constant(0, acc, {n, d}));
  Value out = b.scatter(zero, b.reshape(idx, {n, 1}), u, {1}, {0}, {0}, 1, sum);
  return {b.convert(out, o.dtype)};
}

// (grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
//  scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx)
TPU_LOWER(embedding_bag_backward, "_embedding_bag_backward") {
  if (ctx.flag(9)) throw Unsupported("embedding_bag backward: sparse");
  return embedding_bag_grad(ctx, 0, 1, 3, 4, 5, 6, 7, 8, 10, 11);
}

// (grad, indices, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq,
//  mode, per_sample_weights, padding_idx)
TPU_LOWER(embedding_bag_dense_backward, "_embedding_bag_dense_backward") {
  return embedding_bag_grad(ctx, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9);
}

// d loss / d per_sample_weights[i] = <grad[bag(i)], weight[indices[i]]> (sum mode only).
TPU_LOWER(embedding_bag_psw_backward, "_embedding_bag_per_sample_weights_backward") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  DType acc = acc_type(o.dtype);
  if (ctx.i(5) != 0) throw Unsupported("per_sample_weights backward: only mode sum");
  Value g = b.convert(ctx.in(0), acc), w = b.convert(ctx.in(1), acc);
  Value idx = b.convert(ctx.in(2), DType::I64), o2b = b.convert(ctx.in(4), DType::I64);
  int64_t pad = ctx.i_or(6, -1), n = idx.type.numel(), d = w.shape()[1];
  if (n == 0) return {b.constant(0, o.dtype, o.shape)};
  if (o2b.type.numel() != n || idx.rank() != 1) throw Unsupported("per_sample_weights backward: offset2bag");
  Value gr = b.gather(g, b.reshape(o2b, {n, 1}), {1}, {0}, {0}, 1, {1, d}, {n, d});
  Value wr = b.gather(w, b.reshape(idx, {n, 1}), {1}, {0}, {0}, 1, {1, d}, {n, d});
  Value r = reduce_sum(b, mul(b, gr, wr), {1});
  if (pad >= 0)
    r = b.select(b.compare(idx, b.constant(static_cast<double>(pad), DType::I64, {n}), Cmp::NE), r,
                 b.constant(0, acc, {n}));
  return {b.convert(b.reshape(r, o.shape), o.dtype)};
}

}  // namespace tpu::lowering
