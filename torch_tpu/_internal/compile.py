"""Compiled mode: the torch.compile backend "tpu".

Dynamo captures FX graphs; AOTAutograd turns each into ATen forward and backward
graphs (min-cut partition, as Inductor: cheap values are recomputed in the backward
rather than saved). Each ATen graph is lowered by replaying it through the eager
kernels while the backend records everything (EagerMode.INTERNAL_DEFER_ALL): the
recorded ops become one fused StableHLO program — the DeferAndFuse builder, its caches and donation — flushed
at the graph's end. Eager lowerings are compiled lowerings; a graph's later calls
record the same program and hit the executable cache, so a steady call is one
execution per graph. Graph breaks run eagerly in the surrounding mode.

`torch.compile(model, backend="tpu")` finds the backend through the
`torch_dynamo_backends` entry point (no import of torch_tpu needed). A plain
`torch.compile(model)` reaches Inductor, which has no tpu code generator of its own
here: graphs whose tensors live on tpu are routed to this backend instead.

Cost: each call re-records its graph (tens of µs per op on the host); the next lever
is replaying a recorded graph in C++ with new input buffers. The eager mode is
process-wide: tpu ops another Python thread runs during a graph's call join its program.
"""
import time

import torch

from .. import _C
from .execution_mode import EagerMode

_DEFER_AND_FUSE = EagerMode.DEFER_AND_FUSE.value
_DEFER_ALL = EagerMode.INTERNAL_DEFER_ALL.value
_DEBUG = EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING.value

# Merged into torch_tpu.metrics().
counters = {
    "compiled_graphs": 0,             # ATen graphs (forward, backward, inference) lowered
    "compiled_recompiles": 0,         # Dynamo graphs compiled again for a compiled frame
    "compiled_graph_calls": 0,        # calls of compiled graphs
    "compiled_lowering_seconds": 0.0,  # AOTAutograd + each graph's first recording
    "compiled_call_seconds": 0.0,     # host time in graph calls: recording, handing over
}


class _CompiledGraph:
    """One ATen graph; each call records it and runs it as one fused program."""

    def __init__(self, gm: torch.fx.GraphModule, debug: bool):
        # AOTAutograd passes a list we may clear, so inputs die early. An instance
        # attribute: the torch._dynamo.disable wrapper of backward graphs copies __dict__.
        self._boxed_call = True
        from torch.fx.graph import _BoxedCodeGen
        gm.graph.set_codegen(_BoxedCodeGen())
        gm.recompile()
        self._gm = gm
        self._first = True
        if debug:
            print(gm.print_readable(print_output=False, include_stride=True))
        counters["compiled_graphs"] += 1

    def __call__(self, args):
        t0 = time.perf_counter()
        prev = _C.get_eager_mode()
        if prev == _DEFER_AND_FUSE:
            _C.flush("before compiled graph")  # the surrounding eager work is its own graph
        _C.set_eager_mode(_DEFER_ALL)
        try:
            out = self._gm(args)
        finally:
            _C.flush("compiled graph")  # only values still referenced become outputs
            _C.set_eager_mode(prev)
        if prev == _DEBUG:
            _C.synchronize(-1)  # Debug: errors surface at the call
        dt = time.perf_counter() - t0
        counters["compiled_graph_calls"] += 1
        counters["compiled_call_seconds"] += dt
        if self._first:
            counters["compiled_lowering_seconds"] += dt
            self._first = False
        return out


def _decompositions() -> dict:
    """PyTorch's decompositions of the ops our registry lacks (those torch_tpu runs
    eagerly through a decomposition kernel): applied at trace time instead."""
    from torch._decomp import decomposition_table

    from .. import _decompositions as d
    names = set(d.registered) - set(d._WRAPPERS)
    return {op: fn for op, fn in decomposition_table.items()
            if isinstance(op, torch._ops.OpOverload) and d._name(op) in names}


def _symbols(example_inputs):
    """The free symbols of a Dynamo graph's inputs (dynamic shapes), in order."""
    syms = []
    for x in example_inputs:
        vals = [x] if isinstance(x, torch.SymInt) else (
            list(x.shape) + list(x.stride()) if isinstance(x, torch.Tensor) else [])
        for v in vals:
            if isinstance(v, torch.SymInt):
                syms.extend(s for s in v.node.expr.free_symbols if s not in syms)
    return syms


def _check_dynamism(example_inputs, dynamism: bool) -> None:
    """Dynamic sizes compile only when bounded (mark_dynamic with min and max)."""
    syms = _symbols(example_inputs)
    if not syms:
        return
    from torch.utils._sympy.numbers import int_oo
    env = _shape_env(example_inputs)
    unbounded = []
    for s in syms:
        r = env.var_to_range.get(s) if env is not None else None
        if r is None or r.upper == int_oo or not r.upper.is_number:
            unbounded.append(str(s))
    if unbounded or not dynamism:
        why = (f"dynamic sizes without bounds ({', '.join(unbounded)})" if unbounded
               else "dynamic sizes, but TpuBackend(dynamism=False)")
        raise NotImplementedError(
            f"torch_tpu compiled mode: the graph has {why}. Compile with "
            "torch.compile(..., dynamic=False), or bound each dynamic dimension with "
            "torch_tpu.dynamism.mark_dynamic(tensor, dim, min, max) and use "
            "TpuBackend(dynamism=True). A size outside the bounds [min, max] of an earlier "
            "mark_dynamic lands here too: the graph is traced again without bounds.")


def _shape_env(example_inputs):
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return x.node.shape_env
        if isinstance(x, torch.Tensor):
            for v in x.shape:
                if isinstance(v, torch.SymInt):
                    return v.node.shape_env
    return None


class TpuBackend:
    """The compiler function Dynamo calls with each captured graph.

    `debug` prints each ATen graph as it is lowered; `dynamism` allows dynamic sizes
    bounded by `mark_dynamic`. Options of Google's TorchTPU this backend has no use for
    (`enable_serialization`, `precompile_steps`, ...) are accepted and ignored: the
    executable caches already persist compiled programs.
    """

    def __init__(self, debug: bool = False, dynamism: bool = False, **ignored):
        self.debug = debug
        self.dynamism = dynamism

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, **ignored):
        # `mode=` and `options=` (from torch.compile) have no meaning here.
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        from torch._guards import CompileContext

        _check_dynamism(example_inputs, self.dynamism)
        cid = CompileContext.current_compile_id()
        if cid is not None and (cid.frame_compile_id or 0) > 0:
            counters["compiled_recompiles"] += 1
        t0 = time.perf_counter()
        lower = self._lower
        try:
            return aot_autograd(fw_compiler=lower, bw_compiler=lower, inference_compiler=lower,
                                partition_fn=min_cut_rematerialization_partition,
                                decompositions=_decompositions(),
                                keep_inference_input_mutations=True)(gm, example_inputs)
        finally:
            counters["compiled_lowering_seconds"] += time.perf_counter() - t0

    def _lower(self, gm: torch.fx.GraphModule, example_inputs):
        if _symbols(example_inputs):  # bounded (checked): one program for the bound
            from .bounded import BoundedGraph, user_outputs
            return BoundedGraph(gm, lambda g: _CompiledGraph(g, self.debug), user_outputs(gm))
        return _CompiledGraph(gm, self.debug)


tpu_backend = TpuBackend()  # the entry point Dynamo loads for backend="tpu"


def _holds_tpu(gm, example_inputs) -> bool:
    if any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in example_inputs):
        return True
    for n in gm.graph.nodes:
        v = n.meta.get("example_value")
        if isinstance(v, torch.Tensor) and v.device.type == "tpu":
            return True
    return False


def _route_inductor_to_tpu() -> None:
    """`torch.compile(model)` means Inductor, whose tpu path needs JAX/Pallas: graphs
    on tpu go to this backend instead (with any `mode=`), all others to Inductor."""
    wrapper = torch._TorchCompileInductorWrapper
    if getattr(wrapper, "_torch_tpu_routed", False):
        return
    inductor_call = wrapper.__call__

    def __call__(self, model_, inputs_):
        if _holds_tpu(model_, inputs_):
            return tpu_backend(model_, inputs_)
        return inductor_call(self, model_, inputs_)

    wrapper.__call__ = __call__
    wrapper._torch_tpu_routed = True
