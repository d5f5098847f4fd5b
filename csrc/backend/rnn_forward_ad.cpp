// Forward-mode AD (torch.autograd.forward_ad dual tensors, torch.func.jvp/jacfwd) through
// nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell. On tpu, as on CUDA, PyTorch's RNN code runs
// each time step as _thnn_fused_lstm_cell / _thnn_fused_gru_cell, whose autograd kernel has
// no forward derivative: a dual input raised NotImplementedError where CPU (which runs the
// cell as separate ops) gives the tangent. With a dual input the cell runs here as those
// same separate ops, each with its forward and backward formula; without one the call goes
// on to PyTorch's generated autograd kernel and our fused lowering, as before.
#include <ATen/ATen.h>
#include <ATen/ops/_thnn_fused_gru_cell_ops.h>
#include <ATen/ops/_thnn_fused_lstm_cell_ops.h>
#include <torch/library.h>

namespace tpu::backend {
namespace {

bool has_tangent(const at::Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); }
bool has_tangent(const std::optional<at::Tensor>& t) { return t && has_tangent(*t); }

// Under a torch.func transform too: jacrev/hessian vmap the cell's double backward
// (_thnn_differentiable_*_cell_backward), which has no batching rule: functorch ran it once
// per batch element, a graph that grew with the batch (DeferAndFuse compiled for 20 s).
bool functorch_active() {
  return c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode);
}

// The generated autograd kernel (VariableType) is registered for every autograd key, ours
// only replaces AutogradPrivateUse1's entry: AutogradOther's still holds PyTorch's.
c10::DispatchKeySet generated_autograd(c10::DispatchKeySet ks) {
  return ks.remove(c10::DispatchKey::AutogradFunctionality).add(c10::DispatchKey::AutogradOther);
}

at::Tensor with_bias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias && bias->defined() ? gates + *bias : gates;
}

// CUDA's cell math (gates i, f, g, o): cy = f*cx + i*g, hy = o*tanh(cy); the workspace
// holds the activated gates, as the fused lowering's does.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    c10::DispatchKeySet ks, const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  if (!functorch_active() && !has_tangent(input_gates) && !has_tangent(hidden_gates) && !has_tangent(cx) &&
      !has_tangent(input_bias) && !has_tangent(hidden_bias))
    return at::_ops::_thnn_fused_lstm_cell::redispatch(generated_autograd(ks), input_gates, hidden_gates, cx,
                                                       input_bias, hidden_bias);
  auto gates = (with_bias(input_gates, input_bias) + with_bias(hidden_gates, hidden_bias)).chunk(4, 1);
  at::Tensor i = gates[0].sigmoid(), f = gates[1].sigmoid(), g = gates[2].tanh(), o = gates[3].sigmoid();
  at::Tensor cy = f * cx + i * g;
  at::Tensor hy = o * cy.tanh();
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

// Gates r, z, n: n = tanh(in + r*hn), hy = n + z*(hx - n); workspace [r, z, n, hx, hn].
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(c10::DispatchKeySet ks, const at::Tensor& input_gates,
                                                  const at::Tensor& hidden_gates, const at::Tensor& hx,
                                                  const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  if (!functorch_active() && !has_tangent(input_gates) && !has_tangent(hidden_gates) && !has_tangent(hx) &&
      !has_tangent(input_bias) && !has_tangent(hidden_bias))
    return at::_ops::_thnn_fused_gru_cell::redispatch(generated_autograd(ks), input_gates, hidden_gates, hx,
                                                      input_bias, hidden_bias);
  auto in = with_bias(input_gates, input_bias).chunk(3, 1);
  auto hid = with_bias(hidden_gates, hidden_bias).chunk(3, 1);
  at::Tensor r = (in[0] + hid[0]).sigmoid(), z = (in[1] + hid[1]).sigmoid();
  at::Tensor n = (in[2] + r * hid[2]).tanh();
  at::Tensor hy = n + z * (hx - n);
  return {hy, at::cat({r, z, n, hx, hid[2]}, 1)};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
}

}  // namespace tpu::backend
