"""`torch.nn.DataParallel` across tpu devices of one process.

DataParallel scatters inputs, replicates the module and gathers outputs through
`torch.nn.parallel.comm`, whose functions call CUDA-only C++ (`torch._C._scatter`, ...).
For tpu tensors they are device-to-device copies here; everything else goes to PyTorch's
own functions. Installed by `torch_tpu` at import.
"""
import torch
from torch.nn.parallel import comm

_original = {}


def _on_tpu(tensors) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in tensors)


def _device(d):
    """A comm device argument (an index, a device or a name) as a tpu device; -1 is the CPU."""
    if isinstance(d, torch.device):
        return d
    if isinstance(d, str):
        return torch.device(d)
    return torch.device("cpu") if d == -1 else torch.device("tpu", d)


def _copy_to(t, device):
    return t if t.device == device else t.to(device)


def broadcast(tensor, devices=None, *, out=None):
    if not _on_tpu([tensor]):
        return _original["broadcast"](tensor, devices, out=out)
    if (devices is None) == (out is None):
        raise RuntimeError("Exactly one of 'devices' and 'out' must be specified")
    if out is not None:
        return tuple(o.copy_(tensor) for o in out)
    return tuple(_copy_to(tensor, _device(d)) for d in devices)


def broadcast_coalesced(tensors, devices, buffer_size=10485760):
    if not _on_tpu(tensors):
        return _original["broadcast_coalesced"](tensors, devices, buffer_size)
    return [[_copy_to(t, _device(d)) for t in tensors] for d in devices]


def scatter(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
    if not _on_tpu([tensor]):
        return _original["scatter"](tensor, devices, chunk_sizes, dim, streams, out=out)
    if out is not None:
        parts = tensor.split([o.size(dim) for o in out], dim)
        return tuple(o.copy_(p) for o, p in zip(out, parts))
    devices = list(devices)
    parts = tensor.split(list(chunk_sizes), dim) if chunk_sizes is not None else tensor.chunk(len(devices), dim)
    return tuple(_copy_to(p.contiguous(), _device(d)) for p, d in zip(parts, devices))


def gather(tensors, dim=0, destination=None, *, out=None):
    tensors = list(tensors)
    if not _on_tpu(tensors):
        return _original["gather"](tensors, dim, destination, out=out)
    if out is not None:
        return out.copy_(torch.cat([t.to(out.device) for t in tensors], dim))
    target = tensors[0].device if destination is None else _device(destination)
    return torch.cat([_copy_to(t, target) for t in tensors], dim)


def reduce_add(inputs, destination=None):
    inputs = list(inputs)
    if not _on_tpu(inputs):
        return _original["reduce_add"](inputs, destination)
    target = inputs[0].device if destination is None else _device(destination)
    total = _copy_to(inputs[0], target).clone()
    for t in inputs[1:]:
        total.add_(_copy_to(t, target))
    return total


def reduce_add_coalesced(inputs, destination=None, buffer_size=10485760):
    if not _on_tpu([t for per_device in inputs for t in per_device]):
        return _original["reduce_add_coalesced"](inputs, destination, buffer_size)
    return tuple(reduce_add(same, destination) for same in zip(*inputs))


def install() -> None:
    if _original:
        return
    for f in (broadcast, broadcast_coalesced, scatter, gather, reduce_add, reduce_add_coalesced):
        _original[f.__name__] = getattr(comm, f.__name__)
        setattr(comm, f.__name__, f)
