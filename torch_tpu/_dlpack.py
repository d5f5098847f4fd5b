"""DLPack for tpu tensors (the capsule itself is built in csrc/backend/dlpack.cpp).

A tpu tensor exports a kDLExtDev capsule that shares its storage; torch.from_dlpack
in this process gives back a tpu tensor on the same storage (no copy). A host copy
is explicit: `torch.from_dlpack(t, device="cpu")`, `t.__dlpack__(dl_device=(kDLCPU, 0))`
or numpy's `np.from_dlpack(t, device="cpu")`. PyTorch reaches its DLPack converters
through `torch._C`, so the tpu cases are routed here and every other tensor or
capsule goes to PyTorch unchanged.
"""
import torch
from torch.overrides import has_torch_function_unary
from torch.utils.dlpack import DLDeviceType

from . import _C

_KDL_EXTDEV = int(DLDeviceType.kDLExtDev)
_KDL_CPU = int(DLDeviceType.kDLCPU)


def _target_device(dl_device):
    kind, index = int(dl_device[0]), int(dl_device[1])
    if kind == _KDL_CPU:
        return torch.device("cpu")
    if kind == _KDL_EXTDEV:
        return torch.device("tpu", index)
    raise BufferError(
        f"to_dlpack: a tpu tensor can be exported to kDLExtDev (tpu) or kDLCPU (a host copy), "
        f"not to DLPack device type {kind}"
    )


def _exporter(original, versioned):
    def to_dlpack(tensor, *args, **kwargs):
        if not (isinstance(tensor, torch.Tensor) and tensor.device.type == "tpu"):
            return original(tensor, *args, **kwargs)
        dl_device = kwargs.get("dl_device", args[0] if args else None)
        copy = kwargs.get("copy", args[1] if len(args) > 1 else None)
        t = tensor.detach()
        if dl_device is not None:
            target = _target_device(dl_device)
            if target != t.device:
                if copy is False:
                    raise BufferError(
                        f"to_dlpack: cannot export a {t.device} tensor to {target} without a copy "
                        "(copy=False)"
                    )
                t = t.to(target)
                if target.type == "cpu":
                    return original(t)  # a host copy: PyTorch's own CPU capsule
                copy = False  # .to() made the copy already
        if copy:
            t = t.clone()
        return _C._dlpack_export(t, versioned)

    to_dlpack.__doc__ = original.__doc__
    to_dlpack.__name__ = getattr(original, "__name__", "to_dlpack")
    return to_dlpack


def _importer(original):
    def from_dlpack(capsule):
        t = _C._dlpack_import(capsule)
        return t if t is not None else original(capsule)

    from_dlpack.__doc__ = original.__doc__
    return from_dlpack


def _dlpack_device_method(original):
    def __dlpack_device__(self):
        # PyTorch's own method tests for the name "privateuse1", which the rename hides.
        if not has_torch_function_unary(self) and self.device.type == "tpu":
            return (DLDeviceType.kDLExtDev, self.device.index or 0)
        return original(self)

    __dlpack_device__.__doc__ = original.__doc__
    return __dlpack_device__


def install():
    if getattr(torch._C, "_tpu_dlpack_installed", False):
        return
    to_plain = _exporter(torch._C._to_dlpack, versioned=False)
    torch._C._to_dlpack = to_plain  # Tensor.__dlpack__ looks these up at call time
    torch._C._to_dlpack_versioned = _exporter(torch._C._to_dlpack_versioned, versioned=True)
    torch._C._from_dlpack = _importer(torch._C._from_dlpack)  # torch.from_dlpack calls it
    torch.utils.dlpack.to_dlpack = to_plain  # bound at import by these modules
    torch.to_dlpack = to_plain
    torch.Tensor.__dlpack_device__ = _dlpack_device_method(torch.Tensor.__dlpack_device__)
    torch._C._tpu_dlpack_installed = True
