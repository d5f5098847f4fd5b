"""Small constant fills outside a recorded graph are host-to-device transfers, not
programs (csrc/backend/constant_fill.cpp): autograd's seed of loss.backward() among them."""
import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode

KEYS = ("executions", "host_fills", "h2d_transfers")
EAGER = [EagerMode.DEFER_NEVER, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING]


def counted(fn):
    torch.zeros(1, device="tpu").cpu()  # the client exists, earlier work is done
    torch_tpu.synchronize()
    before = torch_tpu.metrics()
    out = fn()
    after = torch_tpu.metrics()
    return out, {k: after[k] - before[k] for k in KEYS}


@pytest.mark.parametrize("mode", EAGER, ids=lambda m: m.name)
@pytest.mark.parametrize("dtype,value", [
    (torch.float32, 1.0), (torch.float16, -2.5), (torch.bfloat16, 3.25), (torch.float64, 0.1),
    (torch.int64, -7), (torch.int32, 2**31 - 1), (torch.uint8, 255), (torch.int8, -128),
    (torch.bool, True), (torch.complex64, 1.5)])
def test_small_fill_is_one_transfer_with_cpu_values(mode, dtype, value):
    with torch_tpu.set_eager_mode(mode):
        t, d = counted(lambda: torch.full((3, 5), value, dtype=dtype, device="tpu"))
        assert d == {"executions": 0, "host_fills": 1, "h2d_transfers": 1}, d
        assert torch.equal(t.cpu(), torch.full((3, 5), value, dtype=dtype))
        # The storage has the tensor's shape: a program reading it works as after a fill program.
        torch.testing.assert_close((t * 2).cpu(), torch.full((3, 5), value, dtype=dtype) * 2)


@pytest.mark.parametrize("mode", EAGER, ids=lambda m: m.name)
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                                   torch.float8_e5m2fnuz, torch.uint32], ids=str)
def test_small_fill_of_narrow_and_unsigned_types_converts_as_cpu(mode, dtype):
    # fp8 and the wide unsigned types have no AT_DISPATCH entry on CPU's fill kernel path
    # we use, but c10's scalar conversion covers them: the bytes must equal CPU's.
    with torch_tpu.set_eager_mode(mode):
        t, d = counted(lambda: torch.full((4,), 2.7 if dtype.is_floating_point else 9, dtype=dtype, device="tpu"))
        assert d == {"executions": 0, "host_fills": 1, "h2d_transfers": 1}, d
        want = torch.full((4,), 2.7 if dtype.is_floating_point else 9, dtype=dtype)
        assert torch.equal(t.cpu().view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("mode", EAGER, ids=lambda m: m.name)
def test_backward_seed_is_a_fill_not_a_program(mode):
    with torch_tpu.set_eager_mode(mode):
        w = torch.arange(4.0, device="tpu", requires_grad=True)
        loss = (w * w).sum()
        _, d = counted(lambda: loss.backward())
        assert d["host_fills"] == 1, d
        torch.testing.assert_close(w.grad.cpu(), 2 * torch.arange(4.0))


def test_large_fills_and_partial_views_stay_programs():
    with torch_tpu.set_eager_mode(EagerMode.DEFER_NEVER):
        big, d = counted(lambda: torch.ones(4096, device="tpu"))  # 16 KiB: a device fill
        assert d["host_fills"] == 0 and d["executions"] == 1, d
        assert torch.equal(big.cpu(), torch.ones(4096))
        x = torch.arange(6.0, device="tpu")
        _, d = counted(lambda: x[2:5].fill_(9))  # writes part of the storage
        assert d["host_fills"] == 0 and d["executions"] == 1, d
        assert x.cpu().tolist() == [0, 1, 9, 9, 9, 5]
        y = torch.arange(6.0, device="tpu").view(2, 3)
        _, d = counted(lambda: y.t().fill_(4))  # covers the storage, not in order: a program
        assert d["host_fills"] == 0, d
        assert y.cpu().tolist() == [[4.0] * 3] * 2
        _, d = counted(lambda: y.fill_(-1))  # a written storage refilled whole: a transfer
        assert d == {"executions": 0, "host_fills": 1, "h2d_transfers": 1}, d
        assert (y + 1).cpu().tolist() == [[0.0] * 3] * 2


def test_fused_modes_record_fills_into_their_graph():
    with torch_tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE):
        t, d = counted(lambda: (torch.ones(3, device="tpu") + 1).cpu())
        assert d["host_fills"] == 0 and d["executions"] == 1, d
        assert t.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("mode", EAGER, ids=lambda m: m.name)
def test_out_of_range_fill_raises_as_on_cpu(mode):
    with pytest.raises(RuntimeError) as cpu:
        torch.empty(2, dtype=torch.uint8).fill_(300)
    with torch_tpu.set_eager_mode(mode), pytest.raises(RuntimeError) as tpu:
        torch.empty(2, dtype=torch.uint8, device="tpu").fill_(300)
    assert str(tpu.value) == str(cpu.value)


@pytest.mark.parametrize("mode", EAGER, ids=lambda m: m.name)
def test_zero_fill_of_a_whole_storage_leaves_it_unwritten_any_size(mode):
    with torch_tpu.set_eager_mode(mode):
        x = torch.arange(5000.0, device="tpu")  # 20 KiB: above the transfer limit
        _, d = counted(lambda: x.zero_())
        assert d == {"executions": 0, "host_fills": 1, "h2d_transfers": 0}, d
        assert torch.equal(x.cpu(), torch.zeros(5000))
        z, d = counted(lambda: torch.zeros_like(torch.ones(3, 4, device="tpu")))
        assert d["host_fills"] == 2 and d["executions"] == 0, d  # ones: a transfer; zeros: none
        assert torch.equal((z + 2).cpu(), torch.full((3, 4), 2.0))
        # -0.0 is not all zero bytes: it is written.
        neg = torch.empty(4, device="tpu").fill_(-0.0).cpu()
        assert torch.equal(torch.signbit(neg), torch.ones(4, dtype=torch.bool))
