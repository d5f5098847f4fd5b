"""nn.MultiheadAttention's and nn.Transformer*'s inference fast paths on tpu.

In eval mode without gradients, PyTorch runs self-attention and encoder layers through
fused native kernels (`_native_multi_head_attention`, `_transformer_encoder_layer_fwd`)
with CPU and CUDA implementations only: on tpu they ran on the CPU fallback, copying
every weight through the host at each call. Here each is composed of ops tpu lowers
(projections, scaled scores, masked softmax, as the native kernels compute them; a row
whose keys are all masked is NaN, as on CPU).

In eval mode without gradients, with a `src_key_padding_mask`, PyTorch packs the batch
into a strided-layout nested tensor (`torch._nested_tensor_from_mask`) and runs the
layers' fused kernels on it; it allows the PrivateUse1 device there. tpu has no
strided nested tensors (CPU and CUDA kernels only), so that call is refused with a
marker error, which the encoder's forward catches for tpu inputs: the layers then run on
the dense batch with the padding mask, and the padded positions are zeroed before the
final norm, as the nested path's `to_padded_tensor(0.0)` leaves them. Values match CPU's
fast path; every other case is PyTorch's code unchanged.
"""
import torch
import torch.nn.functional as F

_installed = False
_lib = None


def _scores_mask(mask, mask_type, b, h, lq, lk):
    """The native kernels' mask as (B or 1, H or 1, Lq, Lk): type 1 is a key padding
    mask (B, Lk), type 0 an attention mask (Lq, Lk), type 2 either, expanded."""
    if mask.dim() == 2:
        return mask.view(b, 1, 1, lk) if mask_type == 1 else mask.view(1, 1, lq, lk)
    if mask.dim() == 3:
        return mask.view(b, -1, lq, lk)
    return mask


def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                                mask_type=None):
    b, lq, e = query.shape
    lk = key.shape[1]
    d = embed_dim // num_head
    if query is key and key is value:
        q, k, v = F.linear(query, qkv_weight, qkv_bias).chunk(3, dim=-1)
    else:
        (wq, wk, wv), (bq, bk, bv) = qkv_weight.chunk(3), qkv_bias.chunk(3)
        q, k, v = F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)
    q = q.view(b, lq, num_head, d).transpose(1, 2)
    k = k.view(b, lk, num_head, d).transpose(1, 2)
    v = v.view(b, lk, num_head, d).transpose(1, 2)
    scores = (q * d ** -0.5) @ k.transpose(-2, -1)
    if mask is not None:
        m = _scores_mask(mask, mask_type, b, num_head, lq, lk)
        scores = scores.masked_fill(m, float("-inf")) if m.dtype == torch.bool else scores + m
    weights = scores.softmax(-1)
    out = F.linear((weights @ v).transpose(1, 2).reshape(b, lq, e), proj_weight, proj_bias)
    if not need_weights:
        return out, None  # an undefined tensor, as the native kernels return
    return out, weights.mean(1) if average_attn_weights else weights


def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):
    def norm(x, w, b):
        return F.layer_norm(x, (embed_dim,), w, b, eps)
    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                    mask, False, True, mask_type)[0] + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    h = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
    h = F.linear(h, ffn_weight_1, ffn_bias_1)
    h = F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2)
    x = x + h
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


class _NestedFromMaskOnTpu(NotImplementedError):
    """torch._nested_tensor_from_mask on tpu: strided nested tensors are CPU/CUDA only."""


def install() -> None:
    global _installed, _lib
    if _installed:
        return
    _installed = True
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("_native_multi_head_attention", native_multi_head_attention, "PrivateUse1")
    _lib.impl("_transformer_encoder_layer_fwd", transformer_encoder_layer_fwd, "PrivateUse1")
    from torch.nn.modules import transformer

    from_mask = torch._nested_tensor_from_mask

    def nested_tensor_from_mask(t, mask, mask_check=True):
        if t.device.type == "tpu":
            raise _NestedFromMaskOnTpu(
                "torch._nested_tensor_from_mask: strided nested tensors are not supported on tpu "
                "(use torch.nested.nested_tensor(..., layout=torch.jagged))")
        return from_mask(t, mask, mask_check=mask_check)

    torch._nested_tensor_from_mask = nested_tensor_from_mask
    encoder = transformer.TransformerEncoder
    forward = encoder.forward

    def tpu_forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        try:
            return forward(self, src, mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)
        except _NestedFromMaskOnTpu:
            pass
        # PyTorch chose its nested fast path (so: no `mask`, eval, no gradient): the same
        # computation on the dense batch.
        output = src
        for layer in self.layers:
            output = layer(output, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        batch_first = self.layers[0].self_attn.batch_first
        padded = src_key_padding_mask if batch_first else src_key_padding_mask.t()
        output = output.masked_fill(padded.unsqueeze(-1).to(torch.bool), 0.0)
        return self.norm(output) if self.norm is not None else output

    tpu_forward.__doc__ = forward.__doc__
    encoder.forward = tpu_forward
