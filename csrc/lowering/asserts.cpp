// Device-side asserts: _assert_async (what torch._check_tensor_all and transformers'
// compile-friendly checks become under torch.compile). As on CUDA the condition stays
// on the device: a zero is raised at the next synchronization (at once in Debug mode).
#include "lowering/helpers.h"

namespace tpu::lowering {

TPU_LOWER(assert_async, "_assert_async", "_assert_async.msg") {
  Builder& b = ctx.b;
  Type t = ctx.type_of(0);
  if (t.numel() != 1)  // CPU asks for the tensor's truth value first
    throw std::invalid_argument("Boolean value of Tensor with more than one value is ambiguous");
  if (is_complex(t.dtype)) throw Unsupported("_assert_async of a complex value");
  Value x = b.reshape(ctx.in(0), {});
  Value nonzero = b.compare(x, b.constant(0, t.dtype, {}), ir::Cmp::NE);  // NaN is nonzero
  std::string message = ctx.num_args() > 1 && !ctx.is_none(1)
                            ? ctx.str(1)
                            : std::string("Expected Tensor with single nonzero value, but got zero");
  ctx.check(nonzero, "RuntimeError: " + message);
  return {};
}

}  // namespace tpu::lowering
