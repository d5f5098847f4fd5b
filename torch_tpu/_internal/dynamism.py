"""Bounded dynamism for compiled mode: `mark_dynamic(tensor, dim, min, max)`.

A dimension marked dynamic with bounds lets one Dynamo graph serve every size in
[min, max] (no Dynamo recompile per size), and with TpuBackend(dynamism=True) one
compiled program: the graph runs padded to the bound with the true size as an operand
(bounded.py). Compiled mode refuses dynamic sizes without bounds (NotImplementedError).
In eager DeferAndFuse the same rules give one fused program for every size
(bounded_eager.py); Strict and Debug run marked tensors at their true sizes.
"""
import torch


def mark_dynamic(tensor: torch.Tensor, dimension: int, lower_bound: int, upper_bound: int) -> None:
    """Marks `tensor.shape[dimension]` dynamic within [lower_bound, upper_bound]."""
    if not 0 <= lower_bound <= upper_bound:
        raise ValueError(f"mark_dynamic: bounds must satisfy 0 <= min <= max, got "
                         f"[{lower_bound}, {upper_bound}]")
    dim = dimension % tensor.dim()
    if not lower_bound <= tensor.shape[dim] <= upper_bound:
        raise ValueError(f"mark_dynamic: size {tensor.shape[dim]} of dimension {dim} is "
                         f"outside [{lower_bound}, {upper_bound}]")
    # Dynamo's lower bound for a dynamic size is 2 (0 and 1 are specialized).
    torch._dynamo.mark_dynamic(tensor, dim, min=max(lower_bound, 2), max=upper_bound)
    info = dict(getattr(tensor, "_tpu_dynamism", {}))
    info[dim] = (lower_bound, upper_bound)
    tensor._tpu_dynamism = info
    if getattr(tensor, "_tpu_bounded", None) is not None:
        del tensor._tpu_bounded  # marked again: padded again
    from . import bounded_eager
    if tensor.device.type == "tpu" and bounded_eager._active():
        # Eager DeferAndFuse runs ops on a marked tensor padded to the bound
        # (bounded_eager.py); other modes ignore the marks outside compiled graphs.
        bounded_eager.enable()
        if not tensor.requires_grad:
            # Padded now, between steps: padding at the first use would cut the pending
            # graph there (the padding is a per-size program of its own).
            bounded_eager.to_bounded(tensor)


def get_dynamism_info(tensor: torch.Tensor) -> dict:
    """{dimension: (min, max)} of the dimensions marked dynamic ({} when none)."""
    return dict(getattr(tensor, "_tpu_dynamism", {}))
