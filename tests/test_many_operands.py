"""Ops over many operands (stack/cat of thousands of tensors), the device memory that
random normals take, and memory_allocated() with the scalar cache."""
import gc
import time

import pytest
import torch

import torch_tpu  # noqa: F401

D = "tpu"


def _compile_seconds():
    m = torch_tpu.metrics()
    return m.get("op_compile_seconds", 0.0) + m.get("graph_compile_seconds", 0.0)


@pytest.mark.parametrize("op", ["stack", "cat"])
def test_join_of_thousands_of_small_tensors_compiles_quickly(op):
    # One concatenate of n operands took XLA about n^2 to compile (n=2000: 10-30 s).
    n = 3001  # an n no other test uses, so that its program is compiled here
    ts = [torch.tensor([float(i)], device=D) for i in range(n)]
    torch.tpu.synchronize()
    c0 = _compile_seconds()
    t0 = time.time()
    out = getattr(torch, op)(ts)
    torch.tpu.synchronize()
    took = time.time() - t0
    assert out.shape == ((n, 1) if op == "stack" else (n,))
    assert torch.equal(out.cpu().view(-1), torch.arange(n, dtype=torch.float32))
    assert _compile_seconds() - c0 < 6.0 and took < 12.0, took


def test_stack_of_many_along_inner_dim_and_mixed_dtypes():
    n = 700
    ts = [torch.full((2, 3), i, dtype=torch.int32 if i % 2 else torch.float32, device=D) for i in range(n)]
    ref = torch.stack([t.cpu() for t in ts], dim=1)
    out = torch.stack(ts, dim=1)
    assert out.dtype == ref.dtype and torch.equal(out.cpu(), ref)
    ref = torch.cat([t.cpu() for t in ts], dim=1)
    assert torch.equal(torch.cat(ts, dim=1).cpu(), ref)
