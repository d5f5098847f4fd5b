"""A device-side check that failed on one tpu device (an out-of-range index) is raised by
synchronizing that device, as CUDA raises a device-side assert in its own device's
context: synchronize(0) raised tpu:1's failure, and synchronize(1) then passed (found by
session 58's multi-device probe). synchronize() with no device still raises every one."""
import pytest

from conftest import run_python_json

PROGRAM = r"""
import json, torch, torch_tpu
def bad_index_on(d):
    x = torch.tensor([1., 2.], device=f"tpu:{d}"); i = torch.tensor([7], device=f"tpu:{d}")
    return x[i]
def outcome(fn):
    try:
        fn(); return "ok"
    except IndexError as e:
        return "IndexError: " + ("index" in str(e)) * "names the index"
out = {}
y = bad_index_on(1)
out["sync0"] = outcome(lambda: torch.tpu.synchronize(0))
out["sync1"] = outcome(lambda: torch.tpu.synchronize(1))
out["sync1_again"] = outcome(lambda: torch.tpu.synchronize(1))
out["tpu1_usable"] = (torch.ones(2, device="tpu:1") + 1).cpu().tolist()
y = bad_index_on(1)
out["sync_all"] = outcome(lambda: torch.tpu.synchronize())
print(json.dumps(out))
"""


@pytest.mark.parametrize("fused", ["0", "1"])
def test_a_failed_check_is_raised_by_its_devices_synchronize(fused):
    r = run_python_json(PROGRAM, env={"TPU_NUM_DEVICES": "2", "TPU_DEFER_AND_FUSE": fused, "TPU_LAUNCH_BLOCKING": "0"}, timeout=120)
    assert r == {"sync0": "ok", "sync1": "IndexError: names the index", "sync1_again": "ok",
                 "tpu1_usable": [2.0, 2.0], "sync_all": "IndexError: names the index"}, r
