"""Eager execution modes, under the names Google's TorchTPU uses.

DEFER_NEVER (Strict, default): op by op, asynchronous.
DEFER_NEVER_AND_LAUNCH_BLOCKING (Debug): each op waits; errors surface at their line.
DEFER_AND_FUSE (fused eager): ops are recorded; the pending graph runs as one compiled
program when a value is needed (.item(), .cpu(), print, a fallback op, synchronize),
at the end of each optimizer step, or when it reaches TPU_FUSE_MAX_OPS ops.
INTERNAL_DEFER_ALL: what compiled mode records a graph in (no size bound, no step cut).
"""
import contextlib
import enum
import sys

from .. import _C


class EagerMode(enum.Enum):
    DEFER_NEVER = 0
    DEFER_NEVER_AND_LAUNCH_BLOCKING = 1
    DEFER_AND_FUSE = 2
    INTERNAL_DEFER_ALL = 3  # compiled mode: records a whole graph, never cut by size


def get_eager_mode() -> EagerMode:
    return EagerMode(_C.get_eager_mode())


def _set(mode: EagerMode) -> None:
    if not isinstance(mode, EagerMode):
        raise TypeError(f"expected a torch_tpu.EagerMode, got {mode!r}")
    _C.synchronize(-1)  # work recorded or launched under the old mode finishes under it
    _C.set_eager_mode(mode.value)


class set_eager_mode(contextlib.ContextDecorator):
    """Sets the mode; as a context manager, restores the previous one on exit."""

    def __init__(self, mode: EagerMode):
        self._prev = get_eager_mode()
        _set(mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _set(self._prev)
        return False


class _Module(sys.modules[__name__].__class__):
    """Makes `execution_mode.eager_mode = EagerMode.X` switch globally."""

    @property
    def eager_mode(self) -> EagerMode:
        return get_eager_mode()

    @eager_mode.setter
    def eager_mode(self, mode: EagerMode) -> None:
        _set(mode)


sys.modules[__name__].__class__ = _Module
