"""Ops without a lowering rule run on the counted CPU fallback; TPU_FALLBACK=error forbids it."""
import pytest
import torch

import torch_tpu
from conftest import run_python


def fallbacks(op):
    """Fallbacks of `op` under any overload (a functional op may run as its out= form)."""
    return sum(n for k, n in torch_tpu.metrics()["fallbacks"].items() if k.split(".")[0] == op)


pytestmark = pytest.mark.filterwarnings("ignore:.*CPU fallback")


# gcd (integer greatest common divisor) has no lowering rule: the example fallback op.
A = torch.tensor([12, 18, -8, 0, 7, 100])
B = torch.tensor([8, 27, 12, 5, 0, 75])


def test_fallback_computes_counts_and_keeps_results_on_tpu():
    n0 = fallbacks("aten::gcd")
    y = torch.gcd(A.to("tpu"), B.to("tpu"))
    assert y.device.type == "tpu"
    assert torch.equal(y.cpu(), torch.gcd(A, B))
    assert fallbacks("aten::gcd") == n0 + 1


def test_fallback_honours_out_and_in_place():
    out = torch.zeros(2, 6, dtype=torch.int64, device="tpu")
    torch.gcd(A.to("tpu"), B.to("tpu"), out=out[1])
    assert torch.equal(out[1].cpu(), torch.gcd(A, B))
    assert out[0].abs().sum().item() == 0
    t = A.to("tpu")
    view = t[::2]
    view.gcd_(B[::2].to("tpu"))
    ref = A.clone()
    ref[::2].gcd_(B[::2])
    assert torch.equal(t.cpu(), ref)


def test_fallback_error_mode_names_the_op():
    r = run_python("import torch; x = torch.ones(3, dtype=torch.int64, device='tpu'); torch.gcd(x, x)",
                   env={"TPU_FALLBACK": "error"})
    assert r.returncode != 0
    assert "aten::gcd" in r.stderr and "TPU_FALLBACK=error" in r.stderr


def test_fallback_warns_once_per_op():
    code = """
import warnings, torch
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    x = torch.ones(3, dtype=torch.int64, device="tpu")
    torch.gcd(x, x); torch.gcd(x, x); torch.linalg.ldl_factor(torch.eye(3, device="tpu"))
print(sum("CPU fallback" in str(m.message) for m in w))
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "2"
