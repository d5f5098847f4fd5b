"""Marks a module's parameters and buffers on `tpu` as state.

A tensor made on the device and zero-initialized (`nn.init.zeros_`, a BatchNorm's
running statistics under `with torch.device("tpu")`, `to_empty` then `reset_parameters`)
is a storage never written, which an op would read as zeros baked into its program; the
next step reads the written storage, another program to compile. Marked storages get
their zeros first (lowered_kernel.cpp's start_state_from_zeros). Parameters are also
known by requires_grad; buffers are known only here.
"""
from torch.nn.modules.module import (register_module_buffer_registration_hook,
                                     register_module_parameter_registration_hook)

from . import _C


def _mark(module, name, tensor):
    if tensor is not None and tensor.device.type == "tpu":
        _C._mark_module_state(tensor)


buffer_handle = register_module_buffer_registration_hook(_mark)
parameter_handle = register_module_parameter_registration_hook(_mark)
