"""torch.cuda.nvtx's calls for code moved from a GPU: each range is a profiler range
(record_function), so it shows in torch.profiler's tables and traces."""
import contextlib
import itertools
import threading

import torch

_local = threading.local()


def _stack():
    if not hasattr(_local, "ranges"):
        _local.ranges = []
    return _local.ranges


def range_push(msg: str) -> int:
    """Opens a range on this thread; returns its depth (0 for the outermost)."""
    _stack().append(torch.ops.profiler._record_function_enter_new(msg, None))
    return len(_stack()) - 1


def range_pop() -> int:
    """Closes this thread's innermost range; returns the depth it had, or -1 if none was open."""
    stack = _stack()
    if not stack:
        return -1
    torch.ops.profiler._record_function_exit._RecordFunction(stack.pop())
    return len(stack)


_started = {}
_next_id = itertools.count(1)
_lock = threading.Lock()


def range_start(msg: str) -> int:
    """Opens a range that any thread may close with range_end(its id)."""
    handle = torch.ops.profiler._record_function_enter_new(msg, None)
    with _lock:
        rid = next(_next_id)
        _started[rid] = handle
    return rid


def range_end(range_id: int) -> None:
    with _lock:
        handle = _started.pop(range_id, None)
    if handle is not None:
        torch.ops.profiler._record_function_exit._RecordFunction(handle)


def mark(msg: str) -> None:
    """An instant: a range that closes at once."""
    range_push(msg)
    range_pop()


@contextlib.contextmanager
def range(msg: str, *args, **kwargs):
    """A range around the block; msg is formatted with args/kwargs as torch.cuda.nvtx does."""
    range_push(msg.format(*args, **kwargs))
    try:
        yield
    finally:
        range_pop()
