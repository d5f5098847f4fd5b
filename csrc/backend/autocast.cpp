// Autocast for `tpu` (`torch.autocast("tpu", dtype=torch.bfloat16)`): PyTorch routes
// calls through the AutocastPrivateUse1 key but registers no kernels there, so without
// this file every op under autocast fails. We register the policy lists PyTorch
// publishes for backends to reuse (ATen/autocast_mode.h), the same lists CUDA uses:
// contractions, convolutions, RNN cells and attention run in the autocast dtype;
// numerically touchy ops (exp/log, norms, softmax, losses, sums) in float32; ops
// mixing inputs promote to the widest type. Every other op falls through.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace tpu::backend {
namespace {

// The published signature lists name these unqualified (they live in at::autocast).
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

// Like CUDA: binary_cross_entropy on bf16/fp16 probabilities is unsafe, so it is
// refused under autocast with the fix named.
at::Tensor binary_cross_entropy_refused(const at::Tensor&, const at::Tensor&,
                                        const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast on tpu (as on CUDA): the sigmoid before them loses precision in "
              "bfloat16/float16. Use torch.nn.functional.binary_cross_entropy_with_logits or "
              "torch.nn.BCEWithLogitsLoss, which are safe to autocast.");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

#define TPU_AUTOCAST_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPU_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TPU_AUTOCAST_FP32_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TPU_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(TPU_AUTOCAST_LOWER)
  AT_FORALL_FP32(TPU_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPU_AUTOCAST_FP32_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(TPU_AUTOCAST_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN(binary_cross_entropy_refused));
}

}  // namespace
}  // namespace tpu::backend
