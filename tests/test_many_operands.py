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


# torch.randn drawn before the normals were computed elementwise (torch.manual_seed(0),
# 5 values): the values stay the same, for reproducibility.
RANDN_SEED0_BITS = {
    torch.float32: (torch.int32, [-1079317244, -1083341157, 1062801359, 1054950762, -1087297091]),
    torch.float64: (torch.int64, [4593893514242462949, -4616466737921802643, -4624180424664518647,
                                  -4613117540453153705, -4620440517161895934]),
    torch.bfloat16: (torch.int16, [-16469, -16530, 16217, 16097, -16591]),
}


@pytest.mark.parametrize("dtype", list(RANDN_SEED0_BITS))
def test_randn_values_unchanged(dtype):
    torch.manual_seed(0)
    a = torch.randn(5, dtype=dtype, device=D).cpu()
    as_int, bits = RANDN_SEED0_BITS[dtype]
    assert a.view(as_int).tolist() == bits


def test_randn_needs_only_its_output_in_device_memory():
    torch.tpu.synchronize()
    gc.collect()
    free, total = torch.tpu.mem_get_info()
    used = total - free
    torch.tpu.set_per_process_memory_fraction((used + 24_000_000) / total)
    try:
        r = torch.randn(2_500_000, device=D)  # 10 MB; took 30 MB
        assert abs(r.mean().item()) < 0.01 and 0.99 < r.std().item() < 1.01
        del r
        n = torch.empty(2_500_000, device=D).normal_(1.0, 2.0)
        assert abs(n.mean().item() - 1.0) < 0.02
        del n
    finally:
        torch.tpu.set_per_process_memory_fraction(1.0)


def test_memory_allocated_returns_to_baseline_after_scalar_ops():
    x = torch.ones(1000, device=D)
    torch.tpu.synchronize()
    gc.collect()
    before = torch.tpu.memory_allocated()
    stats_before = torch.tpu.memory_stats()["allocated_bytes.all.current"]
    for i in range(50):
        y = x * (i + 0.37251)
        del y
    gc.collect()
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == before
    assert torch.tpu.memory_stats()["allocated_bytes.all.current"] == stats_before
    assert torch_tpu.metrics()["scalar_cache_bytes"] > 0
