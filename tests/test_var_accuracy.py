"""var/std of values far from zero keep CPU's accuracy.

The two-pass variance subtracted a mean rounded to float32; each deviation was then off
by the mean's rounding, and the squares' sum carried n times its square: rows of
randn + 1e5 gave a variance 1.8e-4 off (relative), where CPU (Welford in double) is 6e-8.
The deviations' own sum now takes that offset out. Errors are against float64.
"""
import pytest
import torch


def _rel(got, want):
    return ((got.double() - want).abs() / want.abs()).max().item()


@pytest.mark.parametrize("offset", [0.0, 1e4, 1e5])
@pytest.mark.parametrize("op", ["var", "std", "var_mean", "std_mean"])
def test_variance_of_offset_rows(op, offset):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4096, generator=g) + offset
    f = getattr(torch, op)
    want = f(x.double(), 1)
    got = f(x.to("tpu"), 1)
    if op.endswith("_mean"):
        want, got = want[0], got[0].cpu()
    else:
        got = got.cpu()
    # float32 accumulation: within 1e-5 at every offset (the uncorrected form: 1.8e-4 at 1e5)
    assert _rel(got, want) < 1e-5, (op, offset)


def test_constant_rows_have_zero_variance():
    x = torch.full((3, 1000), 60000.0)
    x[1] = 0.1
    x[2] = -7.3
    got = torch.var(x.to("tpu"), 1, correction=0).cpu()
    assert torch.equal(got, torch.zeros(3)), got
    assert torch.equal(torch.std(x.to("tpu"), 1).cpu(), torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float64, torch.bfloat16])
def test_other_dtypes(dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(8, 300, generator=g, dtype=torch.float64) + 50).to(dtype)
    if dtype.is_complex:
        x = x + 1j * (torch.randn(8, 300, generator=g) - 20).to(dtype)
    want = torch.var(x, 1, correction=1)
    got = torch.var(x.to("tpu"), 1, correction=1).cpu()
    assert got.dtype == want.dtype
    tol = {torch.complex64: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2}[dtype]
    assert _rel(got.double(), want.double()) < tol


def test_empty_and_single():
    e = torch.empty(2, 0)
    assert torch.isnan(torch.var(e.to("tpu"), 1).cpu()).all()
    one = torch.tensor([[3.5]])
    assert torch.isnan(torch.var(one.to("tpu"), 1).cpu()).all()  # correction 1 of one element
    assert torch.equal(torch.var(one.to("tpu"), 1, correction=0).cpu(), torch.zeros(1))
