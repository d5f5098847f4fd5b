"""Unbounded dynamic sizes in compiled mode (dynamic=True, automatic dynamic shapes,
maybe_mark_dynamic): Dynamo traces the frame once with symbolic sizes and the backend
records, captures and replays a program per concrete size signature. Before, each size
was specialized: a Dynamo recompile per size, and past the recompile limit (8) the frame
ran eagerly.

Each test runs in a fresh interpreter with the eager mode forced (Strict, Debug,
DeferAndFuse), so Dynamo's frame counters start at zero.
"""
import pytest

from conftest import run_python_json

MODES = {
    "strict": {"TPU_DEFER_AND_FUSE": "0", "TPU_LAUNCH_BLOCKING": "0"},
    "debug": {"TPU_DEFER_AND_FUSE": "0", "TPU_LAUNCH_BLOCKING": "1"},
    "fused": {"TPU_DEFER_AND_FUSE": "1", "TPU_LAUNCH_BLOCKING": "0"},
}

PRELUDE = """
import json, logging
import torch, torch_tpu
import torch._dynamo
from torch._dynamo.utils import counters

limit_hits = []
class _LimitHits(logging.Handler):
    def emit(self, record):
        if "recompile_limit" in record.getMessage():
            limit_hits.append(record.getMessage())
logging.getLogger("torch._dynamo").addHandler(_LimitHits())

def metrics():
    m = torch_tpu.metrics()
    return {k: m[k] for k in ("compiled_graphs", "compiled_recompiles", "compiled_graph_calls",
                              "compiled_replays")}

def delta(before):
    now = metrics()
    return {k: now[k] - before[k] for k in now}

def dynamo_counts():
    return {"frames": counters["frames"]["total"], "graphs": counters["stats"]["unique_graphs"],
            "limit_hits": len(limit_hits)}

def diff(a, b):
    return (a.detach().cpu().double() - b.detach().cpu().double()).abs().max().item()
"""

# A function whose graph uses the size symbolically: as a value, in a view's shape and
# in a reduction over the dynamic dimension.
FUNCTION = """
def fn(x, w):
    b, n, d = x.shape
    h = torch.tanh(x.reshape(b * n, d) @ w).reshape(b, n, d)
    return h.softmax(1).sum(1) * n + h.mean(1)
"""


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("how", ["dynamic=True", "maybe_mark_dynamic"])
def test_twenty_lengths_compile_the_frame_once_and_replay_repeats(how, mode):
    out = run_python_json(PRELUDE + FUNCTION + f"""
how = {how!r}
f = torch.compile(fn, backend="tpu", **({{"dynamic": True}} if how == "dynamic=True" else {{}}))
torch.manual_seed(0)
w = torch.randn(8, 8)
wt = w.to("tpu")
res = {{"err": 0.0}}
before = metrics()
for rep in range(2):
    for n in range(3, 23):
        x = torch.randn(2, n, 8)
        xt = x.to("tpu")
        if how == "maybe_mark_dynamic":
            torch._dynamo.maybe_mark_dynamic(xt, 1)
        res["err"] = max(res["err"], diff(f(xt, wt), fn(x, w)))
    res["pass%d" % rep] = delta(before)
    before = metrics()
res.update(dynamo_counts())
print(json.dumps(res))
""", env=MODES[mode])
    assert out["err"] < 1e-4, out
    # Dynamo traced the frame once: no recompile per length, no recompile limit, no eager.
    assert (out["frames"], out["graphs"], out["limit_hits"]) == (1, 1, 0), out
    assert out["pass0"]["compiled_graphs"] == 1 and out["pass0"]["compiled_recompiles"] == 0, out
    assert out["pass0"]["compiled_graph_calls"] == 20, out  # every call ran the compiled graph
    # Lengths met again replay their captured programs, recording nothing.
    assert out["pass1"] == {"compiled_graphs": 0, "compiled_recompiles": 0,
                            "compiled_graph_calls": 20, "compiled_replays": 20}, out


@pytest.mark.parametrize("mode", sorted(MODES))
def test_automatic_dynamic_sizes_compile_the_frame_twice_at_most(mode):
    # No dynamic= argument: Dynamo compiles the first size static, then (the frame met at
    # a second size) once with the size dynamic, which serves every later length.
    out = run_python_json(PRELUDE + FUNCTION + """
f = torch.compile(fn, backend="tpu")
torch.manual_seed(0)
w = torch.randn(8, 8)
wt = w.to("tpu")
res = {"err": 0.0}
before = metrics()
for n in list(range(3, 23)) + list(range(3, 23)):
    x = torch.randn(2, n, 8)
    res["err"] = max(res["err"], diff(f(x.to("tpu"), wt), fn(x, w)))
res["calls"] = delta(before)
res.update(dynamo_counts())
print(json.dumps(res))
""", env=MODES[mode])
    assert out["err"] < 1e-4, out
    assert (out["frames"], out["graphs"], out["limit_hits"]) == (2, 2, 0), out
    # 40 calls, all compiled; the repeats replay, but for the first size's: Dynamo tries
    # the dynamic graph first, which records it once more.
    assert out["calls"]["compiled_graph_calls"] == 40 and out["calls"]["compiled_replays"] == 19, out


@pytest.mark.parametrize("mode", sorted(MODES))
def test_branching_on_a_dynamic_size_compiles_each_side_once(mode):
    out = run_python_json(PRELUDE + """
def fn(x):
    if x.shape[1] > 4:
        return x.sin() * x.shape[1]
    return x.cos().sum(1, keepdim=True) + x
f = torch.compile(fn, backend="tpu", dynamic=True)
res = {"err": 0.0}
for n in [2, 9, 3, 12, 4, 5, 6, 7, 8, 10, 11, 13, 14, 2, 9]:
    x = torch.randn(3, n)
    res["err"] = max(res["err"], diff(f(x.to("tpu")), fn(x)))
res.update(dynamo_counts())
print(json.dumps(res))
""", env=MODES[mode])
    assert out["err"] < 1e-5, out
    assert (out["frames"], out["graphs"], out["limit_hits"]) == (2, 2, 0), out


TRAIN = """
torch.manual_seed(0)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)
        self.ln = torch.nn.LayerNorm(16)
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 32)

    def forward(self, idx, target):
        b, t = idx.shape
        h = self.ln(self.emb(idx))
        h = self.fc1(h).relu()
        h = h + h.cumsum(1) / t
        logits = self.fc2(h)
        return torch.nn.functional.cross_entropy(logits.reshape(b * t, -1), target.reshape(-1))

ref = Net().double()
net = Net()
net.load_state_dict(ref.state_dict())
net = net.to("tpu")
opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
f = torch.compile(net, backend="tpu", dynamic=True)
step = torch.compile(opt.step, backend="tpu") if COMPILED_STEP else opt.step
g = torch.Generator().manual_seed(1)
res = {"loss": 0.0, "grad": 0.0, "param": 0.0}
before = metrics()
shapes = [(2, 5), (3, 7), (2, 9), (4, 3), (5, 11), (2, 6), (3, 4), (2, 8), (2, 5), (3, 7)]
for b, t in shapes:
    idx = torch.randint(0, 32, (b, t), generator=g)
    tgt = torch.randint(0, 32, (b, t), generator=g)
    opt.zero_grad()
    opt_ref.zero_grad()
    loss = f(idx.to("tpu"), tgt.to("tpu"))
    loss.backward()
    want = ref(idx, tgt)
    want.backward()
    res["loss"] = max(res["loss"], diff(loss, want))
    res["grad"] = max(res["grad"], max(diff(p.grad, q.grad) for p, q in zip(net.parameters(), ref.parameters())))
    step()
    opt_ref.step()
res["param"] = max(diff(p, q) for p, q in zip(net.parameters(), ref.parameters()))
res["calls"] = delta(before)
res.update(dynamo_counts())
print(json.dumps(res))
"""


@pytest.mark.parametrize("mode,step", [(m, "eager") for m in sorted(MODES)] +
                         [("strict", "compiled"), ("fused", "compiled")])
def test_training_steps_over_varying_sizes_match_cpu_and_compile_once(mode, step):
    # The model's forward and backward graphs keep the batch and sequence sizes symbolic;
    # a compiled optimizer step (static sizes) joins each step's program (fuse_steps).
    out = run_python_json(PRELUDE + f"COMPILED_STEP = {step == 'compiled'}\n" + TRAIN, env=MODES[mode])
    assert out["loss"] < 1e-5 and out["grad"] < 1e-5 and out["param"] < 1e-4, out
    # One forward and one backward graph for all ten steps (8 sizes, 2 met again); the
    # compiled step is a graph of its own (its frames: the model's one, then the
    # optimizer's, which Dynamo enters through a few graph-less frames).
    steps = 1 if step == "compiled" else 0
    assert (out["graphs"], out["limit_hits"]) == (1 + steps, 0), out
    assert out["frames"] == 1 or steps, out
    calls = out["calls"]
    assert calls["compiled_graphs"] == 2 + steps and calls["compiled_recompiles"] == 0, out
    assert calls["compiled_graph_calls"] == 20 + 10 * steps, out
    assert calls["compiled_replays"] >= 4 + 9 * steps, out  # the repeated sizes' forward and backward


def test_size_signatures_past_the_bound_drop_the_least_recently_used(monkeypatch):
    # A graph keeps captures for _MAX_SIZES signatures; the one met longest ago is dropped
    # and, met again, records once more (right values either way).
    import torch

    import torch_tpu
    from torch_tpu._internal import compile as compiled
    monkeypatch.setattr(compiled, "_MAX_SIZES", 2)
    torch._dynamo.reset()

    def fn(x):
        return x.sin() * x.shape[0]
    f = torch.compile(fn, backend="tpu", dynamic=True)
    replayed = []
    for n in (3, 4, 3, 5, 3, 4, 5):
        before = torch_tpu.metrics()["compiled_replays"]
        x = torch.randn(n)
        torch.testing.assert_close(f(x.to("tpu")).cpu(), fn(x))
        replayed.append(torch_tpu.metrics()["compiled_replays"] - before)
    # 5 drops 4 (3 was met since), 4 then drops 5: each comes back recording.
    assert replayed == [0, 0, 1, 0, 1, 0, 0], replayed


@pytest.mark.parametrize("mode", sorted(MODES))
def test_serving_threads_at_varying_lengths_share_one_graph(mode):
    # Four threads serve requests of 12 lengths through one compiled function (session
    # 62's case): before, the frame met its recompile limit and served eagerly.
    out = run_python_json(PRELUDE + FUNCTION + """
import threading
f = torch.compile(fn, backend="tpu", dynamic=True)
torch.manual_seed(0)
w = torch.randn(8, 8)
wt = w.to("tpu")
f(torch.randn(2, 3, 8).to("tpu"), wt)  # the first call compiles
errs = []
def serve(k):
    g = torch.Generator().manual_seed(k)
    for i in range(12):
        x = torch.randn(2, 3 + (i * 5 + k) % 12, 8, generator=g)
        errs.append(diff(f(x.to("tpu"), wt), fn(x, w)))
threads = [threading.Thread(target=serve, args=(k,)) for k in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
res = {"err": max(errs), "calls": len(errs)}
res.update(dynamo_counts())
print(json.dumps(res))
""", env=MODES[mode])
    assert out["calls"] == 48 and out["err"] < 1e-4, out
    assert (out["frames"], out["graphs"], out["limit_hits"]) == (1, 1, 0), out
