"""Ops without a lowering rule run on the counted CPU fallback; TPU_FALLBACK=error forbids it."""
import pytest
import torch

import torch_tpu
from conftest import run_python


def fallbacks(op):
    """Fallbacks of `op` under any overload (a functional op may run as its out= form)."""
    return sum(n for k, n in torch_tpu.metrics()["fallbacks"].items() if k.split(".")[0] == op)


pytestmark = pytest.mark.filterwarnings("ignore:.*CPU fallback")


def test_fallback_computes_counts_and_keeps_results_on_tpu():
    x = torch.rand(5) * 3 + 0.5
    n0 = fallbacks("aten::special_bessel_j0")
    y = torch.special.bessel_j0(x.to("tpu"))
    assert y.device.type == "tpu"
    torch.testing.assert_close(y.cpu(), torch.special.bessel_j0(x))
    assert fallbacks("aten::special_bessel_j0") == n0 + 1


def test_fallback_honours_out_and_in_place():
    x = torch.rand(6) * 3 + 0.5
    out = torch.zeros(2, 6, device="tpu")
    torch.special.bessel_j0(x.to("tpu"), out=out[1])
    torch.testing.assert_close(out[1].cpu(), torch.special.bessel_j0(x))
    assert out[0].abs().sum().item() == 0
    t = x.to("tpu")
    view = t[::2]
    view.lgamma_()
    ref = x.clone()
    ref[::2].lgamma_()
    torch.testing.assert_close(t.cpu(), ref)


def test_fallback_error_mode_names_the_op():
    r = run_python("import torch; torch.special.bessel_j0(torch.ones(3, device='tpu'))",
                   env={"TPU_FALLBACK": "error"})
    assert r.returncode != 0
    assert "special_bessel_j0" in r.stderr and "TPU_FALLBACK=error" in r.stderr


def test_fallback_warns_once_per_op():
    code = """
import warnings, torch
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    x = torch.ones(3, device="tpu")
    torch.special.bessel_j0(x); torch.special.bessel_j0(x); torch.special.bessel_y0(x)
print(sum("CPU fallback" in str(m.message) for m in w))
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "2"
