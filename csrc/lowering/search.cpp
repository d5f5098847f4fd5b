// Searching sorted data and order statistics: searchsorted, median, nanmedian,
// kthvalue, mode.
#include <algorithm>

#include "lowering/scan.h"
#include "lowering/search_util.h"
#include "lowering/sort_replay.h"

namespace tpu::lowering {

using ir::Cmp;
using namespace search;

// searchsorted: CPU's binary search, step for step (so NaN in the boundaries or the
// values lands where CPU puts it), unrolled floor(log2 n) + 1 times over all values.
// Left side moves right while !(mid >= v), right side while !(mid > v). Both compare
// in the result type of boundaries and values (a Python scalar counts as wrapped).
// bucketize is the same search with its arguments the other way round.
struct SearchArgs {
  int boundaries, values;
  bool scalar;  // values is a Scalar
  int sorter;   // -1: none
};

static std::vector<Value> binary_search(Ctx& ctx, const SearchArgs& a, bool right) {
  Builder& b = ctx.b;
  Value bd = ctx.in(a.boundaries);
  DType t;
  Value v;
  if (a.scalar) {
    t = bd.dtype();
    if (!is_float(t) && ctx.scalar_is_float(a.values)) t = DType::F32;
    v = ctx.scalar(a.values, t);
  } else {
    v = ctx.in(a.values);
    t = result_type({bd, v});
  }
  Type out = ctx.out(0);
  int64_t n = bd.shape().back(), total = v.type.numel();
  if (n == 0 || total == 0) return {b.constant(0, out.dtype, out.shape)};
  bd = b.reshape(b.convert(bd, t), {bd.type.numel()});
  v = b.reshape(b.convert(v, t), {total});
  Type it{DType::I64, {total}};
  auto c = [&](double x) { return b.constant(x, DType::I64, {total}); };
  Value base = c(0);
  if (ctx.type_of(a.boundaries).rank() > 1) {  // one row of boundaries per row of values
    int64_t m = ctx.type_of(a.values).shape.back();
    base = mul(b, b.binary("stablehlo.divide", b.iota(it, 0), c(double(m))), c(double(n)));
  }
  std::optional<Value> sorter;
  if (a.sorter >= 0 && !ctx.is_none(a.sorter)) {
    Value s = ctx.in(a.sorter);
    check_in_range(ctx, s, 0, n, "RuntimeError: searchsorted(): sorter index out of range");
    sorter = b.reshape(b.convert(s, DType::I64), {s.type.numel()});
  }
  Value lo = c(0), hi = c(double(n));
  for (int64_t span = 1; span <= n; span *= 2) {
    Value active = b.compare(lo, hi, Cmp::LT);
    Value mid = add(b, lo, b.binary("stablehlo.shift_right_arithmetic", sub(b, hi, lo), c(1)));
    Value at = b.clamp(c(0), mid, c(double(n - 1)));
    if (sorter) at = gather_flat(b, *sorter, add(b, base, at));
    Value mv = gather_flat(b, bd, add(b, base, at));
    Value go_right = lnot(b, b.compare(mv, v, right ? Cmp::GT : Cmp::GE));
    lo = b.select(land(b, active, go_right), add(b, mid, c(1)), lo);
    hi = b.select(land(b, active, lnot(b, go_right)), mid, hi);
  }
  return {b.reshape(b.convert(lo, out.dtype), out.shape)};
}

// searchsorted(sorted_sequence, self, *, out_int32, right, side, sorter): `side` wins,
// and must be "left" or "right" and agree with right=True (CPU's checks, at the call).
static std::vector<Value> searchsorted(Ctx& ctx, bool scalar) {
  bool right = ctx.flag_or(3, false);
  if (!ctx.is_none(4)) {
    std::string side = ctx.str(4);
    if (side != "left" && side != "right")
      throw std::invalid_argument("torch.searchsorted(): side can only be 'left' or 'right' but got " + side);
    if (right && side != "right")
      throw std::invalid_argument("torch.searchsorted(): side and right can't be set to opposites, got side of " +
                                  side + " while right was True");
    right = side == "right";
  }
  return binary_search(ctx, SearchArgs{0, 1, scalar, 5}, right);
}

TPU_LOWER(searchsorted_tensor, "searchsorted.Tensor") { return searchsorted(ctx, false); }
TPU_LOWER(searchsorted_scalar, "searchsorted.Scalar") { return searchsorted(ctx, true); }

// bucketize(self, boundaries, *, out_int32, right): 1-D boundaries only.
static std::vector<Value> bucketize(Ctx& ctx, bool scalar) {
  int64_t rank = ctx.type_of(1).rank();
  if (rank != 1)
    throw std::invalid_argument("boundaries tensor must be 1 dimension, but got dim(" + std::to_string(rank) + ")");
  return binary_search(ctx, SearchArgs{1, 0, scalar, -1}, ctx.flag_or(3, false));
}

TPU_LOWER(bucketize_tensor, "bucketize.Tensor") { return bucketize(ctx, false); }
TPU_LOWER(bucketize_scalar, "bucketize.Scalar") { return bucketize(ctx, true); }

// ---- median / nanmedian ----

// Entry k (an int64 value shaped like x without its last dim) of the last dim of x.
static Value pick_last(Builder& b, const Value& x, const Value& k) {
  Shape s = x.shape();
  int64_t n = s.back(), rows = x.type.numel() / std::max<int64_t>(n, 1);
  Value flat = b.reshape(x, {rows * n});
  Value row = b.iota(Type{DType::I64, {rows}}, 0);
  Value pos = add(b, mul(b, row, b.constant(double(n), DType::I64, {rows})), b.reshape(k, {rows}));
  Shape rs(s.begin(), s.end() - 1);
  return b.reshape(gather_flat(b, flat, pos), rs);
}

// CPU partitions a row of NaN with std::nth_element(k = 0) under a comparator that
// finds no NaN before another: which position ends first then depends on n alone, so
// the same libstdc++ algorithm run on positions gives it.
static int64_t all_nan_pick(int64_t n) {
  std::vector<int64_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = i;
  std::nth_element(pos.begin(), pos.begin(), pos.end(), [](int64_t, int64_t) { return false; });
  return pos[0];
}

// Median along the last dim of x (sorted with NaN last, stable, as CPU's index choice
// agrees with). median: a NaN anywhere gives that row's first NaN. nanmedian: the
// lower median of the non-NaN values; a row of NaN: see all_nan_pick.
static std::pair<Value, Value> median_last(Builder& b, const Value& x, bool ignore_nan) {
  int64_t n = x.shape().back();
  Shape rs(x.shape().begin(), x.shape().end() - 1);
  auto sorted = sort_nan_last(b, x, x.rank() - 1);
  Value k;
  if (ignore_nan) {
    Value cnt = reduce_sum(b, b.convert(lnot(b, is_nan(b, x)), DType::I64), {x.rank() - 1});
    Value half = b.binary("stablehlo.divide", sub(b, cnt, b.constant(1, DType::I64, rs)),
                          b.constant(2, DType::I64, rs));
    Value none = b.compare(cnt, b.constant(0, DType::I64, rs), Cmp::EQ);
    k = b.select(none, b.constant(double(all_nan_pick(n)), DType::I64, rs), half);
  } else {
    // With a NaN, sorted position count(non-NaN) is the first NaN (stable order).
    Value cnt = reduce_sum(b, b.convert(lnot(b, is_nan(b, x)), DType::I64), {x.rank() - 1});
    Value has_nan = b.compare(cnt, b.constant(double(n), DType::I64, rs), Cmp::LT);
    k = b.select(has_nan, cnt, b.constant(double((n - 1) / 2), DType::I64, rs));
  }
  return {pick_last(b, sorted[0], k), pick_last(b, sorted[1], k)};
}

static Value median_all(Ctx& ctx, bool ignore_nan) {
  Value x = ctx.in(0);
  int64_t n = x.type.numel();
  if (n == 0) throw Unsupported("median of an empty tensor");
  Value flat = ctx.b.reshape(x, {n});
  return ctx.b.reshape(median_last(ctx.b, flat, ignore_nan).first, ctx.out(0).shape);
}

static std::vector<Value> median_dim(Ctx& ctx, bool ignore_nan) {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  if (x.rank() == 0) return {x, b.constant(0, DType::I64)};
  int64_t dim = wrap_dim(ctx.i(1), x.rank());
  if (x.shape()[dim] == 0) throw Unsupported("median over an empty dim");
  auto [v, i] = median_last(b, dim_last(b, x, dim), ignore_nan);
  return {b.reshape(v, ctx.out(0).shape), b.reshape(i, ctx.out(1).shape)};
}

TPU_LOWER(median, "median") { return {median_all(ctx, false)}; }
TPU_LOWER(nanmedian, "nanmedian") { return {median_all(ctx, true)}; }
TPU_LOWER(median_d, "median.dim") { return median_dim(ctx, false); }
TPU_LOWER(nanmedian_d, "nanmedian.dim") { return median_dim(ctx, true); }

// ---- kthvalue ----

// CPU's quickselect leaves ties wherever its swaps put them: replayed (sort_replay.h).
TPU_LOWER(kthvalue, "kthvalue") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  int64_t k = ctx.i(1);
  if (x.rank() == 0) {
    if (k != 1) throw Unsupported("kthvalue: k out of range");
    return {x, b.constant(0, DType::I64)};
  }
  int64_t dim = wrap_dim(ctx.i_or(2, -1), x.rank()), n = x.shape()[dim];
  if (k < 1 || k > n || x.type.numel() == 0) throw Unsupported("kthvalue: k out of range or empty input");
  if (x.type.numel() >= (int64_t(1) << 30)) throw Unsupported("kthvalue of 2^30 elements or more");
  Value y = dim_last(b, x, dim);
  if (y.dtype() == DType::Bool) y = b.convert(y, DType::U8);
  int64_t rows = y.type.numel() / n;
  auto [v, i] = replay::quickselect_rows(b, b.reshape(y, {rows, n}), k - 1);
  return {b.reshape(b.convert(v, x.dtype()), ctx.out(0).shape), b.reshape(i, ctx.out(1).shape)};
}

// ---- mode ----

// CPU sorts each row of (value, index) pairs with std::sort on `value <` (replayed, so
// NaN and ties end where CPU leaves them; sort_replay.h), then the first strictly
// longest run of equal values (`!=` ends a run, so each NaN is its own) gives the value
// and the index of the run's last element.
TPU_LOWER(mode, "mode") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  if (x.rank() == 0) return {x, b.constant(0, DType::I64)};
  int64_t dim = wrap_dim(ctx.i_or(1, -1), x.rank());
  int64_t n = x.shape()[dim];
  if (n == 0) throw Unsupported("mode over an empty dim");
  Value y = dim_last(b, x, dim);
  if (y.dtype() == DType::Bool) y = b.convert(y, DType::U8);
  int64_t r = y.rank();
  const Shape& s = y.shape();
  if (y.type.numel() >= (int64_t(1) << 30)) throw Unsupported("mode of 2^30 elements or more");
  auto [sa, si] = replay::std_sort_rows(b, b.reshape(y, {y.type.numel() / n, n}));
  Value a = b.reshape(sa, s), ix = b.reshape(si, s);
  // Run ends: the last element, or a value != its successor.
  Shape lo(r, 0), one(r, 1);
  lo[r - 1] = 1;
  Shape pad_hi(r, 0);
  pad_hi[r - 1] = 1;
  Value next = b.pad(b.slice(a, lo, s, one), b.constant(0, a.dtype()), Shape(r, 0), pad_hi, Shape(r, 0));
  Value pos = b.iota(Type{DType::I64, s}, r - 1);
  Value is_last = b.compare(pos, b.constant(double(n - 1), DType::I64, s), Cmp::EQ);
  Value end = lor(b, is_last, b.compare(a, next, Cmp::NE));
  // Run length at an end: its position minus the previous end's (a running max of the
  // ends, shifted by one).
  Value ends = inclusive_scan(b, b.select(end, pos, b.constant(-1, DType::I64, s)), "stablehlo.maximum", r - 1);
  Shape all_but_last = s;
  all_but_last[r - 1] = n - 1;
  Value prev = b.pad(b.slice(ends, Shape(r, 0), all_but_last, one), b.constant(-1, DType::I64), lo, Shape(r, 0),
                     Shape(r, 0));
  Value len = b.select(end, sub(b, pos, prev), b.constant(0, DType::I64, s));
  // First strictly longest run: max length, ties to the lower position.
  auto best = b.reduce({len, pos}, {b.constant(-1, DType::I64), b.constant(0, DType::I64)}, {r - 1},
                       [](Builder& q, const std::vector<Value>& v) {
    Value pick = lor(q, q.compare(v[0], v[2], Cmp::GT),
                     land(q, q.compare(v[0], v[2], Cmp::EQ), q.compare(v[1], v[3], Cmp::LT)));
    return std::vector<Value>{q.select(pick, v[0], v[2]), q.select(pick, v[1], v[3])};
  });
  Value val = pick_last(b, a, best[1]), idx = pick_last(b, ix, best[1]);
  return {b.reshape(b.convert(val, x.dtype()), ctx.out(0).shape), b.reshape(idx, ctx.out(1).shape)};
}

}  // namespace tpu::lowering
