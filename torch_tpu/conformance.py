"""OpInfo conformance: every entry of PyTorch's op_db run on CPU and on tpu, compared.

    python -m torch_tpu.conformance [--ops add,nn.functional.*] [--dtype float32,bool]
        [--jobs 2] [--timeout 60] [--max-samples N] [--out DIR] [--baseline FILE --check]
        [--compiled]

Samples are the OpInfo's reference inputs (its sample inputs plus the extra ones it lists
for comparisons with a reference), all of them unless --max-samples caps them, moved to
each device with their sizes, strides and storage offset (non-contiguous and expanded
inputs stay so). Each entry's error inputs run too: tpu must raise the exception type CPU
raises (error-input parity, per entry "match" or "mismatch").

`--compiled` runs each tpu sample through torch.compile(backend="tpu") (compiled mode:
one fused program per captured graph, and its backward graph) instead of eagerly. A
sample for which no graph reached the backend (Dynamo broke the graph on every op, as on
data-dependent shapes) ran eagerly: it counts as a fallback, "eager: no graph compiled".

Per (entry, dtype, direction) the status is one of
  native    outputs (or gradients) match and nothing fell back to the CPU
  fallback  they match, but some ATen op ran on the CPU fallback (the ops are recorded)
  mismatch  values, dtypes or structure differ
  error     tpu raised while the CPU worked (first line of the message is recorded)
  skipped   nothing to compare: no samples, dtype unsupported on CPU, complex or sparse
            inputs, CPU itself raised, not differentiable
Outputs are compared structurally: the same nesting (tuple, list, named tuple), then per
leaf the same kind, dtype and shape, then values within the tolerance. A float32 output
(or gradient) outside it is measured, with CPU's, against the op run in float64 on CPU: it
passes when no further from that result than twice CPU's own error (see F64_FACTOR).
Ops that draw random numbers (or return uninitialized memory, like empty) cannot match
CPU's values: their samples are compared by structure, shapes, dtypes and finiteness, and
in float32 each random op with a documented law is tested against it on tpu from a fixed
seed (conformance_random: Kolmogorov-Smirnov or chi-square); a failed test makes it a
mismatch. Each record says what was verified ("verified": values, distribution or shape)
and the summary counts value-verified entries apart from random ones; the backward of a
random op is skipped.
Entries run in spawned worker processes with a per-entry timeout, so a crash or a hang
costs one entry; the timeout counts the entry's run time, not its XLA compiles, so a run
from an empty compile cache reaches the same verdicts as a warm one, and each finished
sample adds a little to it (SAMPLE_ALLOWANCE_S), so an entry with thousands of samples is
not taken for a hang. `--baseline old.json
--check` exits non-zero when an entry that was native in the baseline is not native now.
"""
import argparse
import collections
import contextlib
import functools
import json
import os
import subprocess
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import torch_tpu  # noqa: E402
from torch_tpu._workers import Pool, extend_deadline, first_line  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64,
          "int32": torch.int32, "bool": torch.bool}
STATUSES = ("native", "fallback", "mismatch", "error", "skipped")
# (atol, rtol) when the OpInfo gives none. XLA's float kernels differ from ATen's (other
# polynomial approximations, other summation orders; gradients accumulate both), hence not
# torch's 1.3e-6; PyTorch's own CPU-vs-device test (test_compare_cpu) allows 1e-3.
DEFAULT_TOL = {torch.float32: (1e-4, 1e-4), torch.complex64: (1e-4, 1e-4),
               torch.float64: (1e-7, 1e-7), torch.complex128: (1e-7, 1e-7),
               torch.bfloat16: (1e-2, 1.6e-2), torch.float16: (1e-3, 1e-3)}
# Ops whose tensor arguments other than the input must stay on the CPU (as on CUDA).
CPU_ARGS = {"tensor_split"}
# Each finished sample adds this to its entry's deadline: the timeout is there to catch a
# hang, and an entry with thousands of reference inputs (max_pool2d: 7,200 over its five
# dtypes, about 9 ms of harness work each on one core) is not one.
SAMPLE_ALLOWANCE_S = 0.02
COMPILED = False  # --compiled: tpu samples run through torch.compile(backend="tpu")


# ---------------------------------------------------------------- the op database

@functools.cache
def op_db() -> dict:
    """{entry key: OpInfo} for every op_db entry."""
    from torch.testing._internal.common_methods_invocations import op_db as db
    return {entry_key(op): op for op in db}


def entry_key(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def select(keys, patterns):
    """Keys named by patterns: an entry key or op name, or a prefix ending in '*'."""
    def hit(k, p):
        return k == p or op_db()[k].name == p or p.endswith("*") and k.startswith(p[:-1])
    return [k for k in keys if not patterns or any(hit(k, p) for p in patterns)]


def differentiable(op) -> bool:
    return op.supports_autograd and torch.float32 in op.supported_backward_dtypes("cpu")


def tolerance(op, dtype, out_dtype):
    """(atol, rtol): the loosest of our default for the output dtype and the OpInfo's own
    overrides for the sample dtype (those of Inductor and other devices' tests excluded)."""
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
    from torch.testing._internal.opinfo.core import DecorateInfo
    atol, rtol = DEFAULT_TOL.get(out_dtype, (0.0, 0.0))
    for info in op.decorators:
        if not isinstance(info, DecorateInfo) or "Inductor" in (info.cls_name or "") \
                or info.device_type not in (None, "cpu", "cuda"):
            continue
        for d in info.decorators:
            if isinstance(d, toleranceOverride) and dtype in d.d:
                atol, rtol = max(atol, d.d[dtype].atol), max(rtol, d.d[dtype].rtol)
            elif isinstance(d, precisionOverride) and dtype in d.d:
                atol = max(atol, d.d[dtype])
    return atol, rtol


# ---------------------------------------------------------------- one sample

def fallbacks() -> dict:
    """CPU fallbacks so far: the C++ fallback's and decomposition kernels' round trips
    (torch_tpu.metrics() counts both)."""
    return dict(torch_tpu.metrics()["fallbacks"])


def grown(before: dict) -> list:
    """Ops whose fallback count grew since `before`."""
    return sorted(k for k, n in fallbacks().items() if n > before.get(k, 0))


# --compiled: a sample for which Dynamo handed no graph to the backend (a graph break on
# every op, or the backend declined the graph) ran in eager mode. Its results are right but
# prove nothing about compiled mode, so it counts as a fallback, under this name.
EAGER_IN_COMPILED = "eager: no graph compiled"


def compile_seconds() -> float:
    """XLA compile time of this process so far (every program kind)."""
    return torch_tpu.metrics().get("compile_seconds", 0.0)


def graphs_compiled() -> int:
    from torch_tpu._internal import compile as tpu_compile
    return tpu_compile.counters["compiled_graphs"]


def mismatch_text(e: AssertionError) -> str:
    # assert_close explains on several lines; the first few say what and by how much.
    return "; ".join(s.strip() for s in str(e).splitlines() if s.strip())[:300]


def leaves(sample) -> list:
    return [t for t in pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
            if isinstance(t, torch.Tensor)]


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """A copy of `t` on `device` with t's sizes, strides and storage offset: the storage
    span t reads is copied and viewed as t views it, so non-contiguous, offset and expanded
    (overlapping) samples reach the op as they are (a plain .to() makes them contiguous)."""
    t = t.detach()
    if t.numel() == 0 or t.is_complex() or t.layout != torch.strided \
            or t.is_contiguous() and t.storage_offset() == 0:
        return t.to(device, copy=True)
    extent = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    span = t.as_strided((extent,), (1,), 0).to(device, copy=True)
    return span.as_strided(t.shape, t.stride(), t.storage_offset())


def copy_args(op, sample, device):
    """(input, args, kwargs) with every tensor a fresh leaf on `device` (requires_grad kept)
    of the same layout; device arguments ("cpu" in the samples) follow, so factories
    allocate there too."""
    def move(t, to=device):
        if isinstance(t, torch.device) and t.type == "cpu" or isinstance(t, str) and t == "cpu":
            return torch.device(device) if isinstance(t, torch.device) else device
        if not isinstance(t, torch.Tensor):
            return t
        c = to_device(t, to)
        return c.requires_grad_(t.requires_grad) if c.is_floating_point() else c
    inp = pytree.tree_map(move, sample.input)
    rest = "cpu" if op.name in CPU_ARGS else device
    args, kwargs = pytree.tree_map(lambda t: move(t, rest), (sample.args, sample.kwargs))
    if "device" in kwargs:
        kwargs = dict(kwargs, device=device)
    return inp, args, kwargs


class Seeded(TorchDispatchMode):
    """Notes whether an ATen op that draws random numbers ran (OpInfo wraps some ops in a
    fixed seed, so two runs agree, yet the tpu's generator draws other numbers)."""
    drew = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.drew |= torch.Tag.nondeterministic_seeded in func.tags
        return func(*args, **(kwargs or {}))


def _compile(fn):
    return torch.compile(fn, backend="tpu", dynamic=False)


def _compiled_seed_wrapper(fn, *args, **kwargs):
    """OpInfo's wrapper_set_seed, compiling only the op: the wrapper saves and restores
    the generators' states under no_dispatch, which Dynamo cannot trace."""
    from torch.testing._utils import freeze_rng_state
    with freeze_rng_state():
        torch.manual_seed(42)
        return _compile(fn)(*args, **kwargs)


def _use_compiled_seed_wrapper():
    import torch.testing._internal.common_methods_invocations as cmi
    cmi.wrapper_set_seed = torch._dynamo.disable(_compiled_seed_wrapper)


@contextlib.contextmanager
def _mode(compiled):
    """The run's mode for its duration only: a caller in the same process (a test) gets
    eager conformance back afterwards."""
    global COMPILED
    import torch.testing._internal.common_methods_invocations as cmi
    was, seed_wrapper = COMPILED, cmi.wrapper_set_seed
    COMPILED = compiled
    if compiled:
        _use_compiled_seed_wrapper()
    try:
        yield
    finally:
        COMPILED, cmi.wrapper_set_seed = was, seed_wrapper


def call(op, sample, device):
    inp, args, kwargs = copy_args(op, sample, device)
    fn = op
    if COMPILED and device == "tpu":
        torch._dynamo.reset()  # a fresh compile per sample, never a recompile-limit skip
        fn = _compile(lambda i, *a, **k: op(i, *a, **k))
    return fn(inp, *args, **kwargs), [t for t in pytree.tree_leaves((inp, args, kwargs))
                                     if isinstance(t, torch.Tensor) and t.requires_grad]


def to_cpu(out):
    # .cpu() is differentiable, so a backward from the copies reaches the tpu graph.
    return pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, out)


def same_structure(got, want):
    """Raises AssertionError unless two outputs nest alike (tuple vs list vs named tuple,
    lengths, dict keys) with leaves of the same kind, tensors of the same dtype and shape."""
    g, gspec = pytree.tree_flatten(got)
    w, wspec = pytree.tree_flatten(want)
    if gspec != wspec:
        raise AssertionError(f"output structure differs: {gspec} on tpu, {wspec} on CPU")
    for i, (a, b) in enumerate(zip(g, w)):
        where = f"output {i} of {len(w)}: " if len(w) > 1 else ""
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise AssertionError(f"{where}expected a tensor, got {type(a).__name__}")
            if a.dtype != b.dtype or a.shape != b.shape:
                raise AssertionError(f"{where}{a.dtype}{list(a.shape)} on tpu, "
                                     f"{b.dtype}{list(b.shape)} on CPU")
        elif type(a) is not type(b):
            raise AssertionError(f"{where}{type(a).__name__} on tpu, {type(b).__name__} on CPU")
    return g, w


def compare(got, want, op, dtype):
    """Raises AssertionError when two outputs differ: structure first (same_structure),
    then values of tensor and number leaves, and equality of any other leaf."""
    g, w = same_structure(got, want)
    for i, (a, b) in enumerate(zip(g, w)):
        try:
            if isinstance(b, torch.Tensor):
                atol, rtol = tolerance(op, dtype, b.dtype)
                torch.testing.assert_close(a, b, atol=atol, rtol=rtol, equal_nan=True)
            elif isinstance(b, (bool, int, float, complex)):
                torch.testing.assert_close(a, b, equal_nan=True)
            elif a != b:
                raise AssertionError(f"{a!r} on tpu, {b!r} on CPU")
        except AssertionError as e:
            raise AssertionError(f"output {i} of {len(w)}: {e}" if len(w) > 1 else e) from None


# A float32 result that misses CPU's float32 result can still be as right as CPU's: where
# the two differ by summation order or algorithm on an ill-conditioned input (matrix_exp,
# large reductions), both are measured against the same op computed in float64 on CPU.
# tpu passes if its error is within the tolerance of the float64 result or at most
# F64_FACTOR times CPU's own error, element-normalized by that tolerance; non-finite
# elements must match CPU's exactly, non-float outputs must equal CPU's as before.
F64_FACTOR = 2.0
F64_VERIFIED = f"float64 reference: within {F64_FACTOR:g}x CPU's own float32 error"


def _to_float64(t):
    if isinstance(t, torch.dtype):
        return torch.float64 if t == torch.float32 else t
    if t.dtype != torch.float32:
        return t.detach().clone().requires_grad_(t.requires_grad)
    return t.detach().double().requires_grad_(t.requires_grad)


def float64_run(op, sample, backward=False):
    """(output, grads of the float32 leaves or None) of the op on `sample` with its float32
    tensors (and float32 dtype arguments) in float64, on CPU."""
    s64 = sample.transform(_to_float64)
    out = op(s64.input, *s64.args, **s64.kwargs)
    grads = None
    if backward:
        ins = [t for t in pytree.tree_leaves((s64.input, s64.args, s64.kwargs))
               if isinstance(t, torch.Tensor) and t.requires_grad]
        lo = loss(out)
        lo.backward()
        grads = [t.grad for t in ins]
    return sample.output_process_fn_grad(out), grads


def close_to_float64(got, want, ref, op):
    """Raises AssertionError unless `got` passes the float64-reference rule above."""
    g, w = same_structure(got, want)
    r = pytree.tree_leaves(ref)
    if len(r) != len(w):
        raise AssertionError("float64 reference has another structure")
    for i, (a, b, c) in enumerate(zip(g, w, r)):
        if not (isinstance(b, torch.Tensor) and b.dtype == torch.float32 and isinstance(c, torch.Tensor)):
            compare(a, b, op, torch.float32) if isinstance(b, torch.Tensor) else \
                torch.testing.assert_close(a, b, equal_nan=True)
            continue
        a, b, c = a.detach().double(), b.detach().double(), c.detach().double()
        bad = ~torch.isfinite(b) | ~torch.isfinite(a)
        if bool(bad.any()) and not torch.equal(a[bad].nan_to_num(0.5), b[bad].nan_to_num(0.5)):
            raise AssertionError(f"output {i}: non-finite values differ from CPU's")
        atol, rtol = tolerance(op, torch.float32, torch.float32)
        scale = atol + rtol * c.abs()
        ok = ~bad
        err_tpu = float(((a - c).abs() / scale)[ok].max()) if bool(ok.any()) else 0.0
        err_cpu = float(((b - c).abs() / scale)[ok].max()) if bool(ok.any()) else 0.0
        if err_tpu > max(1.0, F64_FACTOR * err_cpu):
            raise AssertionError(f"output {i}: {err_tpu:.3g} tolerances from the float64 result, "
                                 f"CPU's float32 {err_cpu:.3g}")


def loss(out):
    """Sum of every real floating output that requires grad, or None."""
    ts = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)
          and t.requires_grad and t.is_floating_point()]
    return sum(t.sum() for t in ts) if ts else None


def same(a, b) -> bool:
    """Whether two CPU runs gave bit-identical tensors (else the op is random)."""
    ta = [t for t in pytree.tree_leaves(a) if isinstance(t, torch.Tensor)]
    tb = [t for t in pytree.tree_leaves(b) if isinstance(t, torch.Tensor)]
    try:
        torch.testing.assert_close(ta, tb, atol=0, rtol=0, equal_nan=True)
        return True
    except (AssertionError, TypeError, RuntimeError, ValueError):
        return False


RANDOM = "random: shapes and dtypes compared"
UNINITIALIZED = "uninitialized memory: shapes and dtypes compared"


def compare_meta(got, want):
    """Raises AssertionError unless the outputs agree in structure, shapes and dtypes, and
    float outputs are finite wherever CPU's are all finite (values of random ops differ)."""
    g, w = same_structure(got, want)
    for i, (a, b) in enumerate(zip(g, w)):
        if isinstance(b, torch.Tensor) and b.is_floating_point() and b.numel() \
                and bool(torch.isfinite(b).all()) and not bool(torch.isfinite(a).all()):
            raise AssertionError(f"output {i}: non-finite values on tpu only")


def run_sample(op, sample, dtype, backward, uninitialized=False):
    """((status, detail, fallback ops) forward, same for backward or None). `uninitialized`:
    the op's output is undefined memory (empty & co), so values are not compared."""
    def skip(reason):
        return ("skipped", reason, []), ("skipped", reason, []) if backward else None
    ts = leaves(sample)
    if any(t.is_complex() for t in ts):
        return skip("complex")
    if any(t.layout != torch.strided for t in ts):
        return skip("sparse")
    if any(t.device.type != "cpu" for t in ts):
        return skip("meta-only")
    try:
        want_raw, want_leaves = call(op, sample, "cpu")
        with Seeded() as seeded:  # with grad too: some ops take other paths without
            again = call(op, sample, "cpu")[0]
        want = sample.output_process_fn_grad(want_raw)
    except Exception as e:  # noqa: BLE001 - any CPU failure means nothing to compare
        return skip(f"CPU raised: {first_line(e)}")
    random = uninitialized or seeded.drew or not same(to_cpu(again), to_cpu(want_raw))
    if any(t.layout != torch.strided for t in pytree.tree_leaves(want_raw)
           if isinstance(t, torch.Tensor)):
        return skip("sparse output")

    before, graphs = fallbacks(), graphs_compiled()
    try:
        got_raw, got_leaves = call(op, sample, "tpu")
        wrong = [t.device for t in pytree.tree_leaves(got_raw)
                 if isinstance(t, torch.Tensor) and t.device.type != "tpu"]
        got = sample.output_process_fn_grad(to_cpu(got_raw))
        torch_tpu.synchronize()
    except Exception as e:  # noqa: BLE001
        err = ("error", first_line(e), grown(before))
        return err, ("error", "forward: " + err[1], []) if backward else None
    eager = [EAGER_IN_COMPILED] if COMPILED and graphs_compiled() == graphs else []
    fb = grown(before) + eager
    outs = [t for t in pytree.tree_leaves(got_raw) if isinstance(t, torch.Tensor)]
    if not ts and (wrong or not outs):  # torch.add(2.0, 3.0), broadcast_shapes: no tensor
        return skip("no tensor input: the op runs on CPU")
    kind = UNINITIALIZED if uninitialized else RANDOM if random else ""
    try:
        if wrong:
            raise AssertionError(f"output on {wrong[0]}, not on tpu")
        (compare_meta if random else compare)(*((got, want) if random else (got, want, op, dtype)))
        fwd = ("fallback" if fb else "native", kind, fb)
    except AssertionError as e:
        fwd = ("mismatch", (kind + "; " if random else "") + mismatch_text(e), fb)
        if dtype == torch.float32 and not random and not wrong:
            try:
                with torch.no_grad():
                    close_to_float64(got, want, float64_run(op, sample)[0], op)
                fwd = ("fallback" if fb else "native", F64_VERIFIED, fb)
            except AssertionError as e64:
                fwd = ("mismatch", mismatch_text(e) + "; " + mismatch_text(e64), fb)
            except Exception:  # noqa: BLE001 - no float64 reference: CPU's comparison stands
                pass
    if not backward:
        return fwd, None
    if random:
        return fwd, ("skipped", "random", [])
    return fwd, run_backward(op, dtype, want, want_leaves, got, got_leaves, sample, eager)


def run_backward(op, dtype, want, want_leaves, got, got_leaves, sample=None, eager=()):
    """`eager`: [EAGER_IN_COMPILED] when the forward compiled nothing (its backward is
    then eager too), else empty."""
    lw, lg = loss(want), loss(got)
    if lw is None or not want_leaves:
        return ("skipped", "no differentiable output", [])
    try:
        lw.backward()
    except Exception as e:  # noqa: BLE001
        return ("skipped", f"CPU raised: {first_line(e)}", [])
    before = fallbacks()
    try:
        if lg is None:
            raise AssertionError("no differentiable output on tpu")
        lg.backward()
        grads = [None if t.grad is None else t.grad.cpu() for t in got_leaves]
        torch_tpu.synchronize()
    except AssertionError as e:
        return ("mismatch", mismatch_text(e), grown(before) + list(eager))
    except Exception as e:  # noqa: BLE001
        return ("error", first_line(e), grown(before) + list(eager))
    fb = grown(before) + list(eager)
    try:
        for a, w in zip(grads, want_leaves):
            if (a is None) != (w.grad is None):
                raise AssertionError(f"grad is {'None' if a is None else 'set'} on tpu, "
                                     f"{'None' if w.grad is None else 'set'} on CPU")
            if a is not None:
                compare(a, w.grad, op, dtype)
        return ("fallback" if fb else "native", "", fb)
    except AssertionError as e:
        if dtype != torch.float32 or sample is None:
            return ("mismatch", mismatch_text(e), fb)
        try:
            ref = float64_run(op, sample, backward=True)[1]
            pairs = [(a, w.grad, r) for a, w, r in zip(grads, want_leaves, ref) if a is not None]
            close_to_float64([p[0] for p in pairs], [p[1] for p in pairs], [p[2] for p in pairs], op)
            return ("fallback" if fb else "native", F64_VERIFIED, fb)
        except AssertionError as e64:
            return ("mismatch", mismatch_text(e) + "; " + mismatch_text(e64), fb)
        except Exception:  # noqa: BLE001 - no float64 reference: CPU's comparison stands
            return ("mismatch", mismatch_text(e), fb)


# ---------------------------------------------------------------- one entry

def aggregate(results) -> dict:
    """One record from per-sample (status, detail, fallback ops)."""
    counts = collections.Counter(s for s, _, _ in results)
    ops = sorted({o for _, _, fb in results for o in fb})
    ran = [r for r in results if r[0] != "skipped"]
    if not ran:
        reasons = collections.Counter(d for _, d, _ in results)
        reason = reasons.most_common(1)[0][0] if reasons else "no sample inputs"
        return {"status": "skipped", "reason": reason, "samples": dict(counts)}
    for status in ("mismatch", "error", "fallback", "native"):
        if counts[status]:
            break
    rec = {"status": status, "samples": dict(counts), "fallback_ops": ops}
    msg = next((d for s, d, _ in ran if s == status and d), "")
    if msg:
        rec["message"] = msg
    return rec


def is_random(detail: str) -> bool:
    return detail.startswith((RANDOM, UNINITIALIZED))


def verify_random(op, rec, name, fwd):
    """Marks what a forward record verified; a random float32 entry with a documented law
    is tested against it (conformance_random), a failed test making it a mismatch."""
    kinds = {d for _, d, _ in fwd if is_random(d)}
    if not kinds:
        rec["verified"] = "values" if rec["status"] in ("native", "fallback") else "none"
        return
    if any(d.startswith(UNINITIALIZED) for d in kinds):
        rec["verified"] = "shape"
        rec["random"] = "uninitialized"
        return
    rec["random"] = "drawn"
    law = None
    if name == "float32" and rec["status"] in ("native", "fallback"):
        from torch_tpu import conformance_random
        try:
            law = conformance_random.check(entry_key(op))
            torch_tpu.synchronize()
        except Exception as e:  # noqa: BLE001 - the op failed on its distribution's draws
            rec.update(status="error", message=f"distribution check: {first_line(e)}")
            rec["verified"] = "none"
            return
    if law is None:
        rec["verified"] = "shape"
        return
    rec["distribution"] = law
    if law["ok"]:
        rec["verified"] = "distribution"
    else:
        rec["verified"] = "none"
        rec["status"] = "mismatch"
        rec["message"] = (f"distribution: {law['test']} p={law['p']:.2g} against {law['law']}"
                          + (f" ({law['why']})" if law.get("why") else ""))


def run_error_inputs(op, max_samples=None):
    """Error-input parity: each of the OpInfo's error inputs that raises on CPU must raise
    the same exception type on tpu. A record with status match / mismatch / skipped and
    samples {"match": n, "mismatch": m, "skipped": k}; None without error inputs."""
    if op.error_inputs_func is None:
        return None
    results = []
    try:
        errs = iter(op.error_inputs("cpu"))
    except Exception as e:  # noqa: BLE001
        return {"status": "skipped", "reason": f"error inputs raised: {first_line(e)}", "samples": {}}
    while max_samples is None or len(results) < max_samples:
        try:
            ei = next(errs)
        except StopIteration:
            break
        except Exception as e:  # noqa: BLE001 - the generator itself failed
            results.append(("skipped", f"error inputs raised: {first_line(e)}"))
            break
        results.append(error_input_parity(op, ei.sample_input))
    counts = collections.Counter(s for s, _ in results)
    status = "mismatch" if counts["mismatch"] else "match" if counts["match"] else "skipped"
    rec = {"status": status, "samples": dict(counts)}
    msg = next((d for s, d in results if s == status and d), "")
    if msg:
        rec["message" if status != "skipped" else "reason"] = msg
    return rec


def error_input_parity(op, sample):
    """("match" | "mismatch" | "skipped", detail) for one error input."""
    ts = leaves(sample)
    if any(t.device.type != "cpu" or t.layout != torch.strided for t in ts):
        return "skipped", "meta or sparse input"
    try:
        to_cpu(call(op, sample, "cpu")[0])
        return "skipped", "CPU did not raise"
    except Exception as e:  # noqa: BLE001
        want = e
    try:
        to_cpu(call(op, sample, "tpu")[0])
        torch_tpu.synchronize()
    except Exception as e:  # noqa: BLE001
        if type(e) is type(want):
            return "match", ""
        return "mismatch", f"tpu raised {first_line(e)}; CPU raised {first_line(want)}"
    return "mismatch", f"tpu did not raise; CPU raised {first_line(want)}"


def run_entry(op, dtypes=("float32",), max_samples=None) -> dict:
    """{dtype: {"fwd": record, "bwd": record (float32 differentiable entries only)},
    "error_inputs": {"raise": record} (entries with error inputs)}. max_samples None: all
    of the OpInfo's reference inputs."""
    out = {}
    supported = op.supported_dtypes("cpu")
    compiled_before, done = compile_seconds(), 0
    for name in dtypes:
        dtype = DTYPES[name]
        backward = name == "float32" and differentiable(op)
        if dtype not in supported:
            if name == "float32":
                rec = {"status": "skipped", "reason": "dtype unsupported on CPU", "samples": {}}
                out[name] = {"fwd": rec, **({"bwd": rec} if backward else {})}
            continue
        grad = op.supports_autograd and (dtype.is_floating_point or dtype.is_complex)
        fwd, bwd = [], []
        torch.manual_seed(0)
        try:
            samples = iter(op.reference_inputs("cpu", dtype, requires_grad=grad))
        except Exception as e:  # noqa: BLE001
            samples = iter(())
            fwd.append(("skipped", f"sample inputs raised: {first_line(e)}", []))
        while max_samples is None or len(fwd) < max_samples:
            try:
                sample = next(samples)
            except StopIteration:
                break
            except Exception as e:  # noqa: BLE001 - the OpInfo's generator itself failed
                fwd.append(("skipped", f"sample inputs raised: {first_line(e)}", []))
                break
            # empty & co: uninitialized memory, compared like random outputs.
            f, b = run_sample(op, sample, dtype, backward, op.has_nondeterministic_output)
            fwd.append(f)
            if b:
                bwd.append(b)
            done += 1
            extend_deadline(compile_seconds() - compiled_before, done * SAMPLE_ALLOWANCE_S)
        out[name] = {"fwd": aggregate(fwd)}
        verify_random(op, out[name]["fwd"], name, fwd)
        if backward:
            # No backward records: no samples, or the generator raised (its skip says why).
            out[name]["bwd"] = aggregate(bwd or [r for r in fwd if r[0] == "skipped"])
    if not COMPILED:  # Dynamo wraps exceptions in its own types: parity is an eager check
        errs = run_error_inputs(op, max_samples)
        if errs is not None:
            out["error_inputs"] = {"raise": errs}
    return out


def failed_entry(op, dtypes, message) -> dict:
    """The record of an entry whose worker timed out or died."""
    rec = {"status": "error", "message": message, "samples": {}, "fallback_ops": []}
    out = {}
    for name in dtypes:
        if DTYPES[name] in op.supported_dtypes("cpu") or name == "float32":
            out[name] = {"fwd": rec}
            if name == "float32" and differentiable(op):
                out[name]["bwd"] = rec
    if op.error_inputs_func is not None and not COMPILED:
        out["error_inputs"] = {"raise": rec}
    return out


# ---------------------------------------------------------------- workers

def quiet():
    """Backend warnings (one per fallback op) and OpInfo's deprecation noise, silenced."""
    warnings.filterwarnings("ignore", message=".*CPU fallback")
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def worker_setup():
    quiet()


def run_key(key, dtypes, max_samples, compiled=False):
    """One entry in a worker process (see torch_tpu._workers)."""
    global COMPILED
    if compiled and not COMPILED:
        COMPILED = True
        _use_compiled_seed_wrapper()
    return run_entry(op_db()[key], dtypes, max_samples)


# ---------------------------------------------------------------- reports

def pct(n, total) -> float:
    return round(100.0 * n / total, 1) if total else 0.0


def summarize(entries: dict, wall_s: float) -> dict:
    """Totals and percentages per status for float32 forward and backward; how many float32
    forwards were verified by value (native: no fallback either), by distribution (random
    ops) or by shape only; error-input parity."""
    out = {"entries": len(entries), "wall_s": round(wall_s, 1)}
    for d in ("fwd", "bwd"):
        recs = [e["float32"][d] for e in entries.values() if d in e.get("float32", {})]
        c = collections.Counter(r["status"] for r in recs)
        out[d] = {"total": len(recs),
                  **{s: c[s] for s in STATUSES},
                  **{f"{s}_pct": pct(c[s], len(recs)) for s in STATUSES}}
    fwd = [e["float32"]["fwd"] for e in entries.values() if "fwd" in e.get("float32", {})]
    rnd = [r for r in fwd if r.get("random")]
    v = out["fwd"]
    v["value_verified_native"] = sum(r["status"] == "native" and r.get("verified") == "values"
                                     for r in fwd)
    v["value_verified_native_pct"] = pct(v["value_verified_native"], len(fwd))
    v["float64_verified"] = sum(r["status"] == "native" and r.get("message") == F64_VERIFIED for r in fwd)
    v["random"] = len(rnd)
    v["random_distribution_pass"] = sum(r.get("verified") == "distribution" for r in rnd)
    v["random_distribution_fail"] = sum("distribution" in r and not r["distribution"]["ok"]
                                        for r in rnd)
    v["random_shape_only"] = sum(r.get("verified") == "shape" for r in rnd)
    v["random_distribution_pct"] = pct(v["random_distribution_pass"], len(rnd))
    errs = [e["error_inputs"]["raise"] for e in entries.values() if "error_inputs" in e]
    c = collections.Counter(r["status"] for r in errs)
    n_in = collections.Counter()
    for r in errs:
        n_in.update(r.get("samples", {}))
    compared = c["match"] + c["mismatch"] + c["error"]
    out["error_inputs"] = {"entries": len(errs), "match": c["match"], "mismatch": c["mismatch"],
                           "error": c["error"], "skipped": c["skipped"],
                           "match_pct": pct(c["match"], compared),
                           "inputs_match": n_in["match"], "inputs_mismatch": n_in["mismatch"],
                           "inputs_skipped": n_in["skipped"],
                           "inputs_match_pct": pct(n_in["match"], n_in["match"] + n_in["mismatch"])}
    return out


def timing(seconds: dict, top: int = 15) -> dict:
    """Where the run's time went, from each entry's [wall seconds, XLA compile seconds]
    (compiles an entry reported, its error inputs' not; compiles off the entry's thread
    overlap its wall time): totals, and the slowest."""
    slow = sorted(seconds.items(), key=lambda kv: -kv[1][0])[:top]
    return {"entries_timed": len(seconds),
            "entry_seconds": round(sum(s for s, _ in seconds.values()), 1),
            "compile_seconds": round(sum(c for _, c in seconds.values()), 1),
            "slowest": [[k, s, c] for k, (s, c) in slow]}


def summary_table(s: dict) -> str:
    rows = [f"Entries: {s['entries']}    wall time: {s['wall_s']:.0f} s", "",
            "| float32 | entries | native | via fallback | mismatch | error | skipped |",
            "|---|---|---|---|---|---|---|"]
    for d, label in (("fwd", "forward"), ("bwd", "backward (differentiable)")):
        r = s[d]
        rows.append(f"| {label} | {r['total']} | " + " | ".join(
            f"{r[x + '_pct']:.1f}% ({r[x]})" for x in STATUSES) + " |")
    f = s["fwd"]
    rows += ["", f"Value-verified (native, outputs equal to CPU's within tolerance, or as close to a "
                 f"float64 result as CPU's): {f.get('value_verified_native', 0)} of {f['total']} float32 "
                 f"forwards ({f.get('value_verified_native_pct', 0.0):.1f}%), "
                 f"{f.get('float64_verified', 0)} of them by the float64 reference.",
             f"Random ops, apart: {f.get('random', 0)}; {f.get('random_distribution_pass', 0)} "
             f"pass a goodness-of-fit test of their documented law on tpu "
             f"({f.get('random_distribution_pct', 0.0):.1f}%), "
             f"{f.get('random_distribution_fail', 0)} fail it, "
             f"{f.get('random_shape_only', 0)} checked by shapes and dtypes only "
             "(uninitialized memory, or no law written down)."]
    e = s.get("error_inputs")
    if e:
        rows.append(f"Error inputs: {e['entries']} entries have them; {e['match']} raise as CPU "
                    f"does on every input, {e['mismatch']} do not, {e['error']} failed, "
                    f"{e['skipped']} had nothing to compare ({e['match_pct']:.1f}% parity); "
                    f"per input {e['inputs_match']} match, {e['inputs_mismatch']} mismatch "
                    f"({e['inputs_match_pct']:.1f}%).")
    return "\n".join(rows)


def detail(rec) -> str:
    if rec["status"] == "fallback":
        return "fallback: " + ", ".join(rec.get("fallback_ops", []))
    return rec.get("message") or rec.get("reason") or ""


def markdown(results: dict) -> str:
    others = [d for d in DTYPES if d != "float32"]
    meta = results.get("meta", {})
    where = (f"Commit(s): {', '.join(meta['commits'])}; {meta.get('resumed_entries', 0)} entries "
             "taken from an earlier, interrupted run with the same settings (--resume)."
             if meta.get("commits") else "")
    t = results.get("timing")
    spent = (f"Entries' own time: {t['entry_seconds']:.0f} s over {t['entries_timed']} entries; XLA compiles "
             f"took {t['compile_seconds']:.0f} s in them (a compile on a thread of its own may overlap the "
             f"entry's other work). Slowest: " + ", ".join(
                 f"{k} {s:.0f} s ({c:.0f} s compiling)" for k, s, c in t["slowest"][:10]) + "."
             if t and t.get("entries_timed") else "")
    lines = ["# OpInfo conformance of torch_tpu", "", where, "", summary_table(results["summary"]), "",
             spent, "",
             "| entry | float32 fwd | verified | float32 bwd | " + " | ".join(others)
             + " | error inputs | detail |",
             "|---|---|---|---|" + "---|" * len(others) + "---|---|"]
    for key, e in sorted(results["entries"].items()):
        f32 = e.get("float32", {})
        cells = [f32.get("fwd", {}).get("status", "-"), f32.get("fwd", {}).get("verified", "-"),
                 f32.get("bwd", {}).get("status", "-")]
        cells += [e[d]["fwd"]["status"] if d in e else "-" for d in others]
        cells.append(e["error_inputs"]["raise"]["status"] if "error_inputs" in e else "-")
        notes = [f"{n} {d}: {detail(r)}" for n, x in e.items() for d, r in x.items()
                 if r["status"] != "native" and detail(r)]
        text = "; ".join(dict.fromkeys(notes)).replace("|", "\\|")[:400]
        lines.append(f"| {key} | " + " | ".join(cells) + f" | {text} |")
    return "\n".join(lines) + "\n"


def regressions(baseline: dict, entries: dict) -> list:
    """'key dtype dir: was native, now S' for everything native before and not now (and
    error-input parity: 'key error_inputs raise: was match, now S')."""
    out = []
    for key, e in baseline.get("entries", {}).items():
        for dt, dirs in e.items():
            for d, rec in dirs.items():
                now = entries.get(key, {}).get(dt, {}).get(d)
                if rec["status"] in ("native", "match") and now and now["status"] != rec["status"]:
                    out.append(f"{key} {dt} {d}: was {rec['status']}, now {now['status']}"
                               + (f" ({detail(now)})" if detail(now) else ""))
    return out


def baseline_of(results: dict) -> dict:
    """The results with each record cut to its status: small enough to check in."""
    def cut(rec):
        return {k: rec[k] for k in ("status", "verified") if k in rec}
    entries = {key: {dt: {d: cut(rec) for d, rec in dirs.items()} for dt, dirs in e.items()}
               for key, e in results["entries"].items()}
    return {"meta": results["meta"], "summary": results["summary"], "entries": entries}


def stratified_sample(baseline: dict, n: int, dtype: str = "float32") -> list:
    """About `n` entry keys that were native forward in `baseline`, spread over op
    families (linalg., nn.functional., special., ... and the rest) in proportion to each
    family's size; deterministic, so every run checks the same entries."""
    families = {}
    for key, e in sorted(baseline.get("entries", {}).items()):
        if e.get(dtype, {}).get("fwd", {}).get("status") != "native":
            continue
        fam = key.rsplit(".", 1)[0] if "." in key and not key.startswith("_") else "core"
        families.setdefault(fam, []).append(key)
    total = sum(len(v) for v in families.values())
    picked = []
    for fam, keys in sorted(families.items()):
        k = max(1, round(n * len(keys) / max(total, 1)))
        step = len(keys) / min(k, len(keys))
        picked += [keys[int(i * step)] for i in range(min(k, len(keys)))]
    return picked


# ---------------------------------------------------------------- driver

def _commit() -> str:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, text=True,
                              capture_output=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _finished_entries(path: str, settings: dict) -> dict:
    """Entries an interrupted run with the same settings already finished (its log)."""
    done = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:  # a line cut short when that run was killed
                    continue
                if rec.get("settings") == settings:
                    done[rec["key"]] = rec
    return done


def run(ops=None, dtypes=("float32",), max_samples=None, jobs=2, timeout=60.0, out=None,
        progress=True, compiled=False, resume=False) -> dict:
    """Runs the selected entries (in-process when jobs == 0); writes out/conformance.{json,md}
    when `out` is given. Returns {"meta", "summary", "entries"}. Each finished entry is also
    appended to out/entries.jsonl; `resume` takes the entries found there (same dtypes,
    sample count and mode) instead of running them again, so a long run can be stopped."""
    with _mode(compiled):
        return _run(ops, dtypes, max_samples, jobs, timeout, out, progress, compiled, resume)


def _run(ops, dtypes, max_samples, jobs, timeout, out, progress, compiled, resume):
    t0 = time.monotonic()
    db = op_db()
    keys = select(db, ops)
    entries = {}
    settings = {"dtypes": list(dtypes), "max_samples": max_samples, "compiled": compiled,
                "timeout_s": timeout}
    commit = _commit()
    log_path = os.path.join(out, "entries.jsonl") if out else None
    earlier = _finished_entries(log_path, settings) if (resume and log_path) else {}
    for key in keys:
        if key in earlier:
            entries[key] = earlier[key]["result"]
    commits = sorted({earlier[k]["commit"] for k in entries} | {commit})
    todo = [k for k in keys if k not in entries]
    seconds = {k: earlier[k]["seconds"] for k in entries if earlier[k].get("seconds")}
    def done(i, key, res, msg, took=None):
        entries[key] = res if res is not None else failed_entry(db[key], dtypes, msg)
        if took is not None:
            seconds[key] = [round(took[0], 3), round(took[1], 3)]
        if log_path:
            with open(log_path, "a") as f:
                f.write(json.dumps({"key": key, "settings": settings, "commit": commit,
                                    "result": entries[key], "seconds": seconds.get(key)}) + "\n")
        if progress:
            f32 = entries[key].get("float32", {})
            st = " ".join(f"{d} {r['status']}" for d, r in f32.items())
            print(f"[{i + len(keys) - len(todo)}/{len(keys)}] {key}  {st}", file=sys.stderr,
                  flush=True)
    if out:
        os.makedirs(out, exist_ok=True)
    if jobs == 0:
        with warnings.catch_warnings():
            quiet()
            for i, key in enumerate(todo, 1):
                t, c = time.monotonic(), compile_seconds()
                res = run_entry(db[key], dtypes, max_samples)
                done(i, key, res, "", (time.monotonic() - t, compile_seconds() - c))
    else:
        log = os.path.join(out or ".", "workers.log")
        pool = Pool(jobs, ("torch_tpu.conformance", "run_key"), (dtypes, max_samples, compiled), log)
        try:
            for i, (key, res, msg) in enumerate(pool.map(todo, timeout), 1):
                done(i, key, res, msg, pool.job_seconds.get(key))
        finally:
            pool.close()
    entries = {k: entries[k] for k in keys}
    results = {"meta": {"torch": torch.__version__, "dtypes": list(dtypes),
                        "max_samples": max_samples, "jobs": jobs, "timeout_s": timeout,
                        "compiled": compiled, "commits": commits,
                        "resumed_entries": len(keys) - len(todo)},
               "summary": summarize(entries, time.monotonic() - t0), "entries": entries,
               "timing": timing(seconds)}
    if out:
        with open(os.path.join(out, "conformance.json"), "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
        with open(os.path.join(out, "conformance.md"), "w") as f:
            f.write(markdown(results))
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_tpu.conformance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", help="comma-separated entry keys or op names; 'x*' is a prefix")
    p.add_argument("--dtype", default=",".join(DTYPES), help="subset of " + ",".join(DTYPES))
    p.add_argument("--max-samples", type=int, default=None,
                   help="samples per entry and dtype (default: all of the reference inputs)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (0: in-process)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per entry")
    p.add_argument("--out", default="conformance_results")
    p.add_argument("--baseline", help="a previous conformance.json")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if an entry native in --baseline is not native now")
    p.add_argument("--write-baseline", metavar="FILE",
                   help="also write the statuses alone (the regression guard's baseline) to FILE")
    p.add_argument("--compiled", action="store_true",
                   help="run the tpu side through torch.compile(backend=\"tpu\")")
    p.add_argument("--resume", action="store_true",
                   help="reuse the entries OUT/entries.jsonl holds from a run with the same settings")
    a = p.parse_args(argv)
    dtypes = tuple(d for d in a.dtype.split(",") if d)
    if unknown := [d for d in dtypes if d not in DTYPES]:
        p.error(f"unknown dtype {unknown}")
    if a.check and not a.baseline:
        p.error("--check needs --baseline")
    ops = [o for o in (a.ops or "").split(",") if o]
    res = run(ops, dtypes, a.max_samples, a.jobs, a.timeout, a.out, compiled=a.compiled,
              resume=a.resume)
    print(summary_table(res["summary"]))
    print(f"Results: {os.path.join(a.out, 'conformance.md')}, conformance.json")
    if a.write_baseline:
        with open(a.write_baseline, "w") as f:
            json.dump(baseline_of(res), f, indent=0, sort_keys=True)
    if a.baseline:
        with open(a.baseline) as f:
            lost = regressions(json.load(f), res["entries"])
        print(f"{len(lost)} regression(s) against {a.baseline}")
        for line in lost:
            print("  " + line)
        if lost and a.check:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
