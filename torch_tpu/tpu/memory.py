"""`torch.tpu.memory`, as `torch.cuda.memory`: the memory functions under their module path,
and the memory history (`_record_memory_history`, `_snapshot`, `_dump_snapshot`) that
PyTorch's memory visualizer (pytorch.org/memory_viz) reads.

A tpu storage is one allocation (device buffers are the runtime's, nothing is cached or
split): the snapshot's segments are the live storages made while recording, each with the
Python stack that made it, and its trace the storages made and freed since."""
import pickle
import sys

from .. import _C
from . import (empty_cache, get_per_process_memory_fraction, max_memory_allocated, max_memory_reserved,  # noqa: F401
               mem_get_info, memory_allocated, memory_reserved, memory_stats, memory_summary,
               reset_accumulated_memory_stats, reset_max_memory_allocated, reset_peak_memory_stats,
               set_per_process_memory_fraction)


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries: int = sys.maxsize,
                           device=None, clear_history: bool = False, **unused) -> None:
    """Starts (enabled="all": live storages and the trace; "state": live storages only) or
    stops (enabled=None) recording. Stacks are Python's (`context`/`stacks` choices that
    ask for C++ frames record the Python ones)."""
    if enabled is not None and clear_history:
        _C._record_memory_history(None)
    _C._record_memory_history(enabled, max_entries)


def _snapshot(device=None, augment_with_fx_traces: bool = False) -> dict:
    """{"segments": [...], "device_traces": [[...] per device]}, as torch.cuda.memory._snapshot."""
    return _C._memory_snapshot()


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def memory_snapshot(mempool_id=None) -> list:
    """The live storages recorded, as torch.cuda.memory_snapshot's segments."""
    return _snapshot()["segments"]
