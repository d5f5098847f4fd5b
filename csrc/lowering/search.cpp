// Searching sorted data and order statistics: searchsorted, median, nanmedian,
// kthvalue, mode.
#include <algorithm>

#include "lowering/search_util.h"

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

// CPU finds the k-th value with Sedgewick's quickselect (median of three, then
// scanning i up and j down), and ties end wherever its swaps leave them. Replayed
// here exactly: every row runs the same state machine in lockstep in one while loop,
// one scan step per iteration. Phases: 0 start a round, 1 scan i, 2 scan j, 3 swap or
// close the round, 4 done.
struct QuickSelect {
  Builder& b;
  int64_t rows, n;
  Shape rs, s;
  Value col, base;
  QuickSelect(Builder& bb, int64_t r, int64_t nn) : b(bb), rows(r), n(nn), rs{r}, s{r, nn} {
    col = b.iota(Type{DType::I64, s}, 1);
    base = mul(b, b.iota(Type{DType::I64, rs}, 0), b.constant(double(n), DType::I64, rs));
  }
  Value I(double v) { return b.constant(v, DType::I64, rs); }
  // Row r's entries at positions pos[r, m...] (one gather for all of them).
  Value get(const Value& a, const std::vector<Value>& pos) {
    std::vector<Value> cols;
    for (auto& p : pos) cols.push_back(b.reshape(b.clamp(I(0), p, I(double(n - 1))), {rows, 1}));
    int64_t m = static_cast<int64_t>(pos.size());
    Value at = add(b, b.broadcast_in_dim(base, {rows, m}, {0}), b.concatenate(cols, 1));
    return gather_flat(b, b.reshape(a, {rows * n}), at);
  }
  Value get(const Value& a, const Value& pos) { return b.reshape(get(a, std::vector<Value>{pos}), rs); }
  static Value part(Builder& b, const Value& g, int64_t j) {
    int64_t rows = g.shape()[0];
    return b.reshape(b.slice(g, {0, j}, {rows, j + 1}, {1, 1}), {rows});
  }
  // x sorts after y: greater, or NaN against a number.
  Value gt(const Value& x, const Value& y) {
    Value r = b.compare(x, y, Cmp::GT);
    if (!is_float(x.dtype())) return r;
    return lor(b, r, land(b, is_nan(b, x), lnot(b, is_nan(b, y))));
  }
  // a with row r's entry at pos[r] set to v[r] where on[r].
  Value put(const Value& a, const Value& pos, const Value& v, const Value& on) {
    auto B = [&](const Value& x) { return b.broadcast_in_dim(x, s, {0}); };
    return b.select(land(b, B(on), b.compare(col, B(pos), Cmp::EQ)), B(v), a);
  }
};

static std::pair<Value, Value> quickselect(Builder& outer, const Value& x, int64_t k) {
  int64_t rows = x.shape()[0], n = x.shape()[1];
  Shape rs{rows};
  std::vector<Value> init = {x, outer.iota(Type{DType::I64, x.shape()}, 1),
                             outer.constant(0, DType::I64, rs), outer.constant(double(n - 1), DType::I64, rs),
                             outer.constant(0, DType::I64, rs), outer.constant(0, DType::I64, rs),
                             outer.constant(0, x.dtype(), rs), outer.constant(0, DType::I32, rs)};
  auto st = outer.while_loop(init, [](Builder& b, const std::vector<Value>& v) {
    Value live = b.convert(b.compare(v[7], b.constant(4, DType::I32, v[7].shape()), Cmp::NE), DType::I32);
    return std::vector<Value>{b.compare(b.reduce(live, b.constant(0, DType::I32), {0}, "stablehlo.maximum"),
                                        b.constant(0, DType::I32), Cmp::GT)};
  }, [rows, n, k](Builder& b, const std::vector<Value>& v) {
    QuickSelect q(b, rows, n);
    Value a = v[0], ix = v[1], L = v[2], R = v[3], i = v[4], j = v[5], piv = v[6], ph = v[7];
    auto P = [&](int p) { return b.compare(ph, b.constant(p, DType::I32, ph.shape()), Cmp::EQ); };
    Value p0 = P(0), p1 = P(1), p2 = P(2), p3 = P(3);
    auto ph_to = [&](const Value& on, int p) { ph = b.select(on, b.constant(p, DType::I32, ph.shape()), ph); };
    Value one = q.I(1);
    auto sel = [&](const Value& c, const Value& x, const Value& y) { return b.select(c, x, y); };
    // Phase 0, on registers: entries at L, L+1, mid, R read once, CPU's swaps replayed
    // on them, then written back (mid first: it may be L+1, which then wins).
    Value L1 = add(b, L, one);
    Value mid = b.binary("stablehlo.shift_right_arithmetic", add(b, L, R), one);
    std::vector<Value> at = {L, L1, mid, R};
    Value ga = q.get(a, at), gi = q.get(ix, at);
    Value aL = q.part(b, ga, 0), a1 = q.part(b, ga, 1), am = q.part(b, ga, 2), aR = q.part(b, ga, 3);
    Value iL = q.part(b, gi, 0), i1 = q.part(b, gi, 1), im = q.part(b, gi, 2), iR = q.part(b, gi, 3);
    Value single = b.compare(R, L, Cmp::LE), two = b.compare(R, L1, Cmp::EQ);
    Value gen = land(b, p0, lnot(b, lor(b, single, two)));
    Value two_on = land(b, p0, land(b, lnot(b, single), two));
    // Two elements: order them.
    Value c2 = land(b, two_on, q.gt(aL, aR));
    // More: swap(mid, L+1), then order (L+1, R), (L, R), (L+1, L).
    Value m1 = am, mi1 = im;  // L+1 after the first swap; mid holds the old L+1
    Value s1 = q.gt(m1, aR);
    Value v1 = sel(s1, aR, m1), w1 = sel(s1, iR, mi1), vR = sel(s1, m1, aR), wR = sel(s1, mi1, iR);
    Value s2 = q.gt(aL, vR);
    Value vL = sel(s2, vR, aL), wL = sel(s2, wR, iL);
    vR = sel(s2, aL, vR);
    wR = sel(s2, iL, wR);
    Value s3 = q.gt(v1, vL);
    Value t = v1, tw = w1;
    v1 = sel(s3, vL, v1);
    w1 = sel(s3, wL, w1);
    vL = sel(s3, t, vL);
    wL = sel(s3, tw, wL);
    // Write back: two-element rows swap L and R; general rows write mid, L+1, L, R.
    a = q.put(a, mid, a1, gen);
    ix = q.put(ix, mid, i1, gen);
    a = q.put(a, L1, v1, gen);
    ix = q.put(ix, L1, w1, gen);
    a = q.put(a, L, sel(gen, vL, aR), lor(b, gen, c2));
    ix = q.put(ix, L, sel(gen, wL, iR), lor(b, gen, c2));
    a = q.put(a, R, sel(gen, vR, aL), lor(b, gen, c2));
    ix = q.put(ix, R, sel(gen, wR, iL), lor(b, gen, c2));
    i = sel(gen, L1, i);
    j = sel(gen, R, j);
    piv = sel(gen, vL, piv);
    ph_to(land(b, p0, lnot(b, gen)), 4);
    ph_to(gen, 1);
    // Phase 1: i moves up while piv sorts after arr[i].
    Value inext = add(b, i, one);
    ph_to(land(b, p1, lnot(b, q.gt(piv, q.get(a, inext)))), 2);
    i = sel(p1, inext, i);
    // Phase 2: j moves down while arr[j] sorts after piv.
    Value jnext = sub(b, j, one);
    ph_to(land(b, p2, lnot(b, q.gt(q.get(a, jnext), piv))), 3);
    j = sel(p2, jnext, j);
    // Phase 3: not crossed: swap(i, j), scan on; crossed: swap(L, j), narrow to k's side.
    Value crossed = b.compare(j, i, Cmp::LT);
    Value go_on = land(b, p3, lnot(b, crossed)), close = land(b, p3, crossed);
    Value first = sel(crossed, L, i);
    std::vector<Value> pq = {first, j};
    Value sa = q.get(a, pq), si = q.get(ix, pq);
    a = q.put(q.put(a, first, q.part(b, sa, 1), p3), j, q.part(b, sa, 0), p3);
    ix = q.put(q.put(ix, first, q.part(b, si, 1), p3), j, q.part(b, si, 0), p3);
    ph_to(go_on, 1);
    Value kk = q.I(double(k));
    Value newL = sel(land(b, close, b.compare(j, kk, Cmp::LE)), i, L);
    R = sel(land(b, close, b.compare(j, kk, Cmp::GE)), sub(b, j, one), R);
    L = newL;
    ph_to(close, 0);
    return std::vector<Value>{a, ix, L, R, i, j, piv, ph};
  });
  Value at = outer.constant(double(k), DType::I64, rs);
  QuickSelect q(outer, rows, n);
  return {q.get(st[0], at), q.get(st[1], at)};
}

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
  Value y = dim_last(b, x, dim);
  if (y.dtype() == DType::Bool) y = b.convert(y, DType::U8);
  int64_t rows = y.type.numel() / n;
  auto [v, i] = quickselect(b, b.reshape(y, {rows, n}), k - 1);
  return {b.reshape(b.convert(v, x.dtype()), ctx.out(0).shape), b.reshape(i, ctx.out(1).shape)};
}

// ---- mode ----

// CPU sorts each row of (value, index) pairs with std::sort on `value <`, which for up
// to 16 elements is libstdc++'s insertion sort: replayed here step by step, so NaN and
// ties end where CPU leaves them. Then the first strictly longest run of equal values
// (`!=` ends a run, so each NaN is its own) gives the value and the index of the run's
// last element. Longer rows go through introsort first (replayed below), then an
// insertion pass whose front check only guards the first 16 elements.
static std::pair<Value, Value> insertion_sort(Builder& outer, const Value& a0, const Value& ix0,
                                              int64_t guarded) {
  const Shape s = a0.shape();
  int64_t r = a0.rank(), n = s.back();
  // One insertion per iteration (a loop, not unrolled: small programs compile fast).
  auto st = outer.while_loop({a0, ix0, outer.constant(1, DType::I64)},
                             [n](Builder& b, const std::vector<Value>& v) {
    return std::vector<Value>{b.compare(v[2], b.constant(double(n), DType::I64), Cmp::LT)};
  }, [s, r, guarded](Builder& b, const std::vector<Value>& v) {
    Value a = v[0], ix = v[1], i = v[2];
    Value pos = b.iota(Type{DType::I64, s}, r - 1);
    auto k = [&](double x) { return b.constant(x, DType::I64, s); };
    Value ib = broadcast_to(b, i, s);
    auto col = [&](const Value& x, const Value& at) {
      std::vector<Value> starts(r, b.constant(0, DType::I64));
      starts[r - 1] = at;
      Shape one = s;
      one[r - 1] = 1;
      return broadcast_to(b, b.dynamic_slice(x, starts, one), s);
    };
    auto shift_right = [&](const Value& x) {
      Shape lo(r, 0), hi(r, 0), in(r, 0), zero(r, 0), one(r, 1);
      lo[r - 1] = 1;
      return b.slice(b.pad(x, b.constant(0, x.dtype()), lo, hi, in), zero, s, one);
    };
    Value val = col(a, i), vix = col(ix, i);
    Value lt = b.compare(val, a, Cmp::LT);
    // Insertion point: one past the last earlier element that val is not below; 0 when
    // val is below the first (then everything before i moves up).
    Value stop = land(b, lnot(b, lt), b.compare(pos, ib, Cmp::LT));
    Value p = reduce_max(b, b.select(stop, pos, k(-1)), {r - 1});
    p = add(b, p, b.constant(1, DType::I64, p.shape()));
    Value front = land(b, col(lt, b.constant(0, DType::I64)),
                       broadcast_to(b, b.compare(i, b.constant(double(guarded), DType::I64), Cmp::LT), s));
    Value pb = b.select(front, k(0), broadcast_to(b, keep_dims(b, p, s, {r - 1}), s));
    Value at = b.compare(pos, pb, Cmp::EQ);
    Value moved = land(b, b.compare(pos, pb, Cmp::GT), b.compare(pos, ib, Cmp::LE));
    a = b.select(at, val, b.select(moved, shift_right(a), a));
    ix = b.select(at, vix, b.select(moved, shift_right(ix), ix));
    return std::vector<Value>{a, ix, add(b, i, b.constant(1, DType::I64))};
  });
  return {st[0], st[1]};
}

static Value b_any(Builder& b, const Value& flags) {
  Value m = b.reduce(b.convert(flags, DType::I32), b.constant(0, DType::I32), {0}, "stablehlo.maximum");
  return b.compare(m, b.constant(0, DType::I32), Cmp::GT);
}

// libstdc++'s introsort loop on `value <` (rows in lockstep, one step per iteration):
// ranges over 16 elements get a median-of-three pivot moved to their front and an
// unguarded partition; the right part is stacked, the left one continues. Phases: 0
// take a range, 1 scan lo up, 2 scan hi down, 3 swap or split, 4 done. Its heapsort
// fallback (recursion depth 2 log2 n exhausted) is not replayed: `bad` flags it.
static std::vector<Value> introsort(Builder& outer, const Value& x) {
  int64_t rows = x.shape()[0], n = x.shape()[1];
  int64_t depth = 0;
  for (int64_t m = n; m > 1; m >>= 1) ++depth;
  depth *= 2;
  int64_t slots = depth + 2;
  Shape rs{rows}, ss{rows, slots};
  auto I = [&](double v) { return outer.constant(v, DType::I64, rs); };
  std::vector<Value> init = {x, outer.iota(Type{DType::I64, x.shape()}, 1), I(0), I(double(n)), I(double(depth)),
                             I(0), I(0), outer.constant(0, DType::I64, ss), outer.constant(0, DType::I64, ss),
                             outer.constant(0, DType::I64, ss), I(0), outer.constant(0, DType::I32, rs),
                             outer.constant(0, DType::Bool, rs)};
  auto st = outer.while_loop(init, [](Builder& b, const std::vector<Value>& v) {
    Value live = b.convert(b.compare(v[11], b.constant(4, DType::I32, v[11].shape()), Cmp::NE), DType::I32);
    return std::vector<Value>{b.compare(b.reduce(live, b.constant(0, DType::I32), {0}, "stablehlo.maximum"),
                                        b.constant(0, DType::I32), Cmp::GT)};
  }, [rows, n, slots](Builder& b, const std::vector<Value>& v) {
    QuickSelect q(b, rows, n), stk(b, rows, slots);
    Value a = v[0], ix = v[1], F = v[2], La = v[3], D = v[4], lo = v[5], hi = v[6];
    Value sF = v[7], sL = v[8], sD = v[9], sp = v[10], ph = v[11], bad = v[12];
    auto P = [&](int p) { return b.compare(ph, b.constant(p, DType::I32, ph.shape()), Cmp::EQ); };
    Value p0 = P(0), p1 = P(1), p2 = P(2), p3 = P(3);
    auto ph_to = [&](const Value& on, int p) { ph = b.select(on, b.constant(p, DType::I32, ph.shape()), ph); };
    auto sel = [&](const Value& c, const Value& x, const Value& y) { return b.select(c, x, y); };
    auto lt = [&](const Value& x, const Value& y) { return b.compare(x, y, Cmp::LT); };
    Value one = q.I(1);
    // Phase 0: small range: pop the next (or finish); else pick the pivot.
    Value big = b.compare(sub(b, La, F), q.I(16), Cmp::GT);
    Value empty = b.compare(sp, q.I(0), Cmp::EQ);
    Value pop = land(b, p0, land(b, lnot(b, big), lnot(b, empty)));
    ph_to(land(b, p0, land(b, lnot(b, big), empty)), 4);
    Value top = sub(b, sp, one);
    F = sel(pop, stk.get(sF, top), F);
    La = sel(pop, stk.get(sL, top), La);
    D = sel(pop, stk.get(sD, top), D);
    sp = sel(pop, top, sp);
    Value out_of_depth = land(b, p0, land(b, big, b.compare(D, q.I(0), Cmp::EQ)));
    bad = lor(b, bad, out_of_depth);
    ph_to(out_of_depth, 4);
    Value go = land(b, p0, land(b, big, b.compare(D, q.I(0), Cmp::GT)));
    D = sel(go, sub(b, D, one), D);
    Value F1 = add(b, F, one), mid = add(b, F, b.binary("stablehlo.divide", sub(b, La, F), q.I(2)));
    Value last1 = sub(b, La, one);
    std::vector<Value> at = {F, F1, mid, last1};
    Value ga = q.get(a, at), gi = q.get(ix, at);
    Value vr = q.part(b, ga, 0), va = q.part(b, ga, 1), vb = q.part(b, ga, 2), vc = q.part(b, ga, 3);
    Value ir = q.part(b, gi, 0);
    // __move_median_to_first(result, a, b, c): which of a, b, c trades places with result.
    Value ab = lt(va, vb), bc = lt(vb, vc), ac = lt(va, vc);
    Value pick = sel(ab, sel(bc, mid, sel(ac, last1, F1)), sel(ac, F1, sel(bc, last1, mid)));
    Value pv = q.get(a, pick), pi = q.get(ix, pick);
    a = q.put(q.put(a, pick, vr, go), F, pv, go);
    ix = q.put(q.put(ix, pick, ir, go), F, pi, go);
    lo = sel(go, F1, lo);
    hi = sel(go, La, hi);
    ph_to(go, 1);
    // Phase 1: while a[lo] < pivot (at F): lo++.
    Value piv = q.get(a, F);
    Value up = lt(q.get(a, lo), piv);
    lo = sel(land(b, p1, up), add(b, lo, one), lo);
    ph_to(land(b, p1, lnot(b, up)), 2);
    // Phase 2: do hi-- while pivot < a[hi].
    Value hn = sub(b, hi, one);
    hi = sel(p2, hn, hi);
    ph_to(land(b, p2, lnot(b, lt(piv, q.get(a, hn)))), 3);
    // Phase 3: lo < hi: swap them, lo++, scan on; else cut at lo: stack [lo, last).
    Value cross = lnot(b, lt(lo, hi));
    Value sw = land(b, p3, lnot(b, cross)), cut = land(b, p3, cross);
    std::vector<Value> pq = {lo, hi};
    Value sa = q.get(a, pq), si = q.get(ix, pq);
    a = q.put(q.put(a, lo, q.part(b, sa, 1), sw), hi, q.part(b, sa, 0), sw);
    ix = q.put(q.put(ix, lo, q.part(b, si, 1), sw), hi, q.part(b, si, 0), sw);
    sF = stk.put(sF, sp, lo, cut);
    sL = stk.put(sL, sp, La, cut);
    sD = stk.put(sD, sp, D, cut);
    sp = sel(cut, add(b, sp, one), sp);
    La = sel(cut, lo, La);
    lo = sel(sw, add(b, lo, one), lo);
    ph_to(sw, 1);
    ph_to(cut, 0);
    return std::vector<Value>{a, ix, F, La, D, lo, hi, sF, sL, sD, sp, ph, bad};
  });
  Value any_bad = b_any(outer, st[12]);
  return {st[0], st[1], any_bad};
}

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
  Value a = y, ix = b.iota(Type{DType::I64, s}, r - 1);
  if (n > 16) {
    auto is = introsort(b, b.reshape(y, {y.type.numel() / n, n}));
    ctx.check(lnot(b, is[2]), "RuntimeError: mode: input order hits std::sort's heapsort fallback, not replayed natively");
    a = b.reshape(is[0], s);
    ix = b.reshape(is[1], s);
  }
  std::tie(a, ix) = insertion_sort(b, a, ix, 16);
  // Run ends: the last element, or a value != its successor.
  Shape lo(r, 0), one(r, 1);
  lo[r - 1] = 1;
  Shape pad_hi(r, 0);
  pad_hi[r - 1] = 1;
  Value next = b.pad(b.slice(a, lo, s, one), b.constant(0, a.dtype()), Shape(r, 0), pad_hi, Shape(r, 0));
  Value pos = b.iota(Type{DType::I64, s}, r - 1);
  Value is_last = b.compare(pos, b.constant(double(n - 1), DType::I64, s), Cmp::EQ);
  Value end = lor(b, is_last, b.compare(a, next, Cmp::NE));
  // Run length at an end: its position minus the previous end's.
  Shape s2 = s;
  s2.push_back(n);
  std::vector<int64_t> as_j, as_l;
  for (int64_t d = 0; d < r; ++d) as_j.push_back(d);
  for (int64_t d = 0; d < r - 1; ++d) as_l.push_back(d);
  as_l.push_back(r);
  Value jj = b.iota(Type{DType::I64, s2}, r - 1), ll = b.iota(Type{DType::I64, s2}, r);
  Value earlier_end = land(b, b.broadcast_in_dim(end, s2, as_l), b.compare(ll, jj, Cmp::LT));
  Value prev = reduce_max(b, b.select(earlier_end, ll, b.constant(-1, DType::I64, s2)), {r});
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
