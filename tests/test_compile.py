"""Compiled mode: torch.compile(backend="tpu") runs each captured graph as one fused
program, with the eager kernels' numerics."""
import copy
import os
import sys

import pytest
import torch
import torch.nn as nn

import torch_tpu
from torch_tpu import EagerMode
from conftest import ROOT, run_python

sys.path.insert(0, os.path.join(ROOT, "examples"))
from gpt import GPT, batches  # noqa: E402

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]
ALL_MODES = MODES + [EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def delta(before, after, *keys):
    return {k: after[k] - before[k] for k in keys}


def test_backend_registered_by_autoload():
    # No `import torch_tpu`: the torch.backends entry point loads it, and Dynamo finds
    # "tpu" through its torch_dynamo_backends entry point.
    r = run_python(
        "import torch, torch._dynamo\n"
        "assert 'tpu' in torch._dynamo.list_backends(), torch._dynamo.list_backends()\n"
        "f = torch.compile(lambda x: (x * 2 + 1).relu(), backend='tpu')\n"
        "y = f(torch.arange(-2.0, 3.0, device='tpu'))\n"
        "import torch_tpu\n"
        "print(y.cpu().tolist(), torch_tpu.metrics()['compiled_graphs'])\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "1" and "[0.0, 0.0, 1.0, 3.0, 5.0]" in r.stdout


def test_tpu_backend_names_and_options():
    from torch_tpu._internal import compile as c
    assert torch_tpu.TpuBackend is c.TpuBackend
    b = c.TpuBackend(debug=False, dynamism=False, enable_serialization=True, precompile_steps=0)
    assert (b.debug, b.dynamism) == (False, False)
    m = torch_tpu.metrics()
    for k in ("compiled_graphs", "compiled_recompiles", "compiled_lowering_seconds"):
        assert k in m


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 4))


def train_mlp(model, fwd, steps=10):
    torch.manual_seed(1)
    data = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(steps)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in data:
        loss = nn.functional.mse_loss(fwd(x.to("tpu")), y.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.name)
def test_compiled_mlp_trains_like_eager(mode):
    torch.manual_seed(0)
    base = mlp().to("tpu")
    with torch_tpu.set_eager_mode(mode):
        eager = copy.deepcopy(base)
        want = train_mlp(eager, eager)
        model = copy.deepcopy(base)
        got = train_mlp(model, torch.compile(model, backend="tpu"))
    assert got == pytest.approx(want, abs=1e-5)
    assert want[-1] < want[0]


def train_gpt(model, fwd, steps=10):
    """Losses of `steps` AdamW steps, and the metrics after the first and second steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, seen = [], []
    for x, y in batches(64, 32, 4, steps):
        _, loss = fwd(x.to("tpu"), y.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if len(seen) < 2:
            seen.append(torch_tpu.metrics())
    return losses, seen


STEADY = ("compiled_graph_calls", "compiled_graphs", "compiled_recompiles", "compiles",
          "fused_graphs", "executions", "host_fills")


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_compiled_gpt_trains_like_eager_one_program_per_graph(mode):
    torch.manual_seed(0)
    base = GPT()
    with torch_tpu.set_eager_mode(mode):
        eager = copy.deepcopy(base).to("tpu")
        want, _ = train_gpt(eager, eager)
        model = copy.deepcopy(base).to("tpu")
        fwd = torch.compile(model, backend="tpu")
        got, (first, second) = train_gpt(model, fwd)
        after = torch_tpu.metrics()
        # A steady forward and backward: one program (the forward's replay stays pending
        # and the backward's joins it). Outside them only the backward's seed gradient
        # (ones) and AOTAutograd's zero tangent for the logits (no gradient) run: no
        # program in Strict mode (a host transfer and an unwritten storage, both
        # `host_fills`); in DeferAndFuse they are recorded into the same program.
        # Grads start as None: no accumulation.
        x, y = (t.to("tpu") for t in next(batches(64, 32, 4, 1)))
        model.zero_grad()
        torch_tpu.synchronize()
        before = torch_tpu.metrics()
        _, loss = fwd(x, y)
        loss.backward()
        torch_tpu.synchronize()
        step = delta(before, torch_tpu.metrics(), *STEADY)
    assert got == pytest.approx(want, abs=1e-5)
    assert want[-1] < want[0]
    # Steps 2..10 lowered and recompiled no graph; from step 3 (the eager optimizer's
    # second step differs from its first, which creates its state) nothing compiles.
    later = delta(first, after, *STEADY)
    assert later["compiled_graphs"] == later["compiled_recompiles"] == 0
    assert later["compiled_graph_calls"] == 2 * 9
    assert delta(second, after, "compiles")["compiles"] == 0
    fused = mode == EagerMode.DEFER_AND_FUSE
    assert step["compiled_graph_calls"] == 2 and step["fused_graphs"] == 1
    assert step["executions"] == 1, step
    assert step["host_fills"] == (0 if fused else 2), step


def test_graph_breaks_run_eagerly_with_right_results(capsys):
    lin = nn.Linear(6, 6)

    def fwd(m, x):
        y = m(x).relu()
        print("between graphs")          # a graph break
        s = y.sum().item()               # another: a value on the host
        return y * s + 1

    x = torch.randn(4, 6)
    want = fwd(lin, x)
    capsys.readouterr()
    lin_t = copy.deepcopy(lin).to("tpu")
    before = torch_tpu.metrics()
    f = torch.compile(lambda x: fwd(lin_t, x), backend="tpu")
    got = [f(x.to("tpu")).cpu() for _ in range(2)]
    d = delta(before, torch_tpu.metrics(), "compiled_graphs", "compiled_graph_calls")
    for g in got:
        torch.testing.assert_close(g, want)
    assert capsys.readouterr().out.count("between graphs") == 2
    assert d["compiled_graphs"] >= 2 and d["compiled_graph_calls"] >= 4  # pieces around the breaks


def test_batchnorm_train_mode_matches_cpu_running_stats_too():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    tpu = copy.deepcopy(cpu).to("tpu")
    f = torch.compile(tpu, backend="tpu", dynamic=False)  # the eval batch below is smaller
    for _ in range(3):
        x = torch.randn(5, 3, 8, 8)
        want = cpu(x)
        want.square().sum().backward()
        got = f(x.to("tpu"))
        got.square().sum().backward()
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    bn_c, bn_t = cpu[1], tpu[1]
    torch.testing.assert_close(bn_t.running_mean.cpu(), bn_c.running_mean)
    torch.testing.assert_close(bn_t.running_var.cpu(), bn_c.running_var)
    assert bn_t.num_batches_tracked.item() == bn_c.num_batches_tracked.item() == 3
    torch.testing.assert_close(tpu[0].weight.grad.cpu(), cpu[0].weight.grad, rtol=1e-4, atol=1e-4)
    # Eval mode: a second graph reading the running statistics.
    cpu.eval(), tpu.eval()
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(f(x.to("tpu")).cpu(), cpu(x), rtol=1e-4, atol=1e-4)


def test_dropout_reproducible_with_the_seed_and_equal_to_eager():
    m = nn.Sequential(nn.Linear(8, 64), nn.Dropout(0.5), nn.Linear(64, 4)).to("tpu")
    x = torch.randn(16, 8).to("tpu")
    f = torch.compile(m, backend="tpu")

    def run(fn, seed):
        torch.manual_seed(seed)
        return fn(x).cpu()

    a, b, c = run(f, 3), run(f, 3), run(f, 4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a, run(m, 3))  # the eager kernels draw the same bits


def test_compiled_optimizer_step_matches_eager():
    torch.manual_seed(0)
    eager = nn.Linear(8, 4).to("tpu")
    comp = copy.deepcopy(eager)
    opt_e = torch.optim.Adam(eager.parameters(), lr=0.01)
    opt_c = torch.optim.Adam(comp.parameters(), lr=0.01)

    @torch.compile(backend="tpu")
    def step():
        opt_c.step()

    x = torch.randn(16, 8).to("tpu")
    for i in range(4):
        for m, o in ((eager, opt_e), (comp, opt_c)):
            o.zero_grad()
            m(x).square().mean().backward()
        opt_e.step()
        torch_tpu.synchronize()
        before = torch_tpu.metrics()
        step()
        torch_tpu.synchronize()
        d = delta(before, torch_tpu.metrics(), "executions", "compiled_graph_calls")
        if i >= 2:  # steady: the whole Adam update is one program
            assert d == {"executions": 1, "compiled_graph_calls": 1}
    for pe, pc in zip(eager.parameters(), comp.parameters()):
        torch.testing.assert_close(pc.cpu(), pe.cpu(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(opt_c.state[pc]["exp_avg_sq"].cpu(),
                                   opt_e.state[pe]["exp_avg_sq"].cpu(), rtol=1e-5, atol=1e-6)


def test_symint_without_bounds_raises_not_implemented():
    # dynamic=True and maybe_mark_dynamic are hints (compiled per size: test_dynamism.py);
    # torch._dynamo.mark_dynamic without bounds forbids specializing and is refused.
    f = torch.compile(lambda t: t * 2, backend="tpu")
    x = torch.ones(4, 3, device="tpu")
    torch._dynamo.mark_dynamic(x, 0)
    with pytest.raises(Exception) as e:
        f(x)
    err = e.value  # Dynamo wraps what a backend raises
    while err is not None and not isinstance(err, NotImplementedError):
        err = getattr(err, "inner_exception", None) or err.__cause__
    assert isinstance(err, NotImplementedError), repr(e.value)
    assert "dynamic=False" in str(err) and "mark_dynamic" in str(err)


def test_plain_torch_compile_on_tpu_uses_the_tpu_backend_any_mode():
    torch.manual_seed(0)
    m = mlp()
    x = torch.randn(3, 16)
    want = m(x)
    mt = copy.deepcopy(m).to("tpu")
    before = torch_tpu.metrics()["compiled_graphs"]
    got = torch.compile(mt, mode="max-autotune")(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert torch_tpu.metrics()["compiled_graphs"] > before


@pytest.mark.parametrize("kw", [{}, {"mode": "reduce-overhead"}])
def test_plain_torch_compile_on_tpu_takes_new_sizes_as_new_graphs(kw):
    # CUDA's Inductor makes a size met again dynamic; here, as with backend="tpu", each
    # size is its own static graph (not an unbounded dynamic one, which is refused).
    torch._dynamo.reset()
    w = torch.randn(8, 8)
    f = torch.compile(lambda x, w: torch.tanh(x @ w).sum(0), **kw)
    for n in (4, 6, 7):
        x = torch.randn(n, 8)
        torch.testing.assert_close(f(x.to("tpu"), w.to("tpu")).cpu(), torch.tanh(x @ w).sum(0),
                                   rtol=1e-5, atol=1e-5)


def test_a_graph_with_a_jagged_nested_tensor_input_runs_eagerly_counted():
    torch._dynamo.reset()
    torch.manual_seed(0)
    parts = [torch.randn(n, 8) for n in (3, 5, 2)]
    lin = torch.nn.Linear(8, 4)
    want = [lin(p).relu() for p in parts]
    lin_t = copy.deepcopy(lin).to("tpu")
    nt = torch.nested.nested_tensor([p.to("tpu") for p in parts], layout=torch.jagged)
    before = torch_tpu.metrics()["compiled_eager_graphs"]
    with pytest.warns(UserWarning, match="nested tensor input runs eagerly"):
        got = torch.compile(lambda n: lin_t(n).relu(), backend="tpu")(nt)
    for g, w in zip(got.unbind(), want):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)
    assert torch_tpu.metrics()["compiled_eager_graphs"] == before + 1


def test_bounded_dynamism_one_graph_for_every_size_in_bounds():
    from torch_tpu import dynamism
    from torch_tpu._internal import dynamism as internal
    assert internal.mark_dynamic is dynamism.mark_dynamic
    f = torch.compile(lambda t: (t * 2).sum(0), backend=torch_tpu.TpuBackend(dynamism=True))
    before = torch_tpu.metrics()
    for n in (4, 6, 9, 4):
        x = torch.arange(n * 3.0).reshape(n, 3)
        xt = x.to("tpu")
        dynamism.mark_dynamic(xt, 0, 2, 16)
        assert dynamism.get_dynamism_info(xt) == {0: (2, 16)}
        torch.testing.assert_close(f(xt).cpu(), (x * 2).sum(0))
    d = delta(before, torch_tpu.metrics(), "compiled_graphs", "compiled_recompiles")
    assert d == {"compiled_graphs": 1, "compiled_recompiles": 0}
    assert dynamism.get_dynamism_info(torch.ones(2)) == {}
    with pytest.raises(ValueError, match="outside"):
        dynamism.mark_dynamic(torch.ones(20, 3), 0, 2, 16)


def test_conformance_compiled_option_runs_samples_through_the_backend():
    from torch_tpu import conformance
    before = torch_tpu.metrics()["compiled_graphs"]
    res = conformance.run(["mm", "nn.functional.gelu"], ("float32",), max_samples=2, jobs=0,
                          progress=False, compiled=True)
    assert res["meta"]["compiled"] is True
    for key, rec in res["entries"].items():
        assert rec["float32"]["fwd"]["status"] == "native", (key, rec)
        assert rec["float32"]["bwd"]["status"] == "native", (key, rec)
    # Each sample: a forward and a backward graph.
    assert torch_tpu.metrics()["compiled_graphs"] - before >= 2 * 2 * 2


def test_an_op_without_lowering_inside_a_graph_is_a_counted_fallback():
    # ldl_factor has no native rule: its inputs are produced first (the graph is cut
    # there), it runs on the CPU, and the rest of the graph uses its results.
    a = torch.randn(5, 5)
    a = a @ a.T + torch.eye(5)

    def fn(m):
        ld, piv = torch.linalg.ldl_factor(m * 2)
        return ld.tril() + 1, piv

    want = fn(a)
    before = torch_tpu.metrics()
    got = torch.compile(fn, backend="tpu")(a.to("tpu"))
    fb = torch_tpu.metrics()["fallbacks"]
    torch.testing.assert_close(got[0].cpu(), want[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1].cpu(), want[1])
    grown = {k: v for k, v in fb.items() if v > before["fallbacks"].get(k, 0)}
    assert any("ldl_factor" in k for k in grown), grown


def test_plain_torch_compile_routes_only_tpu_graphs():
    from torch_tpu._internal.compile import _holds_tpu
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    assert not _holds_tpu(gm, [torch.ones(2)])
    assert _holds_tpu(gm, [torch.ones(2, device="tpu")])


def test_attention_results_have_the_layout_meta_kernels_promise():
    # Compiled graphs are traced with meta strides (a view of the output in the GPT
    # example relies on them): eager tpu results must have the same, as on CPU.
    qkv = torch.randn(2, 8, 3 * 16, requires_grad=True)

    def attend(x):
        q, k, v = (z.view(2, 8, 2, 8).transpose(1, 2) for z in x.split(16, -1))
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    want = attend(qkv)
    x = qkv.detach().to("tpu").requires_grad_()
    got = attend(x)
    assert got.stride() == want.stride()
    got.transpose(1, 2).view(2, 8, 16).sum().backward()  # a view, not a copy
    want.transpose(1, 2).reshape(2, 8, 16).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), qkv.grad, rtol=1e-4, atol=1e-5)


def test_input_mutations_are_applied_inside_the_program():
    def f(buf, x):
        buf.add_(x)          # a graph input written in place (kept in the graph)
        x.mul_(2)
        return buf * 3

    buf, x = torch.arange(4.0), torch.ones(4)
    bt, xt = buf.to("tpu"), x.to("tpu")
    g = torch.compile(f, backend="tpu")
    want = [f(buf, x) for _ in range(3)]
    before = torch_tpu.metrics()
    got = [g(bt, xt).cpu() for _ in range(3)]
    d = delta(before, torch_tpu.metrics(), "compiled_graph_calls", "fused_graphs", "executions")
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(bt.cpu(), buf)
    torch.testing.assert_close(xt.cpu(), x)
    # The copies into the inputs are in the program: nothing else runs.
    assert d == {"compiled_graph_calls": 3, "fused_graphs": 3, "executions": 3}


def test_new_outputs_have_cpu_strides_so_traced_views_hold():
    # An elementwise op on a transposed input keeps its layout (as on CPU); a graph
    # traced with those strides views the result where a copy would otherwise be needed.
    x = torch.randn(4, 3)
    xt = x.to("tpu")
    assert (xt.t() * 2).stride() == (x.t() * 2).stride() == (1, 3)
    assert xt.t().exp().stride() == x.t().exp().stride()
    f = torch.compile(lambda x: (x.t() * 2).t().view(-1) + 1, backend="tpu")
    torch.testing.assert_close(f(xt).cpu(), (x.t() * 2).t().reshape(-1) + 1)


# ---- steady calls: the captured program launched again, nothing recorded -------------

@pytest.fixture
def record_every_call():
    """Switches replay off for the test's block; restores it."""
    from torch_tpu._internal import compile as c
    yield c
    c.REPLAY = True


def aten_graph(fn, *example):
    """An ATen FX graph as AOTAutograd hands it to the backend (no Dynamo guards)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(fn)(*example)


def test_steady_gpt_steps_replay_with_values_identical_to_recording(record_every_call):
    torch.manual_seed(0)
    base = GPT()
    runs = {}
    for replay in (False, True):
        record_every_call.REPLAY = replay
        torch._dynamo.reset()
        model = copy.deepcopy(base).to("tpu")
        # A program per graph, as recording runs them (fuse_steps joins a step's graphs
        # into one program: other executables, equal within float rounding, tested below).
        backend = record_every_call.TpuBackend(fuse_steps=False)
        losses, _ = train_gpt(model, torch.compile(model, backend=backend), steps=4)
        # One steady step's forward and backward: with replay nothing is recorded.
        x, y = (t.to("tpu") for t in next(batches(64, 32, 4, 1)))
        torch_tpu.synchronize()
        before = torch_tpu.metrics()
        fwd = torch.compile(model, backend=backend)
        _, loss = fwd(x, y)
        loss.backward()
        torch_tpu.synchronize()
        step = delta(before, torch_tpu.metrics(), "compiled_graph_calls", "compiled_replays",
                     "deferred_ops", "compiles", "fused_graphs")
        runs[replay] = (losses, [p.detach().cpu() for p in model.parameters()], step)
    (want, want_p, recorded), (got, got_p, replayed) = runs[False], runs[True]
    assert got == want  # the same executables on the same buffers: bit for bit
    for a, b in zip(got_p, want_p):
        assert torch.equal(a, b)
    assert recorded["compiled_replays"] == 0
    assert replayed["compiled_graph_calls"] == replayed["compiled_replays"] == 2, replayed
    assert replayed["compiles"] == 0 and replayed["fused_graphs"] == recorded["fused_graphs"]
    # The graphs' ops are recorded no more (what runs eagerly around them still is).
    assert recorded["deferred_ops"] - replayed["deferred_ops"] > 50
    if torch_tpu.get_eager_mode() != EagerMode.DEFER_AND_FUSE:
        assert replayed["deferred_ops"] == 0, replayed


def test_replayed_calls_apply_input_mutations():
    def f(buf, x):
        buf.add_(x)
        x.mul_(2)
        return buf * 3, x.view(2, 2)  # an output viewing a mutated input

    buf, x = torch.arange(4.0), torch.ones(4)
    bt, xt = buf.to("tpu"), x.to("tpu")
    g = torch.compile(f, backend="tpu")
    want = [f(buf, x) for _ in range(4)]
    before = torch_tpu.metrics()
    got = [g(bt, xt) for _ in range(4)]
    d = delta(before, torch_tpu.metrics(), "compiled_replays", "deferred_ops")
    assert d["compiled_replays"] == 3
    for (a, v), (wa, wv) in zip(got, want):
        torch.testing.assert_close(a.cpu(), wa)
    torch.testing.assert_close(bt.cpu(), buf)
    torch.testing.assert_close(xt.cpu(), x)
    # The view output shares the input's storage: later writes show through it.
    v = got[-1][1]
    assert v.untyped_storage().data_ptr() == xt.untyped_storage().data_ptr()
    xt.add_(1)
    torch.testing.assert_close(v.cpu(), (x + 1).view(2, 2))


@torch._dynamo.config.patch(capture_scalar_outputs=True)
def test_an_item_of_an_input_is_read_at_every_call():
    # capture_scalar_outputs: `n.item()` of an input became a size and a constant of the
    # recorded program, which replays kept (found by the s46 compile probe).
    torch._dynamo.reset()

    def f(x, n):
        k = n.item()
        return x * k, x[:k].sum(), torch.ones(k, device=x.device)

    g = torch.compile(f, backend="tpu")
    x = torch.arange(8.0)
    before = torch_tpu.metrics()
    for k in (2, 5, 3, 5):
        got = g(x.to("tpu"), torch.tensor(k, device="tpu"))
        for a, b in zip(got, f(x, torch.tensor(k))):
            assert a.shape == b.shape
            torch.testing.assert_close(a.cpu(), b)
    assert delta(before, torch_tpu.metrics(), "compiled_replays")["compiled_replays"] == 0
    torch._dynamo.reset()


def test_dropout_replays_draw_the_numbers_recording_draws(record_every_call):
    m = nn.Sequential(nn.Linear(8, 64), nn.Dropout(0.5), nn.Linear(64, 4)).to("tpu")
    x = torch.randn(16, 8).to("tpu")
    runs = {}
    for replay in (False, True):
        record_every_call.REPLAY = replay
        torch._dynamo.reset()
        f = torch.compile(m, backend="tpu")
        torch.manual_seed(5)
        before = torch_tpu.metrics()
        runs[replay] = [f(x).detach().cpu() for _ in range(3)]
        runs[replay].append(delta(before, torch_tpu.metrics(), "compiled_replays")["compiled_replays"])
    assert runs[False][3] == 0 and runs[True][3] == 2
    for a, b in zip(runs[False][:3], runs[True][:3]):
        assert torch.equal(a, b)
    assert not torch.equal(runs[True][1], runs[True][2])  # each call its own mask
    eval_m = copy.deepcopy(m).eval()
    assert not torch.equal(runs[True][1], eval_m(x).cpu())


def test_another_input_layout_records_again_then_replays_too():
    from torch_tpu._internal.compile import _CompiledGraph
    gm = aten_graph(lambda x, y: (x * 2 + y, (x - y).sum()), torch.ones(4, 3), torch.ones(4, 3))
    g = _CompiledGraph(gm, False)

    def call(x, y):
        before = torch_tpu.metrics()
        out = g([x.to("tpu") if x.device.type == "cpu" else x, y.to("tpu")])
        torch.testing.assert_close(out[0].cpu(), x.cpu() * 2 + y)
        torch.testing.assert_close(out[1].cpu(), (x.cpu() - y).sum())
        return delta(before, torch_tpu.metrics(), "compiled_replays")["compiled_replays"]

    a, b = torch.randn(4, 3), torch.randn(4, 3)
    assert [call(a, b), call(b, a)] == [0, 1]
    big = torch.randn(6, 3).to("tpu")
    assert call(big[:4], b) == 0          # same sizes and strides, a larger storage
    assert call(big[:4] * 1, a) == 1      # the first layout again
    assert call(big[:4], a) == 1          # the second layout: captured too
    t = torch.randn(3, 4).to("tpu").t()   # other strides
    assert [call(t, a), call(t, b)] == [0, 1]
    assert call(torch.randn(5, 3), torch.randn(5, 3)) == 0  # another shape (no guard here)
    assert g.replay_declined == ""


def test_a_graph_reading_a_tensor_outside_its_inputs_keeps_recording():
    from torch_tpu._internal.compile import _CompiledGraph

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", torch.ones(3, device="tpu"))

        def forward(self, x):
            return (x + self.c,)

    m = M()
    g = _CompiledGraph(torch.fx.symbolic_trace(m), False)
    x = torch.arange(3.0)
    torch.testing.assert_close(g([x.to("tpu")])[0].cpu(), x + 1)
    assert "not among its inputs" in g.replay_declined
    m.c.add_(1)  # seen by the next call: it records again
    before = torch_tpu.metrics()
    torch.testing.assert_close(g([x.to("tpu")])[0].cpu(), x + 2)
    assert delta(before, torch_tpu.metrics(), "compiled_replays")["compiled_replays"] == 0


def test_replay_donates_inputs_nobody_holds_where_donation_is_on():
    # Donation on the XLA CPU plugin needs TPU_FUSE_DONATE=1 at process start.
    r = run_python(
        "import torch, torch_tpu\n"
        "from torch.fx.experimental.proxy_tensor import make_fx\n"
        "from torch_tpu._internal.compile import _CompiledGraph\n"
        "gm = make_fx(lambda a, b: (a * 2 + b,))(torch.ones(64), torch.ones(64))\n"
        "g = _CompiledGraph(gm, False)\n"
        "held = torch.ones(64).to('tpu')\n"
        "res = []\n"
        "for i in range(4):\n"
        "    before = torch_tpu.metrics()['donated_buffers']\n"
        "    out = g([torch.full((64,), float(i)).to('tpu'), held])[0]\n"  # only the list holds a
        "    res.append((out.cpu()[0].item(), torch_tpu.metrics()['donated_buffers'] - before))\n"
        "print(res, torch_tpu.metrics()['compiled_replays'], held.cpu().sum().item())\n",
        env={"TPU_FUSE_DONATE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    res, replays, held = r.stdout.strip().splitlines()[-1].rsplit(" ", 2)
    # Each call donates the dead input (recorded and replayed alike), never the held one.
    assert res == "[(1.0, 1), (3.0, 1), (5.0, 1), (7.0, 1)]" and replays == "3" and held == "64.0"


RECORDING = ("op_calls", "deferred_ops", "compiled_graphs", "compiled_recompiles", "compiles")


@pytest.mark.parametrize("eager_first", [False, True], ids=["fresh", "state_made_eagerly"])
def test_compiled_adamw_step_replays_and_matches_eager(eager_first):
    # Dynamo keeps a compiled optimizer's step counters on the host unless its parameters
    # are on CUDA; on tpu they become device tensors (program operands the step updates),
    # so the update replays instead of recording each call around a host value.
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to("tpu")
    comp = copy.deepcopy(eager)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=0.01, weight_decay=0.1)
    opt_c = torch.optim.AdamW(comp.parameters(), lr=0.01, weight_decay=0.1)

    @torch.compile(backend="tpu")
    def step():
        opt_c.step()

    g = torch.Generator().manual_seed(1)
    for i in range(6):
        x = torch.randn(16, 8, generator=g).to("tpu")
        for m, o in ((eager, opt_e), (comp, opt_c)):
            o.zero_grad()
            m(x).square().mean().backward()
        opt_e.step()
        torch_tpu.synchronize()
        before = torch_tpu.metrics()
        if eager_first and i == 0:
            opt_c.step()  # host step counters, moved to tpu when Dynamo traces the step
        else:
            step()
        torch_tpu.synchronize()
        d = delta(before, torch_tpu.metrics(), "executions", "compiled_replays", *RECORDING)
        if i >= 2:  # steady: one launch of the captured update, nothing recorded
            assert d == dict(executions=1, compiled_replays=1, **{k: 0 for k in RECORDING}), (i, d)
        for pe, pc in zip(eager.parameters(), comp.parameters()):
            torch.testing.assert_close(pc.cpu(), pe.cpu(), rtol=0, atol=1e-6)
            for k in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(opt_c.state[pc][k].cpu(), opt_e.state[pe][k].cpu(),
                                           rtol=0, atol=1e-6)
            on = "cpu" if eager_first and i == 0 else "tpu"  # eager AdamW counts on the host
            assert opt_c.state[pc]["step"].device.type == on
            assert opt_c.state[pc]["step"].item() == opt_e.state[pe]["step"].item() == i + 1


def test_compiled_train_step_is_one_program():
    # forward, backward and AdamW compiled, with a plain `loss.backward()`: a steady step
    # replays the three captured graphs as one program and launches nothing else.
    # Autograd's seed (ones_like(loss)) is a small constant fill: a host-to-device
    # transfer, counted in `host_fills`, not a program. Eager parts run in Strict, as in
    # the benchmark (in DeferAndFuse the seed is recorded into the same program).
    torch.manual_seed(0)
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER):
        _three_programs_step()


def _three_programs_step():
    model = GPT().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_of = torch.compile(lambda x, y: model(x, y)[1], backend="tpu")

    @torch.compile(backend="tpu")
    def update():
        opt.step()

    losses, counts = [], []
    for x, y in batches(64, 32, 4, 6):
        x, y = x.to("tpu"), y.to("tpu")
        torch_tpu.synchronize()
        before = torch_tpu.metrics()
        loss = loss_of(x, y)
        opt.zero_grad()
        loss.backward()
        update()
        losses.append(loss.item())
        counts.append(delta(before, torch_tpu.metrics(), "executions", "compiled_replays", "host_fills",
                            "compiled_recompiles", "compiled_graphs", "compiles"))
    # From the third step (the second compiles the joined program; the update's first
    # call read its fresh state as inputs, so its second replays).
    for c in counts[2:]:
        assert c == {"executions": 1, "compiled_replays": 3, "host_fills": 1, "compiled_recompiles": 0,
                     "compiled_graphs": 0, "compiles": 0}, counts
    assert losses[-1] < losses[0]


def test_a_graph_reading_a_host_tensor_keeps_recording_with_its_new_value():
    # A CPU tensor's value is folded into the program as a host-made operand the capture
    # cannot tie to an input: such graphs decline replay and record each call, exactly.
    from torch_tpu._internal.compile import _CompiledGraph
    gm = aten_graph(lambda x, s: (x * s + 1,), torch.ones(3), torch.tensor(2.0))
    g = _CompiledGraph(gm, False)
    x = torch.arange(3.0)
    for k in (2.0, 3.0, 5.0):
        before = torch_tpu.metrics()
        torch.testing.assert_close(g([x.to("tpu"), torch.tensor(k)])[0].cpu(), x * k + 1)
        assert delta(before, torch_tpu.metrics(), "compiled_replays")["compiled_replays"] == 0
    assert "not a plain tpu tensor" in g.replay_declined


def test_recompute_cheap_saves_less_than_the_default_min_cut_and_trains_like_eager():
    # TpuBackend(recompute="cheap"): only contractions' results (and inputs) cross from the
    # forward to the backward; layer norms, GELU, residual adds, softmax are recomputed.
    from torch_tpu._internal.compile import TpuBackend
    with pytest.raises(ValueError, match="recompute='everything'"):
        TpuBackend(recompute="everything")
    torch.manual_seed(0)
    base = GPT()
    data = [(x.to("tpu"), y.to("tpu")) for x, y in batches(64, 32, 4, 4)]

    def run(backend):
        torch._dynamo.reset()
        model = copy.deepcopy(base).to("tpu")
        fwd = torch.compile(lambda x, y: model(x, y)[1], backend=backend) if backend else \
            (lambda x, y: model(x, y)[1])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        saved, losses = [], []
        for x, y in data:
            def pack(t):
                saved.append(t.numel() * t.element_size())
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = fwd(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, sum(saved) / len(data)

    want, _ = run(None)
    cheap, cheap_bytes = run(TpuBackend(recompute="cheap"))
    _, min_cut_bytes = run(TpuBackend(memory_budget=1.0))
    assert cheap == pytest.approx(want, abs=1e-5)
    assert cheap_bytes < 0.75 * min_cut_bytes, (cheap_bytes, min_cut_bytes)


def test_first_call_time_splits_into_aotautograd_and_our_recording():
    # compiled_lowering_seconds = AOTAutograd's part (inside the backend call) + the graphs'
    # first calls (recording: ours); later calls add to neither.
    torch.manual_seed(0)
    model = mlp().to("tpu")
    before = torch_tpu.metrics()
    fwd = torch.compile(model, backend="tpu")
    train_mlp(model, fwd, steps=1)
    first = delta(before, torch_tpu.metrics(), "compiled_lowering_seconds", "compiled_aot_seconds",
                  "compiled_record_seconds", "compiled_graphs")
    assert first["compiled_graphs"] == 2  # forward and backward
    assert first["compiled_aot_seconds"] > 0 and first["compiled_record_seconds"] > 0
    assert first["compiled_aot_seconds"] + first["compiled_record_seconds"] == \
        pytest.approx(first["compiled_lowering_seconds"], rel=1e-6)
    mid = torch_tpu.metrics()
    train_mlp(model, fwd, steps=3)
    later = delta(mid, torch_tpu.metrics(), "compiled_aot_seconds", "compiled_record_seconds")
    assert later == {"compiled_aot_seconds": 0.0, "compiled_record_seconds": 0.0}


def test_training_graphs_skip_aotautograds_cse_pass_and_import_no_inductor_matcher():
    # AOTAutograd's CSE pass over joint graphs imports Inductor's pattern matcher (about a
    # second of a cold start); XLA does the same elimination, so it is off. In a fresh
    # process: a compiled MLP trains like eager without that import.
    code = (
        "import sys, copy, torch, torch.nn as nn, torch_tpu\n"
        "torch.manual_seed(0)\n"
        "base = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to('tpu')\n"
        "x, y = torch.randn(8, 16).to('tpu'), torch.randn(8, 4).to('tpu')\n"
        "def losses(m, f):\n"
        "    opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "    out = []\n"
        "    for _ in range(3):\n"
        "        loss = nn.functional.mse_loss(f(x), y); opt.zero_grad(); loss.backward(); opt.step()\n"
        "        out.append(loss.item())\n"
        "    return out\n"
        "eager = copy.deepcopy(base); want = losses(eager, eager)\n"
        "model = copy.deepcopy(base); got = losses(model, torch.compile(model, backend='tpu'))\n"
        "assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (got, want)\n"
        "assert torch_tpu.metrics()['compiled_graphs'] == 2\n"
        "print('pattern_matcher' , 'torch._inductor.pattern_matcher' in sys.modules)\n")
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert "pattern_matcher False" in r.stdout, r.stdout


# ---- one program per training step (TpuBackend(fuse_steps=True), the default) ----------

STEP_COUNTS = ("executions", "compiles", "compiled_recompiles", "compiled_graphs", "compiled_replays")


def _fused_step_run(mode, read_between, steps=6, break_graph=False):
    """Compiled forward, backward and AdamW update of the small GPT for `steps` steps in
    eager `mode`, with `loss.item()` between forward and backward when `read_between`;
    the same steps eagerly. Returns both runs' losses and parameters, and per-step counts."""
    torch.manual_seed(0)
    base = GPT()
    runs = []
    for compiled in (False, True):
        torch._dynamo.reset()
        with torch_tpu.set_eager_mode(mode):
            model = copy.deepcopy(base).to("tpu")
            # eps bounds how much Adam magnifies float differences of tiny gradients
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3, eps=1e-3)

            def loss_fn(x, y):
                if break_graph:
                    h = model.blocks[0](model.tok(x) + model.pos(torch.arange(x.shape[1], device=x.device)))
                    print(end="")  # a graph break between two pieces of the forward
                    return nn.functional.cross_entropy(model.head(model.ln(h)).flatten(0, 1), y.flatten())
                return model(x, y)[1]

            loss_of = torch.compile(loss_fn, backend="tpu") if compiled else loss_fn
            update = torch.compile(lambda: opt.step(), backend="tpu") if compiled else opt.step
            losses, counts = [], []
            for x, y in batches(64, 32, 4, steps):
                x, y = x.to("tpu"), y.to("tpu")
                torch_tpu.synchronize()
                before = torch_tpu.metrics()
                loss = loss_of(x, y)
                if read_between:
                    losses.append(loss.item())
                opt.zero_grad()
                loss.backward()
                update()
                if not read_between:
                    losses.append(loss.item())
                torch_tpu.synchronize()
                counts.append(delta(before, torch_tpu.metrics(), *STEP_COUNTS))
            runs.append((losses, [p.detach().cpu() for p in model.parameters()], counts))
    return runs


@pytest.mark.parametrize("read_between", [False, True], ids=["no_read", "item_between"])
@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.name)
def test_compiled_training_step_is_one_program_and_trains_like_eager(mode, read_between):
    (want, want_p, _), (got, got_p, counts) = _fused_step_run(mode, read_between)
    assert got == pytest.approx(want, abs=1e-5)
    assert want[-1] < want[0]
    for a, b in zip(got_p, want_p):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # Steady steps (from the third: the second compiles the joined program once) replay
    # the three graphs and compile nothing: one program (forward + backward + update),
    # two when the loss is read between forward and backward (forward; backward +
    # update), three in Debug (each graph runs at its call).
    programs = 3 if mode == EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING else (2 if read_between else 1)
    for c in counts[2:]:
        assert c == {"executions": programs, "compiles": 0, "compiled_recompiles": 0, "compiled_graphs": 0,
                     "compiled_replays": 3}, counts


def test_compiled_training_with_a_graph_break_trains_like_eager():
    # Two forward pieces around an eager break, their two backwards and the update: the
    # second piece's forward flushes the first (a program of its own), the rest is one.
    (want, want_p, _), (got, got_p, counts) = _fused_step_run(EagerMode.DEFER_NEVER, False, break_graph=True)
    assert got == pytest.approx(want, abs=1e-5)
    for a, b in zip(got_p, want_p):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    for c in counts[3:]:
        assert c["compiles"] == c["compiled_recompiles"] == c["compiled_graphs"] == 0, counts
        assert c["compiled_replays"] == 5 and c["executions"] <= 3, counts


@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.name)
def test_no_grad_graph_between_forward_and_backward_joins_the_pending_forward(mode):
    # An inference graph (no_grad) called while a training forward is pending joins it
    # and flushes both; the backward then reads the materialized saved tensors.
    torch.manual_seed(0)
    lin_cpu = nn.Linear(8, 8)
    lin = copy.deepcopy(lin_cpu).to("tpu")
    fwd = torch.compile(lambda x: lin(x).tanh().sum(), backend="tpu")
    probe = torch.compile(lambda x: (lin(x) * 2).amax(), backend="tpu")
    g = torch.Generator().manual_seed(3)
    with torch_tpu.set_eager_mode(mode):
        for _ in range(4):
            x = torch.randn(4, 8, generator=g)
            lin.zero_grad()
            loss = fwd(x.to("tpu"))
            with torch.no_grad():
                peak = probe(x.to("tpu"))
            loss.backward()
            lin_cpu.zero_grad()
            want = lin_cpu(x).tanh().sum()
            want.backward()
            torch.testing.assert_close(loss.cpu(), want.detach(), rtol=0, atol=1e-5)
            torch.testing.assert_close(peak.cpu(), (lin_cpu(x) * 2).amax().detach(), rtol=0, atol=1e-5)
            torch.testing.assert_close(lin.weight.grad.cpu(), lin_cpu.weight.grad, rtol=0, atol=1e-5)


def test_fuse_steps_off_keeps_a_program_per_graph():
    from torch_tpu._internal.compile import TpuBackend
    torch.manual_seed(0)
    lin = nn.Linear(8, 8).to("tpu")
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-2)
    backend = TpuBackend(fuse_steps=False)
    fwd = torch.compile(lambda x: lin(x).square().mean(), backend=backend)
    update = torch.compile(lambda: opt.step(), backend=backend)
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER):
        for i in range(4):
            x = torch.randn(4, 8).to("tpu")
            torch_tpu.synchronize()
            before = torch_tpu.metrics()
            loss = fwd(x)
            opt.zero_grad()
            loss.backward()
            update()
            torch_tpu.synchronize()
            d = delta(before, torch_tpu.metrics(), "executions", "compiled_replays")
            if i >= 2:
                assert d == {"executions": 3, "compiled_replays": 3}, d


def test_a_view_planned_on_a_meta_layout_runs_on_the_real_one():
    # PyTorch's meta softplus_backward gives a transposed gradient's result a contiguous
    # layout, CPU's kernel (and ours) the gradient's: AOTAutograd plans the backward's
    # view on the meta one. (Doge's compiled backward in the compat run.)
    import torch.nn.functional as F
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 2)

    def f(lin, x):
        dt = F.softplus(lin(x).view(2, 8, 2))
        m = torch.exp(dt).transpose(-1, -2)[:, :, None, :].expand(2, 2, 3, 8)
        return m.masked_fill(torch.arange(8, device=x.device) > 5, 0.0)
    x = torch.randn(16, 4)
    f(lin, x).sum().backward()
    on_tpu = torch.nn.Linear(4, 2).to("tpu")
    on_tpu.load_state_dict(lin.state_dict())
    out = torch.compile(f, backend="tpu")(on_tpu, x.to("tpu"))
    out.sum().backward()
    torch.testing.assert_close(out.cpu(), f(lin, x).detach())
    torch.testing.assert_close(on_tpu.weight.grad.cpu(), lin.weight.grad, rtol=1e-5, atol=1e-6)


class _WritesAnInputItReads(torch.nn.Module):
    """A forward that writes an input before reading it: a buffer scaled in place (the
    graph's copy_ epilogue) and a weight clamped through `.data` (Gemma3n's AltUp; a
    mutation hidden from autograd, copied back by AOTAutograd after the graph)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 16, bias=False)
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x):
        self.scale.mul_(0.5)
        self.b.weight.data.clamp_(-0.2, 0.2)
        return self.b(self.a(x) * self.scale).square().sum()


def test_the_backward_reads_what_the_forward_read_before_writing_an_input():
    # With the activation budget of 0 the backward recomputed `scale * 0.5` and the clamp
    # from the written inputs: a silently wrong gradient (the buffer read twice scaled)
    # and autograd's "modified by an inplace operation" error (the clamped weight).
    def steps(device, compiled):
        torch.manual_seed(0)
        m = _WritesAnInputItReads().to(device)
        f = torch.compile(m, backend="tpu") if compiled else m
        x = (torch.arange(12.0).view(3, 4) / 10).to(device)
        got = []
        for _ in range(2):
            loss = f(x)
            loss.backward()
            got.append([t.detach().cpu().clone() for t in (loss, m.scale, m.b.weight)]
                       + [p.grad.cpu().clone() for p in (m.a.weight, m.a.bias, m.b.weight)])
            m.zero_grad()
        return got
    for want, got in zip(steps("cpu", False), steps("tpu", True)):
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_the_backward_uses_the_forwards_random_draws():
    # With the activation budget of 0 the backward recomputed random ops: a dropout mask
    # or noise drawn again, other numbers than the forward's (a silently wrong gradient).
    def noisy(x):
        u = torch.rand(3, 4, device=x.device)
        return (x * u).sum(), u.detach().clone()
    x = torch.randn(3, 4, device="tpu", requires_grad=True)
    loss, u = torch.compile(noisy, backend="tpu")(x)
    loss.backward()
    torch.testing.assert_close(x.grad.cpu(), u.cpu(), rtol=0, atol=0)

    x = torch.randn(64, device="tpu", requires_grad=True)
    y = torch.compile(lambda x: torch.nn.functional.dropout(x, 0.5, training=True) * 3.0, backend="tpu")(x)
    y.sum().backward()
    kept = y.detach().cpu() != 0
    assert 0 < int(kept.sum()) < 64
    torch.testing.assert_close(x.grad.cpu(), kept.float() * 6.0, rtol=0, atol=0)


def _dropout_block(x):
    return torch.nn.functional.dropout(x * 1.0, 0.5, training=True).relu() + 0


@pytest.mark.parametrize("checkpointed", [False, True])
def test_the_backward_reuses_a_dropout_mask_between_other_ops(checkpointed):
    # Dropout between other ops (and inside a checkpointed region, which asks for its
    # recompute): the partition recomputed native_dropout in the backward, drawing
    # another mask (a silently wrong gradient), or, checkpointed, raised "Backend not
    # supported for tpu". The mask is saved; the rest of the region is recomputed.
    from torch.utils.checkpoint import checkpoint

    def f(x):
        y = checkpoint(_dropout_block, x, use_reentrant=False) if checkpointed else _dropout_block(x)
        return y, (y * 3).sum()
    x = (torch.rand(64, device="tpu") + 0.5).requires_grad_()
    y, loss = torch.compile(f, backend="tpu")(x)
    loss.backward()
    kept = y.detach().cpu() != 0
    assert 0 < int(kept.sum()) < 64
    torch.testing.assert_close(x.grad.cpu(), kept.float() * 6.0, rtol=0, atol=0)


def test_a_checkpointed_compiled_model_with_dropout_has_the_uncheckpointed_gradients():
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8).to("tpu")

    def block(x):
        return torch.nn.functional.dropout(lin(x), 0.5, training=True).relu()
    x = torch.randn(4, 8, device="tpu")
    grads = []
    for ck in (False, True):
        step = torch.compile(lambda x: (checkpoint(block, x, use_reentrant=False) if ck else block(x)).sum(),
                             backend="tpu")
        torch.tpu.manual_seed(1)
        lin.zero_grad()
        step(x).backward()
        grads.append(lin.weight.grad.cpu())
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


def _batch_norm_where_dynamo_gave_up(x, w, b, mean, var):
    # A data-dependent branch inside a loop: Dynamo leaves this frame to eager, so the
    # batch norm below reaches the dispatcher and its tpu kernel (a Python decomposition).
    for _ in range(2):
        if x.sum() > -1e9:
            x = x * 1.0
    return torch.ops.aten.native_batch_norm(x, w, b, mean, var, True, 0.1, 1e-5)[0].square().sum()


def test_python_kernels_are_not_traced_as_user_code():
    # Dynamo compiled the tpu kernel itself as a graph of its own: its autograd saved the
    # running stats before the kernel's write, so the backward raised "modified by an
    # inplace operation" (OmDet-Turbo in the compiled compat run).
    def run(device, compiled):
        torch.manual_seed(0)
        x, w, b = (torch.randn(4, 3, 5), torch.rand(3) + 0.5, torch.randn(3))
        x, w, b = (t.to(device).requires_grad_() for t in (x, w, b))
        mean, var = torch.zeros(3, device=device), torch.ones(3, device=device)
        f = torch.compile(_batch_norm_where_dynamo_gave_up, backend="tpu") if compiled \
            else _batch_norm_where_dynamo_gave_up
        loss = f(x, w, b, mean, var)
        loss.backward()
        return [t.detach().cpu() for t in (loss, x.grad, w.grad, b.grad, mean, var)]
    for w, g in zip(run("cpu", False), run("tpu", True)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_compiled_calls_from_threads_leave_the_eager_mode_alone():
    # The call switched the process-wide mode to DeferAll and restored what it had saved:
    # concurrent calls saved each other's DeferAll, and the process stayed in it (every
    # eager op then joined one unbounded graph).
    import sys
    import threading
    fn = torch.compile(lambda x: (x.sin() @ x).relu() + 1, backend="tpu")
    x = torch.randn(16, 16, device="tpu")
    want = fn(x).cpu()
    before = torch_tpu.get_eager_mode()
    results = []

    def work():
        for _ in range(50):
            results.append(fn(x).cpu())
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # the race, often
    try:
        for _ in range(5):
            threads = [threading.Thread(target=work) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(interval)
    assert torch_tpu.get_eager_mode() == before
    assert len(results) == 1000 and all(torch.equal(r, want) for r in results)


class _FunctionSubclass(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_torch_function_subclass_input_compiles_on_the_first_call():
    # The first call ran the graph's eager ops under AOTAutograd's aliasing check, whose
    # dispatch mode refuses tensor types it does not know: "Multiple dispatch failed".
    x = torch.randn(3, 4)
    f = torch.compile(lambda t: (t * 2).sin().sum(1), backend="tpu")
    for _ in range(2):
        y = f(x.to("tpu").as_subclass(_FunctionSubclass))
        assert type(y) is _FunctionSubclass
        torch.testing.assert_close(y.as_subclass(torch.Tensor).cpu(), (x * 2).sin().sum(1))


def test_a_python_float_that_changes_becomes_a_graph_input():
    # Sizes stay static without dynamism, but a float argument that changes (a scale, a
    # temperature) is a graph input from its second value on, as with stock backends:
    # two graphs, not one per value until the recompile limit.
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters
    dynamo.reset()
    counters.clear()

    def f(x, s):
        return x * s + s

    cf = torch.compile(f, backend="tpu")
    x = torch.randn(4, 8, device="tpu")
    for s in [1.0, 2.0, 3.5, 4.0, 5.0, 6.25, 7.0, 8.0, 9.0, 10.0]:
        torch.testing.assert_close(cf(x, s).cpu(), f(x.cpu(), s))
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    # A size that changes (here the rank too) is made dynamic: one more graph for every
    # size after it, a program per size inside it (test_compile_dynamic_sizes.py).
    for n in (5, 6, 7):
        torch.testing.assert_close(cf(torch.ones(n, device="tpu"), 2.0).cpu(), f(torch.ones(n), 2.0))
    assert counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])


def test_compile_options_are_the_backends_arguments(capsys):
    # options= was ignored, unknown keys included; it now sets TpuBackend's arguments,
    # accepts TorchTPU's own options, and refuses other keys as Inductor does.
    import torch._dynamo as dynamo
    dynamo.reset()
    f = lambda x: (x * 2).sin()  # noqa: E731
    x = torch.randn(4, device="tpu")
    torch.testing.assert_close(torch.compile(f, backend="tpu", options={"debug": True})(x).cpu(), f(x.cpu()))
    assert "aten.sin" in capsys.readouterr().out  # debug prints the graph
    dynamo.reset()
    opts = {"precompile_steps": 0, "enable_serialization": True, "memory_budget": 1.0}
    torch.testing.assert_close(torch.compile(f, backend="tpu", options=opts)(x).cpu(), f(x.cpu()))
    dynamo.reset()
    with pytest.raises(Exception, match="Unexpected optimization option triton.cudagraphs"):
        torch.compile(f, backend="tpu", options={"triton.cudagraphs": True})(x)
    assert (x * 1).sum().item() == x.sum().item()  # usable after
    dynamo.reset()
    # The default backend (Inductor, sent here for tpu graphs) keeps Inductor's options to itself.
    torch.testing.assert_close(torch.compile(f, options={"triton.cudagraphs": False})(x).cpu(), f(x.cpu()))


def _train_then_eval(m, x):
    m.train()
    m(x)  # updates the running statistics (buffers the graph writes)
    m.eval()
    y = m(x)  # reads the updated statistics in the same graph
    m.train()
    return y


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_updated_and_read_in_one_graph_has_eager_gradients(affine):
    # The backward recomputed the training batch norm from the running statistics the
    # step had already written: the eval norm's input gradient used a variance updated
    # twice (0.215 for 0.291), silently.
    torch._dynamo.reset()
    x0 = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 10 + 5
    grads, stats = [], []
    for compiled in (False, True):
        m = torch.nn.BatchNorm2d(3, affine=affine).to("tpu")
        x = x0.to("tpu").requires_grad_()
        f = torch.compile(_train_then_eval, backend="tpu") if compiled else _train_then_eval
        f(m, x).sum().backward()
        grads.append(x.grad.cpu())
        stats.append((m.running_mean.cpu(), m.running_var.cpu()))
    torch.testing.assert_close(grads[1], grads[0])
    torch.testing.assert_close(stats[1], stats[0])
