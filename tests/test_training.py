"""Models train on tpu exactly as on CPU: same losses, no CPU fallbacks, and the
compile count stops growing once every op signature has been seen."""
import os
import sys

import pytest
import torch
import torch.nn as nn

import torch_tpu
from conftest import ROOT, no_fallbacks

sys.path.insert(0, os.path.join(ROOT, "examples"))
from gpt import GPT, batches  # noqa: E402


def train(make_model, data, device, steps, opt_name):
    torch.manual_seed(0)
    model = make_model().to(device)
    if opt_name == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses, compiles = [], []
    for x, y in data[:steps]:
        out = model(x.to(device), y.to(device))
        loss = out[1] if isinstance(out, tuple) else out
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        compiles.append(torch_tpu.metrics().get("compiles", 0))
    return losses, compiles


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(),
                                 nn.Linear(64, 4))

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


def mlp_data(steps):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        x = torch.randn(32, 16, generator=g)
        out.append((x, (x[:, :4].argmax(1))))
    return out


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_mlp_matches_cpu(opt_name):
    data = mlp_data(20)
    ref, _ = train(MLP, data, "cpu", 20, opt_name)
    with no_fallbacks():
        got, compiles = train(MLP, data, "tpu", 20, opt_name)
    assert max(abs(a - b) for a, b in zip(ref, got)) < 1e-4, (ref, got)
    assert ref[-1] < ref[0]
    assert compiles[-1] == compiles[4], "programs were still compiling after warm-up"


def test_gpt_matches_cpu_with_no_fallbacks_and_bounded_compiles():
    data = list(batches(vocab=64, seq=32, batch=8, steps=20))
    make = lambda: GPT(vocab=64, d_model=64, n_heads=4, n_layers=2, seq=32)  # noqa: E731
    ref, _ = train(make, data, "cpu", 20, "adamw")
    m0 = torch_tpu.metrics()
    with no_fallbacks():
        got, compiles = train(make, data, "tpu", 20, "adamw")
    m1 = torch_tpu.metrics()
    assert max(abs(a - b) for a, b in zip(ref, got)) < 1e-4, (ref, got)
    assert got[-1] < got[0] * 0.6
    new_compiles = m1["compiles"] - m0["compiles"]
    assert new_compiles < 400
    assert compiles[-1] == compiles[4], "programs were still compiling after warm-up"
    print(f"GPT: compiles={new_compiles} executions={m1['executions'] - m0['executions']} "
          f"signature_hits={m1['signature_hits'] - m0['signature_hits']} "
          f"misses={m1['signature_misses'] - m0['signature_misses']}")
