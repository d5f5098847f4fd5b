"""The `torch_tpu.api` names users of Google's TorchTPU know."""
import torch

from . import _C


def tpu_device(index=None) -> torch.device:
    """The current (or given) tpu device object."""
    return torch.device("tpu", _C.current_device() if index is None else index)
