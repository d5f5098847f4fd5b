// _foreach_norm (clip_grad_norm_'s per-parameter norms) as one program whose result is
// a single vector: the norms returned are its elements (0-dim views of one storage).
// XLA compiles every output of a program as a kernel of its own, so a list of hundreds
// of separate scalar results cost seconds of compile time (400 parameters: 27 s), where
// one vector costs one. torch_tpu::stacked_norms computes that vector over the tensors
// sorted by shape, so its rule reduces each run of equal shapes together.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "backend/dtype_support.h"

namespace tpu::backend {
namespace {

at::Tensor stacked_norms_meta(at::TensorList self, const at::Scalar& ord, at::ScalarType dtype) {
  return at::empty({static_cast<int64_t>(self.size())}, at::TensorOptions().dtype(dtype).device(at::kMeta));
}

// The dtype of a tensor's norm, or nullopt where the fast path does not take it: the
// per-tensor path (linalg_vector_norm) then computes it, or raises CPU's error.
std::optional<at::ScalarType> norm_dtype(const at::Tensor& t, std::optional<at::ScalarType> dtype) {
  at::ScalarType in = t.scalar_type();
  if (!at::isFloatingType(in) && !at::isComplexType(in)) return std::nullopt;
  if (is_limited_support_dtype(in)) return std::nullopt;  // float8: CPU's norm refuses it
  if (!dtype) return at::toRealValueType(in);
  if (!at::isFloatingType(*dtype) && !at::isComplexType(*dtype)) return std::nullopt;
  if (at::isComplexType(*dtype) != at::isComplexType(in)) return std::nullopt;
  if (at::promoteTypes(in, *dtype) != *dtype) return std::nullopt;  // narrowing
  return at::toRealValueType(*dtype);
}

std::vector<at::Tensor> foreach_norm_tpu(at::TensorList self, const at::Scalar& ord,
                                         std::optional<at::ScalarType> dtype) {
  TORCH_CHECK(!self.empty(), "Tensor list must have at least one tensor.");
  TORCH_CHECK(ord.isFloatingPoint() || ord.isIntegral(false), "foreach_tensor_norm_slow expects ord to be integer or float");
  const double p = ord.toDouble();
  for (const at::Tensor& t : self) {
    if (t.numel() != 0 || !std::isinf(p)) continue;
    TORCH_CHECK(p < 0, "_foreach_norm cannot compute the infinity norm on an empty tensor because the operation "
                "does not have an identity");
    TORCH_CHECK(false, "linalg.vector_norm cannot compute the -inf norm on an empty tensor because the operation "
                "does not have an identity");
  }

  // The tensors the fast path takes, by their norms' dtype; the rest one at a time.
  const c10::Device device = self[0].device();
  std::map<at::ScalarType, std::vector<size_t>> by_dtype;
  std::vector<at::Tensor> out(self.size());
  for (size_t k = 0; k < self.size(); ++k) {
    const at::Tensor& t = self[k];
    std::optional<at::ScalarType> nd = t.device() == device ? norm_dtype(t, dtype) : std::nullopt;
    if (nd)
      by_dtype[*nd].push_back(k);
    else
      out[k] = at::linalg_vector_norm(t, ord, at::OptionalIntArrayRef{}, false, dtype);
  }
  for (auto& [nd, positions] : by_dtype) {
    // Sorted by shape and dtype (stable): equal types form runs the rule stacks.
    auto key = [&](size_t k) { return std::make_pair(self[k].sizes().vec(), self[k].scalar_type()); };
    std::stable_sort(positions.begin(), positions.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
    std::vector<at::Tensor> sorted;
    sorted.reserve(positions.size());
    for (size_t k : positions) sorted.push_back(self[k]);
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("torch_tpu::stacked_norms", "")
                               .typed<at::Tensor(at::TensorList, const at::Scalar&, at::ScalarType)>();
    at::Tensor norms = op.call(sorted, ord, nd);
    for (size_t j = 0; j < positions.size(); ++j) out[positions[j]] = norms.select(0, static_cast<int64_t>(j));
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torch_tpu, m) {
  // The p-norms of tensors (sorted so that equal shapes are adjacent), as one vector.
  m.def("stacked_norms(Tensor[] self, Scalar ord, ScalarType dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(torch_tpu, Meta, m) { m.impl("stacked_norms", &stacked_norms_meta); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("_foreach_norm.Scalar", foreach_norm_tpu); }

}  // namespace tpu::backend
