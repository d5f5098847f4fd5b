// Range factories' values, shared with the rules that build ranges (histogram edges).
#pragma once
#include "lowering/helpers.h"

namespace tpu::lowering {

// CPU's linspace of `steps` values in dtype t from scalars start and end (any real
// dtype; they are first converted to t as Scalar::to<t> does: integers truncate). The
// step is (end - start) / (steps - 1), in double for integer t; the first half counts up
// from start, the rest down from end. bf16/f16 round every operation to the dtype
// (c10::Half arithmetic); f32 adds the exact product once rounded (as an fma), so it may
// differ from a CPU build without fma contraction by an ulp.
Value linspace_values(Builder& b, const Value& start, const Value& end, int64_t steps, DType t);

}  // namespace tpu::lowering
