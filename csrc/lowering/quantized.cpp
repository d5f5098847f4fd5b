// Quantized matrix products: fp8 `_scaled_mm` and the int8 ones (`_int_mm`,
// `_weight_int8pack_mm`). Low-precision operands go to dot_general as they are, with a
// wide result type (f32 / i32): TPU matrix units take them natively, and the scales
// are applied to the accumulated product, per row and per column.
#include <stdexcept>
#include <string>

#include "lowering/helpers.h"

namespace tpu::lowering {

// a [M,K] . b [K,N] accumulated in `acc`. Operands of one element type are contracted
// as they are; mixed ones (e4m3 x e5m2, uint8 x int8) meet in the accumulation type.
static Value product(Builder& b, Value x, Value y, DType acc) {
  if (x.dtype() != y.dtype()) {
    x = b.convert(x, acc);
    y = b.convert(y, acc);
  }
  return b.dot_general(x, y, {}, {}, {1}, {0}, acc);
}

// _scaled_mm(self, mat2, scale_a, scale_b, bias?, scale_result?, out_dtype?, use_fast_accum):
// out = (self . mat2) * scale_a * scale_b + bias, divided by scale_result when out_dtype
// is given as e4m3fn or e5m2 (what CPU does with it), cast to out_dtype (default: self's). Scales are
// tensorwise (one element each) or row-wise: scale_a [M,1] and scale_b [1,N].
// use_fast_accum is a hint (as on CPU): the product always accumulates in f32.
TPU_LOWER(scaled_mm, "_scaled_mm") {
  Builder& b = ctx.b;
  Value a = ctx.in(0), m2 = ctx.in(1), sa = ctx.in(2), sb = ctx.in(3);
  const std::string op = "aten::_scaled_mm";
  if (!is_fp8(a.dtype()) || !is_fp8(m2.dtype()))
    throw std::invalid_argument(op + ": expected self and mat2 to be float8 tensors, got " +
                                mlir_name(a.dtype()) + " and " + mlir_name(m2.dtype()));
  int64_t m = a.shape()[0], n = m2.shape()[1];
  bool tensorwise = sa.type.numel() == 1 && sb.type.numel() == 1;
  bool rowwise = sa.shape() == Shape{m, 1} && sb.shape() == Shape{1, n};
  if (sa.dtype() != DType::F32 || sb.dtype() != DType::F32 || !(tensorwise || rowwise))
    throw std::invalid_argument(
        op + ": invalid scaling configuration: tensorwise scales are float32 with one element each; "
        "row-wise scales are float32 with scale_a of shape [" + std::to_string(m) + ", 1] and scale_b of shape [1, " +
        std::to_string(n) + "]; got scale_a " + mlir_name(sa.dtype()) + shape_text(sa.shape()) + " and scale_b " +
        mlir_name(sb.dtype()) + shape_text(sb.shape()));
  Type o = ctx.out(0);
  Value acc = product(b, a, m2, DType::F32);
  // Tensorwise scales are [] or [1], [1,1]: as scalars; row-wise broadcast along their dim.
  Value scale = tensorwise ? broadcast_to(b, mul(b, b.reshape(sa, {}), b.reshape(sb, {})), o.shape)
                           : mul(b, b.broadcast_in_dim(b.reshape(sa, {m}), o.shape, {0}),
                                 b.broadcast_in_dim(b.reshape(sb, {n}), o.shape, {1}));
  Value out = mul(b, acc, scale);
  if (!ctx.is_none(4)) {
    Value bias = ctx.in(4);
    if (bias.rank() > 2 || (bias.rank() >= 1 && bias.shape().back() != n && bias.shape().back() != 1))
      throw std::invalid_argument(op + ": bias of shape " + shape_text(bias.shape()) +
                                  " does not broadcast to the output's [" + std::to_string(m) + ", " +
                                  std::to_string(n) + "]");
    out = add(b, out, coerce(b, bias, DType::F32, o.shape));
  }
  // CPU divides by scale_result only for an explicit out_dtype of e4m3fn or e5m2.
  bool result_scaled = !ctx.is_none(6) && (o.dtype == DType::F8E4M3FN || o.dtype == DType::F8E5M2);
  if (!ctx.is_none(5) && result_scaled) {
    Value sr = ctx.in(5);
    if (sr.type.numel() != 1)
      throw std::invalid_argument(op + ": scale_result must have one element, got shape " + shape_text(sr.shape()));
    out = div(b, out, broadcast_to(b, b.reshape(b.convert(sr, DType::F32), {}), o.shape));
  }
  return {convert_any(b, out, o.dtype)};
}

// _int_mm(self int8/uint8 [M,K], mat2 int8 [K,N]) -> int32, exact.
TPU_LOWER(int_mm, "_int_mm") {
  return {ctx.b.convert(product(ctx.b, ctx.in(0), ctx.in(1), DType::I32), ctx.out(0).dtype)};
}

// _weight_int8pack_mm(x [M,K] f32/f16/bf16, w int8 [N,K], scales [N]) -> x's dtype:
// (x . w^T) * scales, accumulated and scaled in f32 and rounded once (as CPU's kernel).
TPU_LOWER(weight_int8pack_mm, "_weight_int8pack_mm") {
  Builder& b = ctx.b;
  Value x = ctx.in(0), w = ctx.in(1), s = ctx.in(2);
  if (s.dtype() != x.dtype())
    throw std::invalid_argument(std::string("aten::_weight_int8pack_mm: expected scales of x's dtype ") +
                                mlir_name(x.dtype()) + ", got " + mlir_name(s.dtype()));
  Type o = ctx.out(0);
  Value acc = b.dot_general(b.convert(x, DType::F32), b.convert(w, DType::F32), {}, {}, {1}, {1}, DType::F32);
  Value scaled = mul(b, acc, b.broadcast_in_dim(b.convert(s, DType::F32), o.shape, {1}));
  return {b.convert(scaled, o.dtype)};
}

}  // namespace tpu::lowering
