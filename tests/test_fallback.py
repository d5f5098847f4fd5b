"""Ops without a lowering rule run on the counted CPU fallback; TPU_FALLBACK=error forbids it."""
import pytest
import torch

import torch_tpu
from conftest import run_python


def fallbacks(op):
    """Fallbacks of `op` under any overload (a functional op may run as its out= form)."""
    return sum(n for k, n in torch_tpu.metrics()["fallbacks"].items() if k.split(".")[0] == op)


pytestmark = pytest.mark.filterwarnings("ignore:.*CPU fallback")


# silu of complex values has no lowering rule: the example fallback op (functional,
# out= and in place).
A = torch.tensor([1 + 2j, -0.5 + 1j, 3 - 1j, 0j, 2 + 2j, -1 - 1j])
silu = torch.nn.functional.silu


def test_fallback_computes_counts_and_keeps_results_on_tpu():
    n0 = fallbacks("aten::silu")
    y = silu(A.to("tpu"))
    assert y.device.type == "tpu"
    torch.testing.assert_close(y.cpu(), silu(A))
    assert fallbacks("aten::silu") == n0 + 1


def test_fallback_honours_out_and_in_place():
    out = torch.zeros(2, 6, dtype=torch.complex64, device="tpu")
    torch.ops.aten.silu.out(A.to("tpu"), out=out[1])
    torch.testing.assert_close(out[1].cpu(), silu(A))
    assert out[0].abs().sum().item() == 0
    t = A.to("tpu")
    view = t[::2]
    silu(view, inplace=True)
    ref = A.clone()
    silu(ref[::2], inplace=True)
    torch.testing.assert_close(t.cpu(), ref)


def test_fallback_error_mode_names_the_op():
    r = run_python("import torch; x = torch.ones(3, dtype=torch.complex64, device='tpu'); torch.nn.functional.silu(x)",
                   env={"TPU_FALLBACK": "error"})
    assert r.returncode != 0
    assert "aten::silu" in r.stderr and "TPU_FALLBACK=error" in r.stderr


def test_fallback_warns_once_per_op():
    code = """
import warnings, torch
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    x = torch.ones(3, dtype=torch.complex64, device="tpu")
    torch.nn.functional.silu(x); torch.nn.functional.silu(x); torch.linalg.ldl_factor(torch.eye(3, device="tpu"))
print(sum("CPU fallback" in str(m.message) for m in w))
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "2"
