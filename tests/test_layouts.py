"""Forms of emitted programs chosen for how XLA fuses them (issue 18, the fused step's
distance from its contraction floor), each checked for values against float64.

Exact GELU in f32 math uses a rational erf (one divide, no exp) instead of the
erfc-tail form, whose divide and exp each had several readers and made XLA write
three full-size intermediates per GELU (forward and backward). The forms must still
give CPU's values: within a few f32 ulps of the float64 definition everywhere,
including the tails, the clamp points of the rational fit and the special values.
"""
import json
import math
import os
import shutil
import tempfile

import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401
from conftest import no_fallbacks, run_python

INF, NAN = math.inf, math.nan


@pytest.fixture(autouse=True)
def native():
    with no_fallbacks():
        yield


def grid():
    """Dense over [-12, 12] (the rational erf clamps at |x / sqrt 2| = 4, x = 5.657),
    with the clamp points, zero signs and values around them."""
    c = 4 * math.sqrt(2)
    pts = torch.linspace(-12, 12, 4801, dtype=torch.float64)
    extra = torch.tensor([0.0, -0.0, c, -c, c + 1e-3, -c - 1e-3, c - 1e-3, -c + 1e-3,
                          1e-30, -1e-30, 30.0, -30.0, 1e4, -1e4], dtype=torch.float64)
    return torch.cat([pts, extra])


def gelu_grads(x, g):
    x = x.detach().requires_grad_(True)
    y = F.gelu(x)
    (gx,) = torch.autograd.grad(y, x, g)
    return y.detach(), gx


@pytest.mark.parametrize("dtype,atol,rtol", [(torch.float32, 4e-6, 2e-5),
                                             (torch.bfloat16, 2e-2, 2e-2),
                                             (torch.float16, 4e-3, 4e-3)])
def test_gelu_forward_backward_against_float64(dtype, atol, rtol):
    x64 = grid()
    g64 = torch.randn(x64.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x, g = x64.to(dtype), g64.to(dtype)
    want_y, want_gx = gelu_grads(x.double(), g.double())  # the definition, at the inputs used
    got_y, got_gx = gelu_grads(x.to("tpu"), g.to("tpu"))
    assert got_y.dtype == dtype and got_gx.dtype == dtype
    torch.testing.assert_close(got_y.cpu().double(), want_y, atol=atol, rtol=rtol)
    torch.testing.assert_close(got_gx.cpu().double(), want_gx, atol=atol, rtol=rtol)


def test_gelu_f32_no_farther_from_float64_than_cpu():
    """The f32 forward's worst error is CPU float32's own order (both compute 1 + erf)."""
    x = grid().float()
    exact = F.gelu(x.double())
    ours = (F.gelu(x.to("tpu")).cpu().double() - exact).abs().max().item()
    cpu = (F.gelu(x).double() - exact).abs().max().item()
    assert ours <= max(2 * cpu, 2e-6), (ours, cpu)


def test_gelu_special_values_against_float64():
    x = torch.tensor([INF, -INF, NAN, 0.0, -0.0, 1e30, -1e30, 88.0, -88.0])
    for dtype in (torch.float32, torch.bfloat16):
        xs = x.to(dtype)
        want = F.gelu(xs.double())
        got = F.gelu(xs.to("tpu")).cpu().double()
        torch.testing.assert_close(got, want, equal_nan=True, atol=0, rtol=1e-2, msg=str(dtype))
    assert F.gelu(torch.tensor([INF], device="tpu")).item() == INF
    gx = torch.ops.aten.gelu_backward(torch.ones(4, device="tpu"),
                                      torch.tensor([INF, -INF, 30.0, -30.0], device="tpu")).cpu()
    want = torch.ops.aten.gelu_backward(torch.ones(4, dtype=torch.float64),
                                        torch.tensor([INF, -INF, 30.0, -30.0], dtype=torch.float64))
    torch.testing.assert_close(gx.double(), want, equal_nan=True)


def test_gelu_f64_keeps_its_precision():
    """f64 keeps the erfc form: relative accuracy in the left tail, where 1 + erf would
    cancel to nothing (the erfc fit itself is good to about 1.2e-7 relative)."""
    x = torch.tensor([-20.0, -12.0, -8.0, -5.0, -1.0, 0.5, 3.0], dtype=torch.float64)
    got = F.gelu(x.to("tpu")).cpu()
    want = x * torch.special.erfc(-x / math.sqrt(2)) / 2
    torch.testing.assert_close(got, want, rtol=5e-7, atol=0)


def test_gelu_f32_programs_have_one_divide_and_no_erfc_exp():
    """The emitted f32 GELU programs (forward, backward) as XLA receives them: the
    rational erf's one divide, and no exp except the backward's density term."""
    code = """
import glob, json, os, torch, torch_tpu
import torch.nn.functional as F
x = torch.randn(64, device="tpu", requires_grad=True)
F.gelu(x).backward(torch.ones(64, device="tpu"))
torch.tpu.synchronize()
out = []
for f in sorted(glob.glob(os.path.join(os.environ["DUMP"], "*before_optimizations.txt"))):
    t = open(f).read()
    if " clamp(" in t:
        out.append([t.count(" divide("), t.count(" exponential(")])
print(json.dumps(out))
"""
    dump = tempfile.mkdtemp(prefix="tpu_gelu_dump_")
    try:
        r = run_python(code, env={"XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text",
                                  "DUMP": dump, "TPU_COMPILE_CACHE": "0",
                                  "TPU_DEFER_AND_FUSE": "0", "TPU_LAUNCH_BLOCKING": "0"})
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    assert sorted(counts) == [[1, 0], [1, 1]], counts  # forward; backward (its pdf's exp)
