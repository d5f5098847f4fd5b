// Random ops that PyTorch implements per backend and that are compositions of lowered
// ops here, so their draws come from the tpu generator and nothing crosses to the host.
#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <optional>

namespace tpu::backend {
namespace {

// rrelu_with_noise's argument checks, as CPU's kernel makes them. Half and bfloat16
// are computed (CUDA's kernel takes them; CPU's refuses).
void check_rrelu(const at::Tensor& self, const at::Tensor& noise) {
  TORCH_CHECK(self.sizes() == noise.sizes(), "noise tensor shape must match self tensor shape. Got self.shape = ",
              self.sizes(), " noise.shape = ", noise.sizes());
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(self.scalar_type()), "\"rrelu_with_noise_out_cpu\" not implemented for '",
                              self.scalar_type(), "'");
  TORCH_CHECK(noise.scalar_type() == self.scalar_type(), "expected scalar type ", self.scalar_type(),
              " but found ", noise.scalar_type());
}

// Training: each element <= 0 is scaled by a slope drawn from U(lower, upper), which
// `noise` records (1 elsewhere, for the backward). Evaluation: leaky_relu with the
// mean slope, `noise` untouched.
at::Tensor rrelu_with_noise_tpu(const at::Tensor& self, at::Tensor& noise, const at::Scalar& lower,
                                const at::Scalar& upper, bool training, std::optional<at::Generator> gen) {
  check_rrelu(self, noise);
  double lo = lower.toDouble(), hi = upper.toDouble();
  if (!training) return at::leaky_relu(self, (lo + hi) / 2);
  TORCH_CHECK(lo <= hi, "Expected from <= to to be true, but got false.  (Could this error message be improved?  "
              "If so, please report an enhancement request to PyTorch.)");
  at::Tensor slope = at::empty_like(self).uniform_(lo, hi, gen);
  at::Tensor scaled = self.le(0);
  at::Tensor out = at::where(scaled, self * slope, self);
  noise.copy_(at::where(scaled, slope, at::ones({}, slope.options())));
  return out;
}

at::Tensor& rrelu_with_noise_inplace_tpu(at::Tensor& self, at::Tensor& noise, const at::Scalar& lower,
                                         const at::Scalar& upper, bool training, std::optional<at::Generator> gen) {
  return self.copy_(rrelu_with_noise_tpu(self, noise, lower, upper, training, gen));
}

at::Tensor& rrelu_with_noise_out_tpu(const at::Tensor& self, at::Tensor& noise, const at::Scalar& lower,
                                     const at::Scalar& upper, bool training, std::optional<at::Generator> gen,
                                     at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "expected scalar type ", self.scalar_type(),
              " but found ", out.scalar_type());
  at::Tensor r = rrelu_with_noise_tpu(self, noise, lower, upper, training, gen);
  at::native::resize_output(out, r.sizes());
  return out.copy_(r);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("rrelu_with_noise", rrelu_with_noise_tpu);
  m.impl("rrelu_with_noise_", rrelu_with_noise_inplace_tpu);
  m.impl("rrelu_with_noise.out", rrelu_with_noise_out_tpu);
}

}  // namespace tpu::backend
