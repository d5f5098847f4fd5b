"""Strict mode compiles a program it has not loaded yet on the compile pool and queues
its launch, so the calling thread goes on to the next op (a cold first step's one-op
programs compile in parallel and beside the Python that issues them)."""
import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode
from conftest import run_python_json


def _queued():
    return torch_tpu.metrics()["queued_launches"]


def test_new_programs_are_queued_and_compute_what_cpu_does():
    torch.manual_seed(0)
    a, b = torch.randn(37, 53), torch.randn(53, 29)  # shapes no other test compiles
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER):
        before = _queued()
        x, y = a.to("tpu"), b.to("tpu")
        z = ((x @ y).relu() * 3 + 1).softmax(-1).sum(0)  # each new; each reads a queued one
        assert _queued() - before >= 4
        torch.testing.assert_close(z.cpu(), ((a @ b).relu() * 3 + 1).softmax(-1).sum(0))
        # Loaded now: the same ops launch at once.
        before = _queued()
        z2 = ((x @ y).relu() * 3 + 1).softmax(-1).sum(0)
        assert _queued() == before
        torch.testing.assert_close(z2.cpu(), z.cpu())


def test_debug_mode_compiles_on_the_calling_thread():
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        before = _queued()
        v = torch.arange(41.0, device="tpu").cos().cumsum(0)
        assert _queued() == before
        torch.testing.assert_close(v.cpu(), torch.arange(41.0).cos().cumsum(0))


def test_a_failure_behind_a_queued_launch_is_raised_at_the_next_sync_and_nothing_is_lost():
    keep = torch.arange(6.0, device="tpu") * 2
    keep.cpu()
    t, fail = torch_tpu._C._testing_failing_upload([43])
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER):
        before = _queued()
        y = (t * 5).exp2()  # new programs: queued behind their compiles
        assert _queued() - before == 2
        fail("DMA failed")
        with pytest.raises(RuntimeError, match=r"DMA failed"):
            torch.tpu.synchronize()
    torch.tpu.synchronize()  # reported once
    assert keep.cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert (torch.ones(3, device="tpu") * 2).sum().item() == 6.0
    del y


def test_no_compile_threads_compiles_on_the_calling_thread():
    queued, total = run_python_json("""
import json, torch, torch_tpu
x = torch.arange(47.0, device="tpu").sin() + 1
print(json.dumps([torch_tpu.metrics()["queued_launches"], float(x.sum().cpu())]))
""", env={"TPU_COMPILE_THREADS": "0"})
    assert queued == 0
    assert float(total) == pytest.approx(float((torch.arange(47.0).sin() + 1).sum()), abs=1e-3)
