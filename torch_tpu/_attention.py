"""Attention entry points PyTorch keeps to its own devices, opened to tpu.

`torch.nn.attention.flex_attention` runs on tpu, eager and under torch.compile.

PyTorch checks the query's device against a fixed list (cuda, cpu, xpu, hpu, mps) before
anything runs. What runs after it is device-neutral: eager calls compile the attention
higher-order op with an eager backend, whose dense implementation (scores, score_mod and
mask_mod applied elementwise, softmax, matmul) is ordinary ATen ops, lowered here like any
others; torch.compile(backend="tpu") records the same ops into its program. So the check
lets tpu through, and everything else it refuses stays refused.

`scaled_dot_product_attention` on jagged nested tensors (layout=torch.jagged): CUDA runs
them through its flash kernels on the packed values; PyTorch's other path converts them
to strided nested tensors, which only CPU and CUDA have. On tpu the batch is padded to
its longest sequence (native layout changes, lowering/jagged.cpp), attends with padded
keys masked out (causal within each sequence, which starts at position 0), and is packed
back; values and gradients are those of the per-sequence attention.
"""
import torch

from . import _on_import


def _patch(module) -> None:
    validate = module._validate_device
    if getattr(validate, "_torch_tpu", False):
        return

    def tpu_validate_device(query, key, value):
        if query.device.type != "tpu":
            validate(query, key, value)

    tpu_validate_device._torch_tpu = True
    module._validate_device = tpu_validate_device


def _jagged_sdpa(original):
    def run(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        ragged_seq = all(getattr(t, "_ragged_idx", None) == 2 for t in (query, key, value))
        if query.device.type != "tpu" or attn_mask is not None or not ragged_seq:
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        from torch.nested._internal.nested_tensor import nested_view_from_values_offsets_lengths
        from torch.nested._internal.sdpa import _autocast, _validate_sdpa_input

        # PyTorch's own checks first, then what its math path would refuse: the padded
        # dense call below would broadcast a batch or head count of 1.
        query, key, value, _ = _autocast(query, key, value, None)
        _validate_sdpa_input(query, key, value, None, dropout_p, is_causal, scale)
        if not query.size(0) == key.size(0) == value.size(0):
            raise RuntimeError(f"scaled_dot_product_attention: jagged query, key and value must have the same "
                               f"batch size, got {query.size(0)}, {key.size(0)} and {value.size(0)}")
        hq, hk, hv = query.size(1), key.size(1), value.size(1)
        if hk != hv or (hq != hk and not (enable_gqa and hq % hk == 0)):
            raise RuntimeError(f"scaled_dot_product_attention: jagged query, key and value have {hq}, {hk} and "
                               f"{hv} heads; they must be equal (or, with enable_gqa=True, key's and value's "
                               "must divide query's)")

        def padded(t, size=None):  # (B, H, j, D) -> (B, H, L, D)
            # The aten op, not torch.nested.to_padded_tensor: that one takes int sizes, which
            # would fix a symbolic longest length to a constant under torch.compile.
            return torch.ops.aten.to_padded_tensor(t.transpose(1, 2), 0.0, size).transpose(1, 2)
        # A jagged tensor pads to its cached longest sequence, or to its token count when
        # none is cached: value takes key's length, whichever of the two key had.
        q, k = padded(query), padded(key)
        v = padded(value, (k.size(0), k.size(2), k.size(1), value.size(-1)))
        seq_len, kv_len = q.size(2), k.size(2)
        keys = torch.arange(kv_len, device=q.device)
        keep = (keys[None, :] < key.offsets().diff()[:, None])[:, None, None, :]
        if is_causal:
            keep = keep & (torch.arange(seq_len, device=q.device)[:, None] >= keys[None, :])
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=keep, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa)
        # Each token's (sequence, position): its row of the padded output (an index, so
        # the gradient flows back).
        offsets = query.offsets()
        token = torch.arange(query.transpose(1, 2).values().size(0), device=q.device)
        seq = torch.searchsorted(offsets[1:], token, right=True)
        values = out.transpose(1, 2)[seq, token - offsets[seq]]
        return nested_view_from_values_offsets_lengths(
            values, query.offsets(), query.lengths(), min_seqlen=query._maybe_min_seqlen,
            max_seqlen=query._maybe_max_seqlen).transpose(1, 2)
    run._torch_tpu = True
    return run


def _patch_nested(module) -> None:
    if not getattr(module.jagged_scaled_dot_product_attention, "_torch_tpu", False):
        module.jagged_scaled_dot_product_attention = _jagged_sdpa(module.jagged_scaled_dot_product_attention)


def install() -> None:
    _on_import.patch_when_imported("torch.nn.attention.flex_attention", "_validate_device", _patch)
    _on_import.patch_when_imported("torch.nested._internal.ops", "jagged_scaled_dot_product_attention",
                                   _patch_nested)
