"""What a fused graph takes as parameters. Calls whose results nothing reads are left out
of the graph (with their inputs); when a training step's graph runs as its forward and
the rest, each program takes only the parameters it reads; and the fills a graph's
outputs start from (an optimizer's state: zeros_like, then updated in place) run before
it, so the graph reads them as parameters. The first step's graph, which creates the
optimizer's state, is then the graph of every later step: one compile on a cold start."""
import os
import sys

import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode
from conftest import ROOT, no_fallbacks

sys.path.insert(0, os.path.join(ROOT, "examples"))
from gpt import GPT  # noqa: E402

FUSED = EagerMode.DEFER_AND_FUSE


def counters():
    m = torch_tpu.metrics()
    return m["graph_compiles"], m["dead_calls_dropped"], m["fused_graph_cache_hits"]


def step_graph(x, w, make_dead):
    """x @ w + 1, with a temporary made and dropped before the flush if `make_dead`."""
    y = x @ w
    if make_dead:
        t = torch.exp(x) * 3.0  # noqa: F841 (dropped: never read)
        del t
    return (y + 1).sum().item()


def test_a_dropped_temporary_is_left_out_and_does_not_change_the_graph():
    x = torch.randn(8, 8, device="tpu")
    w = torch.randn(8, 8, device="tpu")
    with torch_tpu.set_eager_mode(FUSED):
        expect = step_graph(x, w, make_dead=False)
        c0, d0, _ = counters()
        got = step_graph(x, w, make_dead=True)
        c1, d1, _ = counters()
    assert got == expect
    assert d1 - d0 == 2  # exp and mul
    assert c1 == c0, "the graph with a dead temporary compiled again"


def test_a_dead_chain_reading_a_live_value_keeps_the_value():
    x = torch.randn(16, device="tpu")
    with torch_tpu.set_eager_mode(FUSED):
        a = x * 2
        b = a.exp()  # dead: reads a live value
        del b
        out = a.cpu()
    torch.testing.assert_close(out, x.cpu() * 2)


def test_a_graph_of_only_dead_calls_runs_nothing():
    x = torch.randn(16, device="tpu")
    torch_tpu.synchronize()
    with torch_tpu.set_eager_mode(FUSED):
        e0 = torch_tpu.metrics()["executions"]
        _, d0, _ = counters()
        t = x.sin()
        del t
        torch_tpu.synchronize()
        e1 = torch_tpu.metrics()["executions"]
        _, d1, _ = counters()
    assert d1 - d0 == 1
    assert e1 == e0
    torch.testing.assert_close(x.cos().cpu(), x.cpu().cos())


def train_steps(model_fn, opt_fn, steps, data):
    torch.manual_seed(0)
    model = model_fn().to("tpu")
    opt = opt_fn(model.parameters())
    out = []
    for i in range(steps):
        c0, _, _ = counters()
        opt.zero_grad()
        x, y = data[i % len(data)]
        loss = model(x.to("tpu"), y.to("tpu"))[1]
        loss.backward()
        opt.step()
        out.append((loss.item(), counters()[0] - c0))
    return out, [p.detach().cpu() for p in model.parameters()]


def gpt_data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 64, (2, 16), generator=g), torch.randint(0, 64, (2, 16), generator=g)) for _ in range(3)]


@pytest.mark.parametrize("opt", ["adamw", "sgd_momentum"])
def test_the_second_step_reuses_the_first_steps_forward(opt):
    make_opt = {
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    }[opt]
    data = gpt_data()
    make_model = lambda: GPT(vocab=64, d_model=32, n_heads=4, n_layers=2, seq=16)  # noqa: E731
    before = torch_tpu._C._split_at_backward()
    torch_tpu._C._set_split_at_backward(True)
    try:
        with torch_tpu.set_eager_mode(FUSED), no_fallbacks():
            fused, fused_params = train_steps(make_model, make_opt, 3, data)
    finally:
        torch_tpu._C._set_split_at_backward(before)
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER):
        strict, strict_params = train_steps(make_model, make_opt, 3, data)
    compiles = [c for _, c in fused]
    if opt == "adamw":
        # Adam's state starts as zeros, hoisted out of the first step's graph: the second
        # step is the first's graph.
        assert compiles[1] == 0 and compiles[2] == 0, compiles
    else:
        # SGD's momentum starts as a clone of the gradient (another op than the later
        # steps' update): the second step compiles its rest, not its forward.
        assert compiles[1] <= 1 and compiles[2] == 0, compiles
    for (lf, _), (ls, _) in zip(fused, strict):
        assert abs(lf - ls) <= 1e-5 * max(1.0, abs(ls))
    # Adam scales rounding noise in gradients that are zero in exact arithmetic (an
    # attention key bias) up to whole lr-sized steps: compare at the scale of lr.
    tol = dict(rtol=1e-3, atol=1e-4) if opt == "adamw" else dict(rtol=1e-5, atol=1e-6)
    for a, b in zip(fused_params, strict_params):
        torch.testing.assert_close(a, b, **tol)


def test_fills_made_every_step_stay_in_their_graph_with_the_same_values():
    """Outside an optimizer's step fills are not state: hoisting those a backward makes
    every step (an index's gradient starts from zeros) would cost a launch and a buffer
    per step. Values are the same either way."""
    x = torch.randn(6, device="tpu")
    with torch_tpu.set_eager_mode(FUSED):
        h0 = torch_tpu.metrics()["hoisted_fills"]
        kept = []
        for i in range(3):
            acc = torch.zeros_like(x)
            acc.add_(x * (i + 1))
            acc[2] = x.sum()
            ones = torch.ones(2, 3, device="tpu")
            kept.append((acc, ones, (acc * 2).sum()))
            torch_tpu.synchronize()
        hoisted = torch_tpu.metrics()["hoisted_fills"] - h0
    assert hoisted == 0
    xc = x.cpu()
    for i, (acc, ones, total) in enumerate(kept):
        want = xc * (i + 1)
        want[2] = xc.sum()
        torch.testing.assert_close(acc.cpu(), want)
        torch.testing.assert_close(ones.cpu(), torch.ones(2, 3))
        torch.testing.assert_close(total.cpu(), (want * 2).sum())


class ZerosMomentum(torch.optim.Optimizer):
    """Momentum whose state is made by torch.zeros (a storage never written: it reads as
    zeros) and ones_like."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["buf"] = torch.zeros(p.shape, device=p.device)
                    st["count"] = torch.zeros(2, device=p.device)
                    st["scale"] = torch.ones_like(p)
                st["buf"].mul_(0.9).add_(p.grad * st["scale"])
                st["count"].add_(1.0)
                p.sub_(group["lr"] * st["buf"])


def test_state_made_by_torch_zeros_joins_the_first_steps_graph():
    torch.manual_seed(0)
    w_cpu = torch.randn(8, 8)
    xs = [torch.randn(4, 8) for _ in range(3)]

    def run(device, mode):
        w = torch.nn.Parameter(w_cpu.clone().to(device))
        opt = ZerosMomentum([w])
        out = []
        with torch_tpu.set_eager_mode(mode):
            h0 = torch_tpu.metrics()["hoisted_fills"]
            for x in xs:
                c0 = torch_tpu.metrics()["graph_compiles"]
                opt.zero_grad()
                loss = (x.to(device) @ w).square().mean()
                loss.backward()
                opt.step()
                out.append((loss.item(), torch_tpu.metrics()["graph_compiles"] - c0))
            hoisted = torch_tpu.metrics()["hoisted_fills"] - h0
        return out, w.detach().cpu(), opt.state[w]["count"].cpu(), hoisted

    fused, w_fused, count_fused, hoisted = run("tpu", FUSED)
    cpu, w_ref, count_ref, _ = run("cpu", EagerMode.DEFER_NEVER)
    assert hoisted == 3, hoisted  # buf's zeros, count's zeros, scale
    assert [c for _, c in fused][1:] == [0, 0], fused
    for (a, _), (b, _) in zip(fused, cpu):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b))
    torch.testing.assert_close(w_fused, w_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(count_fused, count_ref)


def test_a_split_steps_donations_are_counted():
    """The rest of a split step donates the parameters it updates (TPU_FUSE_DONATE=1 at
    process start on the CPU plugin); metrics()['donated_buffers'] counts them."""
    from conftest import run_python_json
    code = (
        "import json, torch, torch_tpu\n"
        "torch_tpu._C._set_split_at_backward(True)\n"
        "torch.manual_seed(0)\n"
        "with torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):\n"
        "    m = torch.nn.Linear(8, 8).to('tpu')\n"
        "    opt = torch.optim.Adam(m.parameters(), lr=1e-2)\n"
        "    x = torch.randn(4, 8, device='tpu')\n"
        "    per_step = []\n"
        "    for _ in range(3):\n"
        "        d0 = torch_tpu.metrics()['donated_buffers']\n"
        "        opt.zero_grad(); loss = m(x).square().mean(); loss.backward(); opt.step(); loss.item()\n"
        "        torch_tpu.synchronize()\n"
        "        per_step.append(torch_tpu.metrics()['donated_buffers'] - d0)\n"
        "print(json.dumps(per_step))\n")
    env = dict(os.environ, TPU_FUSE_DONATE="1")
    per_step = run_python_json(code, env=env)
    # From the second step on, each parameter and its two Adam states give their memory.
    assert per_step[2] >= 6, per_step


def test_a_grad_scaler_step_is_one_graph_from_the_first_step():
    """With a GradScaler the step's graph is cut at scaler.update(), not at the optimizer
    step inside scaler.step(): the scale's update then belongs to its own step, and the
    second step is the first's graphs."""
    def built():
        m = torch_tpu.metrics()
        return m["graph_compiles"] + m["graph_loads"]

    def run(mode):
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        steps = []
        with torch_tpu.set_eager_mode(mode):
            model = GPT(vocab=48, d_model=24, n_heads=4, n_layers=2, seq=16).to("tpu")
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            scaler = torch.amp.GradScaler("tpu", init_scale=2.0 ** 14)
            for _ in range(4):
                c0 = built()
                x = torch.randint(0, 48, (2, 16), generator=g).to("tpu")
                y = torch.randint(0, 48, (2, 16), generator=g).to("tpu")
                opt.zero_grad()
                with torch.autocast("tpu", dtype=torch.float16):
                    loss = model(x, y)[1]
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                scaler.step(opt)
                scaler.update()
                steps.append((loss.item(), built() - c0))
        return steps, scaler.get_scale()

    fused, fused_scale = run(FUSED)
    strict, strict_scale = run(EagerMode.DEFER_NEVER)
    assert [c for _, c in fused][1:] == [0, 0, 0], fused
    assert fused_scale == strict_scale
    for (a, _), (b, _) in zip(fused, strict):
        assert abs(a - b) <= 1e-3 * max(1.0, abs(b))
