"""Meta (shape-only) kernels for the few ATen ops PyTorch ships without one. The backend
plans every lowered op from its Meta outputs, so without these the ops would take the CPU
fallback although a native rule exists. Registered only where PyTorch has none."""
import torch

_lib = torch.library.Library("aten", "IMPL")


def _grad_like_input(*args, **kwargs):
    return torch.empty_like(args[1])  # (grad_output, self / log_probs, ...)


def _geqrf(a):
    return a.new_empty(a.shape), a.new_empty(a.shape[:-2] + (min(a.shape[-2:]),))


def _linalg_lstsq(a, b, rcond=None, *, driver=None):
    driver = driver or "gelsy"
    m, n = a.shape[-2:]
    vec = b.dim() == a.dim() - 1
    bb = b.unsqueeze(-1) if vec else b
    batch = torch.broadcast_shapes(a.shape[:-2], bb.shape[:-2])
    if m > n and driver in ("gelss", "gelsd"):
        # CPU returns residuals only when every matrix has full rank: a shape that
        # depends on values, so this case stays on the CPU.
        raise NotImplementedError("linalg_lstsq: residual shape depends on the rank")
    residuals = (batch + (() if vec else (bb.shape[-1],))) if m > n and driver == "gels" else (0,)
    return (a.new_empty(batch + ((n,) if vec else (n, bb.shape[-1]))),
            a.new_empty(residuals),
            a.new_empty((0,) if driver == "gels" else batch, dtype=torch.int64),
            a.new_empty(batch + (min(m, n),) if driver in ("gelss", "gelsd") else (0,)))


def _in_place_step(*args, **kwargs):
    """An optimizer step that only rewrites its list arguments: no new shapes."""
    return None


_KERNELS = {
    "_fused_adam_.tensor_lr": _in_place_step,
    "_fused_adamw_.tensor_lr": _in_place_step,
    "geqrf": _geqrf,
    "linalg_lstsq": _linalg_lstsq,
    "multi_margin_loss_backward": _grad_like_input,
    "multilabel_margin_loss_backward": _grad_like_input,
    "_ctc_loss_backward": _grad_like_input,
}


def register():
    for name, fn in _KERNELS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "Meta"):
            _lib.impl(name, fn, "Meta")
