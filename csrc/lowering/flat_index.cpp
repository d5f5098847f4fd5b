// Ops that address a tensor as if flattened: take, put, nonzero_static; and
// hash_tensor.
#include "lowering/search_util.h"

namespace tpu::lowering {

using ir::Cmp;
using namespace search;

// Flat positions of `index` into n elements: negative ones wrap; out of range ones
// are an error (an IndexError at the next synchronization), never a clamped access.
static Value flat_positions(Ctx& ctx, const Value& index, int64_t n) {
  Builder& b = ctx.b;
  check_in_range(ctx, index, -n, n,
            "aten::" + ctx.op() + ": out of range: index out of bounds for a tensor of " +
                std::to_string(n) + " elements");
  Value x = b.convert(index, DType::I64);
  Value neg = b.compare(x, b.constant(0, DType::I64, x.shape()), Cmp::LT);
  return b.select(neg, add(b, x, b.constant(double(n), DType::I64, x.shape())), x);
}

TPU_LOWER(take, "take") {
  Builder& b = ctx.b;
  Value self = ctx.in(0), index = ctx.in(1);
  int64_t n = self.type.numel(), m = index.type.numel();
  Type out = ctx.out(0);
  if (m == 0) return {b.constant(0, out.dtype, out.shape)};
  if (n == 0) throw Unsupported("take from an empty tensor");  // CPU's own error
  Value pos = flat_positions(ctx, index, n);
  return {b.reshape(gather_flat(b, b.reshape(self, {n}), pos), out.shape)};
}

// put(self, index, source, accumulate): source's elements written (or added) at the
// flat positions; repeated positions keep the last write, as CPU's serial loop.
TPU_LOWER(put, "put") {
  Builder& b = ctx.b;
  Value self = ctx.in(0), index = ctx.in(1);
  int64_t n = self.type.numel(), m = index.type.numel();
  if (m == 0) return {self};
  if (n == 0) throw Unsupported("put into an empty tensor");
  bool acc = ctx.flag_or(3, false);
  Value pos = b.reshape(flat_positions(ctx, index, n), {m, 1});
  DType t = self.dtype();
  Value src = b.reshape(b.convert(ctx.in(2), t), {m});
  Value r = b.scatter(b.reshape(self, {n}), pos, src, {}, {0}, {0}, 1,
                      [acc](Builder& q, const std::vector<Value>& a) {
    if (!acc) return std::vector<Value>{a[1]};
    const char* op = a[0].dtype() == DType::Bool ? "stablehlo.or" : "stablehlo.add";
    return std::vector<Value>{q.binary(op, a[0], a[1])};
  });
  return {b.reshape(r, self.shape())};
}

// nonzero_static(self, size, fill_value): the first `size` coordinates of nonzero
// elements in row-major order, rows past the count filled with fill_value.
TPU_LOWER(nonzero_static, "nonzero_static") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  Type out = ctx.out(0);
  int64_t n = x.type.numel(), r = x.rank(), size = out.shape[0];
  int64_t fill = ctx.i_or(2, -1);
  if (size == 0 || r == 0) return {b.constant(0, DType::I64, out.shape)};  // no elements
  Value filled = b.constant(double(fill), DType::I64, out.shape);
  if (n == 0) return {filled};
  Value mask = b.convert(b.reshape(x, {n}), DType::Bool);
  Value key = b.select(mask, b.constant(0, DType::I32, {n}), b.constant(1, DType::I32, {n}));
  auto sorted = b.sort({key, b.iota(Type{DType::I64, {n}}, 0)}, 0, true,
                       [](Builder& q, const std::vector<Value>& a) {
    return std::vector<Value>{q.compare(a[0], a[1], Cmp::LT)};
  });
  Value order = sorted[1];
  Value count = reduce_sum(b, b.convert(mask, DType::I64), {0});
  // Fit to `size` rows: cut, or pad (the padded rows are past the count anyway).
  if (size <= n) order = b.slice(order, {0}, {size}, {1});
  else order = b.pad(order, b.constant(0, DType::I64), {0}, {size - n}, {0});
  Shape strides = ir::contiguous_strides(x.shape());
  std::vector<Value> cols;
  for (int64_t d = 0; d < r; ++d) {
    Value q = b.binary("stablehlo.divide", order, b.constant(double(strides[d]), DType::I64, {size}));
    Value c = b.binary("stablehlo.remainder", q, b.constant(double(x.shape()[d]), DType::I64, {size}));
    cols.push_back(b.reshape(c, {size, 1}));
  }
  Value coords = b.concatenate(cols, 1);
  Value row = b.iota(Type{DType::I64, out.shape}, 0);
  Value valid = b.compare(row, broadcast_to(b, count, out.shape), Cmp::LT);
  return {b.select(valid, coords, filled)};
}

}  // namespace tpu::lowering

namespace tpu::lowering {

// hash_tensor(self, dim, keepdim, mode 0): XOR of the elements' 64-bit patterns, as
// CPU forms them: floats widened to f64, integers (and bool) to int64, then reread
// as uint64.
TPU_LOWER(hash_tensor, "hash_tensor") {
  Builder& b = ctx.b;
  Value x = ctx.in(0);
  if (ctx.i_or(3, 0) != 0) throw Unsupported("hash_tensor mode");
  DType t = x.dtype();
  if (is_complex(t)) throw Unsupported("hash_tensor of complex");
  Value w = is_float(t) ? b.bitcast(b.convert(x, DType::F64), DType::U64)
                        : b.bitcast(b.convert(x, DType::I64), DType::U64);
  std::vector<int64_t> dims = reduce_dims(ctx.is_none(1) ? std::vector<int64_t>{} : ctx.ints(1), x.rank());
  Value r = b.reduce(w, b.constant(0, DType::U64), dims, "stablehlo.xor");
  return {b.reshape(r, ctx.out(0).shape)};
}

}  // namespace tpu::lowering
