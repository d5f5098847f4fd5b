"""Foreach ops over tensor lists spanning several tpu devices (a model-parallel model's
parameters: an EMA's _foreach_lerp_, a hand-written SGD) run element by element, as
CUDA's per-tensor path does, with CPU's values; they raised a same-device error."""
import json

import pytest

from conftest import run_python_json

PROGRAM = r"""
import json, torch
torch.manual_seed(0)
cpu = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2), torch.randn(6)]
oth = [torch.rand(3, 4) + 0.5, torch.rand(5) + 0.5, torch.rand(2, 2) + 0.5, torch.rand(6) + 0.5]
devs = ["tpu:0", "tpu:1", "tpu:1", "tpu:0"]
def on(ts):
    return [t.to(d) for t, d in zip(ts, devs)]
out = {}
def record(name, got, want):
    got = got if isinstance(got, (list, tuple)) else [got]
    want = want if isinstance(want, (list, tuple)) else [want]
    out[name] = {"devices": [str(g.device) for g in got],
                 "err": max(float((g.cpu() - w).abs().max()) for g, w in zip(got, want))}
# in place: each element written on its own device
for name, fn in [
    ("lerp_", lambda a, b: torch._foreach_lerp_(a, b, 0.1)),
    ("mul_", lambda a, b: torch._foreach_mul_(a, 0.9)),
    ("add_alpha_", lambda a, b: torch._foreach_add_(a, b, alpha=0.1)),
    ("add_scalarlist_", lambda a, b: torch._foreach_add_(a, [1.0, 2.0, 3.0, 4.0])),
    ("copy_", lambda a, b: torch._foreach_copy_(a, b)),
    ("zero_", lambda a, b: torch._foreach_zero_(a)),
    ("maximum_", lambda a, b: torch._foreach_maximum_(a, b)),
    ("addcdiv_", lambda a, b: torch._foreach_addcdiv_(a, b, b, 0.5)),
]:
    a, b = on(cpu), on(oth)
    ac, bc = [t.clone() for t in cpu], [t.clone() for t in oth]
    fn(a, b); fn(ac, bc)
    record(name, a, ac)
# functional: one result per element, on its element's device
for name, fn in [
    ("add", lambda a, b: torch._foreach_add(a, 1)),
    ("sqrt", lambda a, b: torch._foreach_sqrt(b)),
    ("mul_list", lambda a, b: torch._foreach_mul(a, b)),
    ("norm", lambda a, b: torch._foreach_norm(a)),
]:
    record(name, fn(on(cpu), on(oth)), fn(cpu, oth))
# one device still runs one program over the whole list
import torch_tpu
one = [t.to("tpu:1") for t in cpu]
torch._foreach_mul_(one, 2.0)
torch.tpu.synchronize()
e0 = torch_tpu.metrics()["executions"]
torch._foreach_mul_(one, 2.0)
torch.tpu.synchronize()
out["one_device_executions"] = torch_tpu.metrics()["executions"] - e0
print(json.dumps(out))
"""


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_foreach_over_two_devices_matches_cpu(mode):
    env = {"TPU_NUM_DEVICES": "2", "TPU_DEFER_AND_FUSE": "1" if mode == "fused" else "0",
           "TPU_LAUNCH_BLOCKING": "1" if mode == "debug" else "0"}
    out = run_python_json(PROGRAM, env=env)
    want_devices = ["tpu:0", "tpu:1", "tpu:1", "tpu:0"]
    for name, r in out.items():
        if name == "one_device_executions":
            continue
        assert r["devices"] == want_devices, (name, r)
        assert r["err"] <= 1e-6, (name, r)
    if mode != "fused":  # fused records it into the pending graph
        assert out["one_device_executions"] == 1
