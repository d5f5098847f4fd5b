"""DeferAndFuse keeps a pending graph per device and recording lane: each thread's default
stream is its own lane, and autograd replays a backward on its forward's stream, so a
thread's backward joins that thread's graph. With one graph per device, threads sharing
a device (an inference server's request threads, a training thread per model) recorded
into the same graph in whatever order they ran, so its programs depended on timing:
3 threads training on one device compiled 50 graphs in 30 steps (still compiling at the
last), against 9 by step 5 with lanes. Values must stay CPU's."""
import pytest

from conftest import run_python_json

ENV = {"TPU_DEFER_AND_FUSE": "1", "TPU_LAUNCH_BLOCKING": "0", "TPU_COMPILE_CACHE": "0"}

# Two threads take turns by a schedule that differs every round: thread A records `a` of
# its ops, then B records `b` of its, and so on; each reads its result at the end.
INTERLEAVED = r"""
import json, threading, torch, torch_tpu
K, ROUNDS = 12, 5
turn = threading.Condition(); state = {"who": 0}
def ops(x, i):
    return torch.tanh(x * (1.0 + 0.01 * i)) + 0.5 if i % 2 else torch.sin(x) * 1.5 - 0.25
def worker(me, chunks, x, out):
    done = 0
    for n in chunks[me]:
        with turn:
            turn.wait_for(lambda: state["who"] == me)
            for i in range(done, min(K, done + n)):
                x = ops(x, i)
            done = min(K, done + n)
            state["who"] = 1 - me
            turn.notify_all()
    out[me] = x.cpu()  # reads its own value: its graph runs
def reference(x):
    for i in range(K):
        x = ops(x, i)
    return x
compiles, errs = [], []
for r in range(ROUNDS):
    a = 1 + r % 4; b = 1 + (r * 3) % 5  # a new interleaving each round
    chunks = {0: [a] * K, 1: [b] * K}
    xs = [torch.linspace(-1, 1, 32) * (k + 1) for k in range(2)]
    out = {}; state["who"] = 0
    ts = [threading.Thread(target=worker, args=(k, chunks, xs[k].to("tpu"), out)) for k in range(2)]
    [t.start() for t in ts]; [t.join() for t in ts]
    torch.tpu.synchronize()
    compiles.append(torch_tpu.metrics()["graph_compiles"])
    errs.append(max((out[k] - reference(xs[k])).abs().max().item() for k in range(2)))
print(json.dumps({"compiles": compiles, "err": max(errs)}))
"""


def test_threads_interleaving_on_one_device_do_not_cut_each_others_graphs():
    r = run_python_json(INTERLEAVED, env=ENV, timeout=300)
    assert r["err"] < 1e-5, r
    # Each thread's graph is its own ops, whatever the order they ran in: the first round
    # compiles them, no later round compiles anything.
    assert r["compiles"][0] >= 1 and r["compiles"][-1] == r["compiles"][0], r


TRAINING = r"""
import copy, json, threading, torch, torch.nn as nn, torch_tpu
N, STEPS, WARM = 3, 16, 6
bar = threading.Barrier(N); marks = {}
def make(i):
    torch.manual_seed(i)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
models = [make(i) for i in range(N)]  # here: threads seeding the global generator would race
def train(i, dev, out):
    m = copy.deepcopy(models[i]).to(dev); opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(100 + i)
    xs = [torch.randn(8, 16, generator=g) for _ in range(4)]
    losses = []
    for s in range(STEPS):
        if dev != "cpu" and s == WARM:  # every thread warm: count from here
            bar.wait()
            if i == 0:
                torch.tpu.synchronize(); marks["warm"] = torch_tpu.metrics()["graph_compiles"]
            bar.wait()
        loss = (m(xs[s % 4].to(dev)) ** 2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        losses.append(loss.item())
    out[i] = losses
ref, out = {}, {}
for i in range(N):
    train(i, "cpu", ref)
ts = [threading.Thread(target=train, args=(i, "tpu", out)) for i in range(N)]
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps({
    "err": max(abs(a - b) for i in range(N) for a, b in zip(out[i], ref[i])),
    "warm": marks["warm"], "last": torch_tpu.metrics()["graph_compiles"],
}))
"""


def test_training_threads_sharing_a_device_settle_on_their_graphs():
    r = run_python_json(TRAINING, env=ENV, timeout=300)
    assert r["err"] < 1e-5, r
    # Every thread's steps repeat the same graphs once warm (before lanes: 26 compiles by
    # step 10 and 50 by step 30, a new one almost every step).
    assert r["warm"] >= 1 and r["warm"] == r["last"], r


STREAMS = r"""
import json, threading, torch, torch_tpu
res = {"main": torch.tpu.current_stream().stream_id,
       "main_default": torch.tpu.default_stream().stream_id}
def other():
    res["thread"] = torch.tpu.current_stream().stream_id
    res["thread_default_is_current"] = torch.tpu.current_stream() == torch.tpu.default_stream()
t = threading.Thread(target=other); t.start(); t.join()
# A side stream made by this thread stays in its lane: work on it joins the main graph
# (one pending graph, one fused program).
x = torch.ones(64, device="tpu")
side = torch.tpu.Stream()
y = x * 2
with torch.tpu.stream(side):
    z = y + 1
w = z * 3
res["pending_graphs"] = torch_tpu._C._pending_graphs()
g0 = torch_tpu.metrics()["fused_graphs"]
res["value"] = w.sum().item()
res["graphs_run"] = torch_tpu.metrics()["fused_graphs"] - g0
print(json.dumps(res))
"""


def test_each_thread_has_its_own_default_stream_and_side_streams_stay_in_their_lane():
    r = run_python_json(STREAMS, env=ENV, timeout=120)
    assert r["main"] == 0 and r["main_default"] == 0, r
    assert r["thread"] != 0 and r["thread_default_is_current"], r
    assert r["value"] == 64 * 9, r
    assert r["pending_graphs"] == 1 and r["graphs_run"] == 1, r


@pytest.mark.parametrize("mode", ["strict", "debug"])
def test_other_modes_are_unchanged_by_lanes(mode):
    env = dict(ENV, TPU_DEFER_AND_FUSE="0", TPU_LAUNCH_BLOCKING="1" if mode == "debug" else "0")
    r = run_python_json(TRAINING, env=env, timeout=300)
    assert r["err"] < 1e-5 and r["last"] == 0 and r["warm"] == 0, r
