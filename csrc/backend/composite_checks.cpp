// Checks on values that PyTorch's composite ops make only for CPU tensors (a CUDA
// tensor would need a sync). Here they stay on the device, as an _assert_async: the
// flag is read at the next synchronization (at once in Debug mode), with CPU's message.
// The wrappers sit on PrivateUse1's autograd key (and PrivateUse1 itself, for inference
// mode) and then run PyTorch's composite kernel, whose ops stay differentiable. Also
// CPU's argument checks that a composite kernel leaves out (addr, below).
#include <ATen/ATen.h>
#include <ATen/ops/addr_native.h>
#include <ATen/ops/nanquantile_native.h>
#include <ATen/ops/quantile_native.h>
#include <torch/library.h>

#include <optional>
#include <string_view>

namespace tpu::backend {
namespace {

// Whether quantile's host-side checks (argument types, dims, devices) pass: only then
// is q's range checked on the device, so a call that raises one of those leaves no
// flag behind to fail a later read.
bool quantile_args_ok(const at::Tensor& self, const at::Tensor& q, std::optional<int64_t> dim,
                      std::string_view interpolation, const at::Tensor* out) {
  static const std::string_view modes[] = {"linear", "lower", "higher", "midpoint", "nearest"};
  bool mode_ok = false;
  for (std::string_view m : modes) mode_ok = mode_ok || m == interpolation;
  int64_t rank = std::max<int64_t>(self.dim(), 1);
  bool dim_ok = !dim || (*dim >= -rank && *dim < rank);
  bool out_ok = !out || (out->scalar_type() == self.scalar_type() && out->device() == self.device());
  return mode_ok && dim_ok && out_ok && self.numel() > 0 && q.dim() <= 1 &&
         (self.scalar_type() == at::kFloat || self.scalar_type() == at::kDouble) &&
         q.scalar_type() == self.scalar_type() && q.device() == self.device();
}

// quantile() q values must be in [0, 1] (NaN fails): out of range, the composite's
// gather would report its own index error instead.
void check_q_range(const at::Tensor& self, const at::Tensor& q, std::optional<int64_t> dim,
                   std::string_view interpolation, const at::Tensor* out, const char* op) {
  if (!quantile_args_ok(self, q, dim, interpolation, out) || q.numel() == 0) return;
  at::Tensor ok = at::logical_and(q.ge(0), q.le(1)).all();
  at::_assert_async(ok, std::string(op) + "() q values must be in the range [0, 1]");
}

at::Tensor quantile(const at::Tensor& self, const at::Tensor& q, std::optional<int64_t> dim, bool keepdim,
                    c10::string_view interpolation) {
  check_q_range(self, q, dim, interpolation, nullptr, "quantile");
  return at::native::quantile(self, q, dim, keepdim, interpolation);
}

at::Tensor& quantile_out(const at::Tensor& self, const at::Tensor& q, std::optional<int64_t> dim, bool keepdim,
                         c10::string_view interpolation, at::Tensor& out) {
  check_q_range(self, q, dim, interpolation, &out, "quantile");
  return at::native::quantile_out(self, q, dim, keepdim, interpolation, out);
}

// nanquantile's message names quantile() too (they share their checks).
at::Tensor nanquantile(const at::Tensor& self, const at::Tensor& q, std::optional<int64_t> dim, bool keepdim,
                       c10::string_view interpolation) {
  check_q_range(self, q, dim, interpolation, nullptr, "quantile");
  return at::native::nanquantile(self, q, dim, keepdim, interpolation);
}

at::Tensor& nanquantile_out(const at::Tensor& self, const at::Tensor& q, std::optional<int64_t> dim,
                            bool keepdim, c10::string_view interpolation, at::Tensor& out) {
  check_q_range(self, q, dim, interpolation, &out, "quantile");
  return at::native::nanquantile_out(self, q, dim, keepdim, interpolation, out);
}

void register_quantile(torch::Library& m) {
  m.impl("quantile", TORCH_FN(quantile));
  m.impl("quantile.out", TORCH_FN(quantile_out));
  m.impl("nanquantile", TORCH_FN(nanquantile));
  m.impl("nanquantile.out", TORCH_FN(nanquantile_out));
}

// addr(self, vec1, vec2, beta, alpha): PyTorch's composite kernel (self + outer product)
// checks less than CPU's, which these wrappers run first, in CPU's order and words: the
// vectors' ranks (outer's words otherwise), self expanding to [n, m] (the sum broadcast a
// 3-D self), an in-place self of [n, m] (addr_ resized one that broadcasts), and no
// floating (or, but for bool results, boolean) beta or alpha for integral results.
void check_addr(const at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2, const at::Scalar& beta,
                const at::Scalar& alpha, bool in_place) {
  TORCH_CHECK(vec1.dim() == 1, "addr: Expected 1-D argument vec1, but got ", vec1.dim(), "-D");
  TORCH_CHECK(vec2.dim() == 1, "addr: Expected 1-D argument vec2, but got ", vec2.dim(), "-D");
  int64_t n = vec1.size(0), m = vec2.size(0);
  if (in_place) {
    TORCH_CHECK(self.dim() == 2, "2D tensor expected, got ", self.dim(), "D tensor for input");
    TORCH_CHECK(self.size(0) == n && self.size(1) == m, "size mismatch, input: ", self.sizes(), ", v1: ",
                vec1.sizes(), ", v2: ", vec2.sizes());
  } else {
    (void)self.expand({n, m});  // expand's own error (a view: nothing runs)
  }
  // The inputs' common dtype (self expanded has dimensions: no 0-dim tensor ranks lower).
  c10::ScalarType dtype = c10::promoteTypes(c10::promoteTypes(self.scalar_type(), vec1.scalar_type()),
                                            vec2.scalar_type());
  auto check_scalar = [dtype](const at::Scalar& scalar, const char* name) {
    TORCH_CHECK(!scalar.isBoolean() || dtype == at::kBool, "Boolean ", name, " only supported for Boolean results.");
    TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype) || scalar.isIntegral(/*includeBool=*/true),
                "For integral input tensors, argument ", name, " must not be a floating point number.");
  };
  check_scalar(beta, "beta");
  check_scalar(alpha, "alpha");
}

at::Tensor addr(const at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2, const at::Scalar& beta,
                const at::Scalar& alpha) {
  check_addr(self, vec1, vec2, beta, alpha, /*in_place=*/false);
  return at::native::math_addr(self, vec1, vec2, beta, alpha);
}

at::Tensor& addr_out(const at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2, const at::Scalar& beta,
                     const at::Scalar& alpha, at::Tensor& out) {
  check_addr(self, vec1, vec2, beta, alpha, /*in_place=*/false);
  return at::native::math_addr_out(self, vec1, vec2, beta, alpha, out);
}

at::Tensor& addr_(at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2, const at::Scalar& beta,
                  const at::Scalar& alpha) {
  check_addr(self, vec1, vec2, beta, alpha, /*in_place=*/true);
  return at::native::addr_(self, vec1, vec2, beta, alpha);  // addr.out into self
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { register_quantile(m); }
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  register_quantile(m);
  // (addr's autograd kernel is its own formula's, on every device.)
  m.impl("addr", TORCH_FN(addr));
  m.impl("addr.out", TORCH_FN(addr_out));
  m.impl("addr_", TORCH_FN(addr_));
}

}  // namespace tpu::backend
