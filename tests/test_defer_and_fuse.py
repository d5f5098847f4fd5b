"""DeferAndFuse: ops are recorded as promises and run as one fused program when a value
is needed; results equal Strict's."""
import functools
import io
import os
import re
import sys
import warnings

import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode
from conftest import ROOT, no_fallbacks, run_python, run_python_json

sys.path.insert(0, os.path.join(ROOT, "examples"))
from gpt import GPT, batches  # noqa: E402

FUSED = EagerMode.DEFER_AND_FUSE


def m():
    return torch_tpu.metrics()


def test_ops_are_deferred_until_a_value_is_needed():
    a = torch.randn(64, 64)
    x = a.to("tpu")
    torch.tpu.synchronize()
    with torch_tpu.set_eager_mode(FUSED):
        m0 = m()
        y = ((x * 2 + 1).relu() @ x).softmax(-1)
        assert not torch_tpu._C.is_materialized(y)
        assert m()["executions"] == m0["executions"]      # nothing ran yet
        got = y.cpu()
        m1 = m()
    torch.testing.assert_close(got, ((a * 2 + 1).relu() @ a).softmax(-1))
    assert m1["executions"] - m0["executions"] == 1     # one fused program
    assert m1["deferred_ops"] - m0["deferred_ops"] == 5
    assert m1["elided_intermediates"] - m0["elided_intermediates"] >= 4  # never materialized


def test_python_scalars_that_happen_to_be_equal_reuse_the_fused_program():
    # Equal scalars shared one cached buffer, which changed the graph's wiring: an AdamW
    # step compiled again once 1 - lr * wd rounded to 1.0 (found by the s46 soak probe).
    x = torch.arange(8.0).to("tpu")
    with torch_tpu.set_eager_mode(FUSED):
        def step(a, b, c, d):
            return ((x * a + b) * c + d).sum().item()
        step(0.11, 0.22, 0.33, 0.44)
        before = m()["compiles"]
        for a, b, c, d in [(0.5, 0.5, 0.5, 0.5), (0.5, 0.75, 0.5, 0.75), (0.75, 0.75, 0.5, 0.5), (0.3, 0.7, 0.9, 0.1)]:
            assert step(a, b, c, d) == pytest.approx(((torch.arange(8.0) * a + b) * c + d).sum().item())
        assert m()["compiles"] == before


@pytest.mark.parametrize("trigger", ["item", "cpu", "tolist", "numpy", "print", "save",
                                     "control_flow", "synchronize", "memory_query", "mode_switch"])
def test_materialization_points(trigger):
    with torch_tpu.set_eager_mode(FUSED):
        x = torch.arange(6.0, device="tpu").reshape(2, 3) * 3
        assert not torch_tpu._C.is_materialized(x)
        if trigger == "item":
            assert x.sum().item() == 45.0
        elif trigger == "cpu":
            assert x.cpu()[1, 2].item() == 15.0
        elif trigger == "tolist":
            assert x.tolist() == [[0.0, 3.0, 6.0], [9.0, 12.0, 15.0]]
        elif trigger == "numpy":
            assert x.cpu().numpy()[0, 1] == 3.0
        elif trigger == "print":
            assert "15." in repr(x)
        elif trigger == "save":
            buf = io.BytesIO()
            torch.save(x, buf)
            buf.seek(0)
            assert torch.load(buf, map_location="cpu")[1, 0].item() == 9.0
        elif trigger == "control_flow":
            assert bool((x > 14).any())
        elif trigger == "synchronize":
            torch_tpu.synchronize()
        elif trigger == "memory_query":
            torch.tpu.memory_allocated()
        if trigger == "mode_switch":
            with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER):
                pass
        assert torch_tpu._C.is_materialized(x)


def expert_loop(route, x, w):
    """A mixture-of-experts loop written as DBRX's and LongCat-Flash's are: the host reads
    each hit expert's index (item()) and its tokens (torch.where), both computed before
    the loop, while each expert's work is recorded."""
    mask = torch.nn.functional.one_hot(route, w.shape[0]).T
    hit = (mask.sum(1) > 0).nonzero()
    out = torch.zeros_like(x)
    for e in hit:
        e = e[0]
        (tokens,) = torch.where(mask[e])
        out.index_add_(0, tokens, x[tokens] @ w[e])
    return hit, out


def test_reads_of_computed_values_do_not_cut_the_pending_graph():
    g = torch.Generator().manual_seed(0)
    route, x, w = torch.randint(0, 5, (40,), generator=g), torch.randn(40, 8, generator=g), torch.randn(5, 8, 8, generator=g)
    route[route == 3] = 4  # an expert no token picks
    want_hit, want = expert_loop(route, x, w)
    with torch_tpu.set_eager_mode(FUSED):
        hit, _ = expert_loop(*(t.to("tpu") for t in (route, x, w)))  # compiles the read programs
        r, xt, wt = (t.to("tpu") for t in (route, x, w))
        torch.tpu.synchronize()
        m0 = m()
        hit, out = expert_loop(r, xt, wt)
        m1 = m()
        # Only `hit` read a pending value (the mask's count): one cut. Each expert's
        # index and tokens were read from computed values without cutting again.
        assert m1["fused_graphs"] - m0["fused_graphs"] == 1
        assert m1["flushes"]["value needed"] - m0["flushes"]["value needed"] == 1
        assert len(hit) == 4 and not torch_tpu._C.is_materialized(out)
        got = out.cpu()  # the four experts' work: one graph
        m2 = m()
    assert m2["fused_graphs"] - m1["fused_graphs"] == 1
    torch.testing.assert_close(got, want)
    # A read of a pending value still runs the graph before it (the values it needs).
    with torch_tpu.set_eager_mode(FUSED):
        y = xt * 2
        m3 = m()
        assert y[3, 1].item() == (x[3, 1] * 2).item()
        assert m()["flushes"]["value needed"] - m3["flushes"]["value needed"] == 1
        assert torch_tpu._C.is_materialized(y)
    # A failed check (an index out of range) of work still pending is raised by the read
    # that runs that work, not by a read of other, computed values; all stays usable.
    with torch_tpu.set_eager_mode(FUSED):
        bad = xt.index_select(0, torch.tensor([0, 99], device="tpu"))
        assert hit[1, 0].item() == want_hit[1, 0].item()
        with pytest.raises(IndexError):
            bad.cpu()
        assert xt[2, 3].item() == x[2, 3].item()


def test_fallback_op_materializes_its_inputs_and_results_stay_right():
    # An op without a native rule (ldl_factor: LAPACK's Bunch-Kaufman) runs on the CPU:
    # pending inputs are produced first, and its results join later graphs.
    a = torch.randn(5, 5)
    a = a @ a.T
    with torch_tpu.set_eager_mode(FUSED):
        before = sum(m()["fallbacks"].values())
        x = a.to("tpu") + 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fallback's once-per-op warning
            ld, piv = torch.linalg.ldl_factor(x)
        out = (ld * 2).cpu()
        assert sum(m()["fallbacks"].values()) > before
    torch.testing.assert_close(out, torch.linalg.ldl_factor(a + 1)[0] * 2, rtol=1e-4, atol=1e-4)


def test_a_cut_between_backward_and_step_gives_strict_gradients():
    """A flush between backward() and opt.step() (any .item() there) splits each step into
    two graphs, the second donating the parameters' old buffers. The same with donation
    on: tests/test_donation.py. Both modes also match a float64 CPU run."""
    def grads(mode, device="tpu", dtype=torch.float32):
        torch.manual_seed(0)
        model = GPT(vocab=64, d_model=128, n_heads=4, n_layers=4, seq=64).to(device, dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
        with torch_tpu.set_eager_mode(mode):
            for x, y in batches(64, 64, 8, 2):
                loss = model(x.to(device), y.to(device))[1]
                opt.zero_grad()
                loss.backward()
                torch_tpu.synchronize()
                opt.step()
        return [p.grad.cpu() for p in model.parameters()]
    strict = grads(EagerMode.DEFER_NEVER)
    for got, want in zip(grads(FUSED), strict):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    for got, want in zip(strict, grads(EagerMode.DEFER_NEVER, "cpu", torch.float64)):
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=2e-5)


def test_graph_size_bound_cuts_long_recordings():
    r = run_python(
        "import torch, torch_tpu\n"
        "torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)\n"
        "x = torch.zeros(4, device='tpu')\n"
        "for _ in range(50): x = x + 1\n"
        "print(x.sum().item(), torch_tpu.metrics()['flushes'])\n",
        env={"TPU_FUSE_MAX_OPS": "16"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("200.0")
    assert "'graph size bound': 3" in r.stdout


def test_bounded_graphs_align_with_a_loop_body_and_repeat():
    # A loop with no materialization point: the size bound cuts it where the graph's
    # first op recurs, so every graph is whole loop bodies and compiles once.
    r = run_python(
        "import torch, torch_tpu\n"
        "torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)\n"
        "x = torch.ones(8, device='tpu')\n"
        "c = []\n"
        "for i in range(60):\n"
        "    x = (x * 0.5 + 1).tanh().sin()\n"       # a 4-op body
        "    c.append(torch_tpu.metrics()['compiles'])\n"
        "ref = torch.ones(8)\n"
        "for i in range(60): ref = (ref * 0.5 + 1).tanh().sin()\n"
        "print(torch.allclose(x.cpu(), ref), c[-1] - c[20], torch_tpu.metrics()['flushes'])\n",
        env={"TPU_FUSE_MAX_OPS": "18"})
    assert r.returncode == 0, r.stderr
    ok, late_compiles, _ = r.stdout.split(" ", 2)
    assert ok == "True"
    assert late_compiles == "0"   # the same 4-body (16-op) graph from then on


def test_a_long_chain_of_cheap_ops_is_cut_and_its_graphs_repeat():
    # 3,000 elementwise updates with no read: XLA fuses a chain into one kernel, whose
    # compile grows much faster than the chain (a 4,096-op graph took about 150 s). The
    # chain bound cuts it into graphs that repeat: a few compiles, values as on the CPU.
    r = run_python(
        "import torch, torch_tpu\n"
        "torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)\n"
        "x, ref = torch.zeros(8, device='tpu'), torch.zeros(8)\n"
        "for i in range(1500):\n"
        "    x = x * 1.0001 + 1\n"
        "    ref = ref * 1.0001 + 1\n"
        "m = torch_tpu.metrics()\n"
        "print(torch.allclose(x.cpu(), ref, rtol=1e-5), m['graph_compiles'], m['flushes'])\n",
        env={"TPU_COMPILE_CACHE": "0"})
    assert r.returncode == 0, r.stderr
    ok, compiles, flushes = r.stdout.split(" ", 2)
    assert ok == "True"
    assert int(compiles) <= 3, r.stdout
    cuts = re.search(r"'cheap chain bound': (\d+)", flushes)
    assert cuts and int(cuts.group(1)) >= 10, flushes  # 3,000 ops, at most 256 a graph


DECODE_LOOP = (
    "import torch, torch_tpu\n"
    "torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)\n"
    "def run(dev):\n"
    "    torch.manual_seed(0)\n"
    "    w = [torch.randn(16, 16).to(dev) / 4 for _ in range(8)]\n"
    "    h = torch.randn(1, 16).to(dev)\n"
    "    kv, out = h.clone(), []\n"
    "    for step in range(14):\n"
    "        for i, wi in enumerate(w):\n"
    "            h = torch.tanh(h @ wi + i) * 0.9 + h * 0.1\n"   # shapes that stay
    "        kv = torch.cat([kv, h])\n"                            # one more row per step
    "        h = h + torch.softmax(h @ kv.T, -1) @ kv\n"
    "        out.append(h.sum().item())\n"
    "    return out\n"
    "ref, got = run('cpu'), run('tpu')\n"
    "m = torch_tpu.metrics()\n"
    "print(max(abs(a - b) for a, b in zip(ref, got)), m['fused_graphs_run_op_by_op'], m['graph_compiles'])\n")


def test_a_graph_whose_shapes_grow_each_step_runs_op_by_op():
    # A decode loop: every step is the same ops with one more row in a few of them, so
    # every step's graph is new. Once two of them compiled, the steps run op by op: the
    # ops that keep their shapes reuse their programs and only the growing ones compile.
    r = run_python(DECODE_LOOP, env={"TPU_COMPILE_CACHE": "0"})
    assert r.returncode == 0, r.stderr
    err, op_by_op, graph_compiles = r.stdout.split()
    assert float(err) < 1e-4
    assert int(op_by_op) >= 8        # of 14 steps
    assert int(graph_compiles) <= 6  # each step compiled a graph before


MOE_LOOP = (
    "import torch, torch_tpu\n"
    "from torch_tpu import EagerMode\n"
    "def run(dev, mode=EagerMode.DEFER_NEVER, steps=14):\n"
    "    torch.manual_seed(0)\n"
    "    g = torch.Generator().manual_seed(1)\n"
    "    losses, per_step = [], []\n"
    "    with torch_tpu.set_eager_mode(mode):\n"
    "        gate = (torch.randn(8, 4) / 2).to(dev).requires_grad_()\n"
    "        ws = [(torch.randn(8, 8) / 3).to(dev).requires_grad_() for _ in range(4)]\n"
    "        for step in range(steps):\n"
    "            m0 = torch_tpu.metrics()\n"
    "            x = torch.randn(32, 8, generator=g).to(dev)\n"
    "            w, idx = torch.softmax(x @ gate, -1).max(-1)\n"              # the router
    "            order = torch.argsort(idx, stable=True)\n"
    "            counts = torch.bincount(idx, minlength=4).tolist()\n"        # tokens per expert
    "            outs = [torch.tanh(c @ we) for c, we in zip(torch.split(x[order], counts), ws)]\n"
    "            loss = (torch.cat(outs) * w[order, None] - 0.5).pow(2).mean()\n"
    "            loss.backward()\n"
    "            with torch.no_grad():\n"
    "                for p in [gate] + ws:\n"
    "                    p -= 0.5 * p.grad\n"
    "                    p.grad = None\n"
    "            losses.append(loss.item())\n"
    "            m1 = torch_tpu.metrics()\n"
    "            per_step.append([counts] + [m1[k] - m0[k] for k in ('graph_compiles', 'fused_graphs_run_op_by_op')])\n"
    "    return losses + [p.detach().cpu() for p in [gate] + ws], per_step\n"
    "ref, _ = run('cpu')\n"
    "strict, _ = run('tpu')\n"
    "fused, per_step = run('tpu', EagerMode.DEFER_AND_FUSE)\n"
    "err = lambda a, b: max(float((torch.as_tensor(x) - torch.as_tensor(y)).abs().max()) for x, y in zip(a, b))\n"
    "print(json.dumps({'cpu': err(ref, fused), 'strict': err(strict, fused), 'steps': per_step}))\n")


def test_a_training_step_whose_expert_sizes_change_each_step_runs_op_by_op():
    # A mixture of experts: each step splits its tokens among the experts by the router's
    # counts, so every step's graph (forward and backward) has new shapes, while each
    # expert's per-size programs recur from step to step. Once a few variants compiled,
    # the steps run op by op and stop compiling graphs (each compiled two, its forward
    # and the rest, every step before: the split graph skipped the shape-churn choice).
    r = run_python_json("import json\n" + MOE_LOOP, env={"TPU_COMPILE_CACHE": "0"})
    steps = r["steps"]
    assert r["cpu"] < 1e-5 and r["strict"] < 1e-5, r
    assert all(a[0] != b[0] for a, b in zip(steps, steps[1:])), steps  # new sizes each step
    late = steps[-6:]
    assert sum(s[1] for s in late) == 0, steps       # no graph compiles once settled
    assert sum(s[2] for s in late) == len(late), steps  # each step ran op by op
    assert sum(s[1] for s in steps) <= 12, steps     # 2 a step (28 in all) before


CYCLING = (
    "import json, torch, torch_tpu\n"
    "from torch_tpu import EagerMode\n"
    "torch.manual_seed(0)\n"
    "w = (torch.randn(16, 16) / 4).to('tpu').requires_grad_()\n"
    "per_step = []\n"
    "with torch_tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE):\n"
    "    for cycle in range(4):\n"
    "        for n in (6, 10, 14, 18):\n"  # bucketed lengths, in turn
    "            m0 = torch_tpu.metrics()\n"
    "            h = torch.ones(8, 16, device='tpu')\n"  # most of the step keeps its shapes
    "            for _ in range(8):\n"
    "                h = torch.tanh(h @ w + 0.1)\n"
    "            x = torch.randn(n, 16).to('tpu')\n"  # a small part takes the bucket's length
    "            loss = h.pow(2).mean() + (x @ w).pow(2).mean()\n"
    "            loss.backward()\n"
    "            with torch.no_grad():\n"
    "                w -= 0.1 * w.grad\n"
    "                w.grad = None\n"
    "            loss.item()\n"
    "            m1 = torch_tpu.metrics()\n"
    "            per_step.append([m1[k] - m0[k] for k in ('graph_compiles', 'fused_graphs_run_op_by_op')])\n"
    "print(json.dumps(per_step))\n")


def test_shapes_that_come_back_compile_and_then_run_fused():
    # Bucketed lengths cycle: once two variants compiled, a new one may run op by op, but a
    # variant that comes back compiles its graph, so the later cycles run fused programs
    # from the graph cache (a variant run op by op for good would stay slower).
    steps = run_python_json(CYCLING, env={"TPU_COMPILE_CACHE": "0"})
    assert sum(s[1] for s in steps) >= 1, steps  # new variants ran op by op (the case in question)
    last = steps[-4:]
    assert all(s == [0, 0] for s in last), steps


GROWING = (
    "import json, torch, torch_tpu\n"
    "from torch_tpu import EagerMode\n"
    "torch.manual_seed(0)\n"
    "w = (torch.randn(16, 16) / 4).to('tpu')\n"
    "per_pass = []\n"
    "with torch_tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE):\n"
    "    for rep in range(3):\n"  # generate() called again: the same lengths once each
    "        m0 = torch_tpu.metrics()\n"
    "        ctx = torch.ones(2, 16, device='tpu')\n"
    "        for n in range(3, 15):\n"  # one more token a step
    "            h = torch.ones(8, 16, device='tpu')\n"  # most of the step keeps its shapes
    "            for _ in range(8):\n"
    "                h = torch.tanh(h @ w + 0.1)\n"
    "            nxt = (h[-1:] + (ctx @ w).mean(0)).sigmoid()\n"
    "            ctx = torch.cat([ctx, nxt])\n"
    "            float(nxt.sum())\n"  # the next token is read back
    "        m1 = torch_tpu.metrics()\n"
    "        per_pass.append([m1[k] - m0[k] for k in ('graph_compiles', 'fused_graphs_run_op_by_op')])\n"
    "print(json.dumps(per_pass))\n")


def test_a_decode_loop_run_again_does_not_compile_a_graph_per_length():
    # Each length comes back once per pass (a generate() called again): its one-op programs
    # are loaded, so it keeps running op by op; it compiled one graph per length before.
    passes = run_python_json(GROWING, env={"TPU_COMPILE_CACHE": "0"})
    assert passes[0][1] >= 8, passes  # the lengths ran op by op (the case in question)
    assert [p[0] for p in passes[1:]] == [0, 0], passes


def train(mode, steps=6):
    torch.manual_seed(0)
    data = list(batches(vocab=64, seq=32, batch=8, steps=steps))
    with torch_tpu.set_eager_mode(mode):
        model = GPT(vocab=64, d_model=64, n_heads=4, n_layers=2, seq=32, dropout=0.1).to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses, execs, compiles = [], [], []
        for x, y in data:
            e0, c0 = m()["executions"], m()["compiles"]
            _, loss = model(x.to("tpu"), y.to("tpu"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            execs.append(m()["executions"] - e0)
            compiles.append(m()["compiles"] - c0)
    return losses, execs, compiles


def test_training_matches_strict_with_few_executions_and_no_recompiles():
    # Dropout draws random bits: the streams must match across modes too.
    ref, _, _ = train(EagerMode.DEFER_NEVER)
    with no_fallbacks():
        got, execs, compiles = train(FUSED)
    assert max(abs(a - b) for a, b in zip(ref, got)) < 1e-4, (ref, got)
    assert all(e <= 4 for e in execs[2:]), execs
    assert compiles[3:] == [0] * (len(compiles) - 3), compiles
    assert m()["flushes"].get("optimizer step", 0) >= len(got)


def test_optimizer_steps_inside_the_backward_cut_the_graph_once_at_its_end():
    # Optimizer in backward (a per-parameter step from each gradient hook): the training
    # step ends with the backward, so its graph is cut there once, not at each parameter's
    # step (which ran one fused graph per parameter).
    def run(mode):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Linear(24, 12),
                                    torch.nn.LayerNorm(12), torch.nn.Linear(12, 3)).to("tpu")
        opts = {p: torch.optim.AdamW([p], lr=1e-2) for p in model.parameters()}

        def hook(p):
            opts[p].step()
            opts[p].zero_grad()
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(hook)
        x, y = torch.randn(16, 12).to("tpu"), torch.randint(0, 3, (16,)).to("tpu")
        losses, graphs = [], []
        with torch_tpu.set_eager_mode(mode):
            for _ in range(4):
                g0 = m()["fused_graphs"]
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                losses.append(loss.item())
                graphs.append(m()["fused_graphs"] - g0)
        return losses, graphs, [p.detach().cpu() for p in model.parameters()]

    ref, _, ref_params = run(EagerMode.DEFER_NEVER)
    got, graphs, params = run(FUSED)
    assert max(abs(a - b) for a, b in zip(ref, got)) < 1e-5, (ref, got)
    torch.testing.assert_close(params, ref_params, rtol=1e-5, atol=1e-6)
    assert max(graphs[1:]) <= 3, graphs  # forward, backward with every update, the loss read (was 9+)


REMAT_PROBE = (
    "import sys, torch, torch_tpu\n"
    "sys.path.insert(0, 'examples')\n"
    "from gpt import GPT, batches\n"
    "torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)\n"
    "torch.manual_seed(0)\n"
    "model = GPT(vocab=64, d_model=64, n_heads=4, n_layers=4, seq=64).to('tpu')\n"
    "opt = torch.optim.AdamW(model.parameters(), lr=1e-2)\n"
    "losses = []\n"
    "for i, (x, y) in enumerate(batches(vocab=64, seq=64, batch=8, steps=4)):\n"
    "    if i == 2: torch.tpu.reset_peak_memory_stats()\n"
    "    _, loss = model(x.to('tpu'), y.to('tpu'))\n"
    "    opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())\n"
    "m = torch_tpu.metrics()\n"
    "print(torch.tpu.max_memory_allocated(), m['recomputed_values'], sum(m['fallbacks'].values()), *losses)\n")


@functools.lru_cache(maxsize=None)  # each policy's run serves every test that asks for it
def remat_probe(policy):
    """(peak bytes, recomputed values, losses, stderr) of REMAT_PROBE under a policy."""
    r = run_python(REMAT_PROBE, env={"TPU_FUSE_REMAT": policy, "TPU_COMPILE_CACHE": "0"})
    assert r.returncode == 0, r.stderr
    peak, recomputed, fallbacks, *losses = r.stdout.split()
    assert fallbacks == "0"
    return int(peak), int(recomputed), [float(v) for v in losses], r.stderr


@pytest.mark.parametrize("policy", ["cheap", "matmul"])
def test_recomputation_lowers_the_peak_and_keeps_the_losses(policy):
    # Peak memory here is XLA's buffer assignment for the step's program: deterministic.
    off_peak, off_recomputed, off_losses, _ = remat_probe("off")
    peak, recomputed, losses, _ = remat_probe(policy)
    assert off_recomputed == 0 and recomputed > 0
    assert peak < off_peak * (0.9 if policy == "cheap" else 0.75), (peak, off_peak)
    assert max(abs(a - b) for a, b in zip(losses, off_losses)) < 1e-5, (losses, off_losses)


def test_unknown_recomputation_policy_warns_and_uses_the_default():
    peak, recomputed, losses, err = remat_probe("sometimes")
    assert "TPU_FUSE_REMAT=sometimes is not one of off, cheap, matmul: using matmul" in err
    assert (peak, recomputed, losses) == remat_probe("matmul")[:3]


def test_failed_graph_is_replayed_op_by_op_and_names_the_op():
    keep = torch.arange(10.0, device="tpu")
    torch.tpu.synchronize()
    replays = m()["fused_replays"]
    with torch_tpu.set_eager_mode(FUSED):
        # Room for one 4 MB tensor (an allocation past the limit raises at once), not the
        # graph's two.
        torch_tpu._C.set_memory_limit(torch.tpu.memory_allocated() + 6_000_000)
        try:
            small = keep * 2
            big = torch.ones(1000, 1000, device="tpu") + small.sum()
            bigger = big * 2
            with pytest.raises(torch.OutOfMemoryError, match="TPU out of memory. Tried to allocate"):
                bigger.cpu()
        finally:
            torch_tpu._C.set_memory_limit(0)
        assert m()["fused_replays"] == replays + 1
        assert keep.sum().item() == 45.0
        assert (torch.ones(3, device="tpu") * 2).sum().item() == 6.0


def test_backward_records_from_autograds_thread():
    with torch_tpu.set_eager_mode(FUSED):
        w = torch.randn(8, 8, device="tpu", requires_grad=True)
        loss = (w.tanh() @ w).pow(2).mean()
        loss.backward()
        g = w.grad.cpu()
    wc = w.detach().cpu().requires_grad_()
    (wc.tanh() @ wc).pow(2).mean().backward()
    torch.testing.assert_close(g, wc.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_division_by_a_power_in_one_graph(dtype):
    # XLA's simplifier turns a / pow(m, e) into a * pow(m, -e) inside a fused program,
    # which integers round to 0 (VideoLLaMA 3's split sizes, `thw.prod(1) // m**2`).
    a = torch.tensor([16, 100, -37, 9], dtype=dtype)
    m = torch.tensor([2, 3, 2, 1], dtype=dtype)
    e = torch.tensor([2, 2, 1, 5], dtype=dtype)
    want = [a // m**2, torch.div(a, m**3, rounding_mode="trunc"), a // m.pow(e), a % m**2,
            torch.fmod(a, m**2)]
    at, mt, et = a.to("tpu"), m.to("tpu"), e.to("tpu")
    with torch_tpu.set_eager_mode(FUSED):
        got = [at // mt**2, torch.div(at, mt**3, rounding_mode="trunc"), at // mt.pow(et),
               at % mt**2, torch.fmod(at, mt**2)]
        got = [g.cpu() for g in got]
    for g, w in zip(got, want):
        assert torch.equal(g, w), (g, w)
