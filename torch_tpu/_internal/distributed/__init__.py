"""`tpu_dist`, the c10d backend for tpu tensors (C++: csrc/distributed/).

Importing this module registers it, so `init_process_group("tpu_dist")` works and
`init_process_group()` with no backend gives "cpu:gloo,tpu:tpu_dist". Collectives on
tpu tensors run host-staged over Gloo: device -> host, the Gloo collective, host -> device
in place (the XLA CPU plugin's client cannot span processes).
"""
from .tpu_distributed import create_process_group, register

register()

__all__ = ["create_process_group", "register"]
