"""Copies into views of one storage queued and run as one program at the storage's next
use, and copies out of views into whole storages run together per source (what DDP's
bucket copies do). Every check compares with the same ops on CPU, in the current mode
(run also with TPU_DEFER_AND_FUSE=1 and TPU_LAUNCH_BLOCKING=1); execution counts only
in Strict, where each program is one execution."""
import pytest
import torch

import torch_tpu


def strict():
    return torch_tpu.get_eager_mode() == torch_tpu.EagerMode.DEFER_NEVER


def executions():
    torch.tpu.synchronize()
    return torch_tpu.metrics()["executions"]


def both(fn):
    """fn(device) on CPU and tpu; the tpu results, read back, must equal CPU's exactly."""
    cpu = fn("cpu")
    tpu = fn("tpu")
    cpu = cpu if isinstance(cpu, (list, tuple)) else [cpu]
    tpu = tpu if isinstance(tpu, (list, tuple)) else [tpu]
    for a, b in zip(cpu, tpu):
        b = b.cpu()
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b), (a, b)


def grads(device, sizes=(5, 3, 7, 1, 4)):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(n, generator=g).to(device) for n in sizes]


def test_disjoint_writes_into_a_bucket_run_as_one_program():
    def f(device):
        gs = grads(device)
        bucket = torch.zeros(sum(g.numel() for g in gs), device=device)
        off = 0
        for g in gs:
            bucket[off:off + g.numel()].copy_(g)
            off += g.numel()
        return bucket
    both(f)
    gs = grads("tpu")
    bucket = torch.zeros(20, device="tpu")
    bucket.cpu()  # written: the batch below reads it
    e0 = executions()
    off = 0
    for g in gs:
        bucket[off:off + g.numel()].copy_(g)
        off += g.numel()
    e1 = executions()
    out = bucket.cpu()
    if strict():
        assert e1 - e0 == 0  # queued
        assert executions() - e1 == 1  # one program for the five copies (was five)
    assert torch.equal(out, torch.cat([g.cpu() for g in gs]))


def test_out_writes_into_a_bucket_are_queued_like_copies():
    # DDP's default Reducer divides each gradient into its bucket view (mul.out): each
    # op writes a fresh value, and the writes join the bucket's queue (one program at the
    # bucket's next use) instead of each rewriting the whole bucket.
    scale = torch.tensor(0.5, dtype=torch.float64)  # a wrapped CPU scalar, as the Reducer's

    def f(device):
        gs = grads(device)
        bucket = torch.zeros(20, device=device)
        off = 0
        rets = []
        for g in gs:
            view = bucket[off:off + g.numel()]
            rets.append(torch.mul(g, scale, out=view) is view)
            off += g.numel()
        assert all(rets)
        mid = bucket.clone()
        torch.add(gs[0], 1, out=bucket[2:7])  # overlaps earlier writes: applied in order
        torch.mul(gs[1], 2, out=bucket.view(4, 5)[:, 1])  # strided view
        floats = torch.zeros(6, device=device)
        torch.mul(torch.arange(3, device=device), 3, out=floats[1:4])  # int64 values, converted
        return [mid, bucket, floats]
    both(f)
    gs = grads("tpu")
    bucket = torch.zeros(20, device="tpu")
    bucket.cpu()
    e0 = executions()
    off = 0
    for g in gs:
        torch.mul(g, scale, out=bucket[off:off + g.numel()])
        off += g.numel()
    e1 = executions()
    out = bucket.cpu()
    if strict():
        assert e1 - e0 == len(gs)  # each op's own value, written nowhere yet
        assert executions() - e1 == 1  # the five writes into the bucket: one program
    assert torch.equal(out, torch.cat([g.cpu() * 0.5 for g in gs]))


def test_a_refused_out_write_leaves_the_bucket_as_it_was():
    bucket = torch.arange(8.0, device="tpu")
    ints = torch.zeros(8, dtype=torch.int64, device="tpu")
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.mul(bucket[:4], 0.5, out=ints[2:6])
    bucket[4:].copy_(torch.ones(4, device="tpu"))
    assert ints.cpu().tolist() == [0] * 8
    assert bucket.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 1.0, 1.0, 1.0, 1.0]


def test_overlapping_writes_apply_in_order():
    def f(device):
        a = torch.arange(12.0, device=device)
        a[0:6].copy_(torch.full((6,), -1.0, device=device))
        a[4:9].copy_(torch.full((5,), -2.0, device=device))
        a[::3].copy_(torch.tensor([10.0, 20.0, 30.0, 40.0], device=device))
        a.view(3, 4)[:, 1].copy_(torch.tensor([7.0], device=device))  # broadcast
        return a
    both(f)


def test_reads_in_between_see_each_write():
    def f(device):
        a = torch.zeros(8, device=device)
        outs = []
        a[1:3].copy_(torch.ones(2, device=device))
        outs.append(a.clone())
        s = a.sum()  # a lowered op reading the storage
        a[2:5].copy_(torch.full((3,), 4.0, device=device))
        outs.append(a[1:4].clone())
        a.add_(1)  # an in-place op over queued writes
        a[0:1].copy_(torch.tensor([9.0], device=device))
        outs += [s, a]
        return outs
    both(f)


def test_views_of_another_dtype_write_through_the_bytes():
    def f(device):
        a = torch.arange(8.0, device=device)
        a.view(torch.int32)[2:4].copy_(torch.tensor([1065353216, -1], dtype=torch.int32, device=device))
        a[5:7].copy_(torch.tensor([3, 4], dtype=torch.int64, device=device))  # converted
        b = torch.zeros(4, dtype=torch.float64, device=device)
        b.view(torch.float32)[1:4].copy_(torch.tensor([1.5, 2.5, 3.5], device=device))
        b.view(torch.int64)[3:4].copy_(torch.tensor([7], dtype=torch.int64, device=device))
        return [a.view(torch.int32), b.view(torch.int64)]
    both(f)


def test_writes_into_a_storage_never_written_read_zeros_elsewhere():
    def f(device):
        a = torch.empty(10, device=device) if device == "tpu" else torch.zeros(10)
        a[3:5].copy_(torch.ones(2, device=device))
        a[7:8].copy_(torch.full((1,), 2.0, device=device))
        return a
    both(f)


def test_a_whole_write_replaces_queued_ones():
    def f(device):
        a = torch.zeros(6, device=device)
        a[1:3].copy_(torch.ones(2, device=device))
        a.copy_(torch.arange(6.0, device=device))
        a[4:].copy_(torch.full((2,), 5.0, device=device))
        return a
    both(f)


def test_copies_from_views_read_the_source_at_copy_time():
    def f(device):
        src = torch.arange(10.0, device=device)
        src.cpu()
        dst = torch.zeros(10, device=device)
        dst[0:4].copy_(src[6:10])  # a view read where the queued write runs
        dst[4:6].copy_(src.view(2, 5)[:, 0])
        src.mul_(100)  # after the copies: must not show in dst
        dst[6:8].copy_(dst[0:2])  # from the same storage, queued writes before it
        outs = [dst.clone()]
        grads_ = [torch.zeros(3, device=device), torch.zeros(2, 2, device=device),
                  torch.zeros(3, dtype=torch.int64, device=device)]
        grads_[0].copy_(src[0:3])  # whole destinations: copied later, per source
        grads_[1].copy_(src[3:7].view(2, 2))
        grads_[2].copy_(src[7:10])
        src.zero_()
        outs += [g.clone() for g in grads_]
        return outs
    both(f)


def test_copies_out_of_a_bucket_run_as_one_program():
    bucket = torch.arange(20.0, device="tpu").mul(2)
    bucket.cpu()
    gs = [torch.zeros(n, device="tpu") for n in (5, 3, 7, 1, 4)]
    for g in gs:
        g.cpu()
    e0 = executions()
    off = 0
    for g in gs:
        g.copy_(bucket[off:off + g.numel()])
        off += g.numel()
    e1 = executions()
    del gs[3]  # freed before the copies ran: the others still get theirs
    gs[2].copy_(torch.ones(7, device="tpu"))  # overwritten before they ran
    out = [g.cpu() for g in gs]
    ref = torch.arange(20.0).mul(2)
    assert torch.equal(out[0], ref[0:5]) and torch.equal(out[1], ref[5:8])
    assert torch.equal(out[2], torch.ones(7)) and torch.equal(out[3], ref[16:20])
    if strict():
        assert e1 - e0 == 0
        assert executions() - e1 <= 2  # the copies as one program (was five), the ones


def test_copies_across_devices_and_with_math_bits_are_exact():
    def f(device):
        a = torch.arange(8.0, device=device)
        out = torch.zeros(8, device=device)
        out[2:6].copy_(a[0:4].neg()._neg_view() if device == "tpu" else -(-a[0:4]))
        c = torch.zeros(4, dtype=torch.complex64, device=device)
        z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64, device=device)
        c[1:3].copy_(z.conj())
        return [out, c]
    both(f)


def test_autograd_version_counters_see_queued_writes():
    w = torch.randn(6, device="tpu", requires_grad=True)
    y = w.exp()  # saves its result
    v0 = y._version
    with torch.no_grad():
        y[1:3].copy_(torch.zeros(2, device="tpu"))
    assert y._version == v0 + 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    # A write before use is recorded by autograd as usual: gradients through the copy.
    x = torch.randn(6, device="tpu", requires_grad=True)
    buf = torch.zeros(6, device="tpu")
    buf[0:3].copy_(x[3:6] * 2)
    buf[3:6].copy_(x[0:3])
    (buf * torch.arange(6.0, device="tpu")).sum().backward()
    assert torch.equal(x.grad.cpu(), torch.tensor([3.0, 4.0, 5.0, 0.0, 2.0, 4.0]))


def test_pending_writes_stay_on_their_device():
    if torch.tpu.device_count() < 2:
        pytest.skip("one device")
    a = torch.zeros(6, device="tpu:1")
    src = torch.arange(6.0, device="tpu:0")
    a[0:3].copy_(src[3:6])  # across devices: moved first
    g = torch.zeros(3, device="tpu:1")
    g.copy_(src[0:3])
    assert a.device.index == 1 and g.device.index == 1
    assert torch.equal(a.cpu(), torch.tensor([3.0, 4.0, 5.0, 0, 0, 0]))
    assert torch.equal(g.cpu(), torch.tensor([0.0, 1.0, 2.0]))
