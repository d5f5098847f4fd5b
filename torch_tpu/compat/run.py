"""One model type, run on CPU and on tpu in each eager mode and compiled, compared.

Per mode the status is one of
  pass                forward outputs, gradients and the parameters after one AdamW step
                      match CPU's, and no op fell back to the CPU. A float tensor outside
                      CPU's tolerance is measured, with CPU's, against the step run in
                      float64 on CPU (the conformance tool's rule, F64_FACTOR): within it,
                      the pass is "float64-judged" and counted apart
  fallback            they match, but some ops ran on the CPU fallback (listed)
  mismatch            a value differs (which one, how far)
  error               tpu raised where CPU worked (first line, classified)
  cpu-fails           the model fails on CPU too: not ours
  config-unbuildable  no small valid config or input could be made (the reason)
Mode "compiled" wraps the device copy in torch.compile(model, backend="tpu") (the user's
one-line change): the forward (train mode) and its backward run through the compiled graphs,
graph breaks and the AdamW step (eager, not compiled) in Strict. Its errors are classified
apart: "dynamo" (Dynamo could not capture the model), "compile error" (AOTAutograd or the
backend failed on a captured graph), "dynamic shapes" (a graph came with unbounded sizes),
then the eager classes for what failed when a graph ran. A run for which Dynamo handed no
graph to the backend ran eagerly: a fallback, "eager: no graph compiled". Graph breaks,
compiled graphs and recompiles are recorded beside the status.
The pseudo-mode "cpu" runs the CPU step alone (a fast triage of the two statuses that are
not ours): pass there means the model builds and trains on the CPU.
"""
import contextlib
import copy
import time
import warnings

import torch

import torch_tpu
from torch_tpu._workers import extend_deadline, first_line, report_progress
from torch_tpu.compat import compiled as compiled_mode
from torch_tpu.compat.draws import RandomDraws
from torch_tpu.compat import models
from torch_tpu.conformance import F64_FACTOR

# The eager mode each mode runs in; "compiled" runs its graph breaks and optimizer in Strict.
MODES = {"strict": torch_tpu.EagerMode.DEFER_NEVER, "fused": torch_tpu.EagerMode.DEFER_AND_FUSE,
         "compiled": torch_tpu.EagerMode.DEFER_NEVER}
# float32 through whole models: XLA's and ATen's kernels round differently, and layers
# compound it (the conformance tool allows 1e-4 per op).
RTOL, ATOL = 1e-3, 1e-4
LR = 1e-3
ADAMW = {"lr": LR, "eps": 1e-4}


def worker_setup():
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()


def classify(message: str) -> str:
    m = message.lower()
    if "fallback" in m and "forbids" in m:
        return "missing lowering"
    if "dtype" in m or "not supported for" in m:
        return "unsupported dtype"
    if "compile" in m or "stablehlo" in m or "mlir" in m:
        return "compile error"
    if "timeout" in m or "worker died" in m:
        return "crash or hang"
    return "other"


def fallbacks() -> dict:
    from torch_tpu import _decompositions
    fb = dict(torch_tpu.metrics()["fallbacks"])
    for k, n in _decompositions.fallbacks.items():
        fb[k] = fb.get(k, 0) + n
    return fb


def step(model, kw, device, compiled=False, draws=None, backend="tpu"):
    """Forward (train mode), backward and one AdamW step on `device`; returns the forward's
    tensors, the gradients and the updated parameters, all on the CPU. `compiled`: the
    forward goes through torch.compile(model, backend="tpu") (its backward with it); the
    optimizer stays eager. `draws` (a RandomDraws mode) records or replays the random
    values the step draws (draws.py)."""
    model = model.to(device)
    forward = compiled_mode.wrap(model, backend) if compiled else model
    args = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    torch.manual_seed(0)
    if draws is None:
        replaying = contextlib.nullcontext()
    elif compiled:
        # The mode stays active for the eager code between graph breaks (VITS draws its
        # duration noise there); the graphs run their ops, not a captured program, so
        # their draws reach the same mode.
        from torch_tpu._internal.compile import graph_calls_under
        replaying = contextlib.ExitStack()
        replaying.enter_context(draws)
        replaying.enter_context(graph_calls_under(contextlib.nullcontext()))
    else:
        replaying = draws
    with replaying:
        out = forward(**args)
    # Device-side copies, read back only after the optimizer step: a host read in between
    # would cut DeferAndFuse's graphs and be counted as the model's.
    outs = [t.detach().clone() for t in models.flat_tensors(out)]
    models.loss_of(out).backward()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters() if p.requires_grad]
    torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **ADAMW).step()
    params = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    # On the CPU these are already copies; the next mode reloads the initial weights.
    return ([t.cpu() for t in outs], names, [None if g is None else g.cpu() for g in grads],
            [p.cpu() for p in params])


def _checks(got, want):
    """(what, tpu value, CPU value, index into the step's result) for every compared tensor."""
    (go, names, gg, gp), (wo, _, wg, wp) = got, want
    yield from ((f"output {i}", a, b, (0, i)) for i, (a, b) in enumerate(zip(go, wo)))
    yield from ((f"grad {n}", a, b, (2, i)) for i, (n, a, b) in enumerate(zip(names, gg, wg)))
    yield from ((f"param {n}", a, b, (3, i)) for i, (n, a, b) in enumerate(zip(names, gp, wp)))


def _atol(what, b) -> float:
    # Gradients are compared against their own scale: a layer's gradient can be tiny.
    return ATOL * (max(models.finite_scale(b), 1.0) if what.startswith("grad") else 1.0)


def differences(got, want, zero_grads_for_none=False):
    """(hard, soft): `hard` is the first difference no reference can excuse (counts,
    missing tensors, shapes, dtypes, integer values), '' when none; `soft` lists the float
    tensors outside CPU's tolerance as (message, what, tpu value, CPU value, index).
    `zero_grads_for_none` (compiled mode): a gradient of zeros where CPU has none is
    equal. AOTAutograd gives every parameter its compiled backward reaches a gradient,
    zeros where nothing flows (the tangent of a graph output the loss does not use, such
    as a vision tower's last layer under LLaVA's feature layer -2), on any backend."""
    if len(got[0]) != len(want[0]):
        return f"{len(got[0])} outputs, CPU has {len(want[0])}", []
    soft = []
    for what, a, b, idx in _checks(got, want):
        if (zero_grads_for_none and what.startswith("grad") and b is None and a is not None
                and a.is_floating_point() and not bool(a.any())):
            continue
        if (a is None) != (b is None):
            return f"{what}: {'missing' if a is None else 'unexpected'} on tpu", soft
        if a is None or not b.is_floating_point():
            if a is not None and not torch.equal(a, b):
                return f"{what}: integer values differ", soft
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{what}: {tuple(a.shape)} {a.dtype} vs CPU {tuple(b.shape)} {b.dtype}", soft
        try:
            torch.testing.assert_close(a, b, rtol=RTOL, atol=_atol(what, b), equal_nan=True)
        except AssertionError:
            diff = (a.float() - b.float()).abs().nan_to_num(float("inf")).max().item()
            soft.append((f"{what}: max abs diff {diff:.3g}", what, a, b, idx))
    return "", soft


def compare(got, want) -> str:
    """'' when they match, else what differs first."""
    hard, soft = differences(got, want)
    return hard or (soft[0][0] if soft else "")


def judge_float64(soft, ref, spread=()):
    """The conformance tool's float64 rule for the tensors outside CPU's tolerance: each
    passes when tpu's error against `ref` (the step run in float64 on CPU), in tolerances
    (atol + rtol x |float64 value|, element by element), is at most 1 or F64_FACTOR times
    CPU's own float32 error; non-finite values must sit where CPU's do, equal.
    Returns (ok, message): the first failing tensor, else the worst ratio judged."""
    worst = (0.0, "")
    for msg, what, a, b, (part, i) in soft:
        c = ref[part][i]
        if c is None or c.shape != a.shape:
            return False, f"{msg} (float64 run has no matching {what})"
        a, b, c = a.double(), b.double(), c.detach().double()
        bad = ~torch.isfinite(a) | ~torch.isfinite(b)
        if bool(bad.any()) and not torch.equal(a[bad].nan_to_num(0.5), b[bad].nan_to_num(0.5)):
            return False, f"{msg} (non-finite values differ from CPU's)"
        scale = _atol(what, b) + RTOL * c.abs()
        ok = ~bad

        def err(x):
            return float(((x - c).abs() / scale)[ok].max()) if bool(ok.any()) else 0.0
        err_tpu, err_cpu = err(a), err(b)
        ratio = f"{what}: tpu {err_tpu:.3g} tolerances from float64, CPU {err_cpu:.3g}"
        if spread:
            moved = max(err(o[part][i].double()) for o in spread)
            ratio += f", CPU with inputs and weights 1 ulp away {moved:.3g}"
            err_cpu = max(err_cpu, moved)
        if err_tpu > max(1.0, F64_FACTOR * err_cpu):
            return False, f"{msg}; {ratio}"
        worst = max(worst, (err_tpu / max(err_cpu, 1e-30), ratio))
    return True, "float64-judged: " + worst[1]


def float64_step(model, state, kw, draws=None):
    """The CPU step in float64: the same initial weights, inputs and random draws, floating
    ones cast."""
    m64 = copy.deepcopy(model)
    m64.load_state_dict(state)
    m64.zero_grad(set_to_none=True)
    m64.double()
    kw64 = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in kw.items()}
    return step(m64, kw64, "cpu", draws=draws)


def adamw_from(p0, grad):
    """The step's AdamW update of `p0` by `grad`, on the CPU in float64."""
    p = p0.detach().double().clone().requires_grad_(True)
    p.grad = grad.detach().double()
    torch.optim.AdamW([p], **ADAMW).step()
    return p.detach()


def explained_by_gradient(item, got, initial) -> bool:
    """Whether a parameter outside CPU's tolerance after the step is exactly AdamW
    applied to tpu's own gradient. Its distance from CPU is then its gradient's, which
    is compared (and judged) on its own: AdamW's first step moves a weight by about
    lr x g / (|g| + eps), so a gradient element near zero, equal to CPU's within any
    tolerance, can move its weight up to lr/eps = 10x its rounding (XCLIP: a gradient
    of 3e-5 where float64 has -9e-7, in a tensor whose scale is 13). What the check
    still catches: a wrong optimizer step on the device."""
    _, what, a, _, (part, i) = item
    name = what[len("param "):]
    g = got[2][i]
    if part != 3 or initial is None or name not in initial or g is None:
        return False
    want = adamw_from(initial[name], g)
    return torch.allclose(a.double(), want, rtol=1e-5, atol=LR * 1e-3)


def nudge(t, direction):
    """`t` with each floating value moved one ulp up (direction 1) or down (-1)."""
    if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
        return t
    return torch.nextafter(t, torch.full_like(t, direction * float("inf")))


def perturbed_step(model, state, kw, direction, draws=None):
    """The CPU step from inputs and weights one ulp away: how far rounding alone can move
    this step's result."""
    m = copy.deepcopy(model)
    m.load_state_dict({k: nudge(v, direction) for k, v in state.items()})
    m.zero_grad(set_to_none=True)
    return step(m, {k: nudge(v, direction) for k, v in kw.items()}, "cpu", draws=draws)


def verdict(got, want, reference, zero_grads_for_none=False, initial=None, notes=None,
            spread=None):
    """(why, judged): `why` is '' when tpu matches CPU, or matches the float64 result
    (`reference()`, run on demand) as closely as the rule asks, else what differs;
    `judged` is the rule's message when the float64 rule made it pass, else ''.
    `initial` (the parameters before the step, by name): a parameter that is AdamW of
    tpu's own gradient is judged by that gradient (counted in notes["params_by_grads"])."""
    hard, soft = differences(got, want, zero_grads_for_none)
    if not hard and initial is not None:
        kept = [s for s in soft if not explained_by_gradient(s, got, initial)]
        if notes is not None and len(kept) < len(soft):
            notes["params_by_grads"] = len(soft) - len(kept)
        soft = kept
    if hard or not soft:
        return hard, ""
    try:
        ref = reference()
    except Exception as e:  # noqa: BLE001 -- a model that cannot run in float64 keeps CPU's verdict
        return f"{soft[0][0]} (float64 run failed: {first_line(e)})", ""
    ok, msg = judge_float64(soft, ref)
    if not ok and spread is not None:
        # A chaotic step (batch norm over a few values, ReLU6 kinks): CPU's own error
        # from float64 is a matter of luck, so tpu's is held against the worst of CPU
        # runs whose inputs and weights moved by one ulp (spread(), on demand).
        try:
            ok, msg = judge_float64(soft, ref, spread())
        except Exception as e:  # noqa: BLE001 -- keep the float64 rule's verdict
            msg += f" (perturbed CPU runs failed: {first_line(e)})"
    return ("", msg) if ok else (msg, "")


def carry_config_changes(src, dst):
    """Makes `dst` (a copy of `src` taken before inputs were synthesized) see the config
    values the input synthesis set on `src` (LLaVA-NeXT's grid is shrunk to the image
    size there): otherwise the device runs a different model than the CPU."""
    done = set()
    for a, b in zip(src.modules(), dst.modules()):
        ca, cb = getattr(a, "config", None), getattr(b, "config", None)
        if hasattr(ca, "to_dict") and type(ca) is type(cb) and id(cb) not in done:
            done.add(id(cb))
            for key, value in vars(ca).items():
                if not hasattr(value, "to_dict"):  # sub-configs are visited as their modules' own
                    setattr(cb, key, copy.deepcopy(value))


def identity(key) -> dict:
    """The head, family and class a key is reported under, known without building it (a
    model that cannot be built, or whose worker died, stays in its family)."""
    if "/" not in key:
        head, family, cls_name = models.representative(key)
        return {"head": head, "family": family, "class": models.PARTS.get(key, cls_name)}
    head, model_type = key.split("/", 1)  # a stage-2 key, "task head/model type"
    from torch_tpu.compat import sample
    table = sample.heads()
    return {"head": head, "family": sample.modality(model_type, table),
            "class": table.get(head, {}).get(model_type),
            "stratum": sample.stratum(head, model_type, table)}


def run_model(model_type, modes=("strict", "fused")) -> dict:
    """{"head", "family", "class", "params", "modes": {mode: record}}. Before each part
    it reports the record so far and the part ("build", "cpu" or a mode) to the pool, so
    that a timeout or a crash keeps the modes that finished."""
    rec = {**identity(model_type), "modes": {}}
    want_head = None
    if "/" in model_type:
        want_head, model_type = model_type.split("/", 1)
    report_progress((rec, "build"))
    try:
        model, cfg, head, family, cls_name = models.build(model_type, want_head)
        # Each device run starts from a copy made before any forward: a model that caches
        # tensors outside its parameters and buffers (Mimi's codebook caches its centroids)
        # keeps them on the device of its first forward, as on CUDA after a CPU forward.
        pristine = copy.deepcopy(model)
        kw = models.inputs(model, cfg, head)
        carry_config_changes(model, pristine)
    except Exception as e:  # noqa: BLE001
        status = {"status": "config-unbuildable", "message": first_line(e)}
        rec["modes"] = {m: status for m in modes}
        return rec
    if want_head is None:
        rec.update(head=head, family=family)
    rec["params"] = sum(p.numel() for p in model.parameters())
    rec["class"] = cls_name
    state = {k: v.clone() for k, v in model.state_dict().items()}
    f64 = []

    recorded = RandomDraws()

    def reference():  # the float64 step, run once for all modes that need it
        if not f64:
            f64.append(float64_step(pristine, state, kw, replay(recorded)))
        return f64[0]
    moved = []

    def spread():  # CPU steps from inputs and weights one ulp up and one down, run once
        if not moved:
            moved.extend(perturbed_step(pristine, state, kw, d, replay(recorded)) for d in (1, -1))
        return moved
    report_progress((rec, "cpu"))
    try:
        t0 = time.perf_counter()
        want = step(model, kw, "cpu", draws=recorded)
        cpu_s = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001
        status = {"status": "cpu-fails", "message": first_line(e)}
        rec["modes"] = {m: status for m in modes}
        return rec
    compiled_before = torch_tpu.metrics().get("compile_seconds", 0.0)
    for mode in modes:
        if mode == "cpu":
            rec["modes"][mode] = {"status": "pass", "cpu_seconds": round(cpu_s, 2)}
            continue
        report_progress((rec, mode))
        rec["modes"][mode] = run_mode(mode, pristine, state, kw, want, (reference, spread),
                                      cpu_s, replay(recorded))
        # The timeout counts the model's run time, not XLA's compiles (a cold cache's).
        extend_deadline(torch_tpu.metrics().get("compile_seconds", 0.0) - compiled_before)
    return rec


def replay(recorded):
    """A mode that hands a step the CPU step's random draws; None when it drew none. In
    compiled mode it runs inside the graphs' calls, where the draws are ATen ops (random
    ops in a graph break's eager code draw the device's own numbers)."""
    return RandomDraws(recorded.values) if recorded.values else None


def run_mode(mode, pristine, state, kw, want, references, cpu_s, draws=None) -> dict:
    """One device mode's record for a model whose CPU step (`want`) ran; `references`:
    (the float64 step, the perturbed CPU steps), each run on demand; `draws` replays the
    CPU step's random values."""
    reference, spread = references
    dev_model = copy.deepcopy(pristine)
    dev_model.load_state_dict(state)
    compiled = mode == "compiled"
    r = {}
    before, m0 = fallbacks(), dict(torch_tpu.metrics())
    t0 = time.perf_counter()
    try:
        with torch_tpu.set_eager_mode(MODES[mode]), \
                (compiled_mode.session(r) if compiled else contextlib.nullcontext()):
            got = step(dev_model, kw, "tpu", compiled, draws)
            torch_tpu.synchronize()
    except Exception as e:  # noqa: BLE001
        if compiled:
            rec = {**r, "status": "error", **compiled_mode.error(e, classify),
                   "seconds": round(time.perf_counter() - t0, 2)}
            # The control: Dynamo alone on CPU. Failing there too, the model does not
            # compile on any device: not ours (counted as cpu-fails, the tpu error kept).
            cpu_model = copy.deepcopy(pristine)
            cpu_model.load_state_dict(state)
            why = compiled_mode.fails_on_cpu(lambda: step(cpu_model, kw, "cpu", True, backend="eager"))
            if why is not None:
                rec.update(status="cpu-fails", tpu_message=rec["message"],
                           message=f"torch.compile fails on CPU too (backend eager): {why}")
            return rec
        msg = first_line(e)
        return {"status": "error", "message": msg, "class": classify(msg)}
    finally:
        del dev_model  # its device memory goes before the next mode
    m1 = torch_tpu.metrics()
    r.update({"seconds": round(time.perf_counter() - t0, 2), "cpu_seconds": round(cpu_s, 2),
              "compiles": m1.get("compiles", 0) - m0.get("compiles", 0),
              "executions": m1.get("executions", 0) - m0.get("executions", 0),
              "fused_graphs": m1.get("fused_graphs", 0) - m0.get("fused_graphs", 0)})
    fb = {k: v - before.get(k, 0) for k, v in fallbacks().items() if v != before.get(k, 0)}
    if compiled and not r["compiled_graphs"]:
        fb[compiled_mode.EAGER_IN_COMPILED] = 1
    why, judged = verdict(got, want, reference, zero_grads_for_none=compiled, initial=state, notes=r,
                          spread=spread)
    if draws is not None:
        r["replayed_draws"] = draws.used
    if judged:
        r.update(float64_judged=True, message=judged)
    if why:
        r.update(status="mismatch", message=why)
    elif fb:
        r.update(status="fallback", message=", ".join(sorted(fb)))
    else:
        r["status"] = "pass"
    return r
