"""Marks a module's parameters and buffers on `tpu` as state.

A tensor made on the device and zero-initialized (`nn.init.zeros_`, a BatchNorm's
running statistics under `with torch.device("tpu")`, `to_empty` then `reset_parameters`)
is a storage never written, which an op would read as zeros baked into its program; the
next step reads the written storage, another program to compile. Marked storages get
their zeros first (lowered_kernel.cpp's start_state_from_zeros). Parameters are also
known by requires_grad; buffers are known only here.
"""
import torch
from torch.nn.modules.module import (register_module_buffer_registration_hook,
                                     register_module_parameter_registration_hook)

from . import _C


def _mark_tensor(tensor):
    if tensor is None or tensor.device.type != "tpu":
        return
    local = getattr(tensor, "_local_tensor", None)  # a DTensor: its shard is what ops read
    _C._mark_module_state(local if isinstance(local, torch.Tensor) else tensor)


def _mark(module, name, tensor):
    # Dynamo traces the hook of a buffer assigned in forward (self.n = self.n + 1): no
    # mark there (a call it cannot trace broke the graph); the value is computed anyway.
    if torch.compiler.is_compiling():
        return
    _mark_tensor(tensor)


def _mark_after_to_empty(to_empty):
    # to_empty replaces every parameter and buffer without registering them again.
    def module_to_empty(self, *args, **kwargs):
        out = to_empty(self, *args, **kwargs)
        for t in (*self.parameters(), *self.buffers()):
            _mark_tensor(t)
        return out

    module_to_empty.__doc__, module_to_empty.__name__ = to_empty.__doc__, to_empty.__name__
    module_to_empty.__qualname__ = to_empty.__qualname__
    return module_to_empty


buffer_handle = register_module_buffer_registration_hook(_mark)
parameter_handle = register_module_parameter_registration_hook(_mark)
torch.nn.Module.to_empty = _mark_after_to_empty(torch.nn.Module.to_empty)
