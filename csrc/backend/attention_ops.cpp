// Scaled dot-product attention. PyTorch asks the device which kernel to use
// (_fused_sdp_choice); ours is the "overrideable" one, whose forward and backward run
// the flash-attention-shaped rules of lowering/attention.cpp: the (L, S) probabilities
// are recomputed in the backward instead of being saved. Calls those rules do not take
// (dropout, grouped-query heads, a value head size other than the query's, a mask that
// needs a gradient) use the math path.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/ExpandUtils.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

namespace tpu::backend {

constexpr int64_t kMath = 0, kOverrideable = 4;  // sdp::SDPBackend

// CPU's default choice tries its flash kernel first, and that check reads the mask's
// size(-2): a 0-D or 1-D mask raises IndexError there (its math path, chosen by hand,
// broadcasts it). Raised here on the calls that reach that check on CPU: flash enabled,
// dense 4-D inputs, no dropout, one batch size, heads equal (or grouped, with enable_gqa),
// no empty input, and a mask that needs no gradient.
static void check_mask_rank_as_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const std::optional<at::Tensor>& mask, double dropout_p, bool enable_gqa) {
  if (!mask || !mask->defined() || mask->dim() >= 2 || mask->requires_grad()) return;
  if (!at::globalContext().userEnabledFlashSDP() || dropout_p > 0.0) return;
  if (q.is_nested() || k.is_nested() || v.is_nested() || q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return;
  if (q.sym_size(0) != k.sym_size(0) || q.sym_size(0) != v.sym_size(0)) return;
  if (q.sym_numel() == 0 || k.sym_numel() == 0 || v.sym_numel() == 0) return;
  c10::SymInt hq = q.sym_size(1), hk = k.sym_size(1), hv = v.sym_size(1);
  if (enable_gqa ? (hk != hv || hq % hk != 0) : (hq != hk || hq != hv)) return;
  (void)mask->sym_size(-2);  // CPU's IndexError, with its message
}

// A dual tensor (torch.autograd.forward_ad, torch.func.jvp): the fused op has no forward
// derivative (PyTorch's derivatives.yaml gives none), the math path's ops all have one.
static bool has_tangent(const at::Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); }

int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p, bool,
                         std::optional<double>, bool enable_gqa) {
  bool dense = q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && !q.is_nested();
  // sym_size: under Dynamo's fake tensors a plain size() would specialize every dimension
  // (a bounded dynamic sequence length among them).
  auto sz = [](const at::Tensor& t, int64_t d) { return t.sym_size(d); };
  bool same_heads = dense && sz(q, 1) == sz(k, 1) && sz(k, 1) == sz(v, 1) &&
                    sz(q, 0) == sz(k, 0) && sz(k, 0) == sz(v, 0) &&
                    sz(v, 3) == sz(q, 3);  // the flash kernels' output has q's head size
  bool floats = q.is_floating_point() && k.scalar_type() == q.scalar_type() &&
                v.scalar_type() == q.scalar_type();
  bool mask_ok = !mask || !mask->defined() || !mask->requires_grad();
  // Under vmap the fused op has no batching rule (CUDA's fused ops have theirs, and run
  // whatever backends are enabled): the math path's ops batch. Inside vmap(grad) the
  // tensors seen here need not be batched ones, so any functorch transform decides.
  if (q.key_set().has(c10::DispatchKey::FuncTorchBatched) ||
      c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode))
    return kMath;
  check_mask_rank_as_cpu(q, k, v, mask, dropout_p, enable_gqa);
  if (has_tangent(q) || has_tangent(k) || has_tangent(v) || (mask && has_tangent(*mask))) return kMath;
  bool fused = dense && same_heads && floats && mask_ok && dropout_p == 0.0 && !enable_gqa && sz(q, 2) > 0 &&
               sz(k, 2) > 0;
  // torch.nn.attention.sdpa_kernel / torch.backends.cuda.enable_*_sdp: a CUDA script that
  // asks for flash, efficient or cuDNN attention gets the fused kernel (it is one), one
  // that asks for math gets math; nothing enabled that fits raises as CPU does.
  const auto& g = at::globalContext();
  bool fused_on = g.userEnabledOverrideableSDP() || g.userEnabledFlashSDP() || g.userEnabledMemEfficientSDP() ||
                  g.userEnabledCuDNNSDP();
  if (fused && fused_on) return kOverrideable;
  // Calls CUDA's fused kernels take and ours does not (with one head size): grouped-query
  // heads (flash, without a mask) and dropout (flash without a mask, or memory-efficient).
  // A script that enables only those backends runs them, here on the math path.
  bool no_mask = !mask || !mask->defined();
  bool flash = g.userEnabledFlashSDP() && no_mask, efficient = g.userEnabledMemEfficientSDP() && mask_ok;
  if (dense && floats && sz(v, 3) == sz(q, 3) &&
      ((enable_gqa && flash) || (!enable_gqa && dropout_p > 0 && (flash || efficient))))
    return kMath;
  TORCH_CHECK(g.userEnabledMathSDP(), "No viable backend for scaled_dot_product_attention was found. tpu runs ",
              fused ? "this call with its fused kernel (enabled by the flash, efficient, cuDNN or overrideable backend) "
                      "or the math backend"
                    : "this call with the math backend only (dropout, grouped-query heads, another value head size "
                      "or a mask that needs a gradient)",
              ", and none of them is enabled (torch.nn.attention.sdpa_kernel, torch.backends.cuda.enable_*_sdp).");
  return kMath;
}

namespace {

// `t` in the memory layout of `model`, as PyTorch's meta kernels promise (empty_like):
// compiled graphs are traced with those strides and view the results accordingly.
at::Tensor laid_out_like(const at::Tensor& t, const at::Tensor& model) {
  at::Tensor res = at::empty_like(model);
  if (res.strides() == t.strides()) return t;
  res.copy_(t);
  return res;
}

// CPU's shape errors, at the call (the lowering would only fail to compile at the next
// read): the score matmul's head sizes, key/value lengths, and the mask's broadcast onto
// the (B, H, L, S) scores. (The fused choice already matched batch and head counts.)
void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& bias) {
  c10::SymInt bh = q.sym_size(0) * q.sym_size(1);
  TORCH_CHECK(k.sym_size(3) == q.sym_size(3), "Expected size for first two dimensions of batch2 tensor to be: [",
              bh, ", ", q.sym_size(3), "] but got: [", bh, ", ", k.sym_size(3), "].");
  TORCH_CHECK(v.sym_size(2) == k.sym_size(2), "scaled_dot_product_attention: key and value must have the same ",
              "sequence length, but got ", k.sym_size(2), " and ", v.sym_size(2));
  if (!bias || !bias->defined()) return;
  std::vector<c10::SymInt> scores = {q.sym_size(0), q.sym_size(1), q.sym_size(2), k.sym_size(2)};
  std::vector<c10::SymInt> both = at::infer_size_symint(scores, bias->sym_sizes());  // CPU's add error
  TORCH_CHECK(both == scores, "scaled_dot_product_attention: attn_mask of shape ", bias->sym_sizes(),
              " does not broadcast to the attention scores' shape ", c10::SymIntArrayRef(scores));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
           at::Tensor, at::Tensor>
attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& bias, double dropout_p, bool is_causal,
                  bool return_debug_mask, std::optional<double> scale) {
  TORCH_CHECK(!return_debug_mask, "scaled_dot_product_attention on tpu: no debug attention mask");
  check_shapes(q, k, v, bias);
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal,
                                                                     bias, scale);
  at::Tensor none = at::empty({0}, q.options().dtype(at::kLong));
  return {laid_out_like(out, q), lse, none, none, q.sym_size(2), k.sym_size(2), none, none, none};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& bias, std::array<bool, 4> mask, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor&, const at::Tensor&, c10::SymInt, c10::SymInt, double dropout_p, bool is_causal,
    const at::Tensor&, const at::Tensor&, std::optional<double> scale) {
  TORCH_CHECK(!mask[3], "scaled_dot_product_attention on tpu: no gradient for attn_mask");
  std::optional<at::Tensor> b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out.contiguous(), q, k, v, out, lse, dropout_p, is_causal, b, scale);
  return {laid_out_like(dq, q), laid_out_like(dk, k), laid_out_like(dv, v), at::Tensor()};
}

// nn.TransformerEncoder's fast path (eval, with a padding mask) asks whether every mask row
// is its tokens first, then padding. The answer needs only the mask: CPU's kernel takes `t`
// for its sizes alone, so here `t` stays on the device (the CPU fallback copied all of it to
// the host). CPU's checks and messages, and its computation: the first padded position
// equals the token count in every row. The host reads one flag.
bool nested_tensor_from_mask_left_aligned(const at::Tensor& t, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::ScalarType::Bool, "Expected mask to be of ScalarType Bool, but got ",
              mask.scalar_type(), " instead.");
  TORCH_CHECK(mask.dim() == 2, "Padding mask should be 2D");
  TORCH_CHECK(t.dim() == 3, "Input should be a 3D tensor, N * L * D");
  int64_t n = t.size(0), l = t.size(1);
  TORCH_CHECK(mask.size(0) == n && mask.size(1) == l, "Mask size should match input size");
  at::Tensor first_pad = at::cat({mask, at::zeros({n, 1}, mask.options())}, 1).to(at::kInt).argmin(1);
  at::Tensor tokens = mask.cumsum(1).select(1, l - 1);  // CPU's IndexError when l == 0
  return first_pad.equal(tokens);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_nested_tensor_from_mask_left_aligned", nested_tensor_from_mask_left_aligned);
  m.impl("_fused_sdp_choice", fused_sdp_choice);
  m.impl("_scaled_dot_product_fused_attention_overrideable", attention_forward);
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", attention_backward);
}

}  // namespace tpu::backend

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &tpu::backend::fused_sdp_choice);
}
