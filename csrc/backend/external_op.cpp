// The op behind torch_tpu.pallas.jax_op: torch_tpu::call_stablehlo runs an imported
// StableHLO module (ir/external.h) through the lowered kernel like any ATen op, so it
// is its own program in Strict mode and part of the graph when deferring or compiling.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "backend/dtypes.h"
#include "backend/storage.h"
#include "ir/external.h"

namespace tpu::backend {
namespace {

std::vector<at::Tensor> call_stablehlo_meta(at::TensorList inputs, int64_t module) {
  const ir::ExternalModule& m = ir::external_module(module);
  std::vector<at::Tensor> out;
  for (const ir::Type& t : m.results)
    out.push_back(at::empty(t.shape, at::TensorOptions().dtype(to_scalar_type(t.dtype)).device(at::kMeta)));
  return out;
}

DType dtype_named(const std::string& name, const std::string& what) {
  for (int d = 0; d < static_cast<int>(DType::Invalid); ++d)
    if (name == mlir_name(static_cast<DType>(d))) return static_cast<DType>(d);
  TORCH_CHECK_TYPE(false, what, ": element type ", name, " is not supported on tpu");
}

}  // namespace

// Python: _C._import_stablehlo(generic_text, what, [(elem, shape)], [(elem, shape)]).
int64_t import_stablehlo(const std::string& text, const std::string& what,
                         const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
                         const std::vector<std::pair<std::string, std::vector<int64_t>>>& results) {
  auto types = [&](const std::vector<std::pair<std::string, std::vector<int64_t>>>& specs) {
    std::vector<ir::Type> ts;
    for (auto& [elem, shape] : specs) ts.push_back(ir::Type{dtype_named(elem, what), shape});
    return ts;
  };
  try {
    return ir::add_external_module(text, what, types(params), types(results));
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

// Python: _C._donate(tensor, what): the storage gives up its value (its memory returns
// once the programs reading it have run); later reads raise, naming `what`.
void donate_storage(const at::Tensor& t, const std::string& what) {
  make_unreadable(storage_of(t), "this tpu tensor was donated to " + what + " and can no longer be used");
}

}  // namespace tpu::backend

TORCH_LIBRARY(torch_tpu, m) {
  m.def("call_stablehlo(Tensor[] inputs, int module) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(torch_tpu, Meta, m) {
  m.impl("call_stablehlo", &tpu::backend::call_stablehlo_meta);
}
