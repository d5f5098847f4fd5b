"""Bounded dynamism for compiled mode: `mark_dynamic(tensor, dim, min, max)`.

A dimension marked dynamic with bounds lets one Dynamo graph serve every size in
[min, max] (no Dynamo recompile per size), and with TpuBackend(dynamism=True) one
compiled program: the graph runs padded to the bound with the true size as an operand
(bounded.py). Code that branches on the size (a static index x[:, 5] needs it >= 6, a
slice end x[:, :6]) splits the range at the branch: a graph for each side met, a few in
all; a size where CPU raises (x[:, 5] at 3) raises CPU's error. Compiled mode refuses dynamic sizes without bounds (NotImplementedError).
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
    # A hint, not Dynamo's strict constraint: with min/max Dynamo refuses any guard that
    # narrows the range (x[:, 5] guards the size >= 6, an error where CPU has values).
    # The compiled backend bounds the symbol itself (compile._bound_marked_sizes), so
    # such a guard only narrows the graph's range; the bound becomes a guard as well.
    torch._dynamo.maybe_mark_dynamic(tensor, dim)
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
