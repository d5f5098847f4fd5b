"""DeferAndFuse cuts gradient accumulation at each micro-step's end: a step of ACC
forward/backward pairs before its update runs as micro-step graphs that repeat (the 2nd..
last hit the fused-graph cache) and the update, instead of one graph holding ACC copies
that XLA compiles whole. A step without accumulation keeps its graphs (the forward, then
backward and update as one program). Values equal Strict's."""
import torch
import torch.nn as nn

import torch_tpu
from torch_tpu import EagerMode
from conftest import no_fallbacks

FUSED, STRICT = EagerMode.DEFER_AND_FUSE, EagerMode.DEFER_NEVER
COUNTS = ("fused_graphs", "fused_graph_cache_hits", "executions")


def counts():
    m = torch_tpu.metrics()
    return {**{k: m[k] for k in COUNTS}, "micro-step": m["flushes"].get("micro-step", 0)}


def train(acc, dims, mode=FUSED, device="tpu", steps=3, running=False, clip=True):
    """Losses, final parameters and per-step metric counts (new graphs: flushed graphs
    the in-memory cache did not hold) of `steps` AdamW steps of `acc` micro-steps."""
    d_in, d_hidden, d_out, batch = dims
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_out)).to(device)
    data = torch.randn(steps * acc, batch, d_in, generator=torch.Generator().manual_seed(1))
    losses, per_step = [], []
    with torch_tpu.set_eager_mode(mode), no_fallbacks():
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step in range(steps):
            before = counts()
            total = torch.zeros((), device=device) if running else None
            for k in range(acc):
                x = data[step * acc + k].to(device)
                loss = model(x).square().mean() / acc
                loss.backward()
                if running:
                    total += loss.detach()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            losses.append((total if running else loss).item())
            after = counts()
            d = {k: after[k] - before[k] for k in after}
            d["new_graphs"] = d.pop("fused_graphs") - d.pop("fused_graph_cache_hits")
            per_step.append(d)
    return losses, [p.detach().cpu() for p in model.parameters()], per_step


def assert_same(a, b, rtol=1e-5, atol=1e-6):
    torch.testing.assert_close(torch.tensor(a[0]), torch.tensor(b[0]), rtol=rtol, atol=atol)
    for x, y in zip(a[1], b[1]):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol)


def test_more_micro_steps_compile_no_more_graphs():
    dims = (12, 20, 6, 5)
    _, _, two = train(2, dims)
    _, _, four = train(4, dims)  # its graphs are the 2-step run's: nothing new
    assert [s["new_graphs"] for s in four] == [0, 0, 0], (two, four)
    # fwd, first backward, fwd, accumulating backward, clip + update
    assert [s["executions"] for s in two] [1:] == [5, 5], two
    assert [s["executions"] for s in four][1:] == [9, 9], four
    assert [s["micro-step"] for s in four] == [4, 4, 4], four


def test_steady_steps_compile_nothing():
    for acc, dims in ((1, (7, 9, 3, 4)), (2, (7, 11, 3, 4)), (4, (7, 13, 3, 4))):
        _, _, per_step = train(acc, dims, steps=4)
        assert per_step[0]["new_graphs"] > 0
        assert [s["new_graphs"] for s in per_step[1:]] == [0, 0, 0], (acc, per_step)


def test_values_equal_strict_and_cpu():
    for acc in (1, 2, 4):
        dims = (6, 10, 4, 3)
        fused = train(acc, dims)
        assert_same(fused, train(acc, dims, mode=STRICT))
        assert_same(fused, train(acc, dims, device="cpu"), rtol=1e-4, atol=1e-5)


def test_values_equal_uncut_graph():
    # TPU_SPLIT_AT_BACKWARD=0 keeps a step's graph whole: the same values in one graph.
    dims = (5, 9, 2, 6)
    cut = train(3, dims)
    before = torch_tpu._C._split_at_backward()
    torch_tpu._C._set_split_at_backward(False)
    try:
        whole = train(3, dims)
    finally:
        torch_tpu._C._set_split_at_backward(before)
    assert [s["executions"] for s in whole[2]][1:] == [1, 1] and [s["micro-step"] for s in whole[2]] == [0] * 3
    assert [s["executions"] for s in cut[2]][1:] == [7, 7]
    assert_same(cut, whole)


def test_a_running_loss_between_micro_steps_still_cuts():
    # zeros made before the first forward, `total += loss` after each backward: the
    # forward's start is its first call reading values, and the graphs still repeat.
    dims = (9, 14, 5, 3)
    _, _, two = train(2, dims, running=True)
    four = train(4, dims, running=True)
    assert [s["new_graphs"] for s in four[2]] == [0, 0, 0], (two, four[2])
    assert [s["micro-step"] for s in four[2]] == [4, 4, 4], four[2]
    assert_same(four, train(4, dims, running=True, mode=STRICT))


def test_a_step_without_accumulation_runs_as_before():
    # The forward, then backward, clip and update as one program: no micro-step cut, as
    # clip and update read the gradients (also with a running loss after the backward).
    for running, clip in ((False, True), (True, True), (False, False)):
        _, _, per_step = train(1, (8, 15, 2, 7), running=running, clip=clip, steps=4)
        assert [s["executions"] for s in per_step[1:]] == [2, 2, 2], (running, clip, per_step)
        assert [s["micro-step"] for s in per_step] == [0] * 4, per_step


def test_accumulating_micro_steps_hold_one_micro_steps_activations():
    # Accumulation exists to bound memory by one micro-step's activations: as one graph,
    # the ACC micro-steps' activations were live together (ACC=4: 2.7x ACC=1's peak).
    def peak(acc):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                              nn.Linear(1024, 64)).to("tpu")
        data = torch.randn(3 * acc, 256, 64, generator=torch.Generator().manual_seed(2))
        with torch_tpu.set_eager_mode(FUSED):
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            for step in range(3):
                if step == 2:
                    torch.tpu.synchronize()
                    torch.tpu.reset_peak_memory_stats()
                for k in range(acc):
                    (model(data[step * acc + k].to("tpu")).square().mean() / acc).backward()
                opt.step()
                opt.zero_grad()
            torch.tpu.synchronize()
        return torch.tpu.max_memory_allocated()

    one, four = peak(1), peak(4)
    assert four < 1.3 * one, (one, four)
