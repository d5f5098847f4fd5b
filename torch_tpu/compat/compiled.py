"""Compiled mode of the compatibility pipeline: torch.compile(model, backend="tpu") on the
device copy, what Dynamo did with it (graphs, breaks, recompiles), and its errors' classes."""
import contextlib

import torch

import torch_tpu
from torch_tpu._workers import first_line

# A run for which Dynamo handed no graph to the backend ran eagerly (the conformance
# tool's name for it): right values, but nothing compiled.
EAGER_IN_COMPILED = "eager: no graph compiled"
MAX_REASONS = 3  # graph-break reasons kept per model (distinct first lines)


def wrap(model, backend="tpu"):
    """The user's one-line change (backend "eager": Dynamo alone, the CPU control)."""
    return torch.compile(model, backend=backend)


def fails_on_cpu(run_cpu_step) -> str | None:
    """Whether Dynamo fails on the model with no device in it: `run_cpu_step()` runs the
    step on CPU under torch.compile(backend="eager"). Returns its error's first line, or
    None when it runs (then a compiled error on tpu is ours)."""
    torch._dynamo.reset()
    try:
        run_cpu_step()
    except Exception as e:  # noqa: BLE001
        return first_line(e)
    finally:
        torch._dynamo.reset()
    return None


def _backend_counters() -> dict:
    from torch_tpu._internal import compile as tpu_compile
    return dict(tpu_compile.counters)


@contextlib.contextmanager
def session(record: dict):
    """One model's compiled run, from a fresh Dynamo (no graphs, guards or recompile counts
    of the model before it); fills `record` with compiled graphs, recompiles, graph calls
    and graph breaks (count and the first distinct reasons), also when the run fails. A
    failed run leaves no pending step behind for the next model."""
    from torch._dynamo import utils as dynamo_utils
    torch._dynamo.reset()
    before = _backend_counters()
    try:
        yield
    except BaseException:
        _drain()
        raise
    finally:
        after = _backend_counters()
        reasons = [r.reason for r in dynamo_utils.graph_break_reasons if r.graph_break]
        first = []
        for r in reasons:
            line = first_line_of(r)
            if line not in first and len(first) < MAX_REASONS:
                first.append(line)
        record.update(
            compiled_graphs=after["compiled_graphs"] - before["compiled_graphs"],
            compiled_recompiles=after["compiled_recompiles"] - before["compiled_recompiles"],
            compiled_graph_calls=after["compiled_graph_calls"] - before["compiled_graph_calls"],
            graph_breaks=len(reasons), graph_break_reasons=first)
        torch._dynamo.reset()


def first_line_of(text: str) -> str:
    lines = [s.strip() for s in str(text).splitlines() if s.strip()]
    return (lines[0] if lines else "")[:200]


def _drain() -> None:
    """After a failure mid-step: the backend's open step is closed and any pending device
    work is run (its own error, if any, is the failed model's, not the next one's)."""
    from torch_tpu._internal import compile as tpu_compile
    tpu_compile.close_open_step()
    with contextlib.suppress(Exception):
        torch_tpu.synchronize()


def error(e: BaseException, classify) -> dict:
    """{"message", "class"} of a compiled run's exception: the backend's own exception
    inside Dynamo's BackendCompilerFailed, classified by where it failed."""
    from torch._dynamo import exc
    if isinstance(e, exc.BackendCompilerFailed):
        inner = e.inner_exception
        msg = first_line(inner)
        if isinstance(inner, NotImplementedError) and "dynamic sizes" in str(inner):
            return {"message": msg, "class": "dynamic shapes"}
        cls = classify(msg)
        return {"message": msg, "class": "compile error" if cls == "other" else cls}
    msg = first_line(e)
    if isinstance(e, exc.TorchDynamoException):
        return {"message": msg, "class": "dynamo"}
    return {"message": msg, "class": classify(msg)}
