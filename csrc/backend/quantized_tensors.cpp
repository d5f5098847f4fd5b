// PyTorch's quantized tensors (quint8/qint8/qint32 with a scale and zero point, the
// torch.ao eager-mode quantization path) have no tpu kernels: making one is refused at
// the call, naming what to use instead. Without this the CPU fallback quantized on the
// host and then failed making the tpu result, in an error about a 'Quantizedtpu' backend.
// torchao's quantize_ (plain int8/int4/float8 tensors with scales) runs natively.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>

namespace tpu::backend {
namespace {

[[noreturn]] void refuse(const char* op) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_tpu: ", op,
                              ": quantized tensors (quint8, qint8, qint32) are not supported on tpu. "
                              "Quantize with torchao (torchao.quantization.quantize_, e.g. "
                              "Int8WeightOnlyConfig), which runs on tpu, or keep the quantized model on the CPU.");
}

// Whatever reaches the QuantizedPrivateUse1 key (making a quantized tpu tensor, as
// `q.to("tpu")` of a CPU one does).
void refuse_boxed(const c10::OperatorHandle& op, torch::jit::Stack*) {
  refuse(op.schema().name().c_str());
}

at::Tensor quantize_per_tensor(const at::Tensor&, double, int64_t, at::ScalarType) {
  refuse("aten::quantize_per_tensor");
}
at::Tensor quantize_per_tensor_tensor_qparams(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                              at::ScalarType) {
  refuse("aten::quantize_per_tensor");
}
at::Tensor quantize_per_tensor_dynamic(const at::Tensor&, at::ScalarType, bool) {
  refuse("aten::quantize_per_tensor_dynamic");
}
at::Tensor quantize_per_channel(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                at::ScalarType) {
  refuse("aten::quantize_per_channel");
}
at::Tensor empty_affine_quantized(c10::SymIntArrayRef, std::optional<at::ScalarType>, std::optional<at::Layout>,
                                  std::optional<at::Device>, std::optional<bool>, double, int64_t,
                                  std::optional<at::MemoryFormat>) {
  refuse("aten::_empty_affine_quantized");
}
at::Tensor empty_per_channel_affine_quantized(c10::SymIntArrayRef, const at::Tensor&, const at::Tensor&, int64_t,
                                              std::optional<at::ScalarType>, std::optional<at::Layout>,
                                              std::optional<at::Device>, std::optional<bool>,
                                              std::optional<at::MemoryFormat>) {
  refuse("aten::_empty_per_channel_affine_quantized");
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("quantize_per_tensor", quantize_per_tensor);
  m.impl("quantize_per_tensor.tensor_qparams", quantize_per_tensor_tensor_qparams);
  m.impl("quantize_per_tensor_dynamic", quantize_per_tensor_dynamic);
  m.impl("quantize_per_channel", quantize_per_channel);
  m.impl("_empty_affine_quantized", empty_affine_quantized);
  m.impl("_empty_per_channel_affine_quantized", empty_per_channel_affine_quantized);
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_boxed>());
}

}  // namespace
}  // namespace tpu::backend
