"""DeferAndFuse cuts an RNN's unrolled steps into graphs of a bounded number of steps.

Unrolled into one graph, a 2-layer LSTM's train step compiled in time that grew faster
than the sequence (155 s at 64 steps, Strict 1.7 s): the graphs now hold at most a few
cell calls, repeat, and compile once per kind, whatever the length. The largest graph's
size (in the compiler's instructions) is the measure: it no longer grows with the length."""
import functools

import pytest

from conftest import run_python_json

# A 2-layer LSTM or GRU (batch_first) and a linear head, 3 SGD steps on tpu in
# DeferAndFuse and on CPU: the losses, the largest fused graph and the flush reasons.
PROBE = """
import json, torch, torch.nn as nn, torch_tpu
kind, steps = KIND, STEPS

def train(device):
    torch.manual_seed(0)
    rnn = getattr(nn, kind)(16, 32, num_layers=2, batch_first=True).to(device)
    head = nn.Linear(32, 1).to(device)
    params = list(rnn.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    x = torch.randn(3, steps, 16).to(device)
    losses = []
    for _ in range(3):
        out, _ = rnn(x)
        loss = head(out).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in params]

losses, params = train("tpu")
cpu_losses, cpu_params = train("cpu")
m = torch_tpu.metrics()
print(json.dumps({"losses": losses, "cpu_losses": cpu_losses,
                  "param_diff": max((a - b).abs().max().item() for a, b in zip(params, cpu_params)),
                  "largest": m["largest_graph_instructions"],
                  "step_cuts": m["flushes"].get("recurrent step bound", 0),
                  "fallbacks": sum(m["fallbacks"].values())}))
"""


@functools.lru_cache(maxsize=None)
def probe(kind, steps):
    code = PROBE.replace("KIND, STEPS", f"{kind!r}, {steps}")
    return run_python_json(code, env={"TPU_DEFER_AND_FUSE": "1", "TPU_LAUNCH_BLOCKING": "0",
                                      "TPU_COMPILE_CACHE": "0"}, timeout=600)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_the_largest_graph_does_not_grow_with_the_sequence(kind):
    short, long = probe(kind, 12), probe(kind, 36)
    # Unrolled into one graph, 3x the steps made a graph about 3x as large.
    assert long["largest"] <= 1.1 * short["largest"], (short["largest"], long["largest"])
    assert long["step_cuts"] > short["step_cuts"] > 0


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("steps", [12, 36])
def test_values_equal_cpu(kind, steps):
    got = probe(kind, steps)
    assert got["fallbacks"] == 0
    assert max(abs(a - b) for a, b in zip(got["losses"], got["cpu_losses"])) < 1e-5, got
    assert got["param_diff"] < 1e-5, got
