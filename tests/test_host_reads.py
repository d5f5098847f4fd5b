"""Reads of parts of a storage (an element's item(), a row's tolist(), a slice's cpu())
bring the storage's computed values to the host once and serve later reads of it from
there, until the storage is written: printing a tensor or `[v.item() for v in t]` then
costs one transfer, not a program and a transfer per element. Every read must still
return the storage's current values."""
import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode


def _counts():
    m = torch_tpu.metrics()
    return m["executions"], m["d2h_transfers"], m["d2h_bytes"]


def _delta(before):
    return tuple(a - b for a, b in zip(_counts(), before))


def _ready(*ts):
    for t in ts:
        t.add_(0)  # a computed value (not a host upload still in flight)
    torch.tpu.synchronize()


def test_element_loop_is_one_transfer_and_no_program():
    cpu = torch.randn(100)
    t = cpu.to("tpu")
    _ready(t)
    before = _counts()
    got = [v.item() for v in t]
    execs, transfers, nbytes = _delta(before)
    assert got == cpu.tolist()
    assert (execs, transfers, nbytes) == (0, 1, 400)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float32, torch.bool, torch.int64])
def test_printing_matches_cpu(dtype):
    cpu = torch.randint(-100, 100, (2048, 64)).to(dtype)
    t = cpu.to("tpu")
    body = torch._tensor_str._tensor_str  # what repr shows of the values
    for a, b in ((t, cpu), (t[3], cpu[3]), (t[:, 5], cpu[:, 5]), (t[7, 9], cpu[7, 9])):
        assert body(a, 7) == body(b, 7)
        assert "device='tpu:0'" in repr(a)
    if not dtype.is_floating_point:  # (floats' formatting computes on the device)
        before = _counts()
        repr(t[3])  # the storage's copy serves it: no program, no transfer
        assert _delta(before)[:2] == (0, 0)


def test_reads_see_every_kind_of_write():
    t = torch.arange(12.0, device="tpu")
    keep = torch.empty_like(t).copy_(t)  # holds t's buffer: it outlives t's next write
    assert t[3].item() == 3.0  # the storage's copy is made
    t.add_(1)  # in place: a new value
    assert t[3].item() == 4.0 and keep[3].item() == 3.0
    t[2:5] = torch.tensor([-1.0, -2.0, -3.0], device="tpu")  # a queued write into part
    assert t[3].item() == -2.0 and t[5].item() == 6.0
    t.copy_(torch.full((12,), 7.0, device="tpu"))  # the whole storage from another's buffer
    assert t[3].item() == 7.0 and t[1:3].tolist() == [7.0, 7.0]
    v = t.view(3, 4)
    v[1].zero_()  # through another view of the storage
    assert t[5].item() == 0.0 and t.tolist()[4:8] == [0.0] * 4


def test_reads_under_defer_and_fuse_see_pending_writes():
    with torch_tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE):
        t = torch.arange(8.0, device="tpu") * 2
        assert t[1].item() == 2.0
        t.mul_(3)  # recorded, not run
        assert t[1].item() == 6.0 and t[2:4].tolist() == [12.0, 18.0]
        t[0] = 5.0
        assert [v.item() for v in t[:2]] == [5.0, 6.0]


def test_views_with_other_dtypes_and_lazy_bits():
    f = torch.tensor([1.5, -2.0, 3.25, 0.0], device="tpu")
    fc = f.cpu()
    assert f.view(torch.int32)[1].item() == fc.view(torch.int32)[1].item()
    assert f[1].item() == -2.0
    assert f.view(torch.int32)[2].item() == fc.view(torch.int32)[2].item()  # after f's copy is made
    c = torch.tensor([1 + 2j, 3 - 4j, -5 + 6j], device="tpu")
    cc = c.cpu()
    assert c[1].item() == 3 - 4j
    assert c.conj()[1].item() == (3 + 4j)
    assert c.conj().imag[2].item() == cc.conj().imag[2].item() == -6.0  # a negative-bit view
    assert c.conj()[0:2].cpu().tolist() == cc.conj()[0:2].tolist()


def test_large_storage_is_copied_at_its_second_part_read_and_huge_never():
    t = torch.arange(64 * 1024, dtype=torch.float32, device="tpu")  # 256 KiB
    _ready(t)
    before = _counts()
    assert t[10].item() == 10.0  # a single read copies its part only
    assert _delta(before)[1:] == (1, 4)
    before = _counts()
    assert t[11].item() == 11.0  # the second: the whole storage
    assert _delta(before)[1:] == (1, t.nbytes)
    before = _counts()
    assert t[12].item() == 12.0 and t[-1].item() == 65535.0
    assert _delta(before) == (0, 0, 0)
    huge = torch.zeros(2 * 1024 * 1024, device="tpu")  # 8 MiB: past the bound
    _ready(huge)
    before = _counts()
    for i in range(3):
        assert huge[i].item() == 0.0
    assert _delta(before)[1:] == (3, 12)


def test_whole_reads_keep_no_copy():
    t = torch.arange(6.0, device="tpu")
    _ready(t)
    before = _counts()
    assert t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert t.sum().item() == 15.0
    assert _delta(before)[1:] == (2, 28)  # each value once, straight into the result


def test_threads_reading_one_storage():
    import threading
    cpu = torch.arange(4096, dtype=torch.int32)
    t = cpu.to("tpu")
    errors = []

    def reader(offset):
        try:
            for round_ in range(20):
                for i in range(offset, 4096, 257):
                    assert t[i].item() == i
        except Exception as e:  # reported below, with the thread's failure
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    t.add_(1)  # a write while the copy exists: later reads see it
    assert [t[i].item() for i in (0, 4095)] == [1, 4096]
