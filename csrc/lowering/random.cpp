// Random sampling ops. Bits come from the op's generator (ctx.random_bits), so
// results follow torch.manual_seed; the distributions are built from them here.
// The in-place ops (uniform_, normal_, ...) return the new value of self.
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "lowering/elementwise.h"
#include "lowering/random_util.h"
#include "lowering/search_util.h"

namespace tpu::lowering {
using ir::Cmp;

using namespace ew;

int rnd::digits(DType t) {
  switch (t) {
    case DType::F64: return 53;
    case DType::F16: return 11;
    case DType::BF16: return 8;
    default: return 24;
  }
}
DType rnd::fine_type(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }
Value rnd::unit_floats(Builder& b, const Value& bits, DType t) {
  bool wide = t == DType::F64;
  DType ft = wide ? DType::F64 : DType::F32;
  const Shape& s = bits.shape();
  Value top = op2(b, "shift_right_logical", bits, b.constant((wide ? 64 : 32) - digits(t), bits.dtype(), s));
  return mul(b, b.convert(top, ft), b.constant(std::ldexp(1.0, -digits(t)), ft, s));
}
// 1 - u keeps the log's argument in (0, 1].
Value rnd::box_muller(Builder& b, const Value& u1, const Value& u2) {
  Value v1 = sub(b, cst(b, u1, 1), u1);
  Value r = op1(b, "sqrt", mul(b, cst(b, v1, -2), op1(b, "log", v1)));
  return mul(b, r, op1(b, "cosine", mul(b, cst(b, u2, 2 * M_PI), u2)));
}

// XLA's THREE_FRY bit generator (xla/hlo/builder/lib/prng.cc), written out: the key is
// state[0] and the counter of word k is state[1] + k, each split into (low, high) u32
// halves; Threefry-2x32 with 20 rounds maps (counter, key) to two u32 words. A u32 draw
// of 2m words takes words 0..m-1 from the first output of counters 0..m-1 and words
// m..2m-1 from their second; a u64 word k joins both outputs of counter k (low, high).
static std::pair<Value, Value> threefry2x32(Builder& b, Value x0, Value x1, const Value& k0, const Value& k1) {
  const Shape& s = x0.shape();
  auto u32 = [&](uint32_t v) { return b.constant(static_cast<double>(v), DType::U32, s); };
  auto add = [&](const Value& p, const Value& q) { return op2(b, "add", p, q); };
  auto rotl = [&](const Value& v, int r) {
    return op2(b, "or", op2(b, "shift_left", v, u32(r)), op2(b, "shift_right_logical", v, u32(32 - r)));
  };
  static const int kRotations[8] = {13, 15, 26, 6, 17, 29, 16, 24};
  const Value ks[3] = {k0, k1, op2(b, "xor", op2(b, "xor", u32(0x1BD11BDA), k0), k1)};
  x0 = add(x0, ks[0]);
  x1 = add(x1, ks[1]);
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 4; ++j) {
      x0 = add(x0, x1);
      x1 = op2(b, "xor", x0, rotl(x1, kRotations[(i % 2) * 4 + j]));
    }
    x0 = add(x0, ks[(i + 1) % 3]);
    x1 = add(add(x1, ks[(i + 2) % 3]), u32(static_cast<uint32_t>(i + 1)));
  }
  return {x0, x1};
}

std::pair<Value, Value> rnd::threefry_pair(Builder& b, const Value& state, const Shape& s, bool wide) {
  int64_t m = 1;
  for (int64_t d : s) m *= d;
  auto word = [&](const Value& v, int64_t i, const Shape& to) {  // u32 halves of state[i]
    Value x = b.reshape(b.slice(v, {i}, {i + 1}, {1}), {});
    Value lo = b.convert(x, DType::U32);
    Value hi = b.convert(op2(b, "shift_right_logical", x, b.constant(32, DType::U64)), DType::U32);
    return std::make_pair(b.broadcast_in_dim(lo, to, {}), b.broadcast_in_dim(hi, to, {}));
  };
  Shape flat{m};
  auto [k0, k1] = word(state, 0, flat);
  Value base = b.broadcast_in_dim(b.reshape(b.slice(state, {1}, {2}, {1}), {}), flat, {});
  Value index = b.iota(Type{DType::U64, flat}, 0);
  auto draw = [&](int64_t offset) {  // Threefry of counters base + offset + index
    Value c = op2(b, "add", base, offset ? op2(b, "add", index, b.constant(static_cast<double>(offset), DType::U64, flat)) : index);
    Value lo = b.convert(c, DType::U32);
    Value hi = b.convert(op2(b, "shift_right_logical", c, b.constant(32, DType::U64, flat)), DType::U32);
    return threefry2x32(b, lo, hi, k0, k1);
  };
  if (!wide) {
    auto [first, second] = draw(0);
    return {b.reshape(first, s), b.reshape(second, s)};
  }
  auto join = [&](const std::pair<Value, Value>& w) {
    Value hi = op2(b, "shift_left", b.convert(w.second, DType::U64), b.constant(32, DType::U64, flat));
    return b.reshape(op2(b, "or", b.convert(w.first, DType::U64), hi), s);
  };
  return {join(draw(0)), join(draw(m))};
}

namespace {
using rnd::digits;
using rnd::fine_type;

// `n` independent uniform arrays in [0, 1) shaped `s`, in t's math dtype, from one
// draw of bits: the top digits(t) bits of each word, scaled by 2^-digits.
std::vector<Value> uniforms(Ctx& ctx, DType t, const Shape& s, int n = 1) {
  Builder& b = ctx.b;
  Shape bs = s;
  bs.insert(bs.begin(), n);
  Value u = rnd::unit_floats(b, ctx.random_bits(Type{t == DType::F64 ? DType::U64 : DType::U32, bs}), t);
  std::vector<Value> out;
  Shape lim = bs, start(bs.size(), 0), step(bs.size(), 1);
  for (int i = 0; i < n; ++i) {
    start[0] = i;
    lim[0] = i + 1;
    out.push_back(b.reshape(b.slice(u, start, lim, step), s));
  }
  return out;
}
Value uniform(Ctx& ctx, DType t, const Shape& s) { return uniforms(ctx, t, s)[0]; }

// Standard normals by Box-Muller.
// The two uniforms are the halves of one [2] + s draw, computed elementwise so that XLA
// fuses them into the output instead of holding the draw (twice the output) in memory.
Value standard_normal(Ctx& ctx, DType t, const Shape& s) {
  DType ft = fine_type(t);
  auto [w1, w2] = rnd::threefry_pair(ctx.b, ctx.random_state(), s, ft == DType::F64);
  return rnd::box_muller(ctx.b, rnd::unit_floats(ctx.b, w1, ft), rnd::unit_floats(ctx.b, w2, ft));
}

// Number arg i (a runtime operand; or a Tensor there, for normal.Tensor_*) as dtype t
// shaped s; `dflt` where it is omitted.
Value number_arg(Ctx& ctx, int i, double dflt, DType t, const Shape& s) {
  if (ctx.is_none(i)) return ctx.b.constant(dflt, t, s);
  return coerce(ctx.b, ctx.is_tensor(i) ? ctx.in(i) : ctx.scalar(i, t), t, s);
}

// A 64-bit integer constant, exact beyond 2^53 (constants are spelled from doubles).
Value u64(Builder& b, uint64_t v, const Shape& s) {
  Value hi = b.constant(static_cast<double>(v >> 32), DType::U64, s);
  Value lo = b.constant(static_cast<double>(v & 0xffffffffu), DType::U64, s);
  return op2(b, "or", op2(b, "shift_left", hi, b.constant(32, DType::U64, s)), lo);
}

// The words a range of random integers needs (RangeRuntimeArgs' value class): 32-bit
// words mod a range near 2^32 favour low values (P(x < range / 3) was 0.5 at 3 * 2^30),
// so from 2^28 on 64-bit ones, as CPU and CUDA switch; a range of 2^64 (0 as a u64)
// takes the words as they are.
enum RangeWords { kNarrow = 0, kWide = 1, kWhole = 2 };
int range_words(uint64_t range) {
  return range == 0 ? kWhole : range >= (uint64_t{1} << 28) ? kWide : kNarrow;
}

// Integers uniform in [lo, lo + range) cast to the output dtype: bits mod range, where lo
// and range are i64 runtime values (range read as a u64) and `words` their range_words.
Value random_range(Ctx& ctx, const Value& lo, const Value& range, int words) {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  Value bits = ctx.random_bits(Type{words == kNarrow ? DType::U32 : DType::U64, o.shape});
  if (words != kWhole) {
    Value r = b.bitcast(range, DType::U64);
    if (words == kNarrow) r = b.convert(r, DType::U32);
    bits = op2(b, "remainder", bits, b.broadcast_in_dim(r, o.shape, {}));
  }
  Value v = b.bitcast(b.convert(bits, DType::U64), DType::I64);  // wraps like PyTorch's int64 math
  v = add(b, v, b.broadcast_in_dim(lo, o.shape, {}));
  return b.convert(v, o.dtype);
}

// Largest value random_ draws by default: 2^digits for floats (all exact), else the max.
int64_t default_top(DType t) {
  if (is_float(t)) return int64_t{1} << digits(t);
  if (t == DType::Bool) return 1;
  if (t == DType::I64) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(highest(t));
}

// The output type, rejecting what these samplers do not produce.
Type float_out(Ctx& ctx) {
  Type o = ctx.out(0);
  if (!is_float(o.dtype)) throw Unsupported("random op on a non-float tensor");
  return o;
}
}  // namespace

// from and to are runtime operands; CPU's checks of them (kernel_checks.cpp) run per call.
TPU_LOWER(uniform_rule, "uniform_", "uniform") {  // from + u * (to - from)
  Type o = float_out(ctx);
  Builder& b = ctx.b;
  Value u = uniform(ctx, o.dtype, o.shape);
  Value lo = number_arg(ctx, 1, 0, u.dtype(), o.shape), hi = number_arg(ctx, 2, 1, u.dtype(), o.shape);
  return {b.convert(add(b, lo, mul(b, u, sub(b, hi, lo))), o.dtype)};
}
TPU_RUNTIME_ARGS(uniform_rule, {1, 2});
// mean + std * z, with mean/std (floats or tensors) at args `at` and `at + 1`.
static std::vector<Value> normal(Ctx& ctx, int at) {
  Type o = float_out(ctx);
  Builder& b = ctx.b;
  DType t = math_type(o.dtype);
  Value z = standard_normal(ctx, o.dtype, o.shape);
  Value mean = number_arg(ctx, at, 0, t, o.shape), std = number_arg(ctx, at + 1, 1, t, o.shape);
  if (ctx.is_tensor(at + 1))  // a float std is checked by PyTorch before it gets here
    ctx.check(all_true(b, b.compare(std, cst(b, std, 0), Cmp::GE)),
              "RuntimeError: normal expects all elements of std >= 0.0");
  return {b.convert(add(b, mean, mul(b, std, z)), o.dtype)};
}
TPU_LOWER(normal_rule, "normal_", "normal_functional") { return normal(ctx, 1); }
TPU_RUNTIME_ARGS(normal_rule, {1, 2});
TPU_LOWER(normal_tensor_rule, "normal.Tensor_float", "normal.float_Tensor", "normal.Tensor_Tensor") {
  return normal(ctx, 0);
}
TPU_RUNTIME_ARGS(normal_tensor_rule, {0, 1});
TPU_LOWER(log_normal_rule, "log_normal_", "log_normal") {
  Type o = float_out(ctx);
  Builder& b = ctx.b;
  Value z = standard_normal(ctx, o.dtype, o.shape);
  Value y = add(b, number_arg(ctx, 1, 1, z.dtype(), o.shape), mul(b, number_arg(ctx, 2, 2, z.dtype(), o.shape), z));
  return {b.convert(op1(b, "exponential", y), o.dtype)};
}
TPU_RUNTIME_ARGS(log_normal_rule, {1, 2});
TPU_LOWER(exponential_rule, "exponential_", "exponential") {  // -log(1 - u) / lambda
  Type o = float_out(ctx);
  Builder& b = ctx.b;
  Value u = uniform(ctx, fine_type(o.dtype), o.shape);
  Value y = op1(b, "log", sub(b, cst(b, u, 1), u));
  return {b.convert(op2(b, "divide", y, op1(b, "negate", number_arg(ctx, 1, 1, y.dtype(), o.shape))), o.dtype)};
}
TPU_RUNTIME_ARGS(exponential_rule, {1});
TPU_LOWER(cauchy_rule, "cauchy_", "cauchy") {  // median + sigma * tan(pi (u - 1/2))
  Type o = float_out(ctx);
  Builder& b = ctx.b;
  Value u = uniform(ctx, fine_type(o.dtype), o.shape);
  Value t = op1(b, "tan", mul(b, cst(b, u, M_PI), sub(b, u, cst(b, u, 0.5))));
  Value median = number_arg(ctx, 1, 0, t.dtype(), o.shape), sigma = number_arg(ctx, 2, 1, t.dtype(), o.shape);
  return {b.convert(add(b, median, mul(b, sigma, t)), o.dtype)};
}
TPU_RUNTIME_ARGS(cauchy_rule, {1, 2});
// Trials until the first success: ceil(log(1 - u) / log(1 - p)), at least 1.
TPU_LOWER(geometric_rule, "geometric_", "geometric") {
  Type o = ctx.out(0);
  Builder& b = ctx.b;
  Value u = uniform(ctx, fine_type(o.dtype), o.shape);
  Value log_q = op1(b, "log_plus_one", op1(b, "negate", number_arg(ctx, 1, 0.5, u.dtype(), o.shape)));
  Value q = op2(b, "divide", op1(b, "log", sub(b, cst(b, u, 1), u)), log_q);
  return {b.convert(op2(b, "maximum", op1(b, "ceil", q), cst(b, q, 1)), o.dtype)};
}
TPU_RUNTIME_ARGS(geometric_rule, {1});

// 1 with probability p: u < p. Probabilities outside [0, 1] (or NaN) raise as on CPU.
static std::vector<Value> bernoulli(Ctx& ctx, const Value& p) {
  Type o = ctx.out(0);
  Builder& b = ctx.b;
  ctx.check(all_true(b, b.binary("stablehlo.and", b.compare(p, cst(b, p, 0), Cmp::GE), b.compare(p, cst(b, p, 1), Cmp::LE))),
            "RuntimeError: " + ctx.op() + ": expected all probabilities p to be in [0, 1]");
  Value u = uniform(ctx, p.dtype(), o.shape);
  return {ctx.b.convert(ctx.b.compare(u, p, Cmp::LT), o.dtype)};
}
TPU_LOWER(bernoulli_p_rule, "bernoulli_.float", "bernoulli.p", "bernoulli_.Tensor", "bernoulli.Tensor") {
  Shape s = ctx.out(0).shape;
  // A float p is CPU-checked per call (kernel_checks.cpp): the program's own check holds.
  if (!ctx.is_tensor(1)) return bernoulli(ctx, number_arg(ctx, 1, 0.5, DType::F32, s));
  return bernoulli(ctx, coerce(ctx.b, ctx.in(1), fine_type(ctx.type_of(1).dtype), s));
}
TPU_RUNTIME_ARGS(bernoulli_p_rule, {1});
TPU_LOWER(bernoulli_rule, "bernoulli") {  // self holds the probabilities
  return bernoulli(ctx, coerce(ctx.b, ctx.in(0), fine_type(ctx.type_of(0).dtype), ctx.out(0).shape));
}

// random_: [from, to), [0, to), or [from or 0, top] with the dtype's default top. The
// bounds are runtime operands (randint(0, len(buffer)) reuses its program); CPU's checks
// of them (from < to, both in the dtype's range) run per call (kernel_checks.cpp).
namespace {
// The range random_.from draws: to - from, or top - from + 1 without a `to` (mod 2^64).
uint64_t from_range(const std::vector<Number>& v, DType self) {
  uint64_t lo = static_cast<uint64_t>(v[0].i);
  return v[1].none ? static_cast<uint64_t>(default_top(self)) - lo + 1 : static_cast<uint64_t>(v[1].i) - lo;
}
int from_words(const std::vector<Number>& v, DType self) { return range_words(from_range(v, self)); }
int to_words(const std::vector<Number>& v, DType) { return range_words(static_cast<uint64_t>(v[0].i)); }
}  // namespace
TPU_LOWER(random_from_rule, "random_.from", "random.from") {
  Builder& b = ctx.b;
  Value lo = ctx.scalar(1, DType::I64);
  uint64_t past_top = static_cast<uint64_t>(default_top(ctx.out(0).dtype)) + 1;  // 2^63 for int64: u64 math
  Value hi = ctx.is_none(2) ? b.bitcast(u64(b, past_top, {}), DType::I64) : ctx.scalar(2, DType::I64);
  return {random_range(ctx, lo, sub(b, hi, lo), ctx.value_class())};
}
TPU_RUNTIME_ARGS(random_from_rule, {1, 2}, from_words);
TPU_LOWER(random_to_rule, "random_.to", "random.to") {
  return {random_range(ctx, ctx.b.constant(0, DType::I64), ctx.scalar(1, DType::I64), ctx.value_class())};
}
TPU_RUNTIME_ARGS(random_to_rule, {1}, to_words);
TPU_LOWER(random_full_rule, "random_", "random") {
  uint64_t range = static_cast<uint64_t>(default_top(ctx.out(0).dtype)) + 1;
  Value r = ctx.b.bitcast(u64(ctx.b, range, {}), DType::I64);
  return {random_range(ctx, ctx.b.constant(0, DType::I64), r, range_words(range))};
}

// Dropout: keep with probability 1 - p and scale kept values by 1 / (1 - p); the mask
// is returned for the backward. Not training: identity and an all-true mask.
TPU_LOWER(native_dropout_rule, "native_dropout") {
  Builder& b = ctx.b;
  Type o = ctx.out(0), mo = ctx.out(1);
  bool train = ctx.is_none(2) || ctx.flag(2);
  Value x = ctx.in(0);
  if (!train) return {x, b.constant(1, mo.dtype, mo.shape)};
  DType t = math_type(o.dtype);
  // p is a runtime operand (a scheduled dropout rate reuses the program), checked per call.
  Value p = ctx.scalar(1, t);
  Value q = sub(b, b.constant(1, t), p);
  Value keep = b.compare(uniform(ctx, DType::F32, o.shape), b.broadcast_in_dim(b.convert(q, DType::F32), o.shape, {}), Cmp::LT);
  Value scale = b.select(b.compare(p, b.constant(1, t), Cmp::LT), div(b, b.constant(1, t), q), b.constant(0, t));
  Value y = mul(b, mul(b, b.convert(x, t), b.convert(keep, t)), b.broadcast_in_dim(scale, o.shape, {}));
  return {b.convert(y, o.dtype), b.convert(keep, mo.dtype)};
}
TPU_RUNTIME_ARGS(native_dropout_rule, {1});
TPU_LOWER(native_dropout_backward_rule, "native_dropout_backward") {  // grad * mask * scale
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  DType t = math_type(o.dtype);
  Value g = coerce(b, ctx.in(0), t, o.shape), m = coerce(b, ctx.in(1), t, o.shape);
  return {b.convert(mul(b, mul(b, g, m), number_arg(ctx, 2, 1, t, o.shape)), o.dtype)};
}
TPU_RUNTIME_ARGS(native_dropout_backward_rule, {2});

// randperm(n, generator, out): the positions 0..n-1 sorted by 64-bit random keys
// (a uniform permutation up to key collisions, which a stable sort keeps valid).
TPU_LOWER(randperm_rule, "randperm.generator_out") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  if (o.shape.size() != 1) throw Unsupported("randperm shape");
  int64_t n = o.shape[0];
  Value keys = ctx.random_bits(Type{DType::U64, {n}});
  Value idx = b.iota(Type{DType::I64, {n}}, 0);
  auto sorted = b.sort({keys, idx}, 0, true, [](Builder& b, const std::vector<Value>& a) {
    return std::vector<Value>{b.compare(a[0], a[1], Cmp::LT)};
  });
  return {b.convert(sorted[1], o.dtype)};
}

}  // namespace tpu::lowering

namespace tpu::lowering {

// multinomial(probs (n) or (b, n), num_samples, replacement, generator) -> int64 indices.
// With replacement: the inverse CDF, u scaled by the row's total. Without: the categories
// ordered by p / E with E ~ Exp(1) (an exponential race; the first k arrivals are a
// sample without replacement weighted by p). Bad probabilities fail like CPU's checks.
TPU_LOWER(multinomial_rule, "multinomial") {
  Builder& b = ctx.b;
  Type o = ctx.out(0);
  Value p = ctx.in(0);
  if (!is_float(p.dtype())) throw Unsupported("multinomial of a non-float tensor");
  bool batched = p.rank() == 2;
  int64_t rows = batched ? p.shape()[0] : 1, n = p.shape().back(), k = ctx.i(1);
  if (n == 0 || rows == 0 || k == 0) throw Unsupported("multinomial: empty");
  DType t = fine_type(p.dtype());
  p = b.reshape(b.convert(p, t), {rows, n});
  Value zero = b.constant(0, t, {rows, n});
  Value finite = b.compare(op1(b, "abs", p), b.constant(INFINITY, t, {rows, n}), Cmp::LT);
  Value good = b.binary("stablehlo.and", b.compare(p, zero, Cmp::GE), finite);
  ctx.check(b.reduce(good, b.constant(1, DType::Bool), {0, 1}, "stablehlo.and"),
            "RuntimeError: multinomial: probability tensor contains either `inf`, `nan` or element < 0");
  Value total = reduce_sum(b, p, {1});
  ctx.check(b.reduce(b.compare(total, b.constant(0, t, {rows}), Cmp::GT), b.constant(1, DType::Bool),
                     {0}, "stablehlo.and"),
            "RuntimeError: multinomial: invalid multinomial distribution (sum of probabilities <= 0)");
  Value idx;
  if (ctx.flag(2)) {
    Value cdf = b.reduce_window(p, b.constant(0, t), {1, n}, {1, 1}, {{0, 0}, {n - 1, 0}}, "stablehlo.add");
    Value last = b.slice(cdf, {0, n - 1}, {rows, n}, {1, 1});                      // (rows, 1)
    Value u = mul(b, uniform(ctx, t, {rows, k}), b.broadcast_in_dim(b.reshape(last, {rows}), {rows, k}, {0}));
    // How many cdf entries are <= u: a binary search (the cdf does not decrease), each
    // step a gather; comparing every sample with every category took rows*k*n memory.
    Value flat = b.reshape(cdf, {rows * n});
    Value base = b.broadcast_in_dim(mul(b, b.iota(Type{DType::I64, {rows}}, 0), b.constant(n, DType::I64, {rows})),
                                    {rows, k}, {0});
    Value lo = b.constant(0, DType::I64, {rows, k}), hi = b.constant(n, DType::I64, {rows, k});
    Value one = b.constant(1, DType::I64, {rows, k});
    for (int64_t span = n; span > 0; span /= 2) {  // the interval [lo, hi) halves each step
      Value mid = b.binary("stablehlo.shift_right_logical", add(b, lo, hi), one);
      Value at = b.clamp(b.constant(0, DType::I64, {rows, k}), mid, b.constant(n - 1, DType::I64, {rows, k}));
      Value below = b.binary("stablehlo.and", b.compare(mid, hi, Cmp::LT),
                             b.compare(search::gather_flat(b, flat, add(b, base, at)), u, Cmp::LE));
      lo = b.select(below, add(b, mid, one), lo);
      hi = b.select(below, hi, b.select(b.compare(mid, hi, Cmp::LT), mid, hi));
    }
    idx = lo;
    // Rounding can leave u at the top: the last category with mass is the answer then.
    Value pos = b.select(b.compare(p, zero, Cmp::GT), b.iota(Type{DType::I64, {rows, n}}, 1),
                         b.constant(0, DType::I64, {rows, n}));
    Value top = reduce_max(b, pos, {1});
    idx = b.clamp(b.constant(0, DType::I64, {rows, k}), idx, b.broadcast_in_dim(top, {rows, k}, {0}));
  } else {
    // Like CPU, zero-probability categories come last once the others are drawn.
    Value u = uniform(ctx, t, {rows, n});
    Value e = op1(b, "negate", op1(b, "log", sub(b, cst(b, u, 1), u)));  // Exp(1), > 0 a.s.
    Value key = div(b, p, e);
    auto sorted = b.sort({key, b.iota(Type{DType::I64, {rows, n}}, 1)}, 1, true,
                         [](Builder& r, const std::vector<Value>& a) {
                           return std::vector<Value>{r.compare(a[0], a[1], Cmp::GT)};
                         });
    idx = b.slice(sorted[1], {0, 0}, {rows, k}, {1, 1});
  }
  return {b.reshape(b.convert(idx, o.dtype), o.shape)};
}

}  // namespace tpu::lowering
