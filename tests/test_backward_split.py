"""DeferAndFuse runs a training step's graph as two programs, its forward and the rest
(backward, update), when its ops are small: a loss read waits for the forward alone, and
the rest runs while the host records the next step. Values equal the unsplit graph's."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from torch_tpu import EagerMode
from conftest import ROOT, no_fallbacks

sys.path.insert(0, os.path.join(ROOT, "examples"))
from gpt import GPT, batches  # noqa: E402

FUSED = EagerMode.DEFER_AND_FUSE


def executions():
    return torch_tpu.metrics()["executions"]


def train(split, make_model, data, accumulate=1, steps=5):
    """Losses, final parameters and executions per step, training in DeferAndFuse."""
    before = torch_tpu._C._split_at_backward()
    torch_tpu._C._set_split_at_backward(split)
    try:
        torch.manual_seed(0)
        with torch_tpu.set_eager_mode(FUSED), no_fallbacks():
            model = make_model().to("tpu")
            # SGD: Adam would scale the rounding noise of gradients that are zero in
            # exact arithmetic (attention's key bias) up to whole steps.
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            losses, execs = [], []
            for i in range(steps):
                e0 = executions()
                opt.zero_grad()
                for k in range(accumulate):
                    x, y = data[(i * accumulate + k) % len(data)]
                    loss = model(x.to("tpu"), y.to("tpu"))
                    loss.backward()
                opt.step()
                losses.append(loss.item())
                execs.append(executions() - e0)
            params = [p.detach().cpu() for p in model.parameters()]
    finally:
        torch_tpu._C._set_split_at_backward(before)
    return losses, params, execs


class SmallGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.gpt = GPT(vocab=64, d_model=32, n_heads=4, n_layers=2, seq=16)

    def forward(self, x, y):
        return self.gpt(x, y)[1]


GPT_DATA = list(batches(vocab=64, seq=16, batch=2, steps=4))


def test_a_small_step_runs_as_forward_and_rest_with_the_same_values():
    got, got_params, got_execs = train(True, SmallGPT, GPT_DATA)
    want, want_params, want_execs = train(False, SmallGPT, GPT_DATA)
    assert got_execs[1:] == [2] * 4 and want_execs[1:] == [1] * 4, (got_execs, want_execs)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)
    for a, b in zip(got_params, want_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_accumulated_backwards_split_once_and_match():
    # Two forward/backward pairs before each update: each pair's graph is cut where its
    # backward ends (test_accumulation_cuts.py) and runs as its forward and its backward,
    # the update alone; values match the unsplit graph (one program a step).
    got, got_params, got_execs = train(True, SmallGPT, GPT_DATA, accumulate=2, steps=3)
    want, want_params, want_execs = train(False, SmallGPT, GPT_DATA, accumulate=2, steps=3)
    assert got_execs[1:] == [5, 5] and want_execs[1:] == [1, 1], (got_execs, want_execs)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)
    for a, b in zip(got_params, want_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 16 * 16, 10)

    def forward(self, x, y):
        h = F.max_pool2d(F.relu(self.c(x)), 2)
        return F.cross_entropy(self.fc(h.flatten(1)), y)


def test_a_step_of_large_ops_runs_whole():
    # Each op leaves the backward far more than 16 KiB: the device bounds the step, and
    # handing those values over would cost more than the overlap gains.
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g))]
    losses, _, execs = train(True, ConvNet, data, steps=3)
    assert execs[1:] == [1, 1], execs
    torch.manual_seed(0)
    cpu = ConvNet()
    opt = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        loss = cpu(*data[0])
        loss.backward()
        opt.step()
    assert abs(loss.item() - losses[-1]) < 1e-4

