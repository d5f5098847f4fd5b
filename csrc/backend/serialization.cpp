// Storages restored by torch.load arrive as raw bytes (a flat u8 buffer copied from
// the host). A tensor that spans such a storage gets the storage's value in its own
// dtype and shape, as if the tensor had created it: programs reading it are then the
// same as before the checkpoint (the same fused programs, the same results), and TPU
// layouts are not flattened. The values are the same bits (a reinterpretation).
#include <torch/extension.h>

#include "backend/executor.h"
#include "backend/storage.h"

namespace tpu::backend {
namespace {

bool shape_loaded_storage(const at::Tensor& t) {
  if (t.device().type() != c10::DeviceType::PrivateUse1) return false;
  StorageData& s = storage_of(t);
  if (!s.value || t.storage_offset() != 0 || !t.is_contiguous() || t.is_conj() || t.is_neg()) return false;
  if (static_cast<size_t>(t.numel()) * t.element_size() != s.nbytes || t.numel() == 0) return false;
  Operand v = guarded([&] { return dense_value(t); });
  if (v.type().str() == s.value.type().str()) return false;  // already in its shape
  set_value(s, std::move(v));
  return true;
}

}  // namespace

void bind_serialization(pybind11::module_& m) {
  m.def("_shape_loaded_storage", &shape_loaded_storage, pybind11::arg("tensor"));
}

}  // namespace tpu::backend
