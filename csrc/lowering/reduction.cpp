// Reductions. Low-precision floats accumulate in f32 (acc_type), like
// CPU/CUDA. Rules end by fitting their result to the meta output: keepdim is then a
// reshape to that shape, and the dtype a convert.
#include <cmath>
#include <stdexcept>
#include <string>

#include "lowering/compensated_sum.h"
#include "lowering/helpers.h"

namespace tpu::lowering {

using ir::Cmp;

// Result as PyTorch expects output j: its dtype and its shape.
static Value fit(Ctx& ctx, const Value& v, int j = 0) {
  Type t = ctx.out(j);
  return ctx.b.reshape(ctx.b.convert(v, t.dtype), t.shape);
}

// Dims of an `int[]? dim` argument. None reduces everything; an empty list does too,
// except for any/all.dims, where it reduces nothing.
static std::vector<int64_t> dims_arg(Ctx& ctx, int idx, int64_t rank, bool empty_is_all = true) {
  if (ctx.is_none(idx)) return reduce_dims({}, rank);
  auto d = ctx.ints(idx);
  if (d.empty() && !empty_is_all) return {};
  return reduce_dims(d, rank);
}

static int64_t count(const Shape& s, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (auto d : dims) n *= s[d];
  return n;
}

// Input converted to the type its reduction accumulates in (the output's dtype, or
// f32 for f16/bf16). PyTorch first casts the input to the output dtype (sum, prod and
// the scans with dtype=): a narrower dtype rounds every element before the sum.
static Value acc_in(Ctx& ctx) {
  DType out = ctx.out(0).dtype;
  return ctx.b.convert(ctx.b.convert(ctx.in(0), out), acc_type(out));
}

// The same without the first rounding: CPU's mean with dtype=bf16/f16 sums the input
// in f32 and rounds only the quotient (int32 100000s average to 48704 in f16, not inf).
static Value acc_in_direct(Ctx& ctx) { return ctx.b.convert(ctx.in(0), acc_type(ctx.out(0).dtype)); }

static Value sum_of(Ctx& ctx, const std::vector<int64_t>& dims) {
  return fit(ctx, reduce_sum(ctx.b, acc_in(ctx), dims));
}

TPU_LOWER(sum_all, "sum") { return {sum_of(ctx, reduce_dims({}, ctx.type_of(0).rank()))}; }
TPU_LOWER(sum_dim, "sum.dim_IntList") { return {sum_of(ctx, dims_arg(ctx, 1, ctx.type_of(0).rank()))}; }

static Value mean_of(Ctx& ctx, const std::vector<int64_t>& dims) {
  Builder& b = ctx.b;
  Value x = acc_in_direct(ctx);
  Value s = reduce_sum(b, x, dims);
  // An empty reduction divides 0 by 0: NaN, as PyTorch.
  return fit(ctx, div_count(b, s, static_cast<double>(count(x.shape(), dims))));
}

TPU_LOWER(mean_all, "mean") { return {mean_of(ctx, reduce_dims({}, ctx.type_of(0).rank()))}; }
TPU_LOWER(mean_dim, "mean.dim") { return {mean_of(ctx, dims_arg(ctx, 1, ctx.type_of(0).rank()))}; }

// CPU multiplies f16/bf16 in that dtype, rounding at every step in an order set by its
// vector width and thread count; here the product is taken in f32 and rounded once.
static Value prod_of(Ctx& ctx, const std::vector<int64_t>& dims) {
  return fit(ctx, accurate_prod(ctx.b, acc_in(ctx), dims));
}

TPU_LOWER(prod_all, "prod") { return {prod_of(ctx, reduce_dims({}, ctx.type_of(0).rank()))}; }
TPU_LOWER(prod_dim, "prod.dim_int") {
  return {prod_of(ctx, reduce_dims({ctx.i(1)}, ctx.type_of(0).rank()))};
}

// The identity of max (lowest value) or min (highest) of t. INT64_MAX has no exact
// double, so it is made as (-1 >>> 1).
static Value bound(Builder& b, DType t, bool high) {
  if (high && t == DType::I64)
    return b.binary("stablehlo.shift_right_logical", b.constant(-1, t), b.constant(1, t));
  if (high && t == DType::U64) return b.unary("stablehlo.not", b.constant(0, t));  // no double holds it
  return b.constant(high ? highest(t) : lowest(t), t);
}

// Max/min over dims that propagates NaN like torch.max/amax. The select is spelled
// out: XLA:CPU's maximum/minimum may drop NaN (fast min/max).
static Value extremum(Builder& b, const Value& x, const std::vector<int64_t>& dims, bool is_max) {
  Value init = bound(b, x.dtype(), !is_max);
  if (!is_float(x.dtype()))
    return b.reduce(x, init, dims, is_max ? "stablehlo.maximum" : "stablehlo.minimum");
  return b.reduce({x}, {init}, dims, [&](Builder& b, const std::vector<Value>& a) {
    Value m = b.binary(is_max ? "stablehlo.maximum" : "stablehlo.minimum", a[0], a[1]);
    m = b.select(b.compare(a[1], a[1], Cmp::NE), a[1], m);
    return std::vector<Value>{b.select(b.compare(a[0], a[0], Cmp::NE), a[0], m)};
  })[0];
}

// max()/min() of an empty tensor have no identity to return: CPU raises, and so do
// we (the meta kernels let them through).
static Value extremum_all(Ctx& ctx, bool is_max) {
  Value x = ctx.in(0);
  if (x.type.numel() == 0)
    throw std::invalid_argument(std::string(is_max ? "max" : "min") +
                                "(): Expected reduction dim to be specified for input.numel() == 0. "
                                "Specify the reduction dim with the 'dim' argument.");
  return fit(ctx, extremum(ctx.b, x, reduce_dims({}, x.rank()), is_max));
}
TPU_LOWER(max_all, "max") { return {extremum_all(ctx, true)}; }
TPU_LOWER(min_all, "min") { return {extremum_all(ctx, false)}; }
TPU_LOWER(amax, "amax") {
  Value x = ctx.in(0);
  return {fit(ctx, extremum(ctx.b, x, dims_arg(ctx, 1, x.rank()), true))};
}
TPU_LOWER(amin, "amin") {
  Value x = ctx.in(0);
  return {fit(ctx, extremum(ctx.b, x, dims_arg(ctx, 1, x.rank()), false))};
}

// Value and index of the max (or min) along `dims` in one variadic reduce. NaN wins
// over numbers, and ties (NaN with NaN included) go to the lower index, so the
// combiner is associative and commutative and gives PyTorch's first occurrence.
static std::vector<Value> arg_reduce(Builder& b, const Value& x, int64_t dim, bool is_max) {
  Value idx = b.iota(Type{DType::I64, x.shape()}, dim);
  Value init = bound(b, x.dtype(), !is_max);
  // The init's index 0 only ties with an element equal to the init; then every
  // element equals it and index 0 is right.
  Value init_i = b.constant(0, DType::I64);
  bool fp = is_float(x.dtype());
  return b.reduce({x, idx}, {init, init_i}, {dim}, [&](Builder& b, const std::vector<Value>& a) {
    const Value &va = a[0], &ia = a[1], &vb = a[2], &ib = a[3];
    Value better = b.compare(va, vb, is_max ? Cmp::GT : Cmp::LT);
    Value tie = b.compare(va, vb, Cmp::EQ);
    if (fp) {
      Value na = b.compare(va, va, Cmp::NE), nb = b.compare(vb, vb, Cmp::NE);
      Value not_nb = b.unary("stablehlo.not", nb);
      better = b.binary("stablehlo.or", better, b.binary("stablehlo.and", na, not_nb));
      tie = b.binary("stablehlo.or", tie, b.binary("stablehlo.and", na, nb));
    }
    Value first = b.binary("stablehlo.and", tie, b.compare(ia, ib, Cmp::LT));
    Value pick = b.binary("stablehlo.or", better, first);
    return std::vector<Value>{b.select(pick, va, vb), b.select(pick, ia, ib)};
  });
}

static std::vector<Value> minmax_dim(Ctx& ctx, bool is_max) {
  Value x = ctx.in(0);
  if (x.rank() == 0) return {fit(ctx, x, 0), fit(ctx, ctx.b.constant(0, DType::I64), 1)};
  int64_t dim = wrap_dim(ctx.i(1), x.rank());
  if (x.shape()[dim] == 0)
    throw std::out_of_range(std::string(is_max ? "max" : "min") + "(): Expected reduction dim " +
                            std::to_string(dim) + " to have non-zero size.");
  auto r = arg_reduce(ctx.b, x, dim, is_max);
  return {fit(ctx, r[0], 0), fit(ctx, r[1], 1)};
}

TPU_LOWER(max_dim, "max.dim") { return minmax_dim(ctx, true); }
TPU_LOWER(min_dim, "min.dim") { return minmax_dim(ctx, false); }

// argmax/argmin: dim None flattens the input first.
static Value arg_of(Ctx& ctx, bool is_max) {
  Value x = ctx.in(0);
  int64_t dim = 0;
  if (ctx.is_none(1) || x.rank() == 0) x = ctx.b.reshape(x, {x.type.numel()});
  else dim = wrap_dim(ctx.i(1), x.rank());
  return fit(ctx, arg_reduce(ctx.b, x, dim, is_max)[1]);
}

TPU_LOWER(argmax, "argmax") { return {arg_of(ctx, true)}; }
TPU_LOWER(argmin, "argmin") { return {arg_of(ctx, false)}; }

// {var, mean} over dims in the accumulation type, two-pass for accuracy. The
// divisor is max(N - correction, 0), as PyTorch (0 gives inf/NaN).
// Complex values: the mean is complex, the variance the mean of |x - mean|^2 (real).
static std::pair<Value, Value> var_and_mean(Ctx& ctx) {
  Builder& b = ctx.b;
  DType in = ctx.type_of(0).dtype;
  Value x = is_complex(in) ? ctx.b.convert(ctx.in(0), acc_type(in)) : acc_in_direct(ctx);
  auto dims = dims_arg(ctx, 1, x.rank());
  double n = static_cast<double>(count(x.shape(), dims));
  auto centered = [&](const Value& m) {
    return sub(b, x, broadcast_to(b, keep_dims(b, m, x.shape(), dims), x.shape()));
  };
  auto abs2 = [&](const Value& v) { return is_complex(in) ? complex_abs_squared(b, v) : mul(b, v, v); };
  // The mean, rounded to the dtype, leaves every deviation off by (exact mean - mean), and
  // the squares' sum then holds n times its square: rows offset by 1e5 came out 1.8e-4
  // off where CPU (Welford in double) is 6e-8. The deviations' sum measures that offset:
  // it moves the centre (m2) and is taken out of the squares' sum (the corrected two-pass
  // algorithm; rounding cannot make it negative). var_mean returns m1: sum / n, correctly
  // rounded where the sum is exact, as CPU's.
  // Each reduce reads its own deviations: XLA:CPU stores a reduce's elementwise input, and
  // one set of deviations feeding two reduces kept two input-sized temporaries alive.
  Value m1 = div_count(b, reduce_sum(b, x, dims), n);
  Value sd1 = reduce_sum(b, centered(m1), dims);
  Value m2 = add(b, m1, div_count(b, sd1, n));
  Value ss = reduce_sum(b, abs2(centered(m2)), dims);
  // sum(x - m2) = sd1 - n (m2 - m1); m2 - m1 is exact (the two are close).
  Value sd = sub(b, sd1, mul(b, broadcast_to(b, b.number(n, m2.dtype()), m2.shape()), sub(b, m2, m1)));
  ss = b.binary("stablehlo.maximum", sub(b, ss, div_count(b, abs2(sd), n)),
                b.constant(0, ss.dtype(), ss.shape()));
  DType rt = ss.dtype();
  Value corr = ctx.is_none(2) ? b.constant(1, rt) : ctx.scalar(2, rt);
  // A runtime n: XLA would fold N - 1 and divide by its reciprocal.
  Value denom = sub(b, b.number(n, rt), corr);
  denom = b.binary("stablehlo.maximum", denom, b.constant(0, rt));
  Value var = div(b, ss, broadcast_to(b, denom, ss.shape()));
  return {var, m1};
}

TPU_LOWER(var, "var.correction") { return {fit(ctx, var_and_mean(ctx).first)}; }
TPU_LOWER(std_, "std.correction") {
  return {fit(ctx, ctx.b.unary("stablehlo.sqrt", var_and_mean(ctx).first))};
}
TPU_LOWER(var_mean, "var_mean.correction") {
  auto [v, m] = var_and_mean(ctx);
  return {fit(ctx, v, 0), fit(ctx, m, 1)};
}
TPU_LOWER(std_mean, "std_mean.correction") {
  auto [v, m] = var_and_mean(ctx);
  return {fit(ctx, ctx.b.unary("stablehlo.sqrt", v), 0), fit(ctx, m, 1)};
}

// any/all reduce the input's truth values; the output is bool (uint8 for uint8).
static Value logical(Ctx& ctx, const std::vector<int64_t>& dims, bool is_any) {
  Value x = ctx.b.convert(ctx.in(0), DType::Bool);
  Value init = ctx.b.constant(is_any ? 0 : 1, DType::Bool);
  return fit(ctx, ctx.b.reduce(x, init, dims, is_any ? "stablehlo.or" : "stablehlo.and"));
}

TPU_LOWER(any_all, "any") { return {logical(ctx, reduce_dims({}, ctx.type_of(0).rank()), true)}; }
TPU_LOWER(all_all, "all") { return {logical(ctx, reduce_dims({}, ctx.type_of(0).rank()), false)}; }
TPU_LOWER(any_dim, "any.dim") {
  return {logical(ctx, reduce_dims({ctx.i(1)}, ctx.type_of(0).rank()), true)};
}
TPU_LOWER(all_dim, "all.dim") {
  return {logical(ctx, reduce_dims({ctx.i(1)}, ctx.type_of(0).rank()), false)};
}
TPU_LOWER(any_dims, "any.dims") {
  return {logical(ctx, dims_arg(ctx, 1, ctx.type_of(0).rank(), false), true)};
}
TPU_LOWER(all_dims, "all.dims") {
  return {logical(ctx, dims_arg(ctx, 1, ctx.type_of(0).rank(), false), false)};
}

// log(sum(exp(x - m))) + m with m the max, taken as 0 where it is infinite so that
// all -inf gives -inf and an inf gives inf (not NaN). CPU composes it from tensor
// ops, so bf16/f16 inputs round to their dtype after each step; so do we.
TPU_LOWER(logsumexp, "logsumexp") {
  Builder& b = ctx.b;
  // dim=() without keepdim: CPU's max keeps every dim (size 1) while its sum keeps none,
  // and adding the first into the second in place fails.
  Type in = ctx.type_of(0);
  if (ctx.ints(1).empty() && !ctx.flag_or(2, false) && in.rank() > 0 && in.numel() > 0) {
    std::string ones;
    for (int d = 0; d < in.rank(); ++d) ones += d ? ", 1" : "1";
    throw std::invalid_argument("output with shape [] doesn't match the broadcast shape [" + ones + "]");
  }
  Value x = acc_in(ctx);
  DType t = ctx.out(0).dtype;
  auto R = [&](const Value& v) { return t == v.dtype() ? v : b.convert(b.convert(v, t), v.dtype()); };
  auto dims = dims_arg(ctx, 1, x.rank());
  // Complex values shift by the largest real part (exp(z - m) stays bounded).
  bool cplx = is_complex(x.dtype());
  Type part{x.dtype() == DType::C128 ? DType::F64 : DType::F32, x.shape()};
  Value m = extremum(b, cplx ? b.raw("stablehlo.real", {x}, "", part) : x, dims, true);
  Value finite = b.raw("stablehlo.is_finite", {m}, "", Type{DType::Bool, m.shape()});
  m = b.select(finite, m, full_like(b, m, 0));
  if (cplx) m = b.convert(m, x.dtype());
  Value mk = broadcast_to(b, keep_dims(b, m, x.shape(), dims), x.shape());
  Value s = R(reduce_sum(b, R(b.unary("stablehlo.exponential", R(sub(b, x, mk)))), dims));
  return {fit(ctx, add(b, R(b.unary("stablehlo.log", s)), m))};
}

// Vector p-norm. p is a Scalar, a runtime operand (plans are shared across its values);
// the orders with forms of their own (2, 1, 0, inf, -inf: inf/-inf are max/min of |x|,
// 0 counts nonzeros) are a value class, so each program holds its order's form alone
// (clip_grad_norm_'s 2-norm was all six forms picked by selects: 550 instructions of
// each fused step to compile). Other orders share one program: (sum |x|^p)^(1/p).
enum NormOrder { kGeneral = 0, kTwo, kOne, kZero, kInf, kMinusInf };

static int norm_order(const std::vector<Number>& values, DType) {
  const Number& p = values.at(0);
  if (p.none) return kTwo;
  double v = p.integral ? static_cast<double>(p.i) : p.f;
  return v == 2 ? kTwo : v == 1 ? kOne : v == 0 ? kZero : v == INFINITY ? kInf : v == -INFINITY ? kMinusInf : kGeneral;
}

static Value vector_norm(Ctx& ctx, int p_idx, const std::vector<int64_t>& dims) {
  Builder& b = ctx.b;
  // A complex vector's norm is its magnitudes' norm.
  Value in = ctx.in(0);
  if (is_complex(in.dtype())) in = complex_magnitude(b, in);
  Value x = b.convert(in, acc_type(ctx.out(0).dtype));
  DType t = x.dtype();
  Value a = b.unary("stablehlo.abs", x);
  // Nothing to reduce: zeros, as CPU gives for any order it accepts here (NaN too).
  if (x.type.numel() == 0) return fit(ctx, reduce_sum(b, a, dims));
  auto nonzeros = [&] { return reduce_sum(b, b.convert(b.convert(x, DType::Bool), t), dims); };
  int64_t reduced = 1;
  for (int64_t d : dims) reduced *= x.shape()[d];
  int order = ctx.value_class();
  // CPU's norm of one element is |x| for every order but 0 (NaN too).
  if (reduced == 1) return fit(ctx, order == kZero ? nonzeros() : reduce_sum(b, a, dims));
  switch (order) {
    case kTwo: return fit(ctx, b.unary("stablehlo.sqrt", reduce_sum(b, mul(b, x, x), dims)));
    case kOne: return fit(ctx, reduce_sum(b, a, dims));
    case kZero: return fit(ctx, nonzeros());
    case kInf: return fit(ctx, extremum(b, a, dims, true));
    case kMinusInf: return fit(ctx, extremum(b, a, dims, false));
    default: break;
  }
  Value p = ctx.scalar(p_idx, t);
  Value gen = reduce_sum(b, b.binary("stablehlo.power", a, broadcast_to(b, p, a.shape())), dims);
  const Shape& s = gen.shape();
  return fit(ctx, b.binary("stablehlo.power", gen, div(b, b.constant(1, t, s), broadcast_to(b, p, s))));
}

TPU_LOWER(linalg_vector_norm, "linalg_vector_norm") {
  return {vector_norm(ctx, 1, dims_arg(ctx, 2, ctx.type_of(0).rank()))};
}
TPU_RUNTIME_ARGS(linalg_vector_norm, {1}, norm_order);
TPU_LOWER(norm_scalar, "norm.Scalar") {
  return {vector_norm(ctx, 1, reduce_dims({}, ctx.type_of(0).rank()))};
}
TPU_RUNTIME_ARGS(norm_scalar, {1}, norm_order);
TPU_LOWER(norm_dim, "norm.ScalarOpt_dim") {
  return {vector_norm(ctx, 1, dims_arg(ctx, 2, ctx.type_of(0).rank()))};
}
TPU_RUNTIME_ARGS(norm_dim, {1}, norm_order);

}  // namespace tpu::lowering
