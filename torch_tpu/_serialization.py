"""torch.load of tpu tensors: a restored storage is raw bytes copied from the host; a
tensor spanning it gets the storage's value in its own dtype and shape (the same bits,
csrc/backend/serialization.cpp), so programs after a checkpoint are the ones before it."""
import torch
import torch._utils

from . import _C


def install():
    original = torch._utils._rebuild_tensor
    if getattr(original, "_tpu_shapes_storage", False):
        return

    def _rebuild_tensor(storage, storage_offset, size, stride):
        t = original(storage, storage_offset, size, stride)
        if t.device.type == "tpu":
            _C._shape_loaded_storage(t)
        return t

    _rebuild_tensor._tpu_shapes_storage = True
    torch._utils._rebuild_tensor = _rebuild_tensor  # _rebuild_tensor_v2 looks it up at call time
