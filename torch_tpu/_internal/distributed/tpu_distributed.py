"""Registration of `tpu_dist` and the device ids of a process group (one process per
device, the torchrun model)."""
import atexit
import functools
import os
import sys

import torch
import torch.distributed as dist

from ... import _C

BACKEND = "tpu_dist"
DEFAULT_BACKEND = "cpu:gloo,tpu:tpu_dist"


def create_process_group(store, rank, size, timeout):
    """The c10d factory: a TpuBackend over its own Gloo group on the same store. It also
    makes the groups of dist.split_group (TpuBackend::split calls it back)."""
    _select_visible_chip()
    # Own prefix: the cpu Gloo backend of the same group uses this store too.
    host = dist.ProcessGroupGloo(dist.PrefixStore(f"{BACKEND}/", store), rank, size, timeout)
    backend = _C._dist_create_backend(host, os.environ.get("TPU_DIST_TRANSPORT", ""), timeout, store)
    _drain_at_exit()
    backend._set_sequence_number_for_group()
    return _checked(backend, store, rank, size, timeout)


@functools.cache
def _drain_at_exit():
    """Collectives still completing on the transport's threads finish before Python
    finalizes: a thread that takes the GIL after that is torn down mid-C++ frame (abort)."""
    atexit.register(_C._dist_drain)


def _checked(backend, store, rank, size, timeout):
    """TPU_DIST_CHECKS=1: ranks must agree on each collective (op, shapes, dtypes)
    before any data moves; a mismatch would otherwise kill a rank inside the transport.
    c10d's own ProcessGroupWrapper compares the ranks' fingerprints over a helper Gloo
    group and raises an error naming the op, shapes and ranks (TORCH_DISTRIBUTED_DEBUG=
    DETAIL wraps every backend so already). Off by default: it costs a host barrier and
    all-gather per collective, and its barrier turns a dead peer into a wait for the
    timeout rather than an immediate error."""
    if os.environ.get("TPU_DIST_CHECKS", "0") != "1" or size == 1:
        return backend
    if dist.get_debug_level() == dist.DebugLevel.DETAIL:
        return backend
    from torch._C._distributed_c10d import _ProcessGroupWrapper
    helper = dist.ProcessGroupGloo(dist.PrefixStore(f"{BACKEND}/checks/", store), rank, size, timeout)
    return _ProcessGroupWrapper(backend, helper)


def _select_visible_chip():
    """TPU_VISIBLE_CHIPS=k picks tpu:k when this process sees several devices (on a TPU
    VM libtpu itself then exposes only that chip, as tpu:0)."""
    chips = os.environ.get("TPU_VISIBLE_CHIPS", "").split(",")
    if len(chips) == 1 and chips[0].strip().isdigit():
        k = int(chips[0])
        if k < torch.tpu.device_count() and torch.tpu.device_count() > 1:
            torch.tpu.set_device(k)


def _default_backend(init):
    """With no backend (and no device_id), torch would give only the accelerator's
    backend; give both, as `cpu:gloo,cuda:nccl` is on CUDA machines."""

    @functools.wraps(init)
    def init_process_group(backend=None, *args, **kwargs):
        if backend is None and kwargs.get("device_id") is None:
            backend = DEFAULT_BACKEND
        init(backend, *args, **kwargs)
        if BACKEND in str(backend):
            # torch looks its plugins up by upper-case name in a lower-case map, so a
            # mixed backend string leaves the default backend unset.
            pg = dist.group.WORLD
            pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)

    init_process_group._tpu_default_backend = True
    return init_process_group


def register():
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, create_process_group, devices=["tpu"])
    _C._dist_set_group_factory(create_process_group)
    from torch_tpu import _on_import
    _on_import.patch_when_imported("torch.nn.parallel.distributed", "DistributedDataParallel", _allow_bf16_hooks)
    from torch.distributed import distributed_c10d as c10d

    if not getattr(c10d.init_process_group, "_tpu_default_backend", False):
        c10d.init_process_group = _default_backend(c10d.init_process_group)
        dist.init_process_group = c10d.init_process_group
        # init_device_mesh() initializes the default group through its own import.
        mesh = sys.modules.get("torch.distributed.device_mesh")
        if mesh is not None and hasattr(mesh, "init_process_group"):
            mesh.init_process_group = c10d.init_process_group


_BF16_HOOKS = ("bf16_compress_hook", "bf16_compress_wrapper_hook")


def _allow_bf16_hooks(module) -> None:
    """DDP refuses its bf16 compression hooks by name unless NCCL or XCCL is built in;
    over tpu_dist they work (bf16 all_reduce), so a CUDA script's hook registers."""
    ddp = module.DistributedDataParallel
    check = ddp._check_comm_hook
    if getattr(check, "_tpu_bf16", False):
        return

    def _check_comm_hook(self, hook):
        if getattr(hook, "__name__", "") in _BF16_HOOKS and BACKEND in str(dist.get_backend(self.process_group)):
            # The other checks (signature, annotations) run on a renamed wrapper.
            renamed = functools.wraps(hook)(lambda *args, **kwargs: hook(*args, **kwargs))
            renamed.__name__ = "tpu_dist_" + hook.__name__
            hook = renamed
        return check(self, hook)

    _check_comm_hook._tpu_bf16 = True
    ddp._check_comm_hook = _check_comm_hook


def transport(group=None) -> str:
    """Which transport the group's tpu backend uses ("host": host-staged over Gloo)."""
    pg = group or dist.group.WORLD
    backend = pg._get_backend(torch.device("tpu"))
    backend = getattr(backend, "wrapped_pg", backend)  # under the agreement checks
    return _C._dist_transport(backend)


def global_device_id() -> int:
    """This process's device among all processes' devices. One process per device: its
    rank (without a process group, the current local device)."""
    if not (dist.is_available() and dist.is_initialized()):
        return torch.tpu.current_device()
    return dist.get_rank()


def all_global_device_ids() -> list:
    """Every process's device id, in rank order (without a group: the local devices)."""
    if not (dist.is_available() and dist.is_initialized()):
        return list(range(torch.tpu.device_count()))
    return list(range(dist.get_world_size()))
