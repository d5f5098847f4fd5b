// DLPack for `tpu` tensors. PJRT buffers are not host-addressable, so a tpu tensor is
// exported as a capsule on kDLExtDev whose `data` is only an identity (the storage's
// handle, never dereferenceable) and whose manager context holds the tensor. Importing
// such a capsule in this process gives a tensor on the same storage: the exchange
// shares memory, in-place writes are seen on both sides, nothing is copied or waited
// for. Anything else on kDLExtDev cannot be imported (there is no pointer to read) and
// raises BufferError; capsules on other devices are left to PyTorch (torch_tpu/_dlpack.py).
#include <ATen/dlpack.h>
#include <torch/extension.h>

#include <vector>

#include "backend/storage.h"

namespace py = pybind11;

namespace tpu::backend {
namespace {

template <class Managed>
struct Export {
  at::Tensor tensor;
  std::vector<int64_t> shape, strides;
  Managed managed{};
};

template <class Managed>
void delete_export(Managed* self) {
  delete static_cast<Export<Managed>*>(self->manager_ctx);
}

DLDataType dl_dtype(c10::ScalarType s) {
  DLDataType d{};
  d.lanes = 1;
  d.bits = static_cast<uint8_t>(c10::elementSize(s) * 8);
  switch (s) {
    case at::kBool: d.code = kDLBool; break;
    case at::kByte: case at::kUInt16: case at::kUInt32: case at::kUInt64: d.code = kDLUInt; break;
    case at::kChar: case at::kShort: case at::kInt: case at::kLong: d.code = kDLInt; break;
    case at::kHalf: case at::kFloat: case at::kDouble: d.code = kDLFloat; break;
    case at::kBFloat16: d.code = kDLBfloat; break;
    case at::kComplexHalf: case at::kComplexFloat: case at::kComplexDouble: d.code = kDLComplex; break;
    default:
      throw py::buffer_error(std::string("to_dlpack: dtype ") + c10::toString(s) + " has no DLPack type");
  }
  return d;
}

template <class Managed>
Managed* make_export(const at::Tensor& src) {
  // The capsule carries plain values: lazy conjugate/negative bits are applied first.
  at::Tensor t = src.resolve_conj().resolve_neg();
  auto* e = new Export<Managed>();
  e->tensor = t;
  e->shape.assign(t.sizes().begin(), t.sizes().end());
  e->strides.assign(t.strides().begin(), t.strides().end());
  for (size_t i = 0; i < e->shape.size(); ++i)
    if (e->shape[i] < 2) e->strides[i] = 1;  // as PyTorch does: consumers reject odd strides there
  DLTensor& dl = e->managed.dl_tensor;
  dl.data = t.storage().data_ptr().get();  // an identity, not an address
  dl.device = DLDevice{kDLExtDev, static_cast<int32_t>(device_index(t))};
  dl.ndim = static_cast<int32_t>(t.dim());
  dl.dtype = dl_dtype(t.scalar_type());
  dl.shape = e->shape.data();
  dl.strides = e->strides.data();
  dl.byte_offset = static_cast<uint64_t>(t.storage_offset()) * t.element_size();
  e->managed.manager_ctx = e;
  e->managed.deleter = &delete_export<Managed>;
  return &e->managed;
}

// An unconsumed capsule frees what it holds when Python drops it.
template <class Managed>
void capsule_destructor(PyObject* capsule, const char* name) {
  if (!PyCapsule_IsValid(capsule, name)) return;  // consumed: the consumer owns it
  auto* m = static_cast<Managed*>(PyCapsule_GetPointer(capsule, name));
  if (m && m->deleter) m->deleter(m);
}
void destroy_plain(PyObject* c) { capsule_destructor<DLManagedTensor>(c, "dltensor"); }
void destroy_versioned(PyObject* c) { capsule_destructor<DLManagedTensorVersioned>(c, "dltensor_versioned"); }

py::object export_capsule(const at::Tensor& t, bool versioned) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "_dlpack_export: expected a tpu tensor, got ",
              t.device());
  PyObject* c;
  if (versioned) {
    auto* m = make_export<DLManagedTensorVersioned>(t);
    m->version.major = DLPACK_MAJOR_VERSION;
    m->version.minor = DLPACK_MINOR_VERSION;
    m->flags = 0;
    c = PyCapsule_New(m, "dltensor_versioned", &destroy_versioned);
    if (!c) m->deleter(m);
  } else {
    auto* m = make_export<DLManagedTensor>(t);
    c = PyCapsule_New(m, "dltensor", &destroy_plain);
    if (!c) m->deleter(m);
  }
  if (!c) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(c);
}

template <class Managed>
at::Tensor import_export(Managed* m) {
  auto* e = static_cast<Export<Managed>*>(m->manager_ctx);
  const DLTensor& dl = m->dl_tensor;
  const at::Tensor& src = e->tensor;
  TORCH_CHECK(dl.data == src.storage().data_ptr().get(), "from_dlpack: tpu capsule's data handle was changed");
  int64_t item = src.element_size();
  TORCH_CHECK(dl.byte_offset % item == 0, "from_dlpack: byte_offset ", dl.byte_offset,
              " is not a multiple of the element size ", item);
  std::vector<int64_t> sizes(dl.shape, dl.shape + dl.ndim);
  std::vector<int64_t> strides;
  if (dl.strides) {
    strides.assign(dl.strides, dl.strides + dl.ndim);
  } else {
    auto c = c10::contiguous_strides(sizes);
    strides.assign(c.begin(), c.end());
  }
  // A new tensor on the exported storage (not a view of the exported one: the
  // capsule is released right after, as for any DLPack import).
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(src.storage()), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), src.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, static_cast<int64_t>(dl.byte_offset) / item);
  return out;
}

const char* device_type_name(int t) {
  switch (t) {
    case kDLCPU: return "kDLCPU";
    case kDLCUDA: return "kDLCUDA";
    case kDLCUDAHost: return "kDLCUDAHost";
    case kDLOpenCL: return "kDLOpenCL";
    case kDLVulkan: return "kDLVulkan";
    case kDLMetal: return "kDLMetal";
    case kDLVPI: return "kDLVPI";
    case kDLROCM: return "kDLROCM";
    case kDLROCMHost: return "kDLROCMHost";
    case kDLExtDev: return "kDLExtDev";
    case kDLCUDAManaged: return "kDLCUDAManaged";
    case kDLOneAPI: return "kDLOneAPI";
    case kDLWebGPU: return "kDLWebGPU";
    case kDLHexagon: return "kDLHexagon";
    case kDLMAIA: return "kDLMAIA";
    default: return "unknown";
  }
}

// A tpu tensor for a capsule this module exported; None for capsules PyTorch should
// read itself (other devices, unknown names or versions: its own errors are clear).
py::object import_capsule(py::handle obj) {
  PyObject* o = obj.ptr();
  if (!PyCapsule_CheckExact(o)) return py::none();
  bool versioned = PyCapsule_IsValid(o, "dltensor_versioned");
  if (!versioned && !PyCapsule_IsValid(o, "dltensor")) return py::none();
  const char* name = versioned ? "dltensor_versioned" : "dltensor";
  void* p = PyCapsule_GetPointer(o, name);
  if (!p) throw py::error_already_set();
  const DLTensor* dl;
  bool ours;
  if (versioned) {
    auto* m = static_cast<DLManagedTensorVersioned*>(p);
    if (m->version.major != DLPACK_MAJOR_VERSION) return py::none();  // PyTorch refuses it by name
    dl = &m->dl_tensor;
    ours = m->deleter == &delete_export<DLManagedTensorVersioned>;
  } else {
    auto* m = static_cast<DLManagedTensor*>(p);
    dl = &m->dl_tensor;
    ours = m->deleter == &delete_export<DLManagedTensor>;
  }
  int type = static_cast<int>(dl->device.device_type);
  if (type != kDLExtDev) {
    // PyTorch makes tensors of these only when that backend is built in; otherwise it
    // would build a tensor on an absent device and fail later, far from here.
    bool cuda_like = type == kDLCUDA || type == kDLROCM || type == kDLCUDAManaged;
    if (cuda_like && !at::hasCUDA())
      throw py::buffer_error(std::string("from_dlpack: the capsule is on ") + device_type_name(type) + " device " +
                             std::to_string(dl->device.device_id) +
                             ", and this PyTorch has no CUDA/ROCm; copy it to the host in its own library first");
    return py::none();
  }
  if (!ours)
    throw py::buffer_error(
        "from_dlpack: the capsule is on kDLExtDev device " + std::to_string(dl->device.device_id) +
        " but was not exported by torch_tpu in this process; tpu memory is not host-addressable, so a "
        "capsule can only be imported by the process that exported it (copy the tensor to the host "
        "in the producing library instead)");
  at::Tensor t = versioned ? import_export(static_cast<DLManagedTensorVersioned*>(p))
                           : import_export(static_cast<DLManagedTensor*>(p));
  // Consumed: the new tensor holds the storage, so the export's own hold goes now.
  if (PyCapsule_SetName(o, versioned ? "used_dltensor_versioned" : "used_dltensor") != 0)
    throw py::error_already_set();
  if (versioned) {
    auto* m = static_cast<DLManagedTensorVersioned*>(p);
    m->deleter(m);
  } else {
    auto* m = static_cast<DLManagedTensor*>(p);
    m->deleter(m);
  }
  return py::cast(t);
}

}  // namespace

void bind_dlpack(py::module_& m) {
  m.def("_dlpack_export", &export_capsule, py::arg("tensor"), py::arg("versioned"));
  m.def("_dlpack_import", &import_capsule, py::arg("capsule"));
}

}  // namespace tpu::backend
