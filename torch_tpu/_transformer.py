"""nn.TransformerEncoder's inference fast path on tpu.

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

_installed = False


class _NestedFromMaskOnTpu(NotImplementedError):
    """torch._nested_tensor_from_mask on tpu: strided nested tensors are CPU/CUDA only."""


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
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
