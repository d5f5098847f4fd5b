"""Strict (asynchronous), Debug (launch-blocking) and DeferAndFuse eager modes."""
import os

import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode
from conftest import run_python


def test_default_is_strict_and_switching_works():
    # The suite also runs with TPU_DEFER_AND_FUSE=1 / TPU_LAUNCH_BLOCKING=1 selecting the mode.
    start = torch_tpu.get_eager_mode()
    if not (os.environ.get("TPU_DEFER_AND_FUSE") == "1" or os.environ.get("TPU_LAUNCH_BLOCKING") == "1"):
        assert start == EagerMode.DEFER_NEVER
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        assert torch_tpu.get_eager_mode() == EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
        assert (torch.ones(3, device="tpu") * 2).sum().item() == 6.0
        with torch_tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE):
            assert torch_tpu.get_eager_mode() == EagerMode.DEFER_AND_FUSE
            assert (torch.ones(3, device="tpu") * 2).sum().item() == 6.0
        assert torch_tpu.get_eager_mode() == EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    assert torch_tpu.get_eager_mode() == start
    from torch_tpu._internal import execution_mode
    execution_mode.eager_mode = EagerMode.DEFER_AND_FUSE
    assert torch_tpu.get_eager_mode() == EagerMode.DEFER_AND_FUSE
    execution_mode.eager_mode = start
    assert torch_tpu.get_eager_mode() == start


def test_env_selects_debug_mode():
    r = run_python("import torch, torch_tpu; print(torch_tpu.get_eager_mode().name)",
                   env={"TPU_LAUNCH_BLOCKING": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("DEFER_NEVER_AND_LAUNCH_BLOCKING")


def test_strict_returns_before_the_device_finishes():
    # A long chain of matmuls (about 10 GFLOP): Python gets the result tensor back while
    # the device is still running it, and an event recorded after the chain is not done.
    import time
    x = torch.randn(512, 512, device="tpu") / 23
    for _ in range(3):
        (x @ x).sum().item()  # compile and warm up
    torch.tpu.synchronize()
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER):  # whatever the session's mode
        t0 = time.perf_counter()
        y = x
        for _ in range(40):
            y = y @ x
        done = torch.tpu.Event()
        done.record()
        launched = time.perf_counter() - t0
        busy = not done.query()
        torch.tpu.synchronize()
    finished = time.perf_counter() - t0
    assert busy, f"the chain was done {launched * 1e3:.1f} ms after it started"
    assert done.query()
    assert launched < finished / 2, (launched, finished)
    torch.testing.assert_close(y.cpu(), torch.linalg.matrix_power(x.cpu().double(), 41).float(),
                               rtol=1e-3, atol=1e-5)
    # Debug mode waits per op: the result exists when the call returns.
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        z = x @ x
        assert torch_tpu._C.is_materialized(z)


def test_event_and_stream_cover_launches_queued_behind_a_compile():
    # Strict queues the launches of a program it has not loaded yet behind its compile:
    # an event recorded after them (and the stream) is not done until they ran.
    x = torch.randn(509, 509, device="tpu") / 23  # a shape no other test compiles
    torch.tpu.synchronize()
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER):
        y = x
        for _ in range(40):
            y = y @ x
        done = torch.tpu.Event()
        done.record()
        busy = not done.query()
        stream_busy = not torch.tpu.current_stream().query()
        torch.tpu.synchronize()
    assert busy and stream_busy, (busy, stream_busy)
    assert done.query() and torch.tpu.current_stream().query()
    torch.testing.assert_close(y.cpu(), torch.linalg.matrix_power(x.cpu().double(), 41).float(),
                               rtol=1e-3, atol=1e-5)


def test_results_match_across_modes():
    a = torch.randn(16, 16)
    ref = (a.to("tpu").softmax(-1) @ a.to("tpu")).cpu()
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        dbg = (a.to("tpu").softmax(-1) @ a.to("tpu")).cpu()
    assert torch.equal(ref, dbg)
    a64 = a.double()
    torch.testing.assert_close(ref.double(), a64.softmax(-1) @ a64, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE])
def test_asynchronous_error_is_raised_at_the_next_sync_with_the_op_name(mode):
    t, fail = torch_tpu._C._testing_failing_upload([4])
    with torch_tpu.set_eager_mode(mode):  # (Debug mode would wait for the upload here)
        y = t * 2             # launched (or recorded): waits on the upload
        fail("DMA failed")    # the device side fails after the launch returned
        with pytest.raises(RuntimeError, match=r"aten::mul\.Tensor.*DMA failed|DMA failed.*aten::mul"):
            torch.tpu.synchronize()
    torch.tpu.synchronize()   # reported once
    assert (torch.ones(3, device="tpu") * 2).sum().item() == 6.0
    del y


def test_debug_mode_raises_at_the_failing_op():
    # The in-place add compiles the same program text first: errors still name the
    # op that ran, not the one that compiled the shared executable.
    torch.zeros(4, device="tpu").add_(1).cpu()
    t, fail = torch_tpu._C._testing_failing_upload([4])
    fail("DMA failed")
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        with pytest.raises(RuntimeError, match=r"aten::add\.Tensor.*DMA failed"):
            t + 1
        assert (torch.ones(3, device="tpu") + 1).sum().item() == 6.0


def test_devices_list_their_memories():
    kinds = torch_tpu._C.memory_kinds(0)
    assert "device" in kinds and len(set(kinds)) == len(kinds), kinds
