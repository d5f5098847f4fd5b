// Ops whose output shape depends on tensor values (nonzero, masked_select, indexing
// with boolean masks, unique, repeat_interleave, bincount; equal returns a host bool). One program per input signature packs the selected entries
// first and counts them; the host reads the count (a sync, as on CUDA) and returns a
// view of that prefix, so every count shares the same compiled program.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <limits>
#include <optional>

#include "backend/dtype_support.h"
#include "backend/dtypes.h"
#include "backend/executor.h"
#include "backend/fallback.h"
#include "backend/storage.h"
#include "backend/sync_debug.h"
#include "lowering/helpers.h"
#include "lowering/scan.h"
#include "lowering/search_util.h"

namespace tpu::backend {
namespace {

using ir::Builder;
using ir::Type;
using ir::Value;

int64_t read_count(const runtime::BufferPtr& count) {
  int64_t c = 0;
  runtime::Client::get().to_host(*count, &c, sizeof(c));
  return c;
}

Type type_of(const at::Tensor& t, const char* op) {
  return Type{device_dtype(t.scalar_type(), op), std::vector<int64_t>(t.sizes().begin(), t.sizes().end())};
}

// Inclusive prefix sum of 1-D integer `x` (in blocks: about three passes over x and two
// arrays of its size, where a log-step scan makes log2(n) passes).
Value prefix_sum(Builder& b, const Value& x) { return lowering::inclusive_scan(b, x, "stablehlo.add", 0); }

// 1-D `into` with `upd` written (or added) at positions `at`; positions n drop out.
Value scatter_1d(Builder& b, const Value& into, const Value& at, const Value& upd, bool add) {
  int64_t m = at.shape()[0];
  return b.scatter(into, b.reshape(at, {m, 1}), upd, {}, {0}, {0}, 1,
                   [add](Builder& q, const std::vector<Value>& a) {
    return std::vector<Value>{add ? lowering::add(q, a[0], a[1]) : a[1]};
  });
}

// Positions within n elements: int32 where they fit (half the working memory).
DType position_dtype(int64_t n) { return n <= std::numeric_limits<int32_t>::max() ? DType::I32 : DType::I64; }

// `payload` ([n]) at the selected positions of `mask` ([n], bool), packed in order into
// the front of `rows` (>= the number selected) entries: each goes to its rank among
// the selected (a prefix sum; no sort of the whole input), the others drop out.
Value pack_selected(Builder& b, const Value& mask, const Value& payload, int64_t rows) {
  int64_t n = mask.shape()[0];
  DType pt = position_dtype(n);
  Value rank = lowering::sub(b, prefix_sum(b, b.convert(mask, pt)), b.constant(1, pt, {n}));
  Value at = b.select(mask, rank, b.constant(double(rows), pt, {n}));
  return scatter_1d(b, b.constant(0, payload.dtype(), {rows}), at, payload, false);
}

// Rows a result of `count` (>= 1) rows keeps: the least of 2^k and 3 * 2^k that holds
// them, at most n. Results are views of that many rows, so a result holds at most 1.5x
// its size, and the counts of a bucket share one program (two per power of two, not
// one per count: a loop's varying counts do not compile anew each step).
int64_t bucket_rows(int64_t count, int64_t n) {
  int64_t p = 1;
  while (p < count) {
    if (p >= 2 && p / 2 * 3 >= count) return std::min(p / 2 * 3, n);
    p *= 2;
  }
  return std::min(p, n);
}

// The number of nonzero elements of `t` (read by the host: the sync CUDA makes too).
int64_t count_nonzero_of(const at::Tensor& t, int dev) {
  Type it = type_of(t, "nonzero");
  int64_t n = t.numel();
  auto res = run_internal("count_nonzero:" + it.str(), [&](Builder& b) {
    Value m = b.convert(b.reshape(b.param(it), {n}), DType::Bool);
    return std::vector<Value>{lowering::reduce_sum(b, b.convert(m, DType::I64), {0})};
  }, {dense_value(t)}, dev);
  return read_count(resolve(res[0]));
}

// nonzero: the elements are counted first; a second program, one per input and bucket
// of counts, packs the flat positions of the nonzero ones and turns only those into
// coordinates. The result owns a buffer of its bucket's size, not the input's.
at::Tensor nonzero_tpu(const at::Tensor& self) {
  refuse_limited_dtype("nonzero", self.scalar_type());  // float8, uint16/32/64: CPU has no kernel
  return guarded([&] {
    note_synchronizing_op("aten::nonzero");  // the output size depends on values
    ReadOfComputed now({self});
    int64_t n = self.numel(), r = self.dim();
    int dev = device_index(self);
    at::TensorOptions lo = self.options().dtype(at::kLong);
    if (n == 0) return at::empty({0, r}, lo);
    int64_t count = count_nonzero_of(self, dev);
    if (count == 0 || r == 0) return at::empty({count, r}, lo);
    int64_t rows = bucket_rows(count, n);
    // The count's read ran what self waited on: the packing runs now, not into a graph
    // (the result is a computed value, as the count made it before).
    ReadOfComputed computed({self});
    Type it = type_of(self, "nonzero");
    auto res = run_internal("nonzero:" + it.str() + ":" + std::to_string(rows), [&](Builder& b) {
      Value m = b.convert(b.reshape(b.param(it), {n}), DType::Bool);
      Value flat = b.convert(pack_selected(b, m, b.iota(Type{position_dtype(n), {n}}, 0), rows), DType::I64);
      std::vector<Value> cols;
      ir::Shape strides = ir::contiguous_strides(it.shape);
      for (int64_t d = 0; d < r; ++d) {  // flat position -> coordinate d
        Value q = b.binary("stablehlo.divide", flat, b.constant(double(strides[d]), DType::I64, {rows}));
        Value c = b.binary("stablehlo.remainder", q, b.constant(double(it.shape[d]), DType::I64, {rows}));
        cols.push_back(b.reshape(c, {rows, 1}));
      }
      return std::vector<Value>{b.concatenate(cols, 1)};
    }, {dense_value(self)}, dev);
    at::Tensor kept = wrap_value(res[0], at::kLong, {rows, r}, dev);
    return count == rows ? kept : kept.narrow(0, 0, count);
  });
}

// masked_select: as nonzero, the values packed instead of positions. A mask broadcast
// to n elements selects count(mask) * n / mask.numel() of them.
at::Tensor masked_select_tpu(const at::Tensor& self, const at::Tensor& mask) {
  check_same_device({self, mask});
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask, got ",
              mask.scalar_type());
  return guarded([&] {
    note_synchronizing_op("aten::masked_select");  // the output size depends on values
    ReadOfComputed now({self, mask});
    std::vector<int64_t> shape = at::infer_size(self.sizes(), mask.sizes());
    int64_t n = c10::multiply_integers(shape);
    int dev = device_index(self);
    if (n == 0) return at::empty({0}, self.options());
    int64_t count = count_nonzero_of(mask, dev) * (n / mask.numel());
    if (count == 0) return at::empty({0}, self.options());
    int64_t rows = bucket_rows(count, n);
    ReadOfComputed computed({self, mask});  // as nonzero's
    Type st = type_of(self, "masked_select"), mt = type_of(mask, "masked_select");
    auto res = run_internal("masked_select:" + st.str() + mt.str() + ":" + std::to_string(rows), [&](Builder& b) {
      Value x = b.reshape(lowering::broadcast_to(b, b.param(st), shape), {n});
      Value m = b.reshape(lowering::broadcast_to(b, b.param(mt), shape), {n});
      return std::vector<Value>{pack_selected(b, m, x, rows)};
    }, {dense_value(self), dense_value(mask)}, dev);
    at::Tensor kept = wrap_value(res[0], self.scalar_type(), {rows}, dev);
    return count == rows ? kept : kept.narrow(0, 0, count);
  });
}

// ---- equal, unique, unique_consecutive, repeat_interleave ----

// torch.equal: same sizes and every element equal (NaN never is), compared in the
// promoted dtype on the device; the host reads one flag.
bool equal_tpu(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.device() == other.device(), "Cannot compare two tensors on different devices. Got: ",
              self.device(), " and ", other.device());
  if (self.sizes() != other.sizes()) return false;
  if (self.numel() == 0) return true;
  return guarded([&] {
    note_synchronizing_op("aten::equal");  // the host reads the answer
    ReadOfComputed now({self, other});
    int dev = device_index(self);
    Type st = type_of(self, "equal"), ot = type_of(other, "equal");
    DType t = lowering::promote(st.dtype, ot.dtype);
    auto res = run_internal("equal:" + st.str() + ot.str(), [&](Builder& b) {
      Value a = b.param(st), o = b.param(ot);  // in this order: the buffers' order
      Value eq = b.compare(b.convert(a, t), b.convert(o, t), ir::Cmp::EQ);
      std::vector<int64_t> all;
      for (int64_t d = 0; d < st.rank(); ++d) all.push_back(d);
      Value n_ne = lowering::reduce_sum(b, b.convert(b.unary("stablehlo.not", eq), DType::I64), all);
      return std::vector<Value>{n_ne};
    }, {dense_value(self), dense_value(other)}, dev);
    return read_count(resolve(res[0])) == 0;
  });
}

// Unique values of `self` (flattened): sorted first (stable, NaN last) unless
// `consecutive`; a group starts where a value differs from the previous one (so every
// NaN is its own, as CPU). Returns the group firsts packed in front, the inverse and
// the counts, each cut to the number of groups.
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_impl(const at::Tensor& self, bool consecutive,
                                                           bool want_inverse, bool want_counts) {
  // CPU's kernels refuse complex values (an order is needed).
  TORCH_CHECK_NOT_IMPLEMENTED(!self.is_complex(), consecutive ? "unique_consecutive" : "unique",
                              ": not implemented for '", self.scalar_type(), "' (CPU refuses complex values too)");
  refuse_limited_dtype(consecutive ? "unique_consecutive" : "_unique2", self.scalar_type());
  at::Tensor none = at::empty({0}, self.options().dtype(at::kLong));
  int64_t n = self.numel();
  if (n == 0)
    return {at::empty({0}, self.options()), want_inverse ? at::empty(self.sizes(), none.options()) : none,
            want_counts ? at::empty({0}, none.options()) : none};
  note_synchronizing_op(consecutive ? "aten::unique_consecutive" : "aten::unique");  // the output size depends on values
  ReadOfComputed now({self});
  int dev = device_index(self);
  Type it = type_of(self, "unique");
  auto res = run_internal(std::string(consecutive ? "unique_consecutive:" : "unique:") + it.str(),
                          [&](Builder& b) {
    Value x = b.reshape(b.param(it), {n});
    if (x.dtype() == DType::Bool) x = b.convert(x, DType::U8);
    Type lt{DType::I64, {n}};
    Value pos = b.iota(lt, 0), perm = pos, s = x;
    if (!consecutive) {
      auto sorted = lowering::search::sort_nan_last(b, x, 0);
      s = sorted[0];
      perm = sorted[1];
    }
    Value prev = b.slice(b.pad(s, b.constant(0, s.dtype()), {1}, {0}, {0}), {0}, {n}, {1});
    Value first = b.binary("stablehlo.or", b.compare(pos, b.constant(0, DType::I64, {n}), ir::Cmp::EQ),
                           b.compare(s, prev, ir::Cmp::NE));
    Value one = b.constant(1, DType::I64, {n});
    Value group = lowering::sub(b, prefix_sum(b, b.convert(first, DType::I64)), one);
    Value count = lowering::reduce_sum(b, b.convert(first, DType::I64), {0});
    Value slot = b.select(first, group, b.constant(double(n), DType::I64, {n}));
    Value values = scatter_1d(b, b.constant(0, s.dtype(), {n}), slot, s, false);
    Value inverse = scatter_1d(b, b.constant(0, DType::I64, {n}), perm, group, false);
    Value counts = scatter_1d(b, b.constant(0, DType::I64, {n}), group, one, true);
    return std::vector<Value>{b.convert(values, it.dtype), inverse, counts, count};
  }, {dense_value(self)}, dev);
  int64_t k = read_count(resolve(res[3]));
  at::Tensor values = wrap_value(res[0], self.scalar_type(), {n}, dev).narrow(0, 0, k);
  at::Tensor inverse = want_inverse ? wrap_value(res[1], at::kLong, self.sizes(), dev) : none;
  at::Tensor counts = want_counts ? wrap_value(res[2], at::kLong, {n}, dev).narrow(0, 0, k) : none;
  return {values, inverse, counts};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique2_tpu(const at::Tensor& self, bool, bool inverse,
                                                           bool counts) {
  return guarded([&] { return unique_impl(self, false, inverse, counts); });
}

std::tuple<at::Tensor, at::Tensor> unique_tpu(const at::Tensor& self, bool, bool inverse) {
  return guarded([&] {
    auto r = unique_impl(self, false, inverse, false);
    return std::make_tuple(std::get<0>(r), std::get<1>(r));
  });
}

// Rows of [n, m] `x` in lexicographic order: one stable sort per column, last column
// first, in a loop over the columns (the program's size does not grow with m).
Value lexicographic_order(Builder& b, const Value& x) {
  int64_t n = x.shape()[0], m = x.shape()[1];
  Value cols = b.transpose(x, {1, 0});
  auto st = b.while_loop({b.constant(double(m - 1), DType::I64), b.iota(Type{DType::I64, {n}}, 0), cols},
                         [](Builder& q, const std::vector<Value>& v) {
    return std::vector<Value>{q.compare(v[0], q.constant(0, DType::I64), ir::Cmp::GE)};
  }, [n](Builder& q, const std::vector<Value>& v) {
    Value col = q.reshape(q.dynamic_slice(v[2], {v[0], q.constant(0, DType::I64)}, {1, n}), {n});
    auto sorted = q.sort({lowering::search::gather_flat(q, col, v[1]), v[1]}, 0, true,
                         [](Builder& r, const std::vector<Value>& a) {
      return std::vector<Value>{r.compare(a[0], a[1], ir::Cmp::LT)};
    });
    return std::vector<Value>{lowering::sub(q, v[0], q.constant(1, DType::I64)), sorted[1], v[2]};
  });
  return st[1];
}

// Rows of [n, m] `x` at the int64 positions `at` ([n]).
Value gather_rows(Builder& b, const Value& x, const Value& at) {
  int64_t n = at.shape()[0], m = x.shape()[1];
  return b.gather(x, b.reshape(at, {n, 1}), {1}, {0}, {0}, 1, {1, m}, {n, m});
}

// Unique slices of `self` along `dim` (unique_dim; unique_consecutive with a dim): the
// slices are the rows of an [n, m] matrix, sorted lexicographically unless
// `consecutive`; a group starts where a row differs from the one before in any column
// (so a row holding NaN is its own, as CPU). Values, inverse and counts are all
// returned, as CPU does whatever is asked. Empty where CPU's order cannot be followed:
// sorted rows holding NaN, which std::sort's comparisons leave in an order of its own.
std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> unique_slices(const at::Tensor& self, int64_t dim,
                                                                             bool consecutive) {
  dim = at::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK_NOT_IMPLEMENTED(!self.is_complex(), "\"unique_dim\" not implemented for '", self.scalar_type(), "'");
  refuse_limited_dtype("unique_dim", self.scalar_type());
  at::TensorOptions lo = self.options().dtype(at::kLong);
  if (self.numel() == 0) {
    int64_t zero_dims = 0;
    for (int64_t s : self.sizes()) zero_dims += s == 0;
    TORCH_CHECK(zero_dims == 1, "Number of zero sized dimensions is more than one, so unique cannot be applied ");
    TORCH_CHECK(self.size(dim) == 0, "There are 0 sized dimensions, and they aren't selected, so unique cannot be applied");
    return std::make_tuple(at::empty(self.sizes(), self.options()), at::empty({0}, lo), at::empty({0}, lo));
  }
  note_synchronizing_op("aten::unique_dim");  // the output size depends on values
  ReadOfComputed now({self});
  int dev = device_index(self);
  Type it = type_of(self, "unique_dim");
  int64_t n = self.size(dim), m = self.numel() / n;
  std::vector<int64_t> order{dim};
  std::vector<int64_t> moved{n};
  for (int64_t d = 0; d < self.dim(); ++d)
    if (d != dim) {
      order.push_back(d);
      moved.push_back(self.size(d));
    }
  std::string key = std::string(consecutive ? "unique_consecutive_dim:" : "unique_dim:") + it.str() + ":" +
                    std::to_string(dim);
  auto res = run_internal(key, [&](Builder& b) {
    Value x = b.reshape(b.transpose(b.param(it), order), {n, m});
    if (x.dtype() == DType::Bool) x = b.convert(x, DType::U8);
    Type lt{DType::I64, {n}};
    Value pos = b.iota(lt, 0), perm = consecutive ? pos : lexicographic_order(b, x);
    Value no = b.constant(0, DType::Bool);
    Value has_nan = consecutive ? no : b.reduce(lowering::search::is_nan(b, x), no, {0, 1}, "stablehlo.or");
    Value s = gather_rows(b, x, perm);
    Value prev = b.slice(b.pad(s, b.constant(0, s.dtype()), {1, 0}, {0, 0}, {0, 0}), {0, 0}, {n, m}, {1, 1});
    Value differs = b.reduce(b.compare(s, prev, ir::Cmp::NE), no, {1}, "stablehlo.or");
    Value first = b.binary("stablehlo.or", b.compare(pos, b.constant(0, DType::I64, {n}), ir::Cmp::EQ), differs);
    Value one = b.constant(1, DType::I64, {n});
    Value group = lowering::sub(b, prefix_sum(b, b.convert(first, DType::I64)), one);
    Value count = lowering::reduce_sum(b, b.convert(first, DType::I64), {0});
    Value slot = b.select(first, group, b.constant(double(n), DType::I64, {n}));
    Value first_row = scatter_1d(b, b.constant(0, DType::I64, {n}), slot, perm, false);
    Value values = b.reshape(b.convert(gather_rows(b, x, first_row), it.dtype), moved);
    Value inverse = scatter_1d(b, b.constant(0, DType::I64, {n}), perm, group, false);
    Value counts = scatter_1d(b, b.constant(0, DType::I64, {n}), group, one, true);
    Value stats = b.concatenate({b.reshape(count, {1}), b.reshape(b.convert(has_nan, DType::I64), {1})}, 0);
    return std::vector<Value>{values, inverse, counts, stats};
  }, {dense_value(self)}, dev);
  int64_t st[2] = {0, 0};
  runtime::Client::get().to_host(*resolve(res[3]), st, sizeof(st));
  if (st[1]) return std::nullopt;
  at::Tensor values = wrap_value(res[0], self.scalar_type(), moved, dev).narrow(0, 0, st[0]).movedim(0, dim);
  return std::make_tuple(values, wrap_value(res[1], at::kLong, {n}, dev),
                         wrap_value(res[2], at::kLong, {n}, dev).narrow(0, 0, st[0]));
}

// The boxed ops with a dim: their results replace the `nargs` arguments, or the
// counted fallback runs where unique_slices cannot follow CPU.
void unique_slices_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t nargs,
                         int64_t dim, bool consecutive) {
  at::Tensor self = torch::jit::peek(*stack, 0, nargs).toTensor();
  auto r = guarded([&] { return unique_slices(self, dim, consecutive); });
  if (!r) return run_fallback(op, stack, "sorted unique rows holding NaN");
  torch::jit::drop(*stack, nargs);
  stack->push_back(std::get<0>(*r));
  stack->push_back(std::get<1>(*r));
  stack->push_back(std::get<2>(*r));
}

// unique_dim(self, dim, sorted, return_inverse, return_counts): always sorted, as CPU.
void unique_dim_tpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  unique_slices_boxed(op, stack, 5, torch::jit::peek(*stack, 1, 5).toInt(), false);
}

void unique_consecutive_tpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 4);
  if (!args[3].isNone()) return unique_slices_boxed(op, stack, 4, args[3].toInt(), true);
  at::Tensor self = args[0].toTensor();
  bool inverse = args[1].toBool(), counts = args[2].toBool();
  auto r = guarded([&] { return unique_impl(self, true, inverse, counts); });
  torch::jit::drop(*stack, 4);
  stack->push_back(std::get<0>(r));
  stack->push_back(std::get<1>(r));
  stack->push_back(std::get<2>(r));
}

// repeat_interleave(repeats): i repeated repeats[i] times. The total (and the check
// that no count is negative) is read from the device first; a second program,
// one per total, spreads the indices: out[j] = #{i : cumsum(repeats)[i] <= j}.
at::Tensor repeat_interleave_tpu(const at::Tensor& repeats, std::optional<c10::SymInt> output_size) {
  TORCH_CHECK(repeats.dim() == 1, "repeat_interleave only accept 1D vector as repeat");
  TORCH_CHECK(repeats.scalar_type() == at::kLong || repeats.scalar_type() == at::kInt,
              "repeats has to be Long or Int tensor");
  return guarded([&] {
    note_synchronizing_op("aten::repeat_interleave");  // the output size depends on values
    ReadOfComputed now({repeats});
    int64_t n = repeats.numel();
    int dev = device_index(repeats);
    if (n == 0) return at::empty({0}, repeats.options());
    Type rt = type_of(repeats, "repeat_interleave");
    auto stats = run_internal("repeat_interleave_total:" + rt.str(), [&](Builder& b) {
      Value r = b.convert(b.param(rt), DType::I64);
      Value neg = b.compare(r, b.constant(0, DType::I64, {n}), ir::Cmp::LT);
      Value bad = lowering::reduce_sum(b, b.convert(neg, DType::I64), {0});
      Value total = lowering::reduce_sum(b, r, {0});
      return std::vector<Value>{b.concatenate({b.reshape(total, {1}), b.reshape(bad, {1})}, 0)};
    }, {dense_value(repeats)}, dev);
    int64_t st[2] = {0, 0};
    runtime::Client::get().to_host(*resolve(stats[0]), st, sizeof(st));
    TORCH_CHECK(st[1] == 0, "repeats can not be negative");
    int64_t total = st[0];
    if (output_size.has_value())
      TORCH_CHECK(output_size->expect_int() == total, "allocated size does not match required size");
    if (total == 0) return at::empty({0}, repeats.options());
    at::detail::computeStorageNbytesContiguous({total}, c10::elementSize(repeats.scalar_type()));
    auto res = run_internal("repeat_interleave:" + rt.str() + ":" + std::to_string(total), [&](Builder& b) {
      Value cs = prefix_sum(b, b.convert(b.param(rt), DType::I64));
      Value marks = scatter_1d(b, b.constant(0, DType::I64, {total + 1}), cs, b.constant(1, DType::I64, {n}), true);
      Value out = prefix_sum(b, b.slice(marks, {0}, {total}, {1}));
      return std::vector<Value>{b.convert(out, rt.dtype)};
    }, {dense_value(repeats)}, dev);
    return wrap_value(res[0], repeats.scalar_type(), {total}, dev);
  });
}

// The out= forms: the result made as above, then written into `out` (resized, with CPU's
// warning when it had other elements), after CPU's dtype checks.
at::Tensor& nonzero_out_tpu(const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == at::kLong, "nonzero: Expected out tensor to have scalar type Long but got scalar type",
              out.scalar_type());
  at::Tensor r = nonzero_tpu(self);
  at::native::resize_output(out, r.sizes());
  return out.copy_(r);
}

at::Tensor& masked_select_out_tpu(const at::Tensor& self, const at::Tensor& mask, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "masked_select(): self and result must have the same scalar type");
  at::Tensor r = masked_select_tpu(self, mask);
  at::native::resize_output(out, r.sizes());
  return out.copy_(r);
}

// bincount(self, weights, minlength): the length (largest value + 1, at least minlength)
// and the check that no value is negative are read from the device first; a second
// program, one per length, adds each entry's weight (or 1) at its value.
at::Tensor bincount_tpu(const at::Tensor& self, const std::optional<at::Tensor>& weights_opt, int64_t minlength) {
  TORCH_CHECK(minlength >= 0, "minlength should be >= 0");
  TORCH_CHECK_NOT_IMPLEMENTED(c10::isIntegralType(self.scalar_type(), /*includeBool=*/false),
                              "\"bincount\" not implemented for '", self.scalar_type(), "'");
  TORCH_CHECK(self.dim() == 1, "bincount only supports 1-d non-negative integral inputs.");
  const at::Tensor* weights = weights_opt.has_value() && weights_opt->defined() ? &*weights_opt : nullptr;
  if (weights) check_same_device({self, *weights});
  TORCH_CHECK(!weights || (weights->dim() == 1 && weights->numel() == self.numel()),
              "weights should be 1-d and have the same length as input");
  // CPU's and CUDA's result types: counts, float weights summed as float, others as double.
  at::ScalarType out = !weights ? at::kLong : weights->scalar_type() == at::kFloat ? at::kFloat : at::kDouble;
  return guarded([&] {
    note_synchronizing_op("aten::bincount");  // the output size depends on values
    ReadOfComputed now(weights ? std::initializer_list<std::reference_wrapper<const at::Tensor>>{self, *weights}
                               : std::initializer_list<std::reference_wrapper<const at::Tensor>>{self});
    int64_t n = self.numel();
    int dev = device_index(self);
    if (n == 0) return at::zeros({minlength}, self.options().dtype(out));
    Type it = type_of(self, "bincount");
    auto stats = run_internal("bincount_range:" + it.str(), [&](Builder& b) {
      Value x = b.convert(b.param(it), DType::I64);
      Value hi = lowering::reduce_max(b, x, {0}), lo = lowering::reduce_min(b, x, {0});
      return std::vector<Value>{b.concatenate({b.reshape(hi, {1}), b.reshape(lo, {1})}, 0)};
    }, {dense_value(self)}, dev);
    int64_t st[2] = {0, 0};
    runtime::Client::get().to_host(*resolve(stats[0]), st, sizeof(st));
    TORCH_CHECK(st[1] >= 0, "bincount only supports 1-d non-negative integral inputs.");
    TORCH_CHECK(st[0] < std::numeric_limits<int64_t>::max(), "maximum value of input overflowed, it should be < ",
                std::numeric_limits<int64_t>::max(), " but got ", st[0]);
    int64_t len = std::max(st[0] + 1, minlength);
    at::detail::computeStorageNbytesContiguous({len}, c10::elementSize(out));  // CPU's overflow error
    DType od = device_dtype(out, "bincount");
    std::vector<Operand> args{dense_value(self)};
    std::string key = "bincount:" + it.str() + ":" + std::to_string(len);
    Type wt;
    if (weights) {
      wt = type_of(*weights, "bincount");
      args.push_back(dense_value(*weights));
      key += ":" + wt.str();
    }
    auto res = run_internal(key, [&](Builder& b) {
      Value at = b.convert(b.param(it), DType::I64);
      Value upd = weights ? b.convert(b.param(wt), od) : b.constant(1, od, {n});
      return std::vector<Value>{scatter_1d(b, b.constant(0, od, {len}), at, upd, true)};
    }, args, dev);
    return wrap_value(res[0], out, {len}, dev);
  });
}

}  // namespace

// Boolean masks among an op's Tensor?[] indices become the long coordinates of their
// true entries (PyTorch's own rule), then the op runs again on this backend.
bool redispatch_with_mask_coordinates(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t nargs = schema.arguments().size();
  bool changed = false;
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& v = (*stack)[stack->size() - nargs + i];
    if (!v.isList() || v.toList().elementType()->kind() != c10::TypeKind::OptionalType) continue;
    c10::List<std::optional<at::Tensor>> out;
    auto l = v.toOptionalTensorList();
    for (size_t j = 0; j < l.size(); ++j) {
      std::optional<at::Tensor> t = l.get(j);
      if (t.has_value() && t->defined() && (t->scalar_type() == at::kBool || t->scalar_type() == at::kByte)) {
        at::Tensor coords = nonzero_tpu(t->to(at::kBool));
        for (int64_t d = 0; d < t->dim(); ++d) out.push_back(coords.select(1, d));
        changed = true;
      } else {
        out.push_back(t);
      }
    }
    v = out;
  }
  if (changed) op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), stack);
  return changed;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("nonzero", nonzero_tpu);
  m.impl("masked_select", masked_select_tpu);
  m.impl("equal", equal_tpu);
  m.impl("_unique2", unique2_tpu);
  m.impl("_unique", unique_tpu);
  m.impl("unique_consecutive", torch::CppFunction::makeFromBoxedFunction<&unique_consecutive_tpu>());
  m.impl("unique_dim", torch::CppFunction::makeFromBoxedFunction<&unique_dim_tpu>());
  m.impl("repeat_interleave.Tensor", repeat_interleave_tpu);
  m.impl("bincount", bincount_tpu);
  m.impl("nonzero.out", nonzero_out_tpu);
  m.impl("masked_select.out", masked_select_out_tpu);
}

}  // namespace tpu::backend
