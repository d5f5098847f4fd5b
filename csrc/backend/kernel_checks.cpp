#include "backend/kernel_checks.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <unordered_map>

namespace tpu::backend {

namespace {

// index_put_(self, indices, values[, accumulate]): CPU's and CUDA's kernels write values
// without a cast, except one value on the CPU through one boolean mask on self's device,
// which they fill with masked_fill_ (that casts).
void index_put_values_dtype(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 3 || !args[0].isTensor() || !args[2].isTensor()) return;
  const at::Tensor& v = args[2].toTensor();
  bool accumulate = args.size() > 3 && args[3].isBool() && args[3].toBool();
  if (!accumulate && v.numel() == 1 && v.is_cpu() && args[1].isList()) {
    int masks = 0, others = 0;
    for (const c10::IValue& i : args[1].toListRef()) {
      if (!i.isTensor() || !i.toTensor().defined()) continue;
      const at::Tensor& t = i.toTensor();
      bool mask = (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte) &&
                  t.device() == args[0].toTensor().device();
      (mask ? masks : others) += 1;
    }
    if (masks == 1 && others == 0) return;
  }
  c10::ScalarType self = args[0].toTensor().scalar_type(), values = v.scalar_type();
  TORCH_CHECK(self == values, "Index put requires the source and destination dtypes match, got ", self,
              " for the destination and ", values, " for the source.");
}

}  // namespace

KernelCheck kernel_check_for(const std::string& base) {
  static const std::unordered_map<std::string, KernelCheck> checks = {
      {"index_put", &index_put_values_dtype},
      {"_index_put_impl", &index_put_values_dtype},
  };
  auto it = checks.find(base);
  return it == checks.end() ? nullptr : it->second;
}

}  // namespace tpu::backend
