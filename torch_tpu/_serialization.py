"""torch.load of tpu tensors: PyTorch restores each storage as raw bytes copied from the
host, then rebuilds the tensors over it. During a load the bytes stay on the host until a
tensor is set onto the storage, and are then uploaded once in that tensor's dtype and
shape (csrc/backend/serialization.cpp): no program per shape, and programs after a
checkpoint are the ones before it."""
import functools

import torch
import torch._utils
import torch.serialization

from . import _C


def _in_load_scope(load):
    @functools.wraps(load)
    def scoped(*args, **kwargs):
        _C._begin_load()
        try:
            return load(*args, **kwargs)
        finally:
            _C._end_load()  # uploads what no tensor took (a storage loaded by itself)

    return scoped


def install():
    original = torch._utils._rebuild_tensor
    if getattr(original, "_tpu_shapes_storage", False):
        return
    # torch.load calls these by their module names at call time (both file formats).
    torch.serialization._load = _in_load_scope(torch.serialization._load)
    torch.serialization._legacy_load = _in_load_scope(torch.serialization._legacy_load)

    def _rebuild_tensor(storage, storage_offset, size, stride):
        t = original(storage, storage_offset, size, stride)
        if t.device.type == "tpu":
            _C._shape_loaded_storage(t)
        return t

    _rebuild_tensor._tpu_shapes_storage = True
    torch._utils._rebuild_tensor = _rebuild_tensor  # _rebuild_tensor_v2 looks it up at call time

    # A wrapper subclass (torchao's quantized weights) loaded with map_location="tpu" took
    # the index-less device while its inner tensors, restored as storages, are on tpu:N:
    # detach() and load_state_dict(assign=True) then refused the pair. It takes tpu:N too.
    wrapper = torch._utils._rebuild_wrapper_subclass

    def _rebuild_wrapper_subclass(cls, dtype, size, stride, storage_offset, layout, device, requires_grad):
        loc = torch.device(torch._utils._get_restore_location(device))
        if loc.type == "tpu" and loc.index is None:
            return torch.Tensor._make_wrapper_subclass(
                cls, size, strides=stride, dtype=dtype, storage_offset=storage_offset, layout=layout,
                device=torch.device("tpu", torch.tpu.current_device()), requires_grad=requires_grad)
        return wrapper(cls, dtype, size, stride, storage_offset, layout, device, requires_grad)

    # torch.save names it in pickles (by module and name: files stay loadable without us).
    _rebuild_wrapper_subclass.__module__ = wrapper.__module__
    _rebuild_wrapper_subclass.__qualname__ = wrapper.__qualname__
    torch._utils._rebuild_wrapper_subclass = _rebuild_wrapper_subclass
