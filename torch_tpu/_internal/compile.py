"""Compiled mode: the torch.compile backend "tpu".

Dynamo captures FX graphs; AOTAutograd turns each into ATen forward and backward
graphs (min-cut partition with an activation memory budget of 0 by default: what can be
recomputed is recomputed in the backward rather than saved; see TpuBackend). Each ATen
graph is lowered by replaying it through the eager kernels while the backend records
everything (EagerMode.INTERNAL_DEFER_ALL): the recorded ops become one fused StableHLO
program (the DeferAndFuse builder, its caches and donation) flushed at the graph's end.
Eager lowerings are compiled lowerings. Graph breaks run eagerly in the surrounding mode.

With `fuse_steps` (the default) a steady training step's graphs are one program: the
forward's and the backward's replays are each one call of the pending graph, and the
compiled optimizer step (or an eager op, a host read, the next forward) flushes them, so
activations saved for the backward are values inside that program, never buffers.

A graph's first call is captured while it records (csrc/backend/captured_graph.cpp):
which graph input each program parameter reads, which parameters are constants or fresh
random states (drawn from the generator in the same order as recording would), which
results become outputs (sizes, strides) and which are written back into inputs (the
copy_ epilogue AOTAutograd leaves for BatchNorm's running stats). Later calls whose
inputs match (dtype, sizes, strides, storage layout) launch the cached program on the
new buffers without recording: a guard check and one launch. Inputs nobody holds any
more (the boxed call clears its list) are donated where the runtime allows it. A call
that does not match records again (and is captured too); a graph the capture cannot
explain (it reads a tensor that is not an input, a CPU tensor's value) always records.
A compiled optimizer step would be such a graph through its host step counters; on tpu
they are device tensors (see _capturable_steps_on_tpu), so it replays.
A first call that joins a step's pending graph (fuse_steps) is recorded apart from it,
explained, discarded and replayed into it, so a shape's first step compiles the one
program its later steps run.

Sizes dynamic without a bound (dynamic=True, maybe_mark_dynamic, Dynamo's automatic
dynamic shapes) stay symbolic in the graph (_check_dynamism): Dynamo traces the frame
once, and each call runs the ATen graph at its concrete sizes (sym_size nodes and SymInt
arithmetic are plain ints then), so the recording above is a static program for those
sizes. Captures are kept per size signature (_CompiledGraph._captures_for): a size met
again replays, a new one records and captures, no Dynamo recompile. Sizes bounded by
mark_dynamic take bounded.py's padded program instead.

`torch.compile(model, backend="tpu")` finds the backend through the
`torch_dynamo_backends` entry point (no import of torch_tpu needed). A plain
`torch.compile(model)` reaches Inductor, which has no tpu code generator of its own
here: graphs whose tensors live on tpu are routed to this backend instead.

The eager mode is process-wide: tpu ops another Python thread runs during a graph's call join its program.
"""
import collections
import contextlib
import functools
import operator
import os
import re
import threading
import time
import warnings

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
    "compiled_replays": 0,            # ... that launched a captured program, recording nothing
    "compiled_lowering_seconds": 0.0,  # AOTAutograd + each graph's first recording
    "compiled_aot_seconds": 0.0,      # ... of which AOTAutograd (PyTorch's tracing and partition)
    "compiled_record_seconds": 0.0,   # ... of which first calls: recording, capture (ours)
    "compiled_call_seconds": 0.0,     # host time in graph calls: recording or replaying
    "compiled_eager_graphs": 0,       # Dynamo graphs run eagerly instead (nested tensors)
}


_MAX_CAPTURES = 8  # input layouts one graph keeps programs for (per size signature)
# Size signatures a graph with unbounded dynamic sizes keeps programs for: past it the
# least recently used one's captures are dropped (met again, it records and captures
# anew; its compiled executable is still in the runtime's cache, so no XLA compile).
_MAX_SIZES = 64
_by_size_lock = threading.Lock()
REPLAY = True      # False: every call records (tests compare the two paths)
# AOTAutograd's common-subexpression pass over joint graphs: its first use imports
# Inductor's pattern matcher (much of Inductor) and it copies the graph, together about
# a second of a compiled process's first training step; XLA eliminates the same common
# subexpressions in each program it compiles, so the pass is off.
CSE = False
# A TorchDispatchMode that every graph call runs its ATen ops under, recording (no
# captured replay): the compat tool hands compiled graphs the CPU step's random draws
# this way (Dynamo refuses to trace under a dispatch mode). Set by `graph_calls_under`.
_graph_call_mode = None


@contextlib.contextmanager
def graph_calls_under(mode):
    """Compiled graphs called inside run their ops under the dispatch mode `mode`."""
    global _graph_call_mode
    prev, _graph_call_mode = _graph_call_mode, mode
    try:
        yield
    finally:
        _graph_call_mode = prev


class _PythonNumberTensors(torch.overrides.TorchFunctionMode):
    """While a capture records a graph's call: `torch.tensor(number)` is a constant of the
    graph, as a Python scalar argument of an op is. A higher-order op's eager body runs at
    each call and makes such tensors (flex_attention's `torch.tensor(-inf, device=...)` is
    an upload, its backward's `torch.tensor(0)` a CPU scalar); without this the capture
    could not tell them from a CPU tensor's varying value, and the graph recorded anew
    (and uploaded) at every call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            # The mode is off while it handles a call: the op's body runs with it on again,
            # dispatched as the op's own call would be past this mode.
            with self:
                keys = torch._ops._compute_keyset(args, kwargs, func.non_fallthrough_keys)
                return func.dispatch(keys.highestPriorityTypeId(), *args, **kwargs)
        if not _numbers_only_aten_call(func, args, kwargs):
            out = func(*args, **kwargs)
        else:
            prev = _C._capture_number_scope(True)
            try:
                out = func(*args, **kwargs)
            finally:
                _C._capture_number_scope(prev)
        if func is torch.tensor and args and type(args[0]) in (int, float, bool):
            _C._capture_note_constant(out)
        return out


def _numbers_only_aten_call(func, args, kwargs) -> bool:
    """An ATen op whose arguments hold a Python number and no CPU tensor: a CPU scalar its
    kernel reads is one of those numbers, a constant of the graph (Dynamo bakes the
    number in or guards on it; a number input of the graph is compared at each replay).
    Under vmap (flex_attention's score_mod: `score * 0.5`, `tanh(score / 30) * 30`)
    functorch's batching rule turns the number into a plain CPU tensor of the score's dtype
    before our kernel sees it; without this the capture took it for a CPU value that may
    vary and the graph recorded anew at every call. Custom ops are left out: their Python
    bodies may read a varying CPU value."""
    if not isinstance(func, torch._ops.OpOverload) or func.namespace not in ("aten", "prims"):
        return False
    number = False
    for a in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(a, torch.Tensor):
            if a.device.type == "cpu":
                return False
        elif type(a) in (int, float, bool):
            number = True
    return number


def _tensor_constants(gm: torch.fx.GraphModule) -> list:
    """The buffers of the tpu tensors the graph module holds for literal tensors of the compiled code
    (`torch.tensor(-inf, device=x.device)`: `_tensor_constant0`...). Nothing writes them (a
    graph's own writes are functional), so a capture replays them as constants; without
    this it declined ("reads a tpu value that is not among its inputs") and the graph
    recorded anew at every call. Parameters and buffers (which an optimizer or a later
    call may change) are not among them."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "get_attr" or not n.target.split(".")[-1].startswith("_tensor_constant"):
            continue
        t = gm
        for part in n.target.split("."):
            t = getattr(t, part, None)
        if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter) and t.device.type == "tpu":
            out.append(_C._constant_buffer(t))
    return out


def _mutated_inputs(gm: torch.fx.GraphModule) -> list:
    """Inputs the graph writes (AOTAutograd's copy_ epilogue), by position."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return sorted({placeholders.index(n.args[0]) for n in gm.graph.nodes
                   if n.op == "call_function" and n.target is torch.ops.aten.copy_.default
                   and n.args[0] in placeholders})


# How a steady call launches its captured program (CapturedGraph.replay's `how`).
_LAUNCH, _DEFER, _JOIN = 0, 1, 2
# A forward was deferred and no inference graph has joined it yet: backward graphs defer
# and the next inference graph joins. Without it they run as programs of their own, so
# eager work between graphs (DeferAndFuse's recorded ops) joins only a deferred step.
_step_open = False


def close_open_step() -> None:
    """Forgets a step a failed call left open (a forward deferred, its backward never
    run), so the next model's first backward or inference graph does not join it."""
    global _step_open
    _step_open = False


class _CompiledGraph:
    """One ATen graph: recorded and run as one fused program, then replayed.

    `role` is AOTAutograd's: "forward" and "backward" of a training graph, or
    "inference" (no autograd: a no_grad forward, a compiled optimizer step). With
    `fuse_steps`, a steady training step is one program: the forward's replay is one
    pending call (its outputs, the saved activations among them, stay promises), the
    backward's replay joins it, and the next inference graph (the compiled optimizer
    step) joins both and flushes; an eager optimizer's first op, a host read (`loss.item()`)
    or the next forward flushes them otherwise. Saved activations then never exist as
    buffers between programs: XLA keeps what the backward needs inside one program.
    """

    def __init__(self, gm: torch.fx.GraphModule, debug: bool, role: str = "inference",
                 fuse_steps: bool = True, per_size: bool = False):
        # AOTAutograd passes a list we may clear, so inputs die early. An instance
        # attribute: the torch._dynamo.disable wrapper of backward graphs copies __dict__.
        self._boxed_call = True
        if role == "backward":
            _mark_recomputations(gm)
        from torch.fx.graph import _BoxedCodeGen
        gm.graph.set_codegen(_BoxedCodeGen())
        gm.recompile()
        self._gm = gm
        self._first = True
        self._mutated = _mutated_inputs(gm)
        self._input_outputs = _outputs_that_are_inputs(gm)
        self._constants = _tensor_constants(gm)
        self._captures = []        # (capture, output template), one per input layout
        # Unbounded dynamic sizes (dynamic=True, automatic dynamic shapes): the graph is
        # symbolic and each call's concrete sizes (and int inputs) pick its own captures.
        self._per_size = per_size
        self._by_size = collections.OrderedDict()  # size signature -> captures
        self.replay_declined = ""  # why the capture could not explain the graph
        self.role = role
        self.fuse_steps = fuse_steps
        if debug:
            print(gm.print_readable(print_output=False, include_stride=True))
        counters["compiled_graphs"] += 1

    def _how(self, mode: int) -> int:
        global _step_open
        if not self.fuse_steps or mode == _DEBUG:
            return _LAUNCH  # Debug: each graph runs (and fails) at its call
        if self.role == "forward":
            _step_open = True
            return _DEFER
        if not _step_open:  # no deferred forward: run as a program of its own
            return _LAUNCH
        if self.role == "backward":
            return _DEFER
        _step_open = False
        return _JOIN

    def __call__(self, args):
        t0 = time.perf_counter()
        prev = _C.get_eager_mode()
        how = self._how(prev)
        if (prev == _DEFER_AND_FUSE and how == _LAUNCH) or (how == _DEFER and self.role == "forward"):
            # The surrounding eager work, or an earlier step left pending (a forward
            # without backward, gradient accumulation), is a program of its own.
            _C.flush("before compiled graph")
        # This thread records in DeferAll; other threads keep the process's mode.
        saved = _C._set_thread_eager_mode(_DEFER_ALL)
        try:
            captures = self._captures_for(args)
            out = self._replay(args, how, captures) if isinstance(args, list) and _graph_call_mode is None else None
            if out is None:
                out = self._record(args, how, captures)
        finally:
            _C._set_thread_eager_mode(saved)
        if prev == _DEBUG:
            _C.synchronize(-1)  # Debug: errors surface at the call
        dt = time.perf_counter() - t0
        counters["compiled_graph_calls"] += 1
        counters["compiled_call_seconds"] += dt
        if self._first:
            counters["compiled_lowering_seconds"] += dt
            counters["compiled_record_seconds"] += dt
            self._first = False
        return out

    def _captures_for(self, args) -> list:
        """The captures for this call's sizes: the graph's one list, or with per-size
        programs the list of the call's size signature (its tensors' shapes and int
        inputs: the values of the graph's symbols), the least recently used dropped past
        _MAX_SIZES. Floats stay out of the key (a number input that varies per call)."""
        if not self._per_size or not isinstance(args, list):
            return self._captures
        key = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a if type(a) is int else None
                    for a in args)
        with _by_size_lock:  # serving threads call one graph at their own sizes
            captures = self._by_size.get(key)
            if captures is None:
                captures = self._by_size[key] = []
                if len(self._by_size) > _MAX_SIZES:
                    self._by_size.popitem(last=False)
            else:
                self._by_size.move_to_end(key)
        return captures

    def _replay(self, args, how, captures):
        inputs = list(args) if self._input_outputs else None  # the call may clear `args`
        for cap, template in (captures if REPLAY else ()):
            tensors = cap.replay(args, how)  # None: the inputs do not match; args untouched
            if tensors is not None:
                counters["compiled_replays"] += 1
                return self._outputs(tensors, template, inputs)
        return None

    def _outputs(self, tensors, template, inputs):
        # An output that is a graph input comes back as that very tensor, as the graph
        # itself returns it: AOTAutograd saves such inputs for the backward, whose version
        # check must see an in-place change made after the forward (a new tensor over the
        # same storage has a version counter of its own, so the backward read the changed
        # values without an error).
        outs = [t if t is not None else c for t, c in zip(tensors, template[1])]
        for k, i in self._input_outputs.items():
            outs[k] = inputs[i]
        return template[0](outs)

    def _record(self, args, how=_LAUNCH, captures=None):
        _as_plain_tensors(args)
        captures = self._captures if captures is None else captures
        capturing = (REPLAY and isinstance(args, list) and not self.replay_declined
                     and len(captures) < _MAX_CAPTURES and _graph_call_mode is None)
        # A capture explains one flushed program. A call that joins the step's pending
        # graph (a forward, a backward after it, the update after both) is recorded apart
        # from that graph (captured_graph.cpp), then replayed into it: the step's first
        # program is the one later steps run, so each shape compiles once (recorded on
        # its own, each graph compiled alone and the joined step a step later again).
        # Other calls flush what is pending (a deferred forward) first.
        apart = capturing and how != _LAUNCH
        if not apart:
            _C.flush("before compiled graph")
        cap = _C._capture_begin(args, self._mutated, apart) if capturing else None
        if cap is not None:
            for b in self._constants:
                _C._capture_note_constant_buffer(b)
        kept = list(args) if apart else None  # the call clears `args`; the replay reads them
        role = _C._set_recording_role(_BACKWARD if self.role == "backward" else _NO_ROLE)
        try:
            with (_graph_call_mode if _graph_call_mode is not None
                  else _PythonNumberTensors() if cap is not None else contextlib.nullcontext()):
                out = self._gm(args)
        except BaseException:
            if cap is not None:
                _C._capture_abort(cap)
            _C.flush("compiled graph")
            raise
        finally:
            _C._set_recording_role(role)
        if cap is None:
            _C.flush("compiled graph")  # only values still referenced become outputs
            return out
        _C._capture_end(cap, list(out))  # flushes, then explains the program
        if cap.ready:
            consts = [None if isinstance(o, torch.Tensor) else o for o in out]
            template = (type(out), consts)
            captures.append((cap, template))
            if cap.recorded_apart:  # discarded, inputs as they were: the replay computes it
                del out
                inputs = list(kept)
                tensors = cap.replay(kept, how)
                if tensors is None:
                    raise RuntimeError(f"torch_tpu compiled mode: a graph's first call does not match "
                                       f"its own capture ({cap.miss})")
                return self._outputs(tensors, template, inputs)
        else:
            self.replay_declined = cap.why
        return out


# What the ops a compiled graph records are (deferred.h's RecordingRole): a backward's
# flush fences its recomputations of forward values as an eager backward's are.
_NO_ROLE, _BACKWARD, _RECOMPUTATION = 0, 1, 2


def _mark_recomputations(gm: torch.fx.GraphModule) -> None:
    """Brackets a backward graph's runs of torch.utils.checkpoint recomputations (the
    partition's copies of a region's forward ops) with calls that set the recording role.
    Their flush then has each wait for the backward's latest value before it: in one
    program XLA would otherwise make them all first (or merge them with a fused step's
    forward), every region's activations live at once, and checkpointing saved nothing.
    The budget's own recomputations (no region) are left as they are: they run first
    anyway, and apart from the forward they would be computed twice."""
    from torch.utils.checkpoint import CheckpointPolicy
    recompute = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)
    graph, current = gm.graph, _BACKWARD
    for n in list(graph.nodes):
        if n.op == "output":
            break
        if n.op != "call_function":
            continue
        want = _RECOMPUTATION if "ac_graph_id" in n.meta and n.meta.get("recompute") in recompute else _BACKWARD
        if want != current:
            with graph.inserting_before(n):
                graph.call_function(_C._set_recording_role, (want,))
            current = want
    if current != _BACKWARD:
        with graph.inserting_before(next(n for n in graph.nodes if n.op == "output")):
            graph.call_function(_C._set_recording_role, (_BACKWARD,))


def _outputs_that_are_inputs(gm: torch.fx.GraphModule) -> dict:
    """{output position: input position} of the graph's outputs that are its inputs."""
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    values = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    return {k: placeholders[v] for k, v in enumerate(values) if v in placeholders}


def _as_plain_tensors(args):
    """Inputs of a __torch_function__ Tensor subclass, as plain tensors (in place in the
    list): the graph is run as eager ops, and on a compiled function's first call
    AOTAutograd watches them with a dispatch mode that refuses tensor types it does not
    know (Inductor's generated kernels never meet it). Same data, same storage."""
    if not isinstance(args, list):
        return
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and type(a) not in (torch.Tensor, torch.nn.Parameter) \
                and type(a).__torch_dispatch__ is torch.Tensor.__torch_dispatch__:
            args[i] = a.as_subclass(torch.Tensor)


def _backward_nodes(joint: torch.fx.GraphModule) -> set:
    """The joint graph's nodes that read a tangent, directly or not: the backward's."""
    backward = set()
    for n in joint.graph.nodes:
        if (n.op == "placeholder" and n.name.startswith("tangents")) or any(a in backward for a in n.all_input_nodes):
            backward.add(n)
    return backward


def _recompute_cheap_ops(joint: torch.fx.GraphModule) -> None:
    """Tags the joint graph's forward ops for the min-cut partitioner: every op that is
    neither a contraction (matmul, convolution, attention: PyTorch's compute-intensive
    list) nor random (nor `empty`, seeded too) is recomputed in the backward, so what crosses from the forward to
    the backward is the contractions' results and the graph's inputs. Layer norms,
    activations, residual adds and softmaxes are cheap to redo inside the backward's
    program; saving their outputs was most of the saved memory."""
    from torch._functorch.partitioners import get_default_op_list
    from torch.utils.checkpoint import CheckpointPolicy
    ops = get_default_op_list()
    backward = _backward_nodes(joint)

    def contraction(n):
        name = str(n.target)
        return ops.is_compute_intensive(n) or "scaled_dot_product" in name or "convolution" in name

    for n in joint.graph.nodes:
        # A getitem follows its producer (a contraction's tuple cannot be saved whole).
        if (n.op != "call_function" or n in backward or "recompute" in n.meta or n.target is operator.getitem
                or contraction(n) or ops.is_random(n)
                or torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())):
            continue
        n.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
        for u in n.users:
            if u.target is operator.getitem:
                u.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE


def _must_save(joint: torch.fx.GraphModule) -> int:
    """Tags MUST_SAVE the forward values the backward may not recompute; returns how many.
    - Random ops' results (a dropout mask, Gumbel noise): recomputed, they would draw
      other numbers than the forward used.
    - Ops that read, directly or through views, an input the step writes (the graph's
      copy_ epilogue, or AOTAutograd's copy after it: Gemma3n's `weight.data.clamp_`):
      recomputed, they would read the written input (autograd refuses its newer version,
      or, for a buffer, the gradient is silently wrong).
    PyTorch's partition with a budget of 0 saves the inputs alone and recomputes all of
    these (aot_eager does the same on CPU then); tagged, it saves them."""
    from torch._functorch.partitioners import get_default_op_list
    from torch.utils.checkpoint import CheckpointPolicy
    ops = get_default_op_list()
    backward = _backward_nodes(joint)
    tagged = []

    def save(n):
        if not isinstance(n.meta.get("val"), (tuple, list)):
            tagged.append(n)
            return
        # A multi-output op is saved through copies of its results: the partition reads no
        # tag on a getitem, and recomputed its tuple (a training batch norm read the running
        # stats the step had already written, and an eval batch norm after it in the same
        # graph got the twice-updated variance in its gradient).
        for u in [u for u in n.users if u.target is operator.getitem and u not in backward]:
            with joint.graph.inserting_after(u):
                kept = joint.graph.call_function(torch.ops.aten.clone.default, (u,))
            kept.meta.update({k: v for k, v in u.meta.items() if k in ("val", "tensor_meta", "ac_graph_id")})
            u.replace_all_uses_with(kept, delete_user_cb=lambda user: user is not kept)
            tagged.append(kept)

    def save_dropout(n):
        # The partition never saves a getitem as such (its tag is not read), and may
        # recompute a random op's tuple in the backward: a dropout mask drawn again.
        # Here the mask is read through a copy saved instead (a value, never a tuple),
        # and the dropped-out values are computed from it (native_dropout_backward of x
        # is x * mask * scale, the same arithmetic), so nothing reads the random op's
        # tuple in the backward and the mask crosses as bool.
        x, p = n.args[0], n.args[1]
        outs = {u.args[1]: u for u in n.users if u.target is operator.getitem}
        if 1 not in outs:
            return save(n)
        with joint.graph.inserting_after(n):  # ahead of every reader of either result
            mask = joint.graph.call_function(operator.getitem, (n, 1))
        with joint.graph.inserting_after(mask):
            kept = joint.graph.call_function(torch.ops.aten.clone.default, (mask,))
        with joint.graph.inserting_after(kept):
            scale = 1.0 / (1.0 - p) if p < 1 else 0.0
            values = joint.graph.call_function(torch.ops.aten.native_dropout_backward.default, (x, kept, scale))
        for new, old in ((mask, outs[1]), (kept, outs[1]), (values, outs.get(0))):
            if old is not None:
                new.meta.update({k: v for k, v in old.meta.items() if k in ("val", "tensor_meta", "ac_graph_id")})
        outs[1].replace_all_uses_with(kept)
        joint.graph.erase_node(outs[1])
        if 0 in outs:
            values.meta["recompute"] = outs[0].meta.get("recompute")
            outs[0].replace_all_uses_with(values)
            joint.graph.erase_node(outs[0])
        else:
            values.meta.update({k: v for k, v in x.meta.items() if k in ("val", "tensor_meta")})
        tagged.append(kept)

    copy_ = torch.ops.aten.copy_.default
    for n in list(joint.graph.nodes):
        if (n.op == "call_function" and n not in backward
                and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())):
            if n.target is torch.ops.aten.native_dropout.default and n.args[2] is not False:
                save_dropout(n)
            else:
                save(n)
    written = [n.args[0] for n in joint.graph.nodes
               if n.op == "call_function" and n.target is copy_ and n.args[0].op == "placeholder"]
    # A mutation AOTAutograd applies after the graph (the input requires grad): the joint
    # graph returns the new value, described as the input's mutation.
    from torch._functorch._aot_autograd.descriptors import InputMutationAOTOutput
    inputs = {n.meta.get("desc"): n for n in joint.graph.nodes if n.op == "placeholder"}
    out = joint.graph.output_node()
    for d in out.meta.get("desc") or ():
        if isinstance(d, InputMutationAOTOutput) and d.mutated_input in inputs:
            written.append(inputs[d.mutated_input])
    readers, seen = [u for p in written for u in p.users], set()
    while readers:
        n = readers.pop()
        if n in seen or n.op != "call_function" or n.target is copy_ or n in backward:
            continue
        seen.add(n)
        if ops.is_view(n) or n.target is operator.getitem:  # a view reads through to its users
            readers.extend(n.users)
        else:
            save(n)
    for n in tagged:
        n.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    return len(tagged)


def _save_checkpointed_random_ops(joint: torch.fx.GraphModule) -> None:
    """A random op inside a checkpointed region is saved, not recomputed (_must_save
    tags its results). Tagged for recompute, PyTorch would rerun it between two
    higher-order operators that save and restore the device generator's state, whose
    device choice is a fixed cuda/cpu/hpu/xpu map; and a replayed graph draws fresh
    states, so a recompute could not repeat the forward's draw. Saved, dropout's mask
    is the forward's in both passes; the rest of the region is still recomputed."""
    from torch.utils.checkpoint import CheckpointPolicy
    recompute = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)
    for n in joint.graph.nodes:
        if n.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
            for m in [n, *(u for u in n.users if u.target is operator.getitem)]:
                if m.meta.get("recompute") in recompute:
                    del m.meta["recompute"]


def _partition(recompute: str):
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def partition(joint, joint_inputs, **kwargs):
        _save_checkpointed_random_ops(joint)
        if recompute == "cheap":
            _recompute_cheap_ops(joint)
        budget = torch._functorch.config.activation_memory_budget
        checkpointed = any("ac_graph_id" in n.meta for n in joint.graph.nodes)
        if (_must_save(joint) or checkpointed) and budget == 0:
            # A budget of 0 saves the inputs alone (tags ignored): the backward then runs
            # the whole forward again first, all its activations live at once. Just above
            # it the partition saves the inputs and the tagged values: torch.utils.checkpoint
            # regions' outputs, each region made again just before its backward.
            budget = 1e-6
        with torch._functorch.config.patch(activation_memory_budget=budget):
            return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
    return partition


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
                if not hasattr(v.node, "expr"):  # a jagged nested tensor's ragged size
                    raise NotImplementedError(
                        "torch_tpu compiled mode: an input is a jagged nested tensor, whose ragged "
                        f"dimension ({v}) has no bound; run this function eagerly (nested tensors "
                        "work there) or pad it to a dense tensor first (to_padded_tensor).")
                syms.extend(s for s in v.node.expr.free_symbols if s not in syms)
    return syms


# What a graph's sizes ask of the backend (_check_dynamism).
_STATIC, _BOUNDED, _PER_SIZE = "static", "bounded", "per_size"


def _check_dynamism(example_inputs, dynamism) -> str:
    """How the graph is compiled: _STATIC (no dynamic sizes), _BOUNDED (sizes bounded
    by mark_dynamic: one padded program for every size, bounded.py) or _PER_SIZE.

    Sizes Dynamo made dynamic only as a hint (dynamic=True, automatic dynamic shapes,
    maybe_mark_dynamic), with no bounded mark in the graph, stay symbolic: Dynamo traces
    the frame once and the graph, run through the eager kernels at each call's concrete
    sizes, records and captures a program per size signature (_CompiledGraph), replayed
    for that signature afterwards. Beside bounded sizes such hints are specialized (a
    guard on the value: Dynamo compiles again for another size). A size marked dynamic
    without bounds by torch._dynamo.mark_dynamic (which must not be specialized) is
    refused, as is a data-dependent size without a bound."""
    syms = _symbols(example_inputs)
    if not syms:
        return _STATIC
    from torch.utils._sympy.numbers import int_oo
    env = _shape_env(example_inputs)
    if env is not None:
        _bound_marked_sizes(env)
    unbounded = []
    for s in syms:
        r = env.var_to_range.get(s) if env is not None else None
        if r is None or r.upper == int_oo or not r.upper.is_number:
            unbounded.append(s)
    strict = _strictly_dynamic()
    refused = [s for s in unbounded if s in strict]
    if refused:
        raise NotImplementedError(
            f"torch_tpu compiled mode: the graph has dynamic sizes without bounds "
            f"({', '.join(map(str, refused))}), marked by torch._dynamo.mark_dynamic, which "
            "forbids compiling them per size. torch_tpu compiles one program for every size up "
            "to a bound: bound each dynamic dimension with torch_tpu.dynamism.mark_dynamic(tensor, "
            "dim, min, max) (or torch._dynamo.mark_dynamic(tensor, dim, min=..., max=...)); or use "
            "torch._dynamo.maybe_mark_dynamic, or no mark and torch.compile(..., dynamic=False), "
            "to compile per size.")
    hints = _size_hints(env, syms)
    if missing := [s for s in syms if s not in strict and hints.get(s) is None]:
        raise NotImplementedError(
            f"torch_tpu compiled mode: the graph has a data-dependent size ({missing[0]}) without "
            "a bound; compile with torch.compile(..., dynamic=False) or mark it with "
            "torch_tpu.dynamism.mark_dynamic(tensor, dim, min, max).")
    if not any(s in strict for s in syms):
        return _PER_SIZE
    if unbounded and env is not None:
        from torch.fx.experimental.symbolic_shapes import guard_int
        for s in unbounded:  # Dynamo adds these guards to the frame's
            guard_int(env.create_symintnode(s, hint=int(hints[s])))
        if not _symbols(example_inputs):
            return _STATIC
    if dynamism is False:
        raise NotImplementedError(
            "torch_tpu compiled mode: the graph has dynamic sizes bounded by mark_dynamic, but "
            "TpuBackend(dynamism=False). Use TpuBackend() (or backend='tpu', or plain "
            "torch.compile) to compile one program for every size up to the bounds, or drop the "
            "marks to compile per size.")
    return _BOUNDED


def _size_hints(env, syms) -> dict:
    """{symbol: its value at the call Dynamo traced} (None: data-dependent)."""
    if env is None:
        return {}
    hints = getattr(env, "backed_var_to_val", None)
    hints = hints if hints is not None else env.var_to_val
    return {s: hints.get(s) for s in syms}


def _bound_marked_sizes(env) -> None:
    """Gives the sizes marked with torch_tpu.dynamism.mark_dynamic their bounds. Dynamo
    saw them as plain dynamic sizes (maybe_mark_dynamic): the symbols' ranges are
    narrowed to [min, max] here, and Dynamo then guards the frame on the narrowed range.
    A guard from tracing (x[:, 5]: the size >= 6) narrows the range further, the graph
    then serving that part of the bounds (another size is another graph, or CPU's
    IndexError)."""
    for sym, lo, hi in _marked_sizes(env):
        env.constrain_symbol_range(sym, max(lo, 2), hi)


def _marked_sizes(env=None):
    """(symbol, min, max) of the sizes marked with torch_tpu.dynamism.mark_dynamic in the
    frame Dynamo is compiling: the marks are read from the frame's real tensors, found
    by each graph input's source."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        tx = InstructionTranslator.current_tx()
    except Exception:  # not under Dynamo
        return []
    if tx is None:
        return []
    env = env if env is not None else tx.output.shape_env
    out = []
    for tf in tx.output.tracked_fakes:
        fake = tf.fake
        if not isinstance(fake, torch.Tensor):
            continue
        try:
            real = tx.output.resolve_source_value(tf.source)
        except Exception:  # a source that cannot be read back: no marks from it
            continue
        for dim, (lo, hi) in getattr(real, "_tpu_dynamism", {}).items():
            n = fake.shape[dim] if dim < fake.dim() else None
            if not isinstance(n, torch.SymInt):
                continue  # specialized (0 or 1, or a static graph)
            expr = env.replace(n.node.expr)
            if expr.is_Symbol:
                out.append((expr, lo, hi))
    return out


def _strictly_dynamic() -> set:
    """Symbols of the sizes the frame being compiled marked with torch._dynamo.mark_dynamic
    (Dynamo raises if they are specialized) or torch_tpu.dynamism.mark_dynamic (bounded:
    specializing them would compile per size), when Dynamo is compiling one."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        tx = InstructionTranslator.current_tx()
        tracked = tx.output.tracked_fakes if tx is not None else []
    except Exception:  # not under Dynamo (an AOT or test call): nothing marked
        return set()
    out = set()
    for tf in tracked:
        sizes = getattr(tf.symbolic_context, "constraint_sizes", None) or []
        shape = getattr(tf.fake, "shape", ())
        for c, n in zip(sizes, shape):
            if c is not None and not getattr(c, "warn_only", True) and isinstance(n, torch.SymInt):
                out |= n.node.expr.free_symbols
    return out | {sym for sym, _, _ in _marked_sizes()}


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

    `debug` prints each ATen graph as it is lowered. Dynamic sizes bounded by
    `torch_tpu.dynamism.mark_dynamic` compile to one program for every size up to the
    bound (bounded.py) unless `dynamism=False`; `dynamism=True` also makes changing
    Python ints dynamic (automatic dynamic shapes) and turns fuse_steps off by default.
    Sizes dynamic without a bound (maybe_mark_dynamic, dynamic=True, automatic dynamic
    shapes) stay symbolic, one Dynamo graph with a program per concrete size signature
    (see _check_dynamism). `memory_budget` is AOTAutograd's activation memory budget
    for the forward/backward partition: 0.0 (the default) saves only what cannot be
    recomputed, and the backward program recomputes the rest inside itself, as
    DeferAndFuse's one program per step does: a compiled GPT step then peaks below
    DeferAndFuse's memory (saved activations were most of its peak) and stays faster.
    1.0 is PyTorch's default, runtime-optimized partition. `recompute="cheap"` (budget
    ignored) saves only contractions' results and recomputes everything else: about
    DeferAndFuse's compute per GPT step, but more peak memory than the budget of 0 (what
    crosses to the backward stays live through its whole program). `fuse_steps` (default
    on; TPU_COMPILED_FUSE_STEPS=0 turns the default off) makes a steady training step one
    program: the forward's and backward's replays are calls of the pending graph and the
    compiled optimizer step (any inference graph) joins and flushes them (see
    _CompiledGraph). On the 4-layer GPT with the budget of 0 that is about DeferAndFuse's
    throughput and CPU time per step at 0.99x its peak memory; with the budget of 1.0
    (nothing recomputed) one loaded run was 3 % faster but at 1.4x the peak.
    Off by default with `dynamism=True`; graphs with bounded sizes keep a program each
    (eager padding between them would join the program: see _lower).
    Options of Google's TorchTPU this backend has no use for
    (`enable_serialization`, `precompile_steps`, ...) are accepted and ignored: the
    executable caches already persist compiled programs. `torch.compile(backend="tpu",
    options={...})` sets these arguments (with_options); other keys are refused.
    """

    def __init__(self, debug: bool = False, dynamism: bool | None = None, memory_budget: float = 0.0,
                 recompute: str = "budget", fuse_steps: bool | None = None, **ignored):
        if recompute not in ("budget", "cheap"):
            raise ValueError(f"TpuBackend(recompute={recompute!r}): expected 'cheap' or 'budget'")
        self.debug = debug
        self.dynamism = dynamism
        self.memory_budget = memory_budget
        self.recompute = recompute
        if fuse_steps is None:  # TPU_COMPILED_FUSE_STEPS=0: a program per graph (to compare)
            # Not with dynamism: eager work between its graphs (padding, per size in
            # DeferAndFuse) would join a step's program and compile it once per size.
            fuse_steps = os.environ.get("TPU_COMPILED_FUSE_STEPS", "1") != "0" and not dynamism
        self.fuse_steps = fuse_steps

    # torch.compile(backend="tpu", options={...}): this backend's own arguments, and the
    # TorchTPU options it accepts and ignores; any other key is refused, as Inductor does.
    OPTIONS = ("debug", "dynamism", "memory_budget", "recompute", "fuse_steps")
    IGNORED_OPTIONS = ("enable_serialization", "precompile_steps")

    def with_options(self, options) -> "TpuBackend":
        unknown = sorted(set(options) - set(self.OPTIONS) - set(self.IGNORED_OPTIONS))
        if unknown:
            raise RuntimeError(f"Unexpected optimization option {unknown[0]} for backend 'tpu', known options "
                               f"are {sorted(self.OPTIONS + self.IGNORED_OPTIONS)}")
        kwargs = {k: getattr(self, k) for k in self.OPTIONS}
        kwargs.update({k: v for k, v in options.items() if k in self.OPTIONS})
        if "dynamism" in options and "fuse_steps" not in options:
            kwargs["fuse_steps"] = None  # its default follows dynamism
        return TpuBackend(**kwargs)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, **ignored):
        # `mode=` has no meaning here; `options=` are this backend's arguments.
        if ignored.get("options"):
            return self.with_options(ignored["options"])(gm, example_inputs)
        from torch._dynamo.backends.common import aot_autograd
        from torch._guards import CompileContext

        if any(isinstance(x, torch.Tensor) and x.is_nested for x in example_inputs):
            # A jagged nested tensor's ragged dimension has no bound to compile one program
            # for: the graph runs eagerly (nested tensors work there), counted and warned.
            counters["compiled_eager_graphs"] += 1
            warnings.warn("torch_tpu compiled mode: a graph with a nested tensor input runs eagerly "
                          "(its ragged dimension has no bound to compile for)", stacklevel=2)
            return gm.forward
        sizes = _check_dynamism(example_inputs, self.dynamism)
        cid = CompileContext.current_compile_id()
        if cid is not None and (cid.frame_compile_id or 0) > 0:
            counters["compiled_recompiles"] += 1
        t0 = time.perf_counter()
        lower = functools.partial(self._lower, role="forward", sizes=sizes)
        lower_bw = functools.partial(self._lower, role="backward", sizes=sizes)
        lower_inf = functools.partial(self._lower, role="inference", sizes=sizes)
        decompositions = _decompositions()
        if sizes == _BOUNDED:
            from .bounded_ops import decompositions as bounded_decompositions
            decompositions.update(bounded_decompositions())
        try:
            budget = self.memory_budget if self.recompute == "budget" else 1.0
            with torch._functorch.config.patch(activation_memory_budget=budget, cse=CSE):
                fn = aot_autograd(fw_compiler=lower, bw_compiler=lower_bw, inference_compiler=lower_inf,
                                  partition_fn=_partition(self.recompute),
                                  decompositions=decompositions,
                                  keep_inference_input_mutations=True)(gm, example_inputs)
            from .bounded_eager import outside_eager_bounds
            return outside_eager_bounds(fn)
        finally:
            dt = time.perf_counter() - t0
            counters["compiled_lowering_seconds"] += dt
            counters["compiled_aot_seconds"] += dt

    def _lower(self, gm: torch.fx.GraphModule, example_inputs, role: str = "inference", sizes: str = _STATIC):
        _views_that_copy_when_needed(gm)
        symbolic = bool(_symbols(example_inputs))
        per_size = symbolic and sizes == _PER_SIZE
        bounded = symbolic and not per_size
        # Bounded graphs keep a program per graph: eager padding between them (per size in
        # DeferAndFuse) would join their step's program and make it vary with the sizes.

        def compiled(g):
            return _CompiledGraph(g, self.debug, role, self.fuse_steps and not bounded, per_size)
        if bounded:  # (checked): one program for the bound
            from .bounded import BoundedGraph, user_outputs
            return BoundedGraph(gm, compiled, user_outputs(gm))
        return compiled(gm)


tpu_backend = TpuBackend()  # the entry point Dynamo loads for backend="tpu"


def _views_that_copy_when_needed(gm: torch.fx.GraphModule) -> None:
    """aten.view nodes become aten.reshape. AOTAutograd traces a graph against PyTorch's
    meta kernels, and a few of those give an output another layout than CPU's kernel (and
    ours, which follow CPU's): softplus_backward of a transposed gradient is contiguous in
    meta, transposed on CPU, so a view planned on the meta layout fails on the real one.
    Where the layouts agree reshape is that same view; where they differ it copies. (The
    graph is functional: nothing writes through its views.)"""
    changed = False
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.view.default:
            n.target = torch.ops.aten.reshape.default
            changed = True
    if changed:
        gm.recompile()


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
    _capturable_optimizers_on_tpu()


def _capturable_optimizers_on_tpu() -> None:
    """Adjusts Dynamo for tpu on the first torch.compile call (importing Dynamo at
    torch_tpu's load would cost its start-up, over a second): see _patch_dynamo."""
    compile_fn = torch.compile
    if getattr(compile_fn, "_torch_tpu_capturable", False):
        return

    @functools.wraps(compile_fn)
    def compile(*args, **kwargs):
        _patch_dynamo()
        return compile_fn(*args, **kwargs)

    compile._torch_tpu_capturable = True
    torch.compile = compile


def _patch_dynamo() -> None:
    from torch._dynamo.variables.optimizer import OptimizerVariable
    if getattr(OptimizerVariable._set_capturable, "_torch_tpu", False):
        return
    _capturable_steps_on_tpu(OptimizerVariable)
    _static_gradients_on_tpu()
    _no_guard_profiling_for_tpu_graphs()
    _floats_stay_automatic()
    _true_sizes_in_index_errors()
    from .compile_fake import install
    install()  # fake-tensor rules for tpu where PyTorch's meta kernels are CUDA's


def _capturable_steps_on_tpu(OptimizerVariable) -> None:
    """Dynamo makes a compiled optimizer "capturable" (its step counters live on the
    parameters' device) only for CUDA/XPU parameters; elsewhere `state['step']` stays a
    CPU tensor the graph computes with on the host, and the graph's program then reads
    host values that change each call, so it records every call. Parameters on tpu get
    the CUDA treatment: the counters become tpu tensors, program operands the graph
    updates in place, and the step replays."""
    set_capturable = OptimizerVariable._set_capturable

    def _set_capturable(self, tx):
        for group in self.value.param_groups:
            params = group.get("params", [])
            if ("capturable" in group and params and all(p.device.type == "tpu" for p in params)
                    and all(p not in self.value.state for p in params)):
                group["capturable"] = True
        return set_capturable(self, tx)

    _set_capturable._torch_tpu = True
    OptimizerVariable._set_capturable = _set_capturable


def _static_gradients_on_tpu() -> None:
    """Dynamo asks whether each gradient a compiled optimizer step reads has a static
    address for CUDA graphs; its first question imports Inductor's CUDA graph trees (most
    of Inductor: about a CPU second of a cold compiled start, with Jinja templates
    parsed) only to answer True for any non-CUDA tensor. A tpu tensor gets that answer
    without the import."""
    from torch._dynamo.variables import optimizer
    static_for_cudagraphs = optimizer._is_static_for_cudagraphs

    def _is_static_for_cudagraphs(x):
        return True if x.device.type == "tpu" else static_for_cudagraphs(x)
    optimizer._is_static_for_cudagraphs = _is_static_for_cudagraphs


def _tpu_backend_of(fn):
    """The TpuBackend a Dynamo compiler function wraps, else None."""
    for _ in range(8):  # Dynamo's and torch.compile's wrappers keep the backend they wrap
        if isinstance(fn, TpuBackend):
            return fn
        inner = getattr(fn, "_torchdynamo_orig_backend", None)
        if inner is None and isinstance(fn, torch._TorchCompileWrapper):
            inner = fn.compiler_fn
            options = fn.kwargs.get("options")
            if options and isinstance(inner, TpuBackend):
                return inner.with_options(options)  # the backend torch.compile will call
        if inner is None:
            return None
        fn = inner
    return None


def _is_inductor(fn) -> bool:
    """Whether a Dynamo compiler function is torch.compile's default (Inductor) wrapper."""
    for _ in range(8):
        if isinstance(fn, torch._TorchCompileInductorWrapper):
            return True
        fn = getattr(fn, "_torchdynamo_orig_backend", None)
        if fn is None:
            return False
    return False


def _has_tpu_tensor(frame_locals) -> bool:
    """Whether a frame's arguments hold a tpu tensor (directly, in a module's parameters,
    or one level into a list, tuple or dict)."""
    def tpu(v):
        if isinstance(v, torch.Tensor):
            return v.device.type == "tpu"
        if isinstance(v, torch.nn.Module):
            p = next(v.parameters(), None)
            return p is not None and p.device.type == "tpu"
        return False
    for v in (frame_locals or {}).values():
        items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else (v,)
        if any(tpu(x) for x in items):
            return True
    return False


def _is_tpu_backend(fn) -> bool:
    return _tpu_backend_of(fn) is not None


# One entry per frame Dynamo is compiling (nested frames stack): is its backend ours?
_frames_for_tpu = []
# The same stack: is the frame's backend ours without dynamism (Python ints kept static)?
_static_frames = []


def _floats_stay_automatic() -> None:
    """In a frame for our backend without dynamism, Dynamo's automatic dynamism stays on
    for sizes (a tensor met again at another size: the graph keeps the size symbolic and
    compiles a program per size, see _check_dynamism) and for Python floats (graph
    inputs), but is off for Python ints: one that changed is specialized to its new
    value (a recompile), as before, rather than becoming a graph input that each new
    value would record and compile a program for."""
    from torch._dynamo import pgo
    update = pgo.update_automatic_dynamic

    @functools.wraps(update)
    def update_automatic_dynamic(tx, name, entry, **kwargs):
        if _static_frames and _static_frames[-1] and isinstance(entry.scalar, int):
            with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
                return update(tx, name, entry, **kwargs)
        return update(tx, name, entry, **kwargs)
    pgo.update_automatic_dynamic = update_automatic_dynamic


# A size expression in a traced error message: a symbol (s27), maybe scaled and offset.
_SIZE_TERM = r"(?:\d+\*)?[su]\d+"
_SIZE_EXPR = re.compile(rf"\b{_SIZE_TERM}(?:\s[-+]\s(?:{_SIZE_TERM}|\d+)\b)*")


def _with_true_sizes(msg: str, shape_env) -> str:
    """`msg` with each size expression of the symbols replaced by its value at this call."""
    import sympy  # here: importing it costs 0.3 s, which a process's first op must not pay

    values = {s: v for s, v in (getattr(shape_env, "backed_var_to_val", None)
                                or shape_env.var_to_val).items()}
    by_name = {s.name: s for s in values}

    def true_size(m):
        try:
            e = sympy.sympify(m.group(0), locals=by_name).xreplace(values)
        except (sympy.SympifyError, TypeError, SyntaxError):
            return m.group(0)
        return str(int(e)) if e.is_Integer else m.group(0)
    return _SIZE_EXPR.sub(true_size, msg)


def _true_sizes_in_index_errors() -> None:
    """An index out of range along a dynamic size fails while Dynamo traces (the meta
    kernel checks it against the symbol): the IndexError names the symbol ("with size
    s27"). In frames for this backend it names the true size, as CPU's does (also a
    kernel's RuntimeError or ValueError: narrow's "exceeds dimension size")."""
    from torch._dynamo import utils
    from torch._dynamo.exc import TorchRuntimeError
    impl = utils._get_fake_value_impl

    @functools.wraps(impl)
    def _get_fake_value_impl(node, tx, *args, **kwargs):
        try:
            return impl(node, tx, *args, **kwargs)
        except (IndexError, RuntimeError, ValueError) as e:
            env = getattr(tx.fake_mode, "shape_env", None)
            if type(e) not in (IndexError, RuntimeError, ValueError, TorchRuntimeError) or \
                    env is None or not (_frames_for_tpu and _frames_for_tpu[-1]) or \
                    len(e.args) != 1 or not isinstance(e.args[0], str):
                raise  # (Dynamo's other exceptions derive from RuntimeError: left as they are)
            # (Dynamo words a kernel's RuntimeError "... size (s27: hint = 5)")
            msg = re.sub(r"\(([su]\d+): hint = (\d+)\)", r"(\2)", e.args[0])
            e.args = (_with_true_sizes(msg, env),)
            raise
    utils._get_fake_value_impl = _get_fake_value_impl


def _no_guard_profiling_for_tpu_graphs() -> None:
    """After building a frame's guards Dynamo times one evaluation of them for its
    compile metrics, first flushing the CPU caches so the time is honest: about 0.06 CPU
    s (0.1 s) per frame, a fifth of a second and more of a cold compiled GPT step (its
    forward and optimizer frames, and those the optimizer's graph breaks leave), for a
    number nothing here reads. Frames compiled for this backend skip the measurement
    (their guard_latency_us reads 0); frames for other backends keep it."""
    from torch._dynamo import convert_frame, guards
    compile_frame = convert_frame._compile
    profile = guards.profile_guard_manager

    @functools.wraps(compile_frame)
    def _compile(*args, **kwargs):
        fn = args[5] if len(args) > 5 else kwargs.get("compiler_fn")
        backend = _tpu_backend_of(fn)
        # torch.compile's default (Inductor) sends graphs on tpu here (_route_inductor_to_tpu).
        if backend is None and _is_inductor(fn) and _has_tpu_tensor(args[2] if len(args) > 2 else kwargs.get("locals")):
            backend = tpu_backend
        _frames_for_tpu.append(backend is not None)
        # A size Dynamo makes dynamic on its own (a frame met again at another size: a new
        # batch, or after a graph break the same layer code at the encoder's and the
        # decoder's lengths) stays symbolic, a program per size (_check_dynamism).
        # Without dynamism Python ints are specialized per value (_floats_stay_automatic);
        # floats stay automatic: one that changed (a learning rate from a schedule)
        # becomes a graph input at the next compile, as with stock backends, instead of a
        # new graph per value until the recompile limit.
        static = backend is not None and not backend.dynamism
        _static_frames.append(static)
        try:
            return compile_frame(*args, **kwargs)
        finally:
            _static_frames.pop()
            _frames_for_tpu.pop()

    def profile_guard_manager(root, scope, n_iters):
        if _frames_for_tpu and _frames_for_tpu[-1]:
            return 0.0
        return profile(root, scope, n_iters)
    convert_frame._compile = _compile
    guards.profile_guard_manager = profile_guard_manager
