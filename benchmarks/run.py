"""Side-by-side benchmarks: native PyTorch on CPU and torch_tpu in each eager mode, on the
same models and data.

    .venv/bin/python benchmarks/run.py            (or: make bench)

Workloads: (a) GPT decoder training step, (b) issue 18's small GPT training step, (c) the
GPT's prefill forward, (d) MLP training step, (e) small CNN training step. Per workload and
mode: median step time over --steps timed steps after --warmup steps, throughput (tokens/s
or samples/s), peak device memory (torch.tpu.max_memory_allocated over the timed steps),
compiles and executions per step. Native CPU PyTorch runs in fresh processes without
torch_tpu, with its defaults, with OMP_WAIT_POLICY=PASSIVE and with one thread; the best is
the cpu row (spinning OpenMP threads lose their cores on a busy machine). Then cold- vs
warm-cache start of a fresh process in Strict, DeferAndFuse and compiled mode (time to
finish its first training step, compile seconds of one-op programs and of fused graphs;
compiled over DeferAndFuse cold is issue 13's cold-compile target); a chain of 2,000
tiny ops (Strict, and DeferAndFuse's recording, against native CPU's best); issue 18's
small GPT timed side by side with native CPU in one process (blocks of steps taking turns:
its targets' ratios), and once more in a process whose XLA CPU plugin pools have one
thread; a fresh process's first tpu op; and each step's measured floor (its contractions alone, run as their own program in Strict
and in DeferAndFuse and timed as the step is: fusion cannot shorten them) with the bound it
puts on fused / best eager, and the steady step a warm start still runs. Fused gains are
reported against the better of Strict and Debug. Writes results.json,
results.md and results.png to --out, with issue 4's, 13's and 18's targets: each value and
whether it is met.
"""
import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
from gpt import GPT, batches  # noqa: E402

# The native-CPU probe runs in a process of its own without torch_tpu (its runtime's
# threads would share the CPUs); it is started with TORCH_DEVICE_BACKEND_AUTOLOAD=0.
CPU_PROBE = "--cpu-probe" in sys.argv
if not CPU_PROBE:
    import torch_tpu  # noqa: E402
    from torch_tpu import EagerMode  # noqa: E402

MODES = {"cpu": None} if CPU_PROBE else {
    "cpu": None,
    "strict": EagerMode.DEFER_NEVER,
    "debug": EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING,
    "fused": EagerMode.DEFER_AND_FUSE,
    "compiled": EagerMode.DEFER_NEVER,  # torch.compile(backend="tpu"); eager parts Strict
}
# Native CPU PyTorch, each in a fresh process: its defaults, OpenMP threads that sleep
# instead of spinning while they wait (a busy machine steals spinning threads' cores),
# and one thread. The best is the baseline.
CPU_VARIANTS = {
    "defaults": {},
    "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "1 thread": {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"},
}
_compiling = False  # set by measure() for the "compiled" mode


def forward_of(model):
    """The model, or in the compiled mode its torch.compile(backend="tpu")."""
    return torch.compile(model, backend="tpu") if _compiling else model


def step_of(opt):
    """`opt.step`, or in the compiled mode that step compiled as PyTorch's compiled
    optimizer recipe does: the whole update one graph (with TpuBackend's fuse_steps,
    forward, backward and update are then one program a step; three without)."""
    if not _compiling:
        return opt.step

    @torch.compile(backend="tpu")
    def compiled_step():
        opt.step()
    return compiled_step


# ---- workloads: each returns (step function, units per step, unit name) -------------

def gpt_config(quick):
    return dict(vocab=256, d_model=128 if quick else 256, n_heads=4, n_layers=2 if quick else 4,
                seq=128 if quick else 256), 8


def gpt_train(device, quick):
    cfg, batch = gpt_config(quick)
    return gpt_train_step(device, cfg, batch)


def small_gpt_train(device, quick):
    """Issue 18's small GPT (2 layers, d_model 64, seq 64, batch 4; the same with --quick):
    host work dominates, as it does on a real TPU whose device steps take milliseconds."""
    return gpt_train_step(device, dict(vocab=256, d_model=64, n_heads=4, n_layers=2, seq=64), 4)


def small_gpt_host_work(device):
    """The small GPT's layers at sizes whose compute is nil (d_model 4, seq 2, batch 1):
    natively, a step is then PyTorch's own Python, autograd and dispatch, and its kernels'
    fixed costs, for the same ops."""
    return gpt_train_step(device, dict(vocab=8, d_model=4, n_heads=4, n_layers=2, seq=2), 1)


def gpt_train_step(device, cfg, batch):
    torch.manual_seed(0)
    model = GPT(**cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [(x.to(device), y.to(device)) for x, y in batches(cfg["vocab"], cfg["seq"], batch, 4)]
    state = {"i": 0}
    # The step needs the loss only. Compiled, the model returning its logits too would make
    # autograd feed the backward graph a materialized zero gradient for them (a fill and a
    # logits-sized buffer each step): the compiled function returns the loss alone.
    fwd = torch.compile(lambda x, y: (None, model(x, y)[1]), backend="tpu") if _compiling else model
    update = step_of(opt)

    def step():
        x, y = data[state["i"] % len(data)]
        state["i"] += 1
        _, loss = fwd(x, y)
        opt.zero_grad()
        loss.backward()
        update()
        return loss.item()
    return step, batch * cfg["seq"], "tokens/s"


def gpt_prefill(device, quick):
    cfg, batch = gpt_config(quick)
    torch.manual_seed(0)
    model = GPT(**cfg).to(device).eval()
    x, _ = next(batches(cfg["vocab"], cfg["seq"], batch, 1))
    x = x.to(device)
    fwd = forward_of(model)

    def step():
        with torch.no_grad():
            logits = fwd(x)
            return logits[:, -1].argmax(-1).sum().item()  # next tokens: the value a decoder needs
    return step, batch * cfg["seq"], "tokens/s"


def classifier_step(model, opt, x, y):
    """One cross-entropy training step, ending with the loss read back (a sync). In the
    compiled mode the loss function is one compiled graph (the model alone would leave the
    loss and its backward to eager ops) and so is the optimizer step."""
    loss_of, update = forward_of(lambda x, y: F.cross_entropy(model(x), y)), step_of(opt)

    def step():
        loss = loss_of(x, y)
        opt.zero_grad()
        loss.backward()
        update()
        return loss.item()
    return step


class MLP(nn.Module):
    def __init__(self, d_in=512, hidden=2048, d_out=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, hidden),
                                 nn.GELU(), nn.Linear(hidden, d_out))

    def forward(self, x):
        return self.net(x)


def mlp_train(device, quick):
    torch.manual_seed(0)
    model = MLP(hidden=512 if quick else 2048).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = 256
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 512, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)

    return classifier_step(model, opt, x, y), batch, "samples/s"


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc = nn.Linear(64 * 8 * 8, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1))


def cnn_train(device, quick):
    torch.manual_seed(0)
    model = CNN().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batch = 16 if quick else 32
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 32, 32, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)

    return classifier_step(model, opt, x, y), batch, "samples/s"


WORKLOADS = {"gpt_train": gpt_train, "small_gpt_train": small_gpt_train, "gpt_prefill": gpt_prefill,
             "mlp_train": mlp_train, "cnn_train": cnn_train}


# ---- measuring --------------------------------------------------------------------------

def measure(workload, mode, steps, warmup, quick):
    global _compiling
    on_tpu = mode != "cpu"
    device = "tpu" if on_tpu else "cpu"
    _compiling = mode == "compiled"
    if _compiling:
        torch._dynamo.reset()
    ctx = torch_tpu.set_eager_mode(MODES[mode]) if on_tpu else None
    try:
        step, units, unit_name = WORKLOADS[workload](device, quick)
        t_first = time.perf_counter()
        step()
        if on_tpu:
            torch.tpu.synchronize()  # all of the step: Strict's queued launches finish too
        first = time.perf_counter() - t_first
        after_first = torch_tpu.metrics() if on_tpu else None
        for _ in range(warmup - 1):
            step()
        if on_tpu:
            torch.tpu.synchronize()
            torch.tpu.reset_peak_memory_stats()
            m0 = torch_tpu.metrics()
        times, values = [], []
        for _ in range(steps):
            t = time.perf_counter()
            values.append(step())
            times.append(time.perf_counter() - t)
        row = {"workload": workload, "mode": mode, "unit": unit_name,
               "median_step_s": statistics.median(times), "first_step_s": first,
               "throughput": units / statistics.median(times), "last_value": values[-1]}
        if on_tpu:
            m1 = torch_tpu.metrics()
            row["peak_bytes"] = torch.tpu.max_memory_allocated()
            row["compiles_per_step"] = (m1["compiles"] - m0["compiles"]) / steps
            row["executions_per_step"] = (m1["executions"] - m0["executions"]) / steps
            row["fallbacks"] = sum(m1["fallbacks"].values()) - sum(m0["fallbacks"].values())
            if _compiling:  # Dynamo frames traced again after the first step
                row["compiled_recompiles"] = m1["compiled_recompiles"] - after_first["compiled_recompiles"]
        return row
    finally:
        _compiling = False
        if ctx is not None:
            ctx.__exit__(None, None, None)


# The ops whose math fusion cannot remove (matmuls, convolutions, and attention, whose
# kernel is its two contractions around a softmax): fusion removes launches and memory
# traffic around them. A step's floor is a program of these calls alone.
FLOOR_OPS = ("mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward",
             "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_flash_attention_for_cpu_backward",
             # On tpu, SDPA dispatches to the overrideable fused-attention op.
             "_scaled_dot_product_fused_attention_overrideable",
             "_scaled_dot_product_fused_attention_overrideable_backward")


def record_contractions(workload, quick, warmup=1):
    """The FLOOR_OPS calls of one step of `workload` (after `warmup` steps), in order:
    [(op overload, args, kwargs)] with each tpu tensor replaced by its (sizes, strides,
    storage offset, dtype), recorded in Strict mode under a dispatch mode."""
    from torch.utils._python_dispatch import TorchDispatchMode
    import torch.utils._pytree as pytree

    calls = []

    def spec(t):
        if isinstance(t, torch.Tensor):
            return ("tensor", tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)
        return t

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.overloadpacket.__name__ in FLOOR_OPS:
                calls.append((func, pytree.tree_map(spec, args), pytree.tree_map(spec, kwargs)))
            return func(*args, **kwargs)

    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER):
        step, _, _ = WORKLOADS[workload]("tpu", quick)
        for _ in range(warmup):
            step()
        with Recorder():
            step()
    return calls


def floor_step(calls):
    """A step that runs only `calls` (record_contractions) on fresh tpu tensors of the
    recorded layouts and, like a workload's step, ends by reading a scalar back."""
    import torch.utils._pytree as pytree
    g = torch.Generator().manual_seed(0)

    def make(x):
        if not (isinstance(x, tuple) and len(x) == 5 and x[0] == "tensor"):
            return x
        _, shape, stride, offset, dtype = x
        extent = offset + sum((n - 1) * s for n, s in zip(shape, stride)) + 1 if all(shape) else 0
        span = (torch.randn(max(extent, 1), generator=g) * 0.1).to(dtype).to("tpu")
        return span.as_strided(shape, stride, offset)

    is_spec = lambda x: isinstance(x, tuple) and len(x) == 5 and x[0] == "tensor"  # noqa: E731
    prepared = [(f, pytree.tree_map(make, a, is_leaf=is_spec), pytree.tree_map(make, k, is_leaf=is_spec))
                for f, a, k in calls]
    torch.tpu.synchronize()

    def step():
        outs = [f(*a, **k) for f, a, k in prepared]  # kept alive: fusion may not drop them
        last = [t for t in pytree.tree_leaves(outs) if isinstance(t, torch.Tensor) and t.numel()]
        return last[-1].flatten()[0].item()
    return step


def contraction_floor(workload, mode, steps, warmup, quick, calls=None):
    """The step's measured floor in `mode`: a program of the step's contraction calls only,
    timed like measure() times the step (median of `steps` after `warmup`, ending with a
    value read back). Fusion can remove everything else, never these."""
    calls = calls if calls is not None else record_contractions(workload, quick)
    with torch_tpu.set_eager_mode(MODES[mode]):
        step = floor_step(calls)
        for _ in range(warmup):
            step()
        torch.tpu.synchronize()
        m0 = torch_tpu.metrics()
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        m1 = torch_tpu.metrics()
    return {"floor_s": statistics.median(times), "calls": len(calls),
            "executions_per_step": (m1["executions"] - m0["executions"]) / steps}


def best_eager(by, workload):
    """The faster of the workload's Strict and Debug rows (None if neither ran)."""
    rs = [r for r in (by.get((workload, "strict")), by.get((workload, "debug"))) if r]
    return min(rs, key=lambda r: r["median_step_s"]) if rs else None


def ceilings(rows, starts, quick, steps=5, warmup=3):
    """Per workload the measured contraction floor in Strict and in DeferAndFuse and the
    bounds they give: a fused step cannot beat its fused floor, so fused / best eager
    cannot exceed the best eager step over the fused floor. The start ceilings follow."""
    by = {(r["workload"], r["mode"]): r for r in rows}
    out = []
    for w in WORKLOADS:
        best = best_eager(by, w)
        if not best:
            continue
        calls = record_contractions(w, quick)
        floors = {m: contraction_floor(w, m, steps, warmup, quick, calls) for m in ("strict", "fused")}
        b = {"workload": w, "contraction_calls": len(calls), "best_eager_mode": best["mode"],
             "best_eager_step_s": best["median_step_s"],
             "floor_strict_s": floors["strict"]["floor_s"], "floor_fused_s": floors["fused"]["floor_s"],
             "floor_fused_executions_per_step": floors["fused"]["executions_per_step"],
             "fused_over_best_eager_ceiling": best["median_step_s"] / max(floors["fused"]["floor_s"], 1e-9)}
        for m in ("strict", "fused"):
            r = by.get((w, m))
            if r:
                b[f"{m}_step_over_floor"] = r["median_step_s"] / max(floors[m]["floor_s"], 1e-9)
        out.append(b)
    for st in starts:
        r = by.get(("gpt_train", st["mode"]))
        if r:
            out.append({"workload": "gpt_train start", "mode": st["mode"], "cold_s": st["cold"]["first_step_s"],
                        "steady_step_s": r["median_step_s"],
                        "warm_over_cold_ceiling": st["cold"]["first_step_s"] / r["median_step_s"]})
    return out


def start_probe(workload, mode, quick):
    """In a fresh process: the time to finish the first training step."""
    t0 = time.perf_counter()
    torch.ones(1, device="tpu").add(1).cpu()  # process-level start-up, not the model's
    t1 = time.perf_counter()
    global _compiling
    _compiling = mode == "compiled"  # Dynamo and AOTAutograd's tracing count too
    # Importing Dynamo is part of every mode's first step: torch.compile does it, and so
    # does the first optimizer a process builds (Optimizer.__init__ is wrapped by
    # torch._disable_dynamo), on CPU too. Done first here, so it is timed apart.
    importlib.import_module("torch._dynamo")
    split = {"dynamo_import_s": time.perf_counter() - t1}
    cpu0 = time.process_time()  # all threads: the plugin compiles on threads of its own
    with torch_tpu.set_eager_mode(MODES[mode]):
        step, _, _ = WORKLOADS[workload]("tpu", quick)
        step()
        torch.tpu.synchronize()  # all of the step: Strict's queued launches finish too
    t2 = time.perf_counter()
    cpu1 = time.process_time()
    m = torch_tpu.metrics()
    if _compiling:
        # Dynamo's own timer covers its bytecode tracing and the backend call (AOTAutograd);
        # our first calls (recording) run outside it.
        from torch._dynamo.utils import compilation_time_metrics
        inner = sum(compilation_time_metrics.get("_compile.compile_inner", []))
        split.update(dynamo_s=inner - m["compiled_aot_seconds"], aot_s=m["compiled_aot_seconds"],
                     record_s=m["compiled_record_seconds"])
    print(json.dumps({"first_step_s": t2 - t1, "process_warmup_s": t1 - t0, **split,
                      "tracing_s": m.get("compiled_lowering_seconds", 0.0),
                      "compiles": m["compiles"], "disk_cache_hits": m.get("disk_cache_hits", 0),
                      "compile_s": m["compile_seconds"], "load_s": m["cache_load_seconds"],
                      "op_compiles": m.get("op_compiles", 0), "op_compile_s": m.get("op_compile_seconds", 0.0),
                      "graph_compiles": m.get("graph_compiles", 0),
                      "graph_compile_s": m.get("graph_compile_seconds", 0.0),
                      "process_cpu_s": cpu1 - cpu0, "cores": len(os.sched_getaffinity(0))}))


def cold_vs_warm(workload, mode, quick):
    with tempfile.TemporaryDirectory(prefix="torch_tpu_bench_cache_") as cache:
        env = dict(os.environ, TPU_COMPILE_CACHE_DIR=cache)
        cmd = [sys.executable, os.path.abspath(__file__), "--start-probe", workload, "--probe-mode", mode]
        if quick:
            cmd.append("--quick")
        runs = []
        for _ in range(2):
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
            if r.returncode != 0:
                raise RuntimeError(r.stderr[-2000:])
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    return {"workload": workload, "mode": mode, "cold": cold, "warm": warm,
            "speedup": cold["first_step_s"] / max(warm["first_step_s"], 1e-9)}


def tiny_op_chain(device, n=2000, repeats=5):
    """Seconds per op of `x = x + 1` on 16 floats, a chain of n, to its value (median of
    `repeats`); on tpu also the seconds per op to record the chain in DeferAndFuse."""
    x0 = torch.zeros(16, device=device)

    def chain():
        x = x0
        for _ in range(n):
            x = x + 1
        return x

    def timed(fn):
        ts = []
        for _ in range(repeats + 1):  # the first compiles / warms up
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts[1:]) / n

    if device == "cpu":
        # A chain of views: PyTorch's argument parsing, dispatch and a new tensor, with no
        # compute and no shape inference beyond a view's -- less than recording an op in
        # DeferAndFuse can cost while each op is a PyTorch call. (The meta device is no
        # floor: its add runs Python meta functions, about 18x a CPU add here.)
        def view_chain():
            x = x0
            for _ in range(n):
                x = x.view(16)
            return x

        return {"per_op_s": timed(lambda: chain()[0].item()), "view_per_op_s": timed(view_chain)}
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER):
        strict = timed(lambda: chain()[0].item())
    with torch_tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE):
        ts = []
        for _ in range(repeats + 1):  # the first compiles the fused chain
            t = time.perf_counter()
            x = chain()  # recorded, not run
            ts.append(time.perf_counter() - t)
            x[0].item()  # runs the graph, outside the timing
        rec = statistics.median(ts[1:]) / n
    # The runtime's own launch of the same chain, PyTorch left out: Strict's floor.
    floor = torch_tpu._C._launch_floor(0, n, repeats)
    # The same `x + 1` calls reaching our kernel, which returns a new tensor over x's
    # storage and does nothing else: PyTorch's own cost of each call, under which
    # recording cannot go (recording's floor).
    torch_tpu._C._set_dispatch_floor_probe(1)
    try:
        dispatch = timed(chain)
    finally:
        torch_tpu._C._set_dispatch_floor_probe(0)
    # Both in place: each call as above also makes one chained launch through the runtime
    # alone, the chain ended by its value as Strict's is. Strict's floor, measured with the
    # two costs interleaved as they run (each slows the other: caches, the launch's thread).
    torch_tpu._C._set_dispatch_floor_probe(2)
    try:
        in_place = timed(lambda: (chain(), torch_tpu._C._wait_chain_probe()))
    finally:
        torch_tpu._C._set_dispatch_floor_probe(0)
    return {"strict_per_op_s": strict, "fused_record_per_op_s": rec, "launch_floor_per_op_s": floor,
            "dispatch_floor_per_op_s": dispatch, "dispatch_launch_floor_per_op_s": in_place}


def cpu_probe(workload, steps, warmup, quick):
    """In a fresh native-CPU process: one workload's row, or the tiny-op chain."""
    torch.manual_seed(0)
    if workload == "tiny_op":
        print(json.dumps(tiny_op_chain("cpu")))
    else:
        print(json.dumps(measure(workload, "cpu", steps, warmup, quick)))


def native_cpu(workload, steps, warmup, quick):
    """The workload on native CPU PyTorch under each of CPU_VARIANTS, each in a fresh
    process; returns the best variant's result, with every variant's time in it."""
    key = "per_op_s" if workload == "tiny_op" else "median_step_s"
    results = {}
    for name, env in CPU_VARIANTS.items():
        cmd = [sys.executable, os.path.abspath(__file__), "--cpu-probe", workload, "--steps", str(steps),
               "--warmup", str(warmup)] + (["--quick"] if quick else [])
        r = subprocess.run(cmd, env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", **env),
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        results[name] = json.loads(r.stdout.strip().splitlines()[-1])
    best = min(results, key=lambda k: results[k][key])
    out = dict(results[best])
    out["cpu_variant"] = best
    out["cpu_variants"] = {k: v[key] for k, v in results.items()}
    return out


def fused_step_split(steps=20, warmup=5):
    """The small GPT's fused step, each step reading its loss (as the step rows do), in
    parts (medians): the host recording the step (the optimizer step's launch left out:
    it hands both cores to the programs, so timing the host across it times them), then
    the device from the launch to the loss's value (the forward's program, the graph
    running as forward and rest), then to the end of the rest, with the host idle; and
    the whole step, timed in the same loop. The loss waits for recording and the forward;
    the rest runs while the next step records, so a step takes at least the forward plus
    the longer of recording and the rest."""
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch_tpu import _step_boundary

    torch.manual_seed(0)
    cfg = dict(vocab=256, d_model=64, n_heads=4, n_layers=2, seq=64)
    with torch_tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE):
        model = GPT(**cfg).to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = [(x.to("tpu"), y.to("tpu")) for x, y in batches(cfg["vocab"], cfg["seq"], 4, 4)]

        def step(i):
            x, y = data[i % len(data)]
            _, loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss
        for i in range(warmup):
            step(i).item()
        record, device, rest, whole = [], [], [], []
        for i in range(steps):
            t = time.perf_counter()
            step(i).item()
            whole.append(time.perf_counter() - t)
            # The same step with the launch at its end made explicit: the graph is cut at
            # the same place, so it is the same program.
            _step_boundary.handle.remove()
            try:
                torch_tpu.synchronize()
                t0 = time.perf_counter()
                loss = step(i)
                t1 = time.perf_counter()
            finally:
                _step_boundary.handle = register_optimizer_step_post_hook(_step_boundary._after_optimizer_step)
            torch_tpu._C.flush("benchmark split")
            loss.item()
            t2 = time.perf_counter()
            torch_tpu.synchronize()
            t3 = time.perf_counter()
            record.append(t1 - t0)
            device.append(t2 - t1)
            rest.append(t3 - t2)
    return {"record_s": statistics.median(record), "device_s": statistics.median(device),
            "rest_s": statistics.median(rest), "whole_s": statistics.median(whole)}


def strict_step_split(steps=20, warmup=5, top=6):
    """The small GPT's Strict step beside its floor and beside native CPU's step, all
    timed in one alternating loop (this machine's speed moves between minutes): one step's
    launches traced, then run again by the runtime alone, back to back, with no PyTorch
    above them (each launch reads the replay's own outputs and frees them after their last
    reader, as the step does), and the native step at nil sizes (PyTorch's own host work:
    Strict's launches plus it is the Strict step with nothing overlapped). Medians. Then, each launch of the trace
    waited for in turn, the programs that take the most of it."""
    torch.manual_seed(0)
    native, _, _ = small_gpt_train("cpu", False)
    host_work, _, _ = small_gpt_host_work("cpu")
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER):
        step, _, _ = small_gpt_train("tpu", False)
        for _ in range(warmup):
            native()
            host_work()
            step()
        torch.tpu.synchronize()
        torch_tpu._C._start_launch_trace()
        step()
        torch.tpu.synchronize()
        launches = torch_tpu._C._stop_launch_trace()
        try:
            cpu, whole, replay, host = [], [], [], []
            for _ in range(steps):
                t = time.perf_counter()
                native()
                cpu.append(time.perf_counter() - t)
                t = time.perf_counter()
                host_work()
                host.append(time.perf_counter() - t)
                t = time.perf_counter()
                step()
                torch.tpu.synchronize()
                whole.append(time.perf_counter() - t)
                replay.append(torch_tpu._C._replay_launch_trace(1))
            each = torch_tpu._C._replay_launch_trace_each(5)
        finally:
            torch_tpu._C._drop_launch_trace()
    by_program = {}
    for name, s in each:
        n, total = by_program.get(name, (0, 0.0))
        by_program[name] = (n + 1, total + s)
    heaviest = sorted(by_program.items(), key=lambda kv: -kv[1][1])[:top]
    return {"native_s": statistics.median(cpu), "whole_s": statistics.median(whole),
            "replay_s": statistics.median(replay), "native_nil_sizes_s": statistics.median(host),
            "launches": launches,
            "waited_launches_s": sum(s for _, s in each),
            "heaviest": [{"program": p, "launches": n, "waited_s": t} for p, (n, t) in heaviest]}


def small_gpt_side_by_side(rounds=8, block=10, warmup=5, settle_s=0.05, modes=("strict", "fused"), untimed=2):
    """Issue 18's small GPT step natively (default threads, and one thread) and on tpu in
    Strict and in DeferAndFuse, timed side by side: blocks of `block` steps that take turns,
    `rounds` times, in one process (this machine's speed moves between minutes, so steps
    timed minutes apart do not make a ratio). Each block first runs `untimed` steps (a fused
    step then overlaps the previous one's backward, as in a training loop, and OpenMP's or
    the plugin's threads are awake); a tpu block ends by waiting for its device work; after
    every block the process rests `settle_s`, so OpenMP's or the plugin's spinning threads
    do not run into the next one. Medians."""
    torch.manual_seed(0)
    native, _, _ = small_gpt_train("cpu", False)
    tpu_steps = {}
    for mode in modes:
        with torch_tpu.set_eager_mode(MODES[mode]):
            tpu_steps[mode] = small_gpt_train("tpu", False)[0]
            for _ in range(warmup):
                tpu_steps[mode]()
            torch.tpu.synchronize()
    for _ in range(warmup):
        native()
    threads = torch.get_num_threads()
    times = {"native": [], "native_1_thread": [], **{m: [] for m in modes}}
    for _ in range(rounds):
        for name, ts in times.items():
            if name.startswith("native"):
                torch.set_num_threads(1 if name == "native_1_thread" else threads)
                try:
                    for _ in range(untimed):
                        native()
                    for _ in range(block):
                        t = time.perf_counter()
                        native()
                        ts.append(time.perf_counter() - t)
                finally:
                    torch.set_num_threads(threads)
            else:
                with torch_tpu.set_eager_mode(MODES[name]):
                    for _ in range(untimed):
                        tpu_steps[name]()
                    for _ in range(block):
                        t = time.perf_counter()
                        tpu_steps[name]()
                        ts.append(time.perf_counter() - t)
                    torch.tpu.synchronize()
            time.sleep(settle_s)
    out = {f"{k}_s": statistics.median(v) for k, v in times.items()}
    out["native_best_s"] = min(out["native_s"], out["native_1_thread_s"])
    out["steps_each"] = rounds * block
    return out


def strict_with_one_thread_pools():
    """small_gpt_side_by_side for Strict in a fresh process whose XLA CPU plugin sized its
    thread pools to one thread (NPROC=1, read when the client is made; two otherwise on two
    cores): what the plugin's spinning pool threads cost a Strict step of small programs
    on this machine. (Not the default: with one thread, the GPT's Strict and fused steps
    took 1.6x and 1.9x as long, benchmarks/RESULTS.md, session 37.)"""
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--side-by-side-probe", "strict"],
                       env=dict(os.environ, NPROC="1"), capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def first_op_probe(runs=5):
    """Seconds from after `import torch` to the first tpu op's value in a fresh process
    (`torch.ones(4, device="tpu") + 1` and `.cpu()`), median of `runs` processes after one
    that warms the disk cache and the OS's file cache."""
    code = ("import time, torch\nt = time.perf_counter()\n(torch.ones(4, device='tpu') + 1).cpu()\n"
            "print(time.perf_counter() - t)")
    ts = []
    for _ in range(runs + 1):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        ts.append(float(r.stdout.strip().splitlines()[-1]))
    return {"first_op_s": statistics.median(ts[1:]), "runs_s": ts[1:]}


# ---- reporting -----------------------------------------------------------------------------

def targets(rows, starts):
    by = {(r["workload"], r["mode"]): r for r in rows}
    out = {}
    s, f = by.get(("gpt_train", "strict")), by.get(("gpt_train", "fused"))
    best = best_eager(by, "gpt_train")
    if best and f:
        out[f"gpt_train fused / best eager ({best['mode']}) throughput (>= 2.0)"] = \
            f["throughput"] / best["throughput"]
    if s and f:
        out["gpt_train fused/strict peak memory (<= 0.7)"] = f["peak_bytes"] / max(s["peak_bytes"], 1)
        out["gpt_train fused compiles per step (== 0)"] = f["compiles_per_step"]
        out["gpt_train fused executions per step (<= 4)"] = f["executions_per_step"]
    c = by.get(("gpt_train", "compiled"))
    if c:
        out["gpt_train compiled compiles per step (== 0)"] = c["compiles_per_step"]
        out["gpt_train compiled graph recompiles after the first step (== 0)"] = c["compiled_recompiles"]
        out["gpt_train compiled executions per step (<= 3)"] = c["executions_per_step"]
    if c and f:
        out["gpt_train compiled / fused throughput (>= 1.0)"] = c["throughput"] / f["throughput"]
        out["gpt_train compiled / fused peak memory (<= 1.0)"] = c["peak_bytes"] / max(f["peak_bytes"], 1)
    cold = {st["mode"]: st["cold"]["first_step_s"] for st in starts}
    if "compiled" in cold and "fused" in cold:
        # Everything the first step waits for with an empty cache: Dynamo, AOTAutograd and
        # recording the graphs (compiled), recording (fused), and compiling the programs.
        out["gpt_train compiled / fused cold first step, empty cache (<= 1.5)"] = cold["compiled"] / cold["fused"]
        warm = {st["mode"]: st["warm"] for st in starts}
        # What the cold ratio cannot go below while Dynamo and AOTAutograd trace every start:
        # the warm start compiles nothing, only loads the executables.
        w = warm["compiled"]
        out["gpt_train compiled warm first step less its loading / fused cold (floor of the line above)"] = \
            (w["first_step_s"] - w["load_s"]) / cold["fused"]
    for st in starts:
        out[f"{st['mode']}: warm/cold start speed-up (>= 10)"] = st["speedup"]
    return out


# Issue 18's reference points: the cold and warm first GPT steps of the run it was filed
# after (cold: issue 18's text; warm: benchmarks/RESULTS.md of that time). Warm may not get
# slower; this machine's runs differ by about 10 %, hence 1.1.
COLD_START_BEFORE_S = {"strict": 4.6, "fused": 2.8}
WARM_START_BEFORE_S = {"strict": 1.16, "fused": 1.12}


def issue18_targets(rows, starts, bounds, probes, quick=False, cold_conformance=None):
    """Each of issue 18's targets: name (with its bound) -> value; None where this run
    does not measure it (with --quick the GPT is smaller than the reference numbers').
    cold_conformance: benchmarks/conformance_cold.py's result, a run of its own."""
    by = {(r["workload"], r["mode"]): r for r in rows}
    out = {}
    floor = next((b for b in bounds if b.get("workload") == "gpt_train" and "floor_fused_s" in b), None)
    f = by.get(("gpt_train", "fused"))
    out["gpt_train fused step / its measured contraction floor (<= 1.15)"] = (
        f["median_step_s"] / floor["floor_fused_s"] if f and floor and floor["floor_fused_s"] > 0 else None)
    cpu = by.get(("small_gpt_train", "cpu"))
    side = probes.get("side_by_side")
    for mode, bound in (("fused", 1.0), ("strict", 1.5)):
        r = by.get(("small_gpt_train", mode))
        apart = r["median_step_s"] / cpu["median_step_s"] if r and cpu else None
        # The target's ratio is the side-by-side one where the run measured it.
        out[f"small_gpt_train {mode} step / native CPU's best step (<= {bound})"] = (
            side[f"{mode}_s"] / side["native_best_s"] if side else apart)
        out[f"small_gpt_train {mode} step / native CPU's best step, the step rows (timed apart, --steps each)"] = apart
    pools = probes.get("strict_one_thread_pools")
    out["small_gpt_train strict step with the XLA CPU plugin's thread pools at one thread (NPROC=1) / native CPU's "
        "best step, side by side in that process (what the pools' threads cost Strict here)"] = (
        pools["strict_s"] / pools["native_best_s"] if pools else None)
    tiny, tiny_cpu = probes.get("tiny_op"), probes.get("tiny_op_cpu")
    out["tiny op (x + 1, 16 floats, chain of 2000): strict / native CPU per op (<= 1.2)"] = (
        tiny["strict_per_op_s"] / tiny_cpu["per_op_s"] if tiny and tiny_cpu else None)
    out["tiny op: DeferAndFuse recording / native CPU per op (<= 0.5)"] = (
        tiny["fused_record_per_op_s"] / tiny_cpu["per_op_s"] if tiny and tiny_cpu else None)
    out["tiny op: runtime launch floor / native CPU per op (Strict's floor)"] = (
        tiny["launch_floor_per_op_s"] / tiny_cpu["per_op_s"] if tiny and tiny_cpu else None)
    out["tiny op: a PyTorch call that computes nothing (x.view(16)) / native CPU per op"] = (
        tiny_cpu["view_per_op_s"] / tiny_cpu["per_op_s"] if tiny_cpu and "view_per_op_s" in tiny_cpu else None)
    out["tiny op: PyTorch's own cost of the x + 1 call on tpu (our kernel returning a new tensor over x's storage at once) / native CPU per op (recording's floor)"] = (
        tiny["dispatch_floor_per_op_s"] / tiny_cpu["per_op_s"]
        if tiny and tiny_cpu and "dispatch_floor_per_op_s" in tiny else None)
    out["tiny op: that call with one runtime launch each, interleaved (Strict's floor in place) / native CPU per op"] = (
        tiny["dispatch_launch_floor_per_op_s"] / tiny_cpu["per_op_s"]
        if tiny and tiny_cpu and "dispatch_launch_floor_per_op_s" in tiny else None)
    split = probes.get("fused_split")
    out["small_gpt_train fused programs' device time alone / native CPU's best step (the fused floor)"] = (
        (split["device_s"] + split["rest_s"]) / cpu["median_step_s"] if split and cpu else None)
    out["small_gpt_train fused, its forward's device time + the longer of recording and the rest's device time / native CPU's best step (the floor of a step that reads its loss)"] = (
        (split["device_s"] + max(split["record_s"], split["rest_s"])) / cpu["median_step_s"]
        if split and cpu else None)
    ssplit = probes.get("strict_split")
    out["small_gpt_train strict: its launches alone, replayed by the runtime back to back / native CPU's step, both in one alternating loop (Strict's floor)"] = (
        ssplit["replay_s"] / ssplit["native_s"] if ssplit and "native_s" in ssplit else None)
    out["small_gpt_train strict: those launches replayed + the native step at nil sizes (PyTorch's own host work), Strict if none of them overlapped / native CPU's step, same loop"] = (
        (ssplit["replay_s"] + ssplit["native_nil_sizes_s"]) / ssplit["native_s"]
        if ssplit and "native_nil_sizes_s" in ssplit else None)
    out["small_gpt_train strict step / native CPU's step, in that loop"] = (
        ssplit["whole_s"] / ssplit["native_s"] if ssplit and "native_s" in ssplit else None)
    first = probes.get("first_op")
    out["first tpu op of a fresh process, seconds (<= 0.3)"] = first["first_op_s"] if first else None
    for st in (st for st in starts if st["mode"] in COLD_START_BEFORE_S):
        m = st["mode"]
        # The reference runs imported Dynamo in their process warm-up (the first tpu op
        # did then), so it is left out here as well.
        for which, before, bound in (("cold", COLD_START_BEFORE_S, "0.5"), ("warm", WARM_START_BEFORE_S, "1.1")):
            r = st[which]
            out[f"gpt_train {m} {which} first step less importing torch._dynamo / {before[m]} s before "
                f"(<= {bound})"] = (None if quick else (r["first_step_s"] - r.get("dynamo_import_s", 0.0)) / before[m])
        r = st["cold"]
        # A step that keeps every core busy (compiles run on several threads) cannot end
        # before its CPU seconds, all threads', spread over the cores: the less work it
        # does, the lower this floor, not the better it overlaps.
        out[f"gpt_train {m} cold first step's CPU seconds (all threads, less importing torch._dynamo) over its "
            f"{r.get('cores', '?')} cores / {COLD_START_BEFORE_S[m]} s before (a floor, with this much work)"] = (
            None if quick or "process_cpu_s" not in r else r["process_cpu_s"] / r["cores"] / COLD_START_BEFORE_S[m])
    full = cold_conformance and not cold_conformance.get("ops")
    out["cold full conformance run, minutes (<= 20)"] = cold_conformance["minutes"] if full else None
    out["cold full conformance run: its XLA compiles over its jobs, minutes (an estimate of its floor)"] = (
        cold_conformance["compile_minutes"] / cold_conformance["jobs"]
        if full and cold_conformance.get("compile_minutes") else None)
    out["cold full conformance run: its programs times the simplest program's compile, over its jobs, minutes "
        "(XLA's fixed cost per program, a floor)"] = (
        cold_conformance["fixed_compile_floor_minutes"]
        if full and cold_conformance.get("fixed_compile_floor_minutes") else None)
    return out


def met(name, value):
    if value is None:
        return None
    if "(>= " in name:
        return value >= float(name.split("(>= ")[1].rstrip(")"))
    if "(<= " in name:
        return value <= float(name.split("(<= ")[1].rstrip(")"))
    if "(== " in name:
        return value == float(name.split("(== ")[1].rstrip(")"))
    return None


def load_cold_conformance(out_dir):
    """The last full cold conformance run's result in out_dir, or None."""
    try:
        with open(os.path.join(out_dir, "conformance_cold.json")) as f:
            r = json.load(f)
    except (OSError, ValueError):
        return None
    return None if r.get("ops") else r


def markdown(rows, starts, checks, meta, bounds=(), issue18=None, probes=None, cold_conformance=None):
    lines = [f"# torch_tpu benchmarks ({meta['date']}, {meta['machine']})", "",
             f"Plugin: `{meta['plugin']}`; median of {meta['steps']} steps after {meta['warmup']} warm-up "
             f"steps{' (quick sizes)' if meta['quick'] else ''}.", "",
             "\"vs best eager\" is throughput over the better of Strict and Debug (marked *); "
             "\"vs strict\" over Strict alone.", "",
             "| workload | mode | throughput | median step | vs best eager | vs strict | peak device MiB | "
             "compiles/step | executions/step | first step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r["workload"], r["mode"]): r for r in rows}
    slower = []
    for r in rows:
        s = by.get((r["workload"], "strict"))
        b = best_eager(by, r["workload"])
        d = by.get((r["workload"], "debug"))
        if r["mode"] == "strict" and d and r["median_step_s"] > d["median_step_s"]:
            slower.append(f"{r['workload']} ({r['median_step_s'] / d['median_step_s']:.2f}x Debug's step)")
        rel = f"{r['throughput'] / s['throughput']:.2f}x" if s else ""
        rel_best = (f"{r['throughput'] / b['throughput']:.2f}x" + (" *" if r is b else "")) if b else ""
        peak = f"{r['peak_bytes'] / 2**20:.1f}" if "peak_bytes" in r else "-"
        cps = f"{r['compiles_per_step']:.1f}" if "compiles_per_step" in r else "-"
        eps = f"{r['executions_per_step']:.1f}" if "executions_per_step" in r else "-"
        lines.append(f"| {r['workload']} | {r['mode']} | {r['throughput']:,.0f} {r['unit']} | "
                     f"{r['median_step_s'] * 1e3:.1f} ms | {rel_best} | {rel} | {peak} | {cps} | {eps} | "
                     f"{r['first_step_s']:.2f} s |")
    if slower:
        lines += ["", "Strict slower than Debug (Debug waits for each op, Strict does not): "
                  + ", ".join(slower) + "."]
    if starts:
        lines += ["", "Start of a fresh process (time to finish its first gpt_train step, "
                  "after a one-op process warm-up), with an empty and with a warm compile cache:", "",
                  "| mode | cache | first step | of which importing torch._dynamo (PyTorch's, also on CPU: "
                  "the first optimizer imports it) | compiles | compiling | of which one-op programs | "
                  "of which fused graphs | disk-cache hits | loading them | compiled: its graphs' first calls "
                  "(Dynamo, AOTAutograd, recording, and the compiles they wait for) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for st in starts:
            for which in ("cold", "warm"):
                r = st[which]
                lines.append(f"| {st['mode']} | {which} | {r['first_step_s']:.2f} s | "
                             f"{r.get('dynamo_import_s', 0.0):.2f} s | {r['compiles']} | "
                             f"{r['compile_s']:.2f} s | {r.get('op_compiles', 0)}: {r.get('op_compile_s', 0):.2f} s | "
                             f"{r.get('graph_compiles', 0)}: {r.get('graph_compile_s', 0):.2f} s | "
                             f"{r['disk_cache_hits']} | {r['load_s']:.2f} s | "
                             + (f"{r.get('tracing_s', 0.0):.2f} s |" if st["mode"] == "compiled" else "- |"))
    split = [st for st in starts if st["mode"] == "compiled" and "aot_s" in st["cold"]]
    if split:
        lines += ["", "Compiled mode's first step, split. PyTorch's part: importing Dynamo, Dynamo's bytecode "
                  "tracing and guards, AOTAutograd (joint trace, decompositions, partition); ours: recording "
                  "each graph's first call, and compiling the programs (on the launcher thread, overlapping the "
                  "Python side). A warm cache compiles nothing, so the warm first step is the floor PyTorch's "
                  "tracing (plus one step) puts under the cold target:", "",
                  "| cache | first step | import Dynamo | Dynamo tracing | AOTAutograd | recording (ours) | "
                  "XLA compile (ours) | loading executables |",
                  "|---|---|---|---|---|---|---|---|"]
        for which in ("cold", "warm"):
            r = split[0][which]
            lines.append(f"| {which} | {r['first_step_s']:.2f} s | {r['dynamo_import_s']:.2f} s | "
                         f"{r['dynamo_s']:.2f} s | {r['aot_s']:.2f} s | {r['record_s']:.2f} s | "
                         f"{r.get('graph_compile_s', 0.0):.2f} s | {r['load_s']:.2f} s |")
    if bounds:
        lines += ["", "Measured floors. A step's contractions (matmuls, convolutions, attention kernels), "
                  "recorded from one step, run alone with the same layouts as a program of their own, timed as "
                  "the step is (median of the same steps after the same warm-up, ending with a value read back), "
                  "in Strict and in DeferAndFuse. Fusion removes the work around them, not theirs, so a fused "
                  "step cannot beat its fused floor and fused / best eager cannot exceed the best eager step over "
                  "the fused floor (a measured bound, as noisy as the steps: about 10 % here). A warm first step "
                  "still computes a step, so warm/cold cannot exceed the cold first step over a steady step:", "",
                  "| workload | contractions | floor strict | floor fused (executions) | strict step / floor | "
                  "fused step / floor | best eager step | ceiling |", "|---|---|---|---|---|---|---|---|"]
        for b in bounds:
            if "fused_over_best_eager_ceiling" in b:
                ratio = {m: f"{b[m + '_step_over_floor']:.2f}x" if m + "_step_over_floor" in b else "-"
                         for m in ("strict", "fused")}
                lines.append(f"| {b['workload']} | {b['contraction_calls']} calls | {b['floor_strict_s'] * 1e3:.1f} ms | "
                             f"{b['floor_fused_s'] * 1e3:.1f} ms ({b['floor_fused_executions_per_step']:.0f}) | "
                             f"{ratio['strict']} | {ratio['fused']} | {b['best_eager_step_s'] * 1e3:.1f} ms "
                             f"({b['best_eager_mode']}) | fused/best eager <= "
                             f"{b['fused_over_best_eager_ceiling']:.2f}x |")
            else:
                lines.append(f"| {b['workload']} ({b['mode']}) | - | - | - | - | - | cold first step {b['cold_s']:.2f} s, "
                             f"steady step {b['steady_step_s'] * 1e3:.1f} ms | warm/cold <= "
                             f"{b['warm_over_cold_ceiling']:.2f}x |")
    cpu_rows = [r for r in rows if r["mode"] == "cpu" and "cpu_variants" in r]
    if cpu_rows or (probes or {}).get("tiny_op_cpu"):
        lines += ["", "Native CPU PyTorch, each variant in a fresh process (the cpu rows above are the best):", "",
                  "| workload | " + " | ".join(CPU_VARIANTS) + " | best |", "|---|" + "---|" * (len(CPU_VARIANTS) + 1)]
        for r in cpu_rows:
            lines.append(f"| {r['workload']} (step) | " + " | ".join(
                f"{r['cpu_variants'][k] * 1e3:.1f} ms" for k in CPU_VARIANTS) + f" | {r['cpu_variant']} |")
        t = (probes or {}).get("tiny_op_cpu")
        if t:
            lines.append("| tiny op (per op) | " + " | ".join(
                f"{t['cpu_variants'][k] * 1e6:.2f} us" for k in CPU_VARIANTS) + f" | {t['cpu_variant']} |")
    if probes and probes.get("tiny_op"):
        t = probes["tiny_op"]
        lines += ["", f"Tiny op chain on tpu: Strict {t['strict_per_op_s'] * 1e6:.2f} us per op, DeferAndFuse "
                  f"recording {t['fused_record_per_op_s'] * 1e6:.2f} us per op; the runtime's launch of the same "
                  f"chain with no PyTorch above it (Strict's floor) {t['launch_floor_per_op_s'] * 1e6:.2f} us per op"
                  + (f"; PyTorch's own cost of each `x + 1` call, our kernel handing back x at once (recording's "
                     f"floor), {t['dispatch_floor_per_op_s'] * 1e6:.2f} us per op" if "dispatch_floor_per_op_s" in t else "")
                  + (f"; that call with one chained launch by the runtime alone each, interleaved (Strict's floor "
                     f"in place), {t['dispatch_launch_floor_per_op_s'] * 1e6:.2f} us per op"
                     if "dispatch_launch_floor_per_op_s" in t else "")
                  + "."]
    if probes and probes.get("fused_split"):
        t = probes["fused_split"]
        lines += ["", f"Small GPT fused step, split (each step reads its loss): the host records it in "
                  f"{t['record_s'] * 1e3:.2f} ms; its programs then run {t['device_s'] * 1e3:.2f} ms from the "
                  f"launch to the loss's value (the forward) and {t['rest_s'] * 1e3:.2f} ms more to their end "
                  f"(backward and update, which a step overlaps with the next one's recording), with the host "
                  f"idle; the whole step, timed in the same loop, {t['whole_s'] * 1e3:.2f} ms (medians)."]
    if probes and probes.get("strict_split"):
        t = probes["strict_split"]
        lines += ["", f"Small GPT Strict step, split, in one alternating loop: native CPU's step (default threads) "
                  f"{t['native_s'] * 1e3:.2f} ms; the Strict step {t['whole_s'] * 1e3:.2f} ms; its {t['launches']} "
                  f"launches, replayed by the runtime alone (no PyTorch), {t['replay_s'] * 1e3:.2f} ms; "
                  + (f"the native step at nil sizes (d_model 4, seq 2, batch 1: PyTorch's own host work) "
                     f"{t['native_nil_sizes_s'] * 1e3:.2f} ms " if "native_nil_sizes_s" in t else "")
                  + f"(medians). Launched one at a time, each waited for "
                  f"({t['waited_launches_s'] * 1e3:.2f} ms in all), the programs that take the most: " + "; ".join(
                      f"{h['program'].split('(')[0]} x{h['launches']} {h['waited_s'] * 1e3:.2f} ms"
                      for h in t["heaviest"]) + "."]
    if probes and probes.get("side_by_side"):
        t = probes["side_by_side"]
        lines += ["", f"Small GPT side by side, one process, blocks of steps taking turns ({t['steps_each']} steps "
                  f"each): native CPU {t['native_s'] * 1e3:.2f} ms (default threads), {t['native_1_thread_s'] * 1e3:.2f} "
                  f"ms (one thread); Strict {t['strict_s'] * 1e3:.2f} ms; DeferAndFuse {t['fused_s'] * 1e3:.2f} ms "
                  f"(medians). The small GPT's targets are these over native's best."]
        p = probes.get("strict_one_thread_pools")
        if p:
            lines[-1] += (f" In a process whose XLA CPU plugin has one-thread pools (NPROC=1), timed the same way: "
                          f"native {p['native_best_s'] * 1e3:.2f} ms at best, Strict {p['strict_s'] * 1e3:.2f} ms.")
    if probes and probes.get("first_op"):
        lines += ["", "First tpu op of a fresh process, per process: " + ", ".join(
            f"{x:.3f} s" for x in probes["first_op"]["runs_s"]) + "."]
    if checks:
        lines += ["", "| target | value | met |", "|---|---|---|"]
        for k, v in checks.items():
            lines.append(f"| {k} | {v:.3f} | {'yes' if met(k, v) else 'NO'} |")
    if issue18:
        lines += ["", "Issue 18's targets:", "", "| target | value | met |", "|---|---|---|"]
        for k, v in issue18.items():
            if v is None:
                lines.append(f"| {k} | not measured by this run (skipped, or --quick sizes) | - |")
            else:
                ok = met(k, v)  # None: a floor reported beside the targets, not a target
                lines.append(f"| {k} | {v:.3f} | {'-' if ok is None else 'yes' if ok else 'NO'} |")
        if cold_conformance:
            c = cold_conformance
            lines += ["", f"The cold conformance run is benchmarks/conformance_cold.py's ({c['date']}, commit "
                      f"{c['commit']}, {c['machine']}, {c['jobs']} jobs): {c['entries']} entries, "
                      f"{c['fwd_value_verified_native']} forwards value-verified natively, "
                      f"{c['cache_files_written']} cache files written from empty."]
            if c.get("slowest_entries"):
                lines[-1] += (f" Entries took {c['entry_minutes']:.1f} min in all, {c['compile_minutes']:.1f} of "
                              "them compiling; the slowest: " + ", ".join(
                                  f"{k} {s:.0f} s ({cs:.0f} s compiling)" for k, s, cs in c["slowest_entries"][:8]) + ".")
    return "\n".join(lines) + "\n"


def chart(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    by = {(r["workload"], r["mode"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        vals = []
        for w in workloads:
            s, r = by.get((w, "strict")), by.get((w, mode))
            vals.append(r["throughput"] / s["throughput"] if r and s else 0)
        ax.bar([j + i * width for j in range(len(workloads))], vals, width, label=mode)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(workloads))], workloads)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_ylabel("throughput relative to Strict")
    ax.set_title("torch_tpu eager modes vs native CPU PyTorch")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smaller models (a smoke run)")
    ap.add_argument("--no-start", action="store_true", help="skip the cold/warm start measurement")
    ap.add_argument("--start-modes", default="strict,fused,compiled", help="modes of the cold/warm start")
    ap.add_argument("--no-ceilings", action="store_true", help="skip the measured contraction floors")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--no-probes", action="store_true", help="skip the tiny-op and first-op probes")
    ap.add_argument("--start-probe", help=argparse.SUPPRESS)
    ap.add_argument("--cpu-probe", help=argparse.SUPPRESS)
    ap.add_argument("--probe-mode", default="fused", help=argparse.SUPPRESS)
    ap.add_argument("--side-by-side-probe", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.cpu_probe:
        cpu_probe(a.cpu_probe, a.steps, a.warmup, a.quick)
        return
    if a.start_probe:
        start_probe(a.start_probe, a.probe_mode, a.quick)
        return
    if a.side_by_side_probe:
        print(json.dumps(small_gpt_side_by_side(modes=tuple(a.side_by_side_probe.split(",")))))
        return
    rows = []
    for w in a.workloads.split(","):
        for mode in a.modes.split(","):
            print(f"{w:12s} {mode:7s} ...", end=" ", flush=True)
            if mode == "cpu":
                r = native_cpu(w, a.steps, a.warmup, a.quick)
            else:
                r = measure(w, mode, a.steps, a.warmup, a.quick)
            rows.append(r)
            print(f"{r['throughput']:,.0f} {r['unit']}  median {r['median_step_s'] * 1e3:.1f} ms"
                  + (f"  peak {r['peak_bytes'] / 2**20:.1f} MiB  exec/step {r['executions_per_step']:.1f}"
                     if "peak_bytes" in r else ""), flush=True)
    starts = [] if a.no_start else [cold_vs_warm("gpt_train", m, a.quick) for m in a.start_modes.split(",")]
    probes = {}
    if not a.no_probes:
        probes["tiny_op_cpu"] = native_cpu("tiny_op", a.steps, a.warmup, a.quick)
        probes["tiny_op"] = tiny_op_chain("tpu")
        probes["first_op"] = first_op_probe()
        probes["fused_split"] = fused_step_split()
        probes["strict_split"] = strict_step_split()
        probes["side_by_side"] = small_gpt_side_by_side()
        probes["strict_one_thread_pools"] = strict_with_one_thread_pools()
    checks = targets(rows, starts)
    bounds = [] if a.no_ceilings else ceilings(rows, starts, a.quick, a.steps, a.warmup)
    cold_conformance = load_cold_conformance(a.out)
    issue18 = issue18_targets(rows, starts, bounds, probes, a.quick, cold_conformance)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.cpu_count()} CPUs",
            "plugin": torch_tpu._C.plugin_path(), "steps": a.steps, "warmup": a.warmup, "quick": a.quick,
            "torch": torch.__version__}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "start": starts, "ceilings": bounds, "probes": probes,
                   "targets": {k: {"value": v, "met": met(k, v)} for k, v in checks.items()},
                   "issue18_targets": {k: {"value": v, "met": met(k, v)} for k, v in issue18.items()}},
                  f, indent=1)
    md = markdown(rows, starts, checks, meta, bounds, issue18, probes, cold_conformance)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(md)
    chart(rows, os.path.join(a.out, "results.png"))
    print()
    print(md)


if __name__ == "__main__":
    main()
