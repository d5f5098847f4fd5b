"""`torch.tpu`: the device module, shaped like `torch.cuda`."""
import contextlib
import sys
import warnings

import torch

from .. import _C


def is_available() -> bool:
    return _C.device_count() > 0


def is_initialized() -> bool:
    """Whether this process has started the device runtime (plugin, client, devices)."""
    return _C.is_initialized()


def init() -> None:
    """Starts the device runtime now rather than at the first tpu operation."""
    _lazy_init()


def _lazy_init():
    # Raises "Cannot re-initialize TPU in forked subprocess" in a child forked after the
    # parent started the runtime (PyTorch calls this before creating tpu tensors).
    _C.init_client()


def _is_in_bad_fork() -> bool:
    """True in a child forked after the parent started the runtime: tpu is unusable there
    (torch.manual_seed and DataLoader workers then leave the tpu generators alone)."""
    return _C.in_bad_fork()


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def _index(device=None, check=True) -> int:
    """The device index `device` names; with `check`, one that exists (as CUDA's calls
    refuse an invalid ordinal)."""
    if device is None:
        return _C.current_device()
    if isinstance(device, int):
        i = device
    else:
        device = torch.device(device)
        if device.type != "tpu":
            raise ValueError(f"expected a tpu device, got {device}")
        i = _C.current_device() if device.index is None else device.index
    if check and not 0 <= i < _C.device_count():
        raise RuntimeError(f"Invalid device argument: tpu:{i} does not exist ({_C.device_count()} tpu devices)")
    return i


def set_device(device) -> None:
    """As torch.cuda.set_device: a negative index changes nothing."""
    i = _index(device, check=False)
    if i >= 0:
        _C.set_device(i)


@contextlib.contextmanager
def device(dev):
    """As torch.cuda.device: None or a negative index changes nothing."""
    i = -1 if dev is None else _index(dev, check=False)
    if i < 0:
        yield
        return
    prev = _C.current_device()
    _C.set_device(i)
    try:
        yield
    finally:
        _C.set_device(prev)


def synchronize(device=None) -> None:
    """Waits for every launched program on the device; raises any deferred error."""
    _C.synchronize(-1 if device is None else _index(device))


def _seed_bits(seed) -> int:
    """A seed as the 64 bits a generator keeps: torch.Generator takes [-2**63, 2**64) (a
    negative one as its two's complement) and refuses the rest; masking made 2**64 seed 0."""
    seed = int(seed)
    if not -(1 << 63) <= seed < (1 << 64):
        raise ValueError(f"manual_seed: the seed {seed} does not fit in 64 bits (Overflow when unpacking long long)")
    return seed & 0xFFFFFFFFFFFFFFFF


def manual_seed(seed: int) -> None:
    _C.manual_seed(_C.current_device(), _seed_bits(seed))


def manual_seed_all(seed: int) -> None:
    bits = _seed_bits(seed)
    for d in range(device_count()):
        _C.manual_seed(d, bits)


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
    # As torch.cuda.set_rng_state: a non-contiguous state is copied (a tpu one raises).
    if isinstance(state, torch.Tensor) and state.device.type == "cpu":
        state = state.clone(memory_format=torch.contiguous_format)
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


def reset_accumulated_memory_stats(device=None) -> None:
    """Zeroes the accumulated counts (allocations); current and peak bytes stay."""
    _C.reset_accumulated_memory_stats(_index(device))


def memory_cached(device=None) -> int:
    warnings.warn("torch.tpu.memory_cached has been renamed to torch.tpu.memory_reserved", FutureWarning)
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    warnings.warn("torch.tpu.max_memory_cached has been renamed to torch.tpu.max_memory_reserved",
                  FutureWarning)
    return max_memory_reserved(device)


def reset_max_memory_cached(device=None) -> None:
    warnings.warn("torch.tpu.reset_max_memory_cached now calls torch.tpu.reset_peak_memory_stats, "
                  "which resets all peak memory stats", FutureWarning)
    reset_peak_memory_stats(device)


def memory_stats_as_nested_dict(device=None) -> dict:
    """memory_stats() with its dotted keys as nested dicts ("allocated_bytes.all.peak")."""
    nested = {}
    for key, value in memory_stats(device).items():
        *path, last = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


def is_tf32_supported() -> bool:
    """No TensorFloat-32 here: float32 matmuls follow torch.set_float32_matmul_precision
    ("high" and "medium" take bfloat16 passes)."""
    return False


def can_device_access_peer(device, peer_device) -> bool:
    """Every tpu device can copy to every other one (PJRT's device-to-device copies)."""
    _index(device), _index(peer_device)  # an invalid ordinal raises, as on CUDA
    return True


has_half = True


def get_allocator_backend() -> str:
    """PJRT's own buffers, freed with their last tensor (no caching allocator to choose)."""
    return "native"


def is_current_stream_capturing() -> bool:
    """No stream is ever capturing: tpu has no CUDA-graph capture (libraries ask before
    syncing or allocating)."""
    return False


def memory_stats(device=None) -> dict:
    """torch.cuda.memory_stats' keys (the device allocator's stats, as
    torch.accelerator.memory_stats gives them), and the device's limit."""
    d = _index(device)
    stats = dict(torch.accelerator.memory_stats(d))
    stats.update({"num_alloc.all": _C.num_allocs(d), "bytes_limit": _C.memory_limit(d)})
    return stats


def mem_get_info(device=None):
    """(free, total) bytes: total is the device's capacity (TPU_MEMORY_LIMIT overrides).
    Free leaves out the runtime's cached scalars too, which memory_allocated() does not count."""
    free, total = torch.accelerator.get_memory_info(_index(device))
    return (free, total)


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Caps this process's allocations on `device` at `fraction` of its capacity: past it,
    an allocation raises torch.OutOfMemoryError (as on CUDA)."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    d = _index(device)
    _C.set_device_memory_limit(d, max(int(fraction * _C.memory_capacity(d)), 1))


def get_per_process_memory_fraction(device=None) -> float:
    d = _index(device)
    return _C.memory_limit(d) / _C.memory_capacity(d)


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A short table of memory_stats() (the allocator keeps no segment or block pools)."""
    stats = memory_stats(device)
    mib = 1024 * 1024
    rows = [f"tpu:{_index(device)} memory summary",
            f"  allocated: {stats['allocated_bytes.all.current'] / mib:.1f} MiB "
            f"(peak {stats['allocated_bytes.all.peak'] / mib:.1f} MiB)",
            f"  allocations: {stats['num_alloc.all']}",
            f"  limit: {stats['bytes_limit'] / mib:.1f} MiB"]
    return "\n".join(rows) + "\n"


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 is a native dtype of every XLA backend (TPU's training dtype)."""
    return is_available()


def empty_cache() -> None:
    """Buffers are freed when their last tensor goes; nothing is held back."""
    import gc
    gc.collect()


def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


class _TpuDeviceProperties:
    """What torch.tpu.get_device_properties returns (the fields torch.cuda's has that
    apply: name, total_memory, major, minor)."""

    def __init__(self, index: int):
        self.index = index
        self.type = "tpu"
        self.platform = _C.platform()
        self.device_kind = _C.device_kind(index)
        # On a TPU the plugin names the chip ("TPU v4"); other plugins name their kind.
        self.name = (self.device_kind if self.platform == "tpu"
                     else f"tpu ({self.platform} PJRT plugin)")
        self.total_memory = _C.memory_limit(index)
        self.major, self.minor = _capability(self.device_kind)

    def __repr__(self):
        return (f"_TpuDeviceProperties(name='{self.name}', device_kind='{self.device_kind}', "
                f"major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1024 * 1024)}MB)")


def _capability(kind: str):
    """(generation, 0) from a TPU kind such as "TPU v5 lite"; (0, 0) when it names none."""
    import re
    m = re.search(r"\bv(\d+)", kind)
    return (int(m.group(1)), 0) if m else (0, 0)


def get_device_properties(device=None) -> _TpuDeviceProperties:
    _lazy_init()
    d = _index(device, check=False)  # CUDA raises an AssertionError here
    if not 0 <= d < device_count():
        raise AssertionError(f"Invalid device id: tpu:{d} (this process has {device_count()})")
    return _TpuDeviceProperties(d)


def get_device_capability(device=None):
    """(major, minor) like torch.cuda's: the TPU generation, (0, 0) off TPU hardware."""
    p = get_device_properties(device)
    return p.major, p.minor


def get_rng_state_all():
    return [get_rng_state(d) for d in range(device_count())]


def set_rng_state_all(states) -> None:
    for d, state in enumerate(states):
        set_rng_state(state, d)


# ---- streams and events (every stream of a device is its one in-order queue) ----------

_stream_priorities = {}  # (device index, stream id) -> the priority a stream was made with


class Stream(torch.Stream):
    """torch.cuda.Stream's shape: `torch.tpu.Stream(device=None, priority=0)`."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if kwargs:  # (stream_id=, device_index=, device_type=): an existing stream
            s = super().__new__(cls, **kwargs)
        else:
            s = super().__new__(cls, device=torch.device("tpu", _index(device)), priority=priority)
            _stream_priorities[(s.device_index, s.stream_id)] = priority
        # A stream rebuilt from its id (current_stream) keeps the priority it was made with.
        s._priority = priority if not kwargs else _stream_priorities.get((s.device_index, s.stream_id), 0)
        return s

    @property
    def priority(self) -> int:
        """The priority it was made with (a device's streams share one in-order queue, so
        priorities order nothing)."""
        return self._priority

    def record_event(self, event=None):
        """Records `event` (a new torch.tpu.Event when None) on this stream and returns it
        (torch.Stream's own accepts only its exact Event type, not torch.tpu.Event)."""
        if event is None:
            event = Event()
        event.record(self)
        return event


class Event(torch.Event):
    """torch.cuda.Event's shape: `torch.tpu.Event(enable_timing=False)`."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        return super().__new__(cls, device="tpu", enable_timing=enable_timing,
                               blocking=blocking, interprocess=interprocess)

    def elapsed_time(self, end_event) -> float:
        """Milliseconds of device work between this event's record and `end_event`'s."""
        return _C.event_elapsed_ms(self.event_id, end_event.event_id)


def current_stream(device=None) -> Stream:
    s = torch.accelerator.current_stream(_index(device))
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def default_stream(device=None) -> Stream:
    """This thread's default stream: the main thread's is id 0, every other thread has its
    own (CUDA's per-thread default streams), so DeferAndFuse records each thread's work as
    a graph of its own."""
    s = current_stream(device)
    return Stream(stream_id=_C._default_stream_id(s.device_index), device_index=s.device_index,
                  device_type=s.device_type)


def set_stream(stream) -> None:
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """torch.cuda.StreamContext's shape: `with StreamContext(s):` is `with stream(s):`."""

    def __init__(self, stream):
        self.stream = stream
        self._entered = []

    def __enter__(self):
        cm = stream(self.stream)
        self._entered.append(cm)
        return cm.__enter__()

    def __exit__(self, *exc):
        return self._entered.pop().__exit__(*exc)


@contextlib.contextmanager
def device_of(obj):
    """Makes the device of tensor `obj` current inside the block (no change for a tensor
    that is not on tpu), as torch.cuda.device_of does."""
    if isinstance(obj, torch.Tensor) and obj.device.type == "tpu":
        with device(obj.device.index):
            yield
    else:
        yield


# torch.cuda's error type, caught by scripts as `except torch.cuda.OutOfMemoryError`.
OutOfMemoryError = torch.OutOfMemoryError


def ipc_collect() -> None:
    """Nothing to collect: a tpu storage shared with another process (torch.multiprocessing)
    is freed when both sides have released it."""


def set_sync_debug_mode(debug_mode) -> None:
    """As torch.cuda's: 0 / "default" does nothing, 1 / "warn" warns and 2 / "error" raises
    at each op that makes the host wait for device values (a read back to the CPU, an
    output size that depends on values). torch.tpu.synchronize() never counts."""
    if isinstance(debug_mode, str):
        modes = {"default": 0, "warn": 1, "error": 2}
        if debug_mode not in modes:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = modes[debug_mode]
    if debug_mode not in (0, 1, 2):
        raise RuntimeError(f"invalid value of debug_mode {debug_mode!r}, expected 0, 1 or 2")
    _C._set_sync_debug_mode(int(debug_mode))


def get_sync_debug_mode() -> int:
    return _C._get_sync_debug_mode()


def get_arch_list() -> list:
    return []


def __getattr__(name):
    # Built on first use: listing the devices starts the runtime.
    if name == "default_generators":
        return tuple(_default_generator(i) for i in range(device_count()))
    # torch.cuda's flag, which PyTorch reads of a device module: torch.utils.checkpoint
    # saves and restores the device's random state only when it is set (without it a
    # checkpointed dropout drew another mask when recomputed).
    if name == "_initialized":
        return is_initialized()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextlib.contextmanager
def stream(s):
    """Makes `s` (and its device) current inside the block; both are restored after,
    also when the block raises."""
    if s is None:
        yield
        return
    prev_device = _C.current_device()
    prev_dst = torch.accelerator.current_stream(s.device_index)
    prev_src = torch.accelerator.current_stream(prev_device)
    _C.set_device(s.device_index)
    torch.accelerator.set_stream(s)
    try:
        yield s
    finally:
        torch.accelerator.set_stream(prev_dst)
        torch.accelerator.set_stream(prev_src)
        _C.set_device(prev_device)


from . import amp, graphs, memory, nvtx  # noqa: E402  (torch.tpu.amp, .graphs, .memory, .nvtx)
from . import random, streams  # noqa: E402  (torch.cuda.random's and torch.cuda.streams' names)
from . import legacy_types as _legacy_types  # noqa: E402

_legacy_types.install(sys.modules[__name__])  # torch.tpu.FloatTensor, ...
from .graphs import CUDAGraph, TPUGraph, graph, graph_pool_handle, make_graphed_callables  # noqa: E402,F401
from .memory import memory_snapshot  # noqa: E402,F401
