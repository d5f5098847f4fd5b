"""`torch.tpu`: the device module, shaped like `torch.cuda`."""
import contextlib

import torch

from . import _C


def is_available() -> bool:
    return _C.device_count() > 0


def is_initialized() -> bool:
    return True


def _lazy_init():
    pass


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def _index(device=None) -> int:
    if device is None:
        return _C.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "tpu":
        raise ValueError(f"expected a tpu device, got {device}")
    return _C.current_device() if device.index is None else device.index


def set_device(device) -> None:
    _C.set_device(_index(device))


@contextlib.contextmanager
def device(dev):
    prev = _C.current_device()
    _C.set_device(_index(dev))
    try:
        yield
    finally:
        _C.set_device(prev)


def synchronize(device=None) -> None:
    """Waits for every launched program on the device; raises any deferred error."""
    _C.synchronize(-1 if device is None else _index(device))


def manual_seed(seed: int) -> None:
    _C.manual_seed(_C.current_device(), int(seed) & 0xFFFFFFFFFFFFFFFF)


def manual_seed_all(seed: int) -> None:
    for d in range(device_count()):
        _C.manual_seed(d, int(seed) & 0xFFFFFFFFFFFFFFFF)


def seed() -> None:
    import random
    manual_seed(random.getrandbits(63))


def seed_all() -> None:
    import random
    manual_seed_all(random.getrandbits(63))


def initial_seed() -> int:
    return _default_generator().initial_seed()


def _default_generator(device=None):
    return _C.default_generator(_index(device))


def get_rng_state(device=None):
    return _default_generator(device).get_state()


def set_rng_state(state, device=None):
    _default_generator(device).set_state(state)


def memory_allocated(device=None) -> int:
    return _C.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    return _C.max_memory_allocated(_index(device))


def memory_reserved(device=None) -> int:
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def reset_peak_memory_stats(device=None) -> None:
    _C.reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def memory_stats(device=None) -> dict:
    d = _index(device)
    cur, peak = _C.memory_allocated(d), _C.max_memory_allocated(d)
    return {
        "allocated_bytes.all.current": cur,
        "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": cur,
        "reserved_bytes.all.peak": peak,
        "num_alloc.all": _C.num_allocs(d),
        "bytes_limit": _C.memory_limit(d),
    }


def mem_get_info(device=None):
    """(free, total) bytes: total is the device's capacity (TPU_MEMORY_LIMIT overrides)."""
    d = _index(device)
    total = _C.memory_limit(d)
    return (max(total - _C.memory_allocated(d), 0), total)


def empty_cache() -> None:
    """Buffers are freed when their last tensor goes; nothing is held back."""
    import gc
    gc.collect()


def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]


def _is_in_bad_fork() -> bool:
    return False


def get_device_name(device=None) -> str:
    return f"tpu ({_C.platform()} PJRT plugin)"


# Streams and events as torch.cuda spells them (FSDP2 asks the device module for them).
# Each device has one in-order queue: these are PyTorch's generic stream objects.
def Stream(device=None, priority: int = 0, **kwargs):
    return torch.Stream(device=torch.device("tpu", _index(device)), priority=priority)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
    return torch.Event(device="tpu", enable_timing=enable_timing, blocking=blocking,
                       interprocess=interprocess)


def current_stream(device=None):
    return torch.accelerator.current_stream(_index(device))


def set_stream(stream) -> None:
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(s):
    if s is None:
        yield
        return
    prev = torch.accelerator.current_stream(s.device_index)
    torch.accelerator.set_stream(s)
    try:
        yield
    finally:
        torch.accelerator.set_stream(prev)
