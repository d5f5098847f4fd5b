// Factories that compute their values on the device.
#include "lowering/helpers.h"

namespace tpu::lowering {

// arange: start + i * step. The length comes from PyTorch's meta kernel (the out
// tensor's size); start and step are runtime operands, so ranges share a program.
TPU_LOWER(arange_start_out, "arange.start_out") {
  Type t = ctx.out(0);
  DType compute = is_float(t.dtype) ? (t.dtype == DType::F64 ? DType::F64 : DType::F32) : DType::I64;
  Value start = ctx.scalar(0, compute), step = ctx.scalar(2, compute);
  Value i = ctx.b.iota(Type{compute, t.shape}, 0);
  Value v = add(ctx.b, broadcast_to(ctx.b, start, t.shape), mul(ctx.b, i, broadcast_to(ctx.b, step, t.shape)));
  return {ctx.b.convert(v, t.dtype)};
}

}  // namespace tpu::lowering
