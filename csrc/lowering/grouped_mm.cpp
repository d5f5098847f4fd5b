// _grouped_mm: one matrix product per group (a MoE layer's experts). The group
// boundaries `offs` (int32 cumulative ends) stay on the device: every row/column
// finds its group by comparing its index against the offsets inside the program,
// so no value is read on the host and a deferred graph is not cut. Products are
// dense over the groups (G x the work of one product) and the wanted group's result
// is selected, never multiplied by a mask, so inf/NaN of other groups cannot leak in
// and results are exact up to the summation order of one product.
#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

namespace {

// in_group[g, i] = offs[g-1] <= i < offs[g] (offs[-1] = 0): a bool (G, n) value.
// Indices past offs[G-1] belong to no group.
Value group_mask(Builder& b, const Value& offs, int64_t n) {
  int64_t g = offs.shape()[0];
  Value ends = b.convert(offs, DType::I64);
  Value starts = b.concatenate({b.constant(0, DType::I64, {1}), b.slice(ends, {0}, {g - 1}, {1})}, 0);
  Shape gn{g, n};
  Value idx = b.iota(Type{DType::I64, gn}, 1);
  Value lo = b.broadcast_in_dim(starts, gn, {0});
  Value hi = b.broadcast_in_dim(ends, gn, {0});
  return b.binary("stablehlo.and", b.compare(lo, idx, Cmp::LE), b.compare(idx, hi, Cmp::LT));
}

// From `p` (per-group results, group dim `gdim`), each element's own group's value:
// other groups are replaced by -0.0 and summed away (x + -0.0 == x for every x,
// signed zeros included). `mask` is bool, shaped like `p`. Elements of no group are 0.
Value pick_group(Builder& b, const Value& p, const Value& mask, int64_t gdim) {
  DType t = p.dtype();
  Value neg_zero = b.constant(-0.0, t, p.shape());
  Value picked = b.reduce(b.select(mask, p, neg_zero), b.constant(-0.0, t), {gdim}, "stablehlo.add");
  Value any = b.reduce(b.convert(mask, DType::I32), b.constant(0, DType::I32), {gdim}, "stablehlo.maximum");
  Value has = b.compare(any, b.constant(0, DType::I32, any.shape()), Cmp::NE);
  return b.select(has, picked, b.constant(0, t, picked.shape()));
}

Value dot(Builder& b, const Value& x, const Value& y, DType acc, const std::vector<int64_t>& ba,
          const std::vector<int64_t>& bb, const std::vector<int64_t>& ca, const std::vector<int64_t>& cb) {
  return b.dot_general(b.convert(x, acc), b.convert(y, acc), ba, bb, ca, cb, acc);
}

}  // namespace

TPU_LOWER(grouped_mm, "_grouped_mm") {
  Builder& b = ctx.b;
  if (!ctx.is_none(3)) throw std::invalid_argument("_grouped_mm: Bias not supported yet");
  Value x = ctx.in(0), y = ctx.in(1);
  DType out = ctx.out(0).dtype;
  DType acc = acc_type(x.dtype());
  int64_t xr = x.shape().size(), yr = y.shape().size();
  if ((xr != 2 && xr != 3) || (yr != 2 && yr != 3))
    throw std::invalid_argument("_grouped_mm: multiplicands must be 2D or 3D");

  if (xr == 3 && yr == 3) {  // a plain batched product
    if (!ctx.is_none(2)) throw std::invalid_argument("_grouped_mm: offsets given for 3D/3D multiplicands");
    return {b.convert(dot(b, x, y, acc, {0}, {0}, {2}, {1}), out)};
  }
  if (ctx.is_none(2)) throw std::invalid_argument("_grouped_mm: offsets needed for a 2D multiplicand");
  Value offs = ctx.in(2);
  int64_t g = offs.shape()[0];
  if (g == 0) return {b.constant(0, out, ctx.out(0).shape)};  // no groups: nothing is covered

  if (xr == 2 && yr == 3) {
    // (M, K) x (G, K, N) -> (M, N): row m uses the weights of its group.
    int64_t m = x.shape()[0], n = y.shape()[2];
    Value p = dot(b, x, y, acc, {}, {}, {1}, {1});  // (M, G, N)
    Value mask = b.broadcast_in_dim(group_mask(b, offs, m), {m, g, n}, {1, 0});
    return {b.convert(pick_group(b, p, mask, 1), out)};
  }
  if (xr == 3 && yr == 2) {
    // (G, M, K) x (K, N) -> (M, N): column n uses the matrix of its group.
    int64_t m = x.shape()[1], n = y.shape()[1];
    Value p = dot(b, x, y, acc, {}, {}, {2}, {0});  // (G, M, N)
    Value mask = b.broadcast_in_dim(group_mask(b, offs, n), {g, m, n}, {0, 2});
    return {b.convert(pick_group(b, p, mask, 0), out)};
  }
  // (M, K) x (K, N) -> (G, M, N), grouped over K (a weight gradient): both operands
  // are masked per group (zeros, not a product with a mask: inf * 0 would be NaN).
  int64_t m = x.shape()[0], k = x.shape()[1], n = y.shape()[1];
  Value in_k = group_mask(b, offs, k);  // (G, K)
  Value xs = b.broadcast_in_dim(x, {g, m, k}, {1, 2});
  Value ys = b.broadcast_in_dim(y, {g, k, n}, {1, 2});
  Value xm = b.select(b.broadcast_in_dim(in_k, {g, m, k}, {0, 2}), xs, b.constant(0, x.dtype(), {g, m, k}));
  Value ym = b.select(b.broadcast_in_dim(in_k, {g, k, n}, {0, 1}), ys, b.constant(0, y.dtype(), {g, k, n}));
  return {b.convert(dot(b, xm, ym, acc, {0}, {0}, {2}, {1}), out)};
}

}  // namespace tpu::lowering
