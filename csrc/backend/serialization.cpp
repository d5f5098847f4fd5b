// torch.load of tpu storages. PyTorch restores each storage as raw bytes (a uint8 copy
// from the host into a fresh storage) before the tensors over it are rebuilt. While a
// load runs, those bytes stay on the host (StorageData::loaded_bytes) until a tensor is
// set onto the storage; they are then uploaded once, as a buffer of that tensor's dtype
// and shape: no program reinterprets the bytes (one compile per shape), programs reading
// the tensor are the same as before the checkpoint, and TPU layouts are not flattened.
#include <torch/extension.h>

#include <vector>

#include "backend/executor.h"
#include "backend/storage.h"

namespace tpu::backend {
namespace {

// The storages each running torch.load on this thread deferred (innermost load last).
thread_local std::vector<std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>>> t_loads;

void begin_load() { t_loads.emplace_back(); }

// What no tensor spanned (a storage loaded by itself, views of part of one) is uploaded
// now: keeping the host bytes relies on nothing writing them, which holds only for the
// load's own storages during the load, and some reads (a compiled graph's inputs) take
// the storage's value without asking storage_data.
void end_load() {
  if (t_loads.empty()) return;
  auto deferred = std::move(t_loads.back());
  t_loads.pop_back();
  guarded([&] {
    for (auto& weak : deferred) {
      c10::intrusive_ptr<c10::StorageImpl> impl = weak.lock();
      StorageData* s = impl ? storage_record(*impl) : nullptr;
      if (s && s->loaded_bytes.defined()) upload_loaded_bytes(*s);
    }
    return 0;
  });
}

// A storage whose bytes are already on the device (restored outside torch.load): a
// tensor that spans it gets the storage's value in its own dtype and shape, by a
// program that reinterprets the bytes there (the same bits).
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

bool defer_loaded_bytes(const at::Tensor& dst, const at::Tensor& src) {
  if (t_loads.empty() || dst.scalar_type() != at::kByte || src.scalar_type() != at::kByte) return false;
  if (dst.storage_offset() != 0 || !dst.is_contiguous() || dst.nbytes() != dst.storage().nbytes()) return false;
  if (!src.is_cpu() || !src.is_contiguous() || src.numel() != dst.numel() || src.is_neg() || dst.is_neg())
    return false;
  StorageData& s = storage_data(dst);
  if (s.value || !s.pending.empty() || s.copy_of || !s.unreadable.empty() || s.nbytes != dst.nbytes()) return false;
  s.loaded_bytes = src;
  t_loads.back().push_back(dst.storage().getWeakStorageImpl());
  return true;
}

void bind_serialization(pybind11::module_& m) {
  m.def("_shape_loaded_storage", &shape_loaded_storage, pybind11::arg("tensor"));
  m.def("_begin_load", &begin_load);
  m.def("_end_load", &end_load);
}

}  // namespace tpu::backend
