// Data-parallel replays of CPU's quickselect (kthvalue) and libstdc++'s std::sort
// (mode). Both partition a range around a pivot with two scans: one moves up past
// elements that sort before the pivot and stops at the others ("low stops"), one moves
// down past elements that sort after it ("high stops"). Their m-th stops meet in the
// m-th swap, for as long as the m-th low stop lies before the m-th high stop; the
// scans then cross at a place these counts give too. So one partition is a few prefix
// counts, a compaction of the stop positions (scatter) and one permutation (gather),
// whatever the values (NaN and ties included): the result is CPU's arrangement.
#include "lowering/sort_replay.h"

#include <algorithm>

#include "lowering/scan.h"
#include "lowering/search_util.h"

namespace tpu::lowering::replay {

using ir::Cmp;
using namespace search;

namespace {

constexpr DType kPos = DType::I32;  // positions and counts (rows * n < 2^31)

Value pos_const(Builder& b, double v, const Shape& s = {}) { return b.constant(v, kPos, s); }

// Elements of 1-D x at int32 positions pos (any shape), clamped into range.
Value take(Builder& b, const Value& x, const Value& pos) {
  int64_t m = x.shape()[0];
  Value p = b.clamp(pos_const(b, 0, pos.shape()), pos, pos_const(b, double(m - 1), pos.shape()));
  Shape s1 = pos.shape();
  s1.push_back(1);
  return b.gather(x, b.reshape(p, s1), {}, {0}, {0}, pos.rank(), {1}, pos.shape());
}

// 1-D x with v written at positions pos (same 1-D shape as v); `min` keeps the least
// of colliding writes, else one of them wins (callers send only don't-care writes to a
// shared position).
Value put(Builder& b, const Value& x, const Value& pos, const Value& v, bool min = false) {
  int64_t k = pos.shape()[0];
  return b.scatter(x, b.reshape(pos, {k, 1}), v, {}, {0}, {0}, 1,
                   [min](Builder& r, const std::vector<Value>& a) {
                     return std::vector<Value>{min ? r.binary("stablehlo.minimum", a[0], a[1]) : a[1]};
                   });
}

// Inclusive counts of two flags along the last dim in one scan (packed in an int64).
std::pair<Value, Value> count_two(Builder& b, const Value& f1, const Value& f2) {
  const Shape& s = f1.shape();
  Value packed = add(b, b.convert(f1, DType::I64),
                     b.binary("stablehlo.shift_left", b.convert(f2, DType::I64), b.constant(32, DType::I64, s)));
  packed = inclusive_scan(b, packed, "stablehlo.add", packed.rank() - 1);
  Value low = b.binary("stablehlo.and", packed, b.constant(4294967295.0, DType::I64, s));
  Value high = b.binary("stablehlo.shift_right_logical", packed, b.constant(32, DType::I64, s));
  return {b.convert(low, kPos), b.convert(high, kPos)};
}

Value as_pos(Builder& b, const Value& flag) { return b.convert(flag, kPos); }
Value sel(Builder& b, const Value& c, const Value& x, const Value& y) { return b.select(c, x, y); }
Value any_of(Builder& b, const Value& flags) {
  std::vector<int64_t> all;
  for (int64_t d = 0; d < flags.rank(); ++d) all.push_back(d);
  return b.reduce(flags, b.constant(0, DType::Bool), all, "stablehlo.or");
}

// ---- std::sort ----

// One level of libstdc++'s __introsort_loop over every range at once. Each position
// carries its range [F, La) and the range's depth budget D (flat positions: a row's
// ranges stay inside it). A range of more than 16 with budget left moves the median of
// a[F+1], a[mid], a[La-1] to F (__move_median_to_first) and partitions [F+1, La)
// around it (__unguarded_partition): low stops are !(a < p), high stops !(p < a),
// pairs swap while low < high strictly, and the cut (the left range's end) is the
// first unpaired low stop or the last swapped high stop, whichever comes first.
std::vector<Value> introsort_level(Builder& b, const std::vector<Value>& v, int64_t N) {
  Value a = v[0], ix = v[1], F = v[2], La = v[3], D = v[4];
  Shape s{N};
  auto C = [&](double x) { return pos_const(b, x, s); };
  auto lt = [&](const Value& x, const Value& y) { return b.compare(x, y, Cmp::LT); };
  Value col = b.iota(Type{kPos, s}, 0);
  Value size = sub(b, La, F);
  Value act = land(b, b.compare(size, C(16), Cmp::GT), b.compare(D, C(0), Cmp::GT));
  // __move_median_to_first(F, F+1, mid, La-1): which of the three trades with F.
  Value F1 = add(b, F, C(1)), mid = add(b, F, b.binary("stablehlo.divide", size, C(2))), last1 = sub(b, La, C(1));
  Value va = take(b, a, F1), vb = take(b, a, mid), vc = take(b, a, last1);
  Value ab = lt(va, vb), bc = lt(vb, vc), ac = lt(va, vc);
  Value pick = sel(b, ab, sel(b, bc, mid, sel(b, ac, last1, F1)), sel(b, ac, F1, sel(b, bc, last1, mid)));
  Value p = sel(b, ab, sel(b, bc, vb, sel(b, ac, vc, va)), sel(b, ac, va, sel(b, bc, vc, vb)));
  Value at_F = land(b, act, b.compare(col, F, Cmp::EQ)), at_pick = land(b, act, b.compare(col, pick, Cmp::EQ));
  Value swap1 = sel(b, at_F, pick, sel(b, at_pick, F, col));
  Value a1 = take(b, a, swap1);
  // Stops of the partition of [F+1, La) around p (now at F).
  Value inner = land(b, act, land(b, b.compare(col, F, Cmp::GT), b.compare(col, La, Cmp::LT)));
  Value lo = land(b, inner, lnot(b, lt(a1, p))), hi = land(b, inner, lnot(b, lt(p, a1)));
  auto [lo_count, hi_count] = count_two(b, lo, hi);
  // Ranks within the range: low stops from the left, high stops from the right.
  Value lo_rank = sub(b, lo_count, take(b, lo_count, F));
  Value hi_rank = add(b, sub(b, take(b, hi_count, last1), hi_count), as_pos(b, hi));
  Value lo_swaps = land(b, lo, b.compare(sub(b, hi_rank, as_pos(b, hi)), lo_rank, Cmp::GE));
  Value hi_swaps = land(b, hi, b.compare(sub(b, lo_rank, as_pos(b, lo)), hi_rank, Cmp::GE));
  // The cut, gathered per range at slot F.
  Value cand = lor(b, land(b, lo, lnot(b, lo_swaps)), hi_swaps);
  Value cut_at = put(b, pos_const(b, double(N + 1), {N + 1}), sel(b, cand, F, C(double(N))), col, true);
  Value cut = take(b, cut_at, F);
  // Swap partners: the m-th low stop and the m-th high stop, compacted by rank.
  Value lo_slot = sub(b, add(b, F, lo_rank), C(1)), hi_slot = sub(b, add(b, F, hi_rank), C(1));
  Value slot = sel(b, lo_swaps, lo_slot, sel(b, hi_swaps, add(b, hi_slot, C(double(N))), C(double(2 * N))));
  Value stops = put(b, pos_const(b, 0, {2 * N + 1}), slot, col);
  Value partner = sel(b, lo_swaps, take(b, stops, add(b, lo_slot, C(double(N)))),
                      sel(b, hi_swaps, take(b, stops, hi_slot), col));
  Value from = take(b, swap1, partner);
  a = take(b, a, from);
  ix = take(b, ix, from);
  Value left = b.compare(col, cut, Cmp::LT);
  F = sel(b, land(b, act, lnot(b, left)), cut, F);
  La = sel(b, land(b, act, left), cut, La);
  D = sel(b, act, sub(b, D, C(1)), D);
  return {a, ix, F, La, D};
}

// std::__partial_sort(first, last, last) (heapsort: __make_heap, then __sort_heap) of
// every range the introsort loop left over 16 with no depth budget, one after another,
// one step of __adjust_heap / __push_heap per iteration. Only adversarial orders
// (median-of-three killers) get here.
namespace heap {

// Scalar state of the heapsort steps (all int32 but the value being sifted).
struct State {
  Value f, m, stage, c, phase, hole, top, second, len, done;  // stage: 0 make, 1 sort;
  Value val, vix;  // phase: 0 start an adjust, 1 sift down, 2 push up
};

Value S(Builder& b, double v) { return pos_const(b, v); }
Value half(Builder& b, const Value& x) { return b.binary("stablehlo.divide", x, S(b, 2)); }
Value rd(Builder& b, const Value& x, const Value& at) { return b.reshape(b.dynamic_slice(x, {at}, {1}), {}); }

// The two positions a step reads: phase 0 a[f+c] (the value to sift) and a[f] (the top
// a pop moves there); phase 1 the children a[f+s2] and a[f+s2-1]; phase 2 the parent.
std::pair<Value, Value> reads(Builder& b, const State& t) {
  Value s2 = b.binary("stablehlo.multiply", add(b, t.second, S(b, 1)), S(b, 2));
  Value p0 = b.compare(t.phase, S(b, 0), Cmp::EQ), p1 = b.compare(t.phase, S(b, 1), Cmp::EQ);
  Value q1 = add(b, t.f, sel(b, p0, t.c, sel(b, p1, s2, half(b, sub(b, t.hole, S(b, 1))))));
  Value q2 = sel(b, p0, t.f, sub(b, add(b, t.f, s2), S(b, 1)));
  return {q1, q2};
}

}  // namespace heap

std::pair<Value, Value> heapsort_ranges(Builder& outer, const Value& a, const Value& ix, const Value& F,
                                        const Value& La, const Value& D, int64_t N) {
  using namespace heap;
  Shape s{N};
  Value col = outer.iota(Type{kPos, s}, 0);
  Value is_heap = land(outer, outer.compare(sub(outer, La, F), pos_const(outer, 16, s), Cmp::GT),
                       outer.compare(D, pos_const(outer, 0, s), Cmp::EQ));
  Value start = sel(outer, land(outer, is_heap, outer.compare(col, F, Cmp::EQ)), col, pos_const(outer, double(N), s));
  // The first heap range starting at or after each position.
  Value next = outer.reverse(inclusive_scan(outer, outer.reverse(start, {0}), "stablehlo.minimum", 0), {0});
  State t0;
  Value zero = S(outer, 0);
  t0.f = rd(outer, next, zero);
  t0.m = sub(outer, rd(outer, La, t0.f), t0.f);
  t0.stage = t0.phase = t0.hole = t0.top = t0.second = t0.len = zero;
  t0.c = half(outer, sub(outer, t0.m, S(outer, 2)));
  t0.done = outer.convert(outer.compare(t0.f, S(outer, double(N)), Cmp::GE), kPos);
  t0.val = outer.constant(0, a.dtype());
  t0.vix = outer.constant(0, DType::I64);
  // Each step's two reads come from the step before, after its write: the arrays then
  // have no reader besides the write, which XLA does in place (reads next to it made
  // it copy both arrays every step).
  auto [q1, q2] = reads(outer, t0);
  std::vector<Value> init = {a, ix, next, La, t0.f, t0.m, t0.stage, t0.c, t0.phase, t0.hole, t0.top, t0.second,
                             t0.len, t0.done, t0.val, t0.vix, rd(outer, a, q1), rd(outer, ix, q1), rd(outer, a, q2),
                             rd(outer, ix, q2)};
  auto st = outer.while_loop(init, [](Builder& b, const std::vector<Value>& v) {
    return std::vector<Value>{b.compare(v[13], S(b, 0), Cmp::EQ)};
  }, [N](Builder& b, const std::vector<Value>& v) {
    Value arr = v[0], arx = v[1], next = v[2], La = v[3];
    State t{v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13], v[14], v[15]};
    Value r1 = v[16], r1i = v[17], r2 = v[18], r2i = v[19];
    auto eq = [&](const Value& x, double y) { return b.compare(x, S(b, y), Cmp::EQ); };
    auto [q1, q2] = reads(b, t);
    Value p0 = eq(t.phase, 0), p1 = eq(t.phase, 1), p2 = eq(t.phase, 2), make = eq(t.stage, 0);
    Value s2 = b.binary("stablehlo.multiply", add(b, t.second, S(b, 1)), S(b, 2));
    Value down = land(b, p1, b.compare(t.second, half(b, sub(b, t.len, S(b, 1))), Cmp::LT));
    Value even = eq(b.binary("stablehlo.remainder", t.len, S(b, 2)), 0);
    Value tail = land(b, land(b, p1, lnot(b, down)),
                      land(b, even, b.compare(t.second, half(b, sub(b, t.len, S(b, 2))), Cmp::EQ)));
    Value parent = half(b, sub(b, t.hole, S(b, 1)));
    // Phase 0: take the value to sift; __pop_heap first moves the top to f+c.
    Value sort_start = land(b, p0, lnot(b, make));
    // Phase 1: the larger child (the right one unless it is below the left) moves up.
    Value left_child = b.compare(r1, r2, Cmp::LT);
    Value child = sel(b, left_child, sub(b, s2, S(b, 1)), s2);
    Value cv = sel(b, left_child, r2, r1), cvi = sel(b, left_child, r2i, r1i);
    // Phase 2: the parent moves down while it is below the value.
    Value up = land(b, p2, land(b, b.compare(t.hole, t.top, Cmp::GT), b.compare(r1, t.val, Cmp::LT)));
    Value settle = land(b, p2, lnot(b, up));
    // The one write (a no-op rewrite of a[q1] when none is due).
    Value w = sel(b, sort_start, q1, sel(b, lor(b, down, lor(b, tail, p2)), add(b, t.f, t.hole), q1));
    Value wv = sel(b, sort_start, r2, sel(b, down, cv, sel(b, tail, r2, sel(b, up, r1, sel(b, settle, t.val, r1)))));
    Value wi = sel(b, sort_start, r2i,
                   sel(b, down, cvi, sel(b, tail, r2i, sel(b, up, r1i, sel(b, settle, t.vix, r1i)))));
    arr = b.dynamic_update_slice(arr, b.reshape(wv, {1}), {w});
    arx = b.dynamic_update_slice(arx, b.reshape(wi, {1}), {w});
    // State after phase 0.
    State u = t;
    u.val = sel(b, p0, r1, t.val);
    u.vix = sel(b, p0, r1i, t.vix);
    Value start_hole = sel(b, make, t.c, S(b, 0));
    u.top = sel(b, p0, start_hole, t.top);
    u.second = sel(b, p0, start_hole, sel(b, down, child, sel(b, tail, s2, t.second)));
    u.len = sel(b, p0, sel(b, make, t.m, t.c), t.len);
    u.hole = sel(b, p0, start_hole, sel(b, down, child, sel(b, tail, sub(b, s2, S(b, 1)), sel(b, up, parent, t.hole))));
    // The adjust ends at settle: next parent (make) or next pop (sort); a range ends
    // after its pop at 1, and the next range starts.
    Value make_next = land(b, settle, make), sort_next = land(b, settle, lnot(b, make));
    Value to_sort = land(b, make_next, eq(t.c, 0));
    Value c_next = sel(b, to_sort, sub(b, t.m, S(b, 1)), sub(b, t.c, S(b, 1)));
    Value range_done = land(b, sort_next, b.compare(t.c, S(b, 1), Cmp::LE));
    u.c = sel(b, settle, c_next, t.c);
    u.stage = sel(b, to_sort, S(b, 1), t.stage);
    Value end = add(b, t.f, t.m);
    Value nf = sel(b, b.compare(end, S(b, double(N)), Cmp::GE), S(b, double(N)), rd(b, next, end));
    Value finished = land(b, range_done, b.compare(nf, S(b, double(N)), Cmp::GE));
    Value moved_on = land(b, range_done, lnot(b, finished));
    Value nm = sub(b, rd(b, La, nf), nf);
    u.f = sel(b, moved_on, nf, t.f);
    u.m = sel(b, moved_on, nm, t.m);
    u.stage = sel(b, moved_on, S(b, 0), u.stage);
    u.c = sel(b, moved_on, half(b, sub(b, nm, S(b, 2))), u.c);
    u.done = sel(b, finished, S(b, 1), t.done);
    u.phase = sel(b, p0, S(b, 1),
                  sel(b, lor(b, tail, land(b, p1, lnot(b, down))), S(b, 2), sel(b, settle, S(b, 0), t.phase)));
    auto [n1, n2] = reads(b, u);
    return std::vector<Value>{arr, arx, next, La, u.f, u.m, u.stage, u.c, u.phase, u.hole, u.top, u.second,
                              u.len, u.done, u.val, u.vix, rd(b, arr, n1), rd(b, arx, n1), rd(b, arr, n2),
                              rd(b, arx, n2)};
  });
  return {st[0], st[1]};
}

// __insertion_sort on the last dim of (a, ix), one insertion per iteration: for the
// first `guarded` positions an element below the front one goes straight to the front
// (past NaN too); otherwise it moves left while it is below its neighbour.
std::pair<Value, Value> guarded_insertion_sort(Builder& outer, const Value& a0, const Value& ix0) {
  const Shape s = a0.shape();
  int64_t r = a0.rank(), n = s.back();
  auto st = outer.while_loop({a0, ix0, outer.constant(1, DType::I64)},
                             [n](Builder& b, const std::vector<Value>& v) {
    return std::vector<Value>{b.compare(v[2], b.constant(double(n), DType::I64), Cmp::LT)};
  }, [s, r](Builder& b, const std::vector<Value>& v) {
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
    Value front = col(lt, b.constant(0, DType::I64));
    Value pb = b.select(front, k(0), broadcast_to(b, keep_dims(b, p, s, {r - 1}), s));
    Value at = b.compare(pos, pb, Cmp::EQ);
    Value moved = land(b, b.compare(pos, pb, Cmp::GT), b.compare(pos, ib, Cmp::LE));
    a = b.select(at, val, b.select(moved, shift_right(a), a));
    ix = b.select(at, vix, b.select(moved, shift_right(ix), ix));
    return std::vector<Value>{a, ix, add(b, i, b.constant(1, DType::I64))};
  });
  return {st[0], st[1]};
}


// ---- quickselect ----

// Rows of width W in lockstep: per-row values are [rows], per-element [rows, W].
struct Rows {
  Builder& b;
  int64_t rows, W;
  Shape rs, s;
  Value col, base;  // column of each element; row * W of each element
  Rows(Builder& bb, int64_t r, int64_t w) : b(bb), rows(r), W(w), rs{r}, s{r, w} {
    col = b.iota(Type{kPos, s}, 1);
    base = b.binary("stablehlo.multiply", b.iota(Type{kPos, s}, 0), pos_const(b, double(W), s));
  }
  Value P(double v) const { return pos_const(b, v, rs); }
  Value E(const Value& per_row) const { return b.broadcast_in_dim(per_row, s, {0}); }
  Value flat(const Value& x) const { return b.reshape(x, {rows * W}); }
  // Row r's entry at column c[r].
  Value at(const Value& x, const Value& c) const {
    Value cc = b.clamp(P(0), c, P(double(W - 1)));
    Value row = b.binary("stablehlo.multiply", b.iota(Type{kPos, rs}, 0), P(double(W)));
    return take(b, flat(x), add(b, row, cc));
  }
  // x permuted within rows: element (r, c) takes (r, from[r, c]).
  Value permute(const Value& x, const Value& from) const {
    return b.reshape(take(b, flat(x), add(b, base, from)), s);
  }
  Value reduce(const Value& x, const char* op, double init) const {
    return b.reduce(x, b.constant(init, x.dtype()), {1}, op);
  }
  Value where_col(const Value& mask, double other) const { return sel(b, mask, col, pos_const(b, other, s)); }
};

// x sorts after y in kthvalue's order: greater, or NaN against a number.
Value after(Builder& b, const Value& x, const Value& y) {
  Value r = b.compare(x, y, Cmp::GT);
  if (!is_float(x.dtype())) return r;
  return lor(b, r, land(b, is_nan(b, x), lnot(b, is_nan(b, y))));
}

// Equal in kthvalue's order (NaN equals NaN).
Value same(Builder& b, const Value& x, const Value& y) {
  Value r = b.compare(x, y, Cmp::EQ);
  if (!is_float(x.dtype())) return r;
  return lor(b, r, land(b, is_nan(b, x), is_nan(b, y)));
}

// Rows settled before their next round: where k has left the live range [L, R] (the
// last pivot stopped at k), position k is final (state 1); where [L, R] holds the k-th
// value once only, that element ends at k whatever the remaining rounds do, as they
// stay inside [L, R] (state 2, `at` its position).
void settle(const Rows& q, const Value& a, const Value& L, const Value& R, const Value& K, const Value& kv,
            Value& state, Value& at) {
  Builder& b = q.b;
  Value live = b.compare(state, q.P(0), Cmp::EQ);
  Value has_k = land(b, b.compare(K, L, Cmp::GE), b.compare(K, R, Cmp::LE));
  Value in = land(b, b.compare(q.col, q.E(L), Cmp::GE), b.compare(q.col, q.E(R), Cmp::LE));
  Value hit = land(b, in, same(b, a, q.E(kv)));
  Value once = b.compare(q.reduce(as_pos(b, hit), "stablehlo.add", 0), q.P(1), Cmp::EQ);
  Value found = land(b, live, land(b, has_k, once));
  at = sel(b, found, q.reduce(q.where_col(hit, -1), "stablehlo.maximum", -1), at);
  state = sel(b, found, q.P(2), sel(b, land(b, live, lnot(b, has_k)), q.P(1), state));
}

// One round of quick_select_template on every live row (state 0): the median of
// a[L], a[L+1], a[mid], a[R] rule (after swapping mid to L+1), then i scans up from
// L+1 past elements the pivot sorts after and j down from R past elements that sort
// after it, swapping while j >= i (a meeting at one element swaps it with itself and
// goes on), the pivot swapped to j, and [L, R] narrowed to k's side. State 1: the
// answer is at k; 2: at `at`.
std::vector<Value> quickselect_round(Builder& b, const std::vector<Value>& v, int64_t rows, int64_t W) {
  Rows q(b, rows, W);
  Value a = v[0], ix = v[1], L = v[2], R = v[3], state = v[4], at = v[5], kv = v[6], K = v[7];
  settle(q, a, L, R, K, kv, state, at);
  Value live = b.compare(state, q.P(0), Cmp::EQ);
  Value one = land(b, live, b.compare(R, L, Cmp::LE));
  Value two = land(b, live, b.compare(R, add(b, L, q.P(1)), Cmp::EQ));
  Value gen = land(b, live, b.compare(R, add(b, L, q.P(2)), Cmp::GE));
  state = sel(b, lor(b, one, two), q.P(1), state);
  Value L1 = add(b, L, q.P(1)), mid = add(b, L, b.binary("stablehlo.divide", sub(b, R, L), q.P(2)));
  Value aL = q.at(a, L), a1 = q.at(a, L1), am = q.at(a, mid), aR = q.at(a, R);
  Value iL = q.at(ix, L), i1 = q.at(ix, L1), im = q.at(ix, mid), iR = q.at(ix, R);
  // Two elements: ordered by one swap.
  Value c2 = land(b, two, after(b, aL, aR));
  // More: swap(mid, L+1), then order (L+1, R), (L, R), (L+1, L).
  Value s1 = after(b, am, aR);
  Value v1 = sel(b, s1, aR, am), w1 = sel(b, s1, iR, im), vR = sel(b, s1, am, aR), wR = sel(b, s1, im, iR);
  Value s2 = after(b, aL, vR);
  Value vL = sel(b, s2, vR, aL), wL = sel(b, s2, wR, iL);
  vR = sel(b, s2, aL, vR);
  wR = sel(b, s2, iL, wR);
  Value s3 = after(b, v1, vL);
  Value t = v1, tw = w1;
  v1 = sel(b, s3, vL, v1);
  w1 = sel(b, s3, wL, w1);
  vL = sel(b, s3, t, vL);
  wL = sel(b, s3, tw, wL);
  // Written back; mid may be L+1, which then wins.
  Value Gg = q.E(gen), Gc = q.E(lor(b, gen, c2));
  auto is = [&](const Value& c) { return b.compare(q.col, q.E(c), Cmp::EQ); };
  Value atR = land(b, Gc, is(R)), atL = land(b, Gc, is(L)), at1 = land(b, Gg, is(L1)), atm = land(b, Gg, is(mid));
  auto write = [&](const Value& x, const Value& r, const Value& l, const Value& x1, const Value& xm,
                   const Value& r2, const Value& l2) {
    return sel(b, atR, q.E(sel(b, gen, r, r2)),
               sel(b, atL, q.E(sel(b, gen, l, l2)), sel(b, at1, q.E(x1), sel(b, atm, q.E(xm), x))));
  };
  a = write(a, vR, vL, v1, a1, aL, aR);
  ix = write(ix, wR, wL, w1, i1, iL, iR);
  // The partition's stops and their pairing.
  Value piv = q.E(vL), G = q.E(gen);
  Value lo = land(b, G, land(b, b.compare(q.col, q.E(add(b, L, q.P(2))), Cmp::GE), b.compare(q.col, q.E(R), Cmp::LE)));
  lo = land(b, lo, lnot(b, after(b, piv, a)));
  Value hi = land(b, G, land(b, b.compare(q.col, q.E(L1), Cmp::GE), b.compare(q.col, q.E(sub(b, R, q.P(1))), Cmp::LE)));
  hi = land(b, hi, lnot(b, after(b, a, piv)));
  auto [lo_rank, hi_count] = count_two(b, lo, hi);
  Value hi_total = b.reshape(b.slice(hi_count, {0, W - 1}, {rows, W}, {1, 1}), {rows});
  Value hi_rank = add(b, sub(b, q.E(hi_total), hi_count), as_pos(b, hi));
  Value lo_swaps = land(b, lo, b.compare(hi_rank, lo_rank, Cmp::GE));
  Value hi_swaps = land(b, hi, b.compare(lo_rank, hi_rank, Cmp::GE));
  double big = double(W + 1);
  Value last_lo = q.reduce(q.where_col(lo_swaps, -1), "stablehlo.maximum", -1);
  Value last_hi = q.reduce(q.where_col(hi_swaps, big), "stablehlo.minimum", big);
  Value next_lo = q.reduce(q.where_col(land(b, lo, lnot(b, lo_swaps)), big), "stablehlo.minimum", big);
  Value next_hi = q.reduce(q.where_col(land(b, hi, lnot(b, hi_swaps)), -1), "stablehlo.maximum", -1);
  Value met = b.reduce(land(b, lo_swaps, hi_swaps), b.constant(0, DType::Bool), {1}, "stablehlo.or");
  // Where the scans cross: i and j.
  Value i = sel(b, met, add(b, last_lo, q.P(1)), b.binary("stablehlo.minimum", next_lo, last_hi));
  Value j = sel(b, met, sub(b, last_lo, q.P(1)), b.binary("stablehlo.maximum", next_hi, last_lo));
  int64_t M = rows * W;
  Value flat_slot = sel(b, lo_swaps, sub(b, add(b, q.base, lo_rank), q.E(q.P(1))),
                        sel(b, hi_swaps, add(b, add(b, q.base, hi_rank), pos_const(b, double(M - 1), q.s)),
                            pos_const(b, double(2 * M), q.s)));
  Value stops = put(b, pos_const(b, 0, {2 * M + 1}), q.flat(flat_slot), q.flat(q.col));
  Value lo_partner = take(b, stops, add(b, add(b, q.base, lo_rank), pos_const(b, double(M - 1), q.s)));
  Value hi_partner = take(b, stops, sub(b, add(b, q.base, hi_rank), pos_const(b, 1, q.s)));
  // (An element where the scans met is both stops, its own partner.)
  Value partner = sel(b, lo_swaps, lo_partner, sel(b, hi_swaps, hi_partner, q.col));
  partner = sel(b, land(b, lo_swaps, hi_swaps), q.col, partner);
  // Then swap(L, j).
  Value pj = q.at(partner, j);
  Value from = sel(b, G, sel(b, is(L), q.E(pj), sel(b, is(j), q.E(L), partner)), q.col);
  a = q.permute(a, from);
  ix = q.permute(ix, from);
  Value newL = sel(b, land(b, gen, b.compare(j, K, Cmp::LE)), i, L);
  R = sel(b, land(b, gen, b.compare(j, K, Cmp::GE)), sub(b, j, q.P(1)), R);
  return {a, ix, newL, R, state, at, kv, K};
}

}  // namespace

std::pair<Value, Value> quickselect_rows(Builder& b, const Value& x, int64_t k) {
  int64_t rows = x.shape()[0], n = x.shape()[1];
  // The k-th value, from a sort: rows where it occurs once need no replay.
  Value kv = b.reshape(b.slice(sort_nan_last(b, x, 1)[0], {0, k}, {rows, k + 1}, {1, 1}), {rows});
  // Rounds narrow [L, R]: once every live row's range fits a sixteenth of the row, the
  // rows continue on that window of themselves, whose passes are 16x shorter (one more
  // stage costs as much compile time as it saves run time on a 1e6-element row).
  std::vector<int64_t> widths = {n};
  if (n / 16 >= 1024) widths.push_back(n / 16);
  Rows q0(b, rows, n);
  Value a = x, ix = b.iota(Type{DType::I64, q0.s}, 1), L = q0.P(0), R = q0.P(double(n - 1)), K = q0.P(double(k));
  Value state = q0.P(0), at = q0.P(0);
  for (size_t st = 0; st < widths.size(); ++st) {
    int64_t W = widths[st], next = st + 1 < widths.size() ? widths[st + 1] : 0;
    Rows q(b, rows, W);
    settle(q, a, L, R, K, kv, state, at);
    auto r = b.while_loop({a, ix, L, R, state, at, kv, K}, [next](Builder& c, const std::vector<Value>& v) {
      Shape rs = v[4].shape();
      Value live = c.compare(v[4], pos_const(c, 0, rs), Cmp::EQ);
      if (next) live = land(c, live, c.compare(sub(c, v[3], v[2]), pos_const(c, double(next - 1), rs), Cmp::GT));
      return std::vector<Value>{any_of(c, live)};
    }, [rows, W](Builder& c, const std::vector<Value>& v) { return quickselect_round(c, v, rows, W); });
    a = r[0], ix = r[1], L = r[2], R = r[3], state = r[4], at = r[5];
    if (!next) break;
    // The window of `next` columns from each row's focus: its live range, or its answer.
    settle(q, a, L, R, K, kv, state, at);
    Value focus = sel(b, b.compare(state, q.P(0), Cmp::EQ), L, sel(b, b.compare(state, q.P(1), Cmp::EQ), K, at));
    Value off = b.clamp(q.P(0), focus, q.P(double(W - next)));
    Rows w(b, rows, next);
    Value from = add(b, add(b, w.col, w.E(off)),
                     b.binary("stablehlo.multiply", b.iota(Type{kPos, w.s}, 0), pos_const(b, double(W), w.s)));
    a = b.reshape(take(b, q.flat(a), from), w.s);
    ix = b.reshape(take(b, q.flat(ix), from), w.s);
    L = sub(b, L, off), R = sub(b, R, off), K = sub(b, K, off), at = sub(b, at, off);
  }
  int64_t W = a.shape()[1];
  Rows q(b, rows, W);
  Value pos = sel(b, b.compare(state, q.P(2), Cmp::EQ), at, K);
  return {q.at(a, pos), q.at(ix, pos)};
}

std::pair<Value, Value> std_sort_rows(Builder& b, const Value& x) {
  int64_t rows = x.shape()[0], n = x.shape()[1], N = rows * n;
  Shape rs{rows, n};
  Value a = x, ix = b.iota(Type{DType::I64, rs}, 1);
  if (n > 16) {
    int64_t depth = 0;
    for (int64_t m = n; m > 1; m >>= 1) ++depth;
    Shape s{N};
    Value col = b.iota(Type{kPos, s}, 0);
    Value F = b.binary("stablehlo.multiply", b.binary("stablehlo.divide", col, pos_const(b, double(n), s)),
                       pos_const(b, double(n), s));
    std::vector<Value> init = {b.reshape(a, s), b.reshape(ix, s), F, add(b, F, pos_const(b, double(n), s)),
                               pos_const(b, double(2 * depth), s)};
    auto lv = b.while_loop(init, [](Builder& q, const std::vector<Value>& v) {
      Shape s = v[2].shape();
      Value big = q.compare(sub(q, v[3], v[2]), pos_const(q, 16, s), Cmp::GT);
      return std::vector<Value>{any_of(q, land(q, big, q.compare(v[4], pos_const(q, 0, s), Cmp::GT)))};
    }, [N](Builder& q, const std::vector<Value>& v) { return introsort_level(q, v, N); });
    auto [ha, hi] = heapsort_ranges(b, lv[0], lv[1], lv[2], lv[3], lv[4], N);
    a = b.reshape(ha, rs);
    ix = b.reshape(hi, rs);
  }
  // __final_insertion_sort: the first 16 guarded, then unguarded insertions, which move
  // an element left only past larger numbers: NaN stays where it is and bounds them. As
  // the first pass leaves each NaN-free stretch sorted, the rest is a stable sort of
  // each stretch, keyed by the NaN count before it.
  int64_t m = std::min<int64_t>(n, 16);
  auto [ga, gi] = guarded_insertion_sort(b, b.slice(a, {0, 0}, {rows, m}, {1, 1}), b.slice(ix, {0, 0}, {rows, m}, {1, 1}));
  if (m == n) return {ga, gi};
  a = b.concatenate({ga, b.slice(a, {0, m}, {rows, n}, {1, 1})}, 1);
  ix = b.concatenate({gi, b.slice(ix, {0, m}, {rows, n}, {1, 1})}, 1);
  if (!is_float(a.dtype())) {
    auto r = b.sort({a, ix}, 1, true, [](Builder& q, const std::vector<Value>& v) {
      return std::vector<Value>{q.compare(v[0], v[1], Cmp::LT)};
    });
    return {r[0], r[1]};
  }
  Value nan = is_nan(b, a);
  Value stretch = sub(b, b.binary("stablehlo.multiply", inclusive_scan(b, as_pos(b, nan), "stablehlo.add", 1),
                                  pos_const(b, 2, rs)),
                      as_pos(b, nan));
  auto r = b.sort({stretch, a, ix}, 1, true, [](Builder& q, const std::vector<Value>& v) {
    Value before = q.compare(v[0], v[1], Cmp::LT), same = q.compare(v[0], v[1], Cmp::EQ);
    return std::vector<Value>{lor(q, before, land(q, same, q.compare(v[2], v[3], Cmp::LT)))};
  });
  return {r[1], r[2]};
}

}  // namespace tpu::lowering::replay
