"""torch.tpu.set_sync_debug_mode, as torch.cuda's: ops that make the host wait for device
values warn ("warn") or raise before reading anything ("error"), naming the op; ops that
stay on the device and explicit waits never do; a refused read loses nothing."""
import warnings

import pytest
import torch

from conftest import run_python

SYNC = "synchronizing tpu operation"


@pytest.fixture(autouse=True)
def _default_mode():
    yield
    torch.tpu.set_sync_debug_mode(0)


def _warnings_of(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if SYNC in str(w.message)]


def test_modes_are_set_as_on_cuda():
    assert torch.tpu.get_sync_debug_mode() == 0
    for given, mode in (("warn", 1), ("error", 2), ("default", 0), (2, 2), (1, 1), (0, 0)):
        torch.tpu.set_sync_debug_mode(given)
        assert torch.tpu.get_sync_debug_mode() == mode
    with pytest.raises(RuntimeError, match="expected one of `default`, `warn`, `error`"):
        torch.tpu.set_sync_debug_mode("loud")
    with pytest.raises(RuntimeError, match="expected 0, 1 or 2"):
        torch.tpu.set_sync_debug_mode(3)
    assert torch.tpu.get_sync_debug_mode() == 0


READS = {
    "item": (lambda x: x.sum().item(), "a copy to the CPU"),
    "cpu": (lambda x: x.cpu(), "a copy to the CPU"),
    "tolist": (lambda x: x.tolist(), "a copy to the CPU"),
    "bool": (lambda x: bool(x[0] > 0), "a copy to the CPU"),
    "nonzero": (lambda x: torch.nonzero(x > 0), "aten::nonzero"),
    "mask_index": (lambda x: x[x > 0], "aten::nonzero"),  # indexing by a mask takes its nonzeros
    "masked_select": (lambda x: torch.masked_select(x, x > 0), "aten::masked_select"),
    "unique": (lambda x: torch.unique(x), "aten::unique"),
    "equal": (lambda x: torch.equal(x, x + 0), "aten::equal"),
    "repeat_interleave": (lambda x: torch.repeat_interleave(torch.tensor([1, 2], device="tpu")), "aten::repeat_interleave"),
    "bincount": (lambda x: torch.bincount(torch.tensor([0, 2, 2], device="tpu")), "aten::bincount"),
}


@pytest.mark.parametrize("name", sorted(READS))
def test_each_synchronizing_op_warns_naming_itself(name):
    fn, what = READS[name]
    x = torch.tensor([1.0, -2.0, 3.0], device="tpu")
    assert _warnings_of(lambda: fn(x)) == []  # off by default
    torch.tpu.set_sync_debug_mode("warn")
    got = _warnings_of(lambda: fn(x))
    assert got and all(what in w for w in got[:1]), got


def test_device_ops_and_explicit_waits_do_not_warn():
    torch.tpu.set_sync_debug_mode("warn")
    x = torch.randn(8, 8, device="tpu", requires_grad=True)

    def step():
        y = (x @ x).relu().sum()
        y.backward()
        torch.where(x > 0, x, 0.0).mean(0)
        x.grad.zero_()
        torch.tpu.synchronize()
        torch.tpu.current_stream().synchronize()
    assert _warnings_of(step) == []


@pytest.mark.parametrize("name", ["item", "cpu", "nonzero", "mask_index", "masked_select", "equal"])
def test_error_mode_raises_before_reading_and_loses_nothing(name):
    fn, what = READS[name]
    x = torch.tensor([1.0, -2.0, 3.0], device="tpu") * 2
    torch.tpu.set_sync_debug_mode("error")
    with pytest.raises(RuntimeError, match=SYNC) as e:
        fn(x)
    assert what in str(e.value)
    torch.tpu.set_sync_debug_mode(0)
    assert x.tolist() == [2.0, -4.0, 6.0]
    torch.testing.assert_close(fn(x), fn(x.cpu()) if name != "equal" else True, check_device=False)


@pytest.mark.parametrize("env", [{"TPU_DEFER_AND_FUSE": "1"}, {"TPU_LAUNCH_BLOCKING": "1"}])
def test_error_mode_in_other_eager_modes(env):
    # DeferAndFuse: the refused read leaves the pending graph as it was; a later read runs it.
    r = run_python("""
import torch, torch_tpu
x = torch.arange(6.0, device="tpu").reshape(2, 3)
y = (x * 3).sum(1)
torch.tpu.set_sync_debug_mode("error")
z = y + 1  # recorded, not read: no error
for read in (lambda: y.cpu(), lambda: z.item() if z.numel() == 1 else z.tolist(), lambda: torch.nonzero(z)):
    try:
        read()
        raise SystemExit("no error")
    except RuntimeError as e:
        assert "synchronizing tpu operation" in str(e), e
torch.tpu.set_sync_debug_mode("default")
print(y.tolist(), z.tolist(), torch.nonzero(z).flatten().tolist())
""", env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[9.0, 36.0] [10.0, 37.0] [0, 1]", r.stdout
