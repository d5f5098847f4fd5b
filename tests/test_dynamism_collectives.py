"""Collectives on tensors with a bounded dynamic dimension (mark_dynamic) in eager
DeferAndFuse: the collective runs on the true-size values, so results equal those of the
same tensors unmarked, and later bounded ops read the collective's result.

(c10d's ops reached the bounded mode's per-op graph builder, which cannot trace a
ProcessGroup argument: dist.all_reduce of such a tensor raised SyntaxError.)
Run as a script, this file is a rank process (see test_distributed.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import launch, assert_check, rank_main  # noqa: E402

HERE = os.path.abspath(__file__)
SUITES = {"bounded": []}
LAUNCHES = {"two": [("fused", "bounded")]}


def check(fn):
    SUITES["bounded"].append(fn)
    return fn


def _marked(rank, n):
    """A [n, 3] tpu tensor marked dynamic along dim 0 (bounds [2, 16]), and its CPU value."""
    import torch
    from torch_tpu import dynamism
    cpu = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3) + 10 * rank
    t = cpu.to("tpu")
    dynamism.mark_dynamic(t, 0, 2, 16)
    return t, cpu


@check
def all_reduce_of_a_bounded_result(rank, world):
    import torch
    import torch.distributed as dist
    for n in (5, 7, 5):  # the second 5 meets the programs the first made
        t, cpu = _marked(rank, n)
        y = t * 2 + 1  # a bounded result
        dist.all_reduce(y)
        got = (y.sum(0) * 1).cpu()
        want = sum(((cpu - 10 * rank + 10 * r) * 2 + 1) for r in range(world)).sum(0)
        torch.testing.assert_close(got, want)
        assert y.shape == (n, 3)


@check
def broadcast_and_all_gather_of_bounded_values(rank, world):
    import torch
    import torch.distributed as dist
    t, cpu = _marked(rank, 6)
    y = t + 0.5
    dist.broadcast(y, src=1)
    torch.testing.assert_close(y.cpu(), cpu - 10 * rank + 10 + 0.5)
    z = t * 3
    outs = [torch.empty(6, 3, device="tpu") for _ in range(world)]
    dist.all_gather(outs, z)
    for r, o in enumerate(outs):
        torch.testing.assert_close(o.cpu(), (cpu - 10 * rank + 10 * r) * 3)


@check
def a_marked_input_reduced_in_place_is_read_fresh(rank, world):
    import torch
    import torch.distributed as dist
    t, cpu = _marked(rank, 5)
    (t * 2).sum().cpu()  # the padded copy of t is made
    dist.all_reduce(t)
    want = sum(cpu - 10 * rank + 10 * r for r in range(world))
    torch.testing.assert_close((t * 1).cpu(), want)


if __name__ == "__main__":
    rank_main(SUITES, LAUNCHES, sys.argv)


@pytest.fixture(scope="module")
def two_ranks():
    return launch("two", 2, script=HERE)


@pytest.mark.parametrize("name", [f"fused/{fn.__name__}" for fn in SUITES["bounded"]])
def test_collectives_on_bounded_tensors(two_ranks, name):
    assert_check(two_ranks, name)
