"""Products with few outputs (a vector dot, a matrix-vector or matrix product of a few
rows and columns) keep CPU's accuracy on long contractions.

XLA:CPU ran such a dot_general as one sequential chain of adds per output: torch.dot over
2e5 float32 values with a +1e3 offset came out 3.7e-4 off (relative), 1000x CPU's error.
They are now products summed by a reduce (csrc/lowering/matmul.cpp). Errors are measured
against the same product in float64; the bound is CPU's own error times a small factor,
so this does not depend on which BLAS or instruction set CPU PyTorch uses.
"""
import pytest
import torch

N = 200_000

CASES = {
    "dot": lambda x, y: torch.dot(x, y),
    "vdot": lambda x, y: torch.vdot(x, y),
    "inner": lambda x, y: torch.inner(x, y),
    "matmul_1d": lambda x, y: x @ y,
    "mv_one_row": lambda x, y: x[None] @ y,
    "mv_three_rows": lambda x, y: torch.stack([x, -x, 2 * x]) @ y,
    "mm_one_output": lambda x, y: x[None] @ y[:, None],
    "mm_two_by_two": lambda x, y: torch.stack([x, -x]) @ torch.stack([y, 2 * y], 1),
    "einsum": lambda x, y: torch.einsum("i,i->", x, y),
    "bmm_one_output": lambda x, y: torch.bmm(x[None, None], y[None, :, None]),
    "addmv": lambda x, y: torch.addmv(torch.ones(2, dtype=x.dtype, device=x.device), torch.stack([x, x]), y),
}


def _relative_error(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("name", sorted(CASES))
def test_long_contraction_keeps_cpu_accuracy(name):
    f = CASES[name]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, generator=g) + 1e3
    y = torch.randn(N, generator=g) + 1e3
    want = f(x.double(), y.double())
    cpu_error = _relative_error(f(x, y), want)
    got = f(x.to("tpu"), y.to("tpu")).cpu()
    assert got.dtype == torch.float32 and got.shape == want.shape
    # CPU's own error is 2e-7 to 3e-5 here; the sequential chain was 3.7e-4
    assert _relative_error(got, want) <= max(4 * cpu_error, 1e-6), (name, cpu_error)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int64, torch.complex64, torch.float64])
def test_dot_dtypes_match_cpu(dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(1000, generator=g) * 3).to(dtype)
    y = (torch.randn(1000, generator=g) * 3).to(dtype)
    want = torch.dot(x, y)
    got = torch.dot(x.to("tpu"), y.to("tpu")).cpu()
    assert got.dtype == want.dtype
    tol = {torch.bfloat16: 2e-2, torch.int64: 0, torch.complex64: 1e-5, torch.float64: 1e-12}[dtype]
    assert abs(complex(got.item()) - complex(want.item())) <= tol * max(1.0, abs(complex(want.item())))


def test_small_products_gradients():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(3, 50, generator=g, dtype=torch.float64)
    b = torch.randn(50, 2, generator=g, dtype=torch.float64)
    at = a.to("tpu").requires_grad_()
    bt = b.to("tpu").requires_grad_()
    (at @ bt).sin().sum().backward()
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    (ac @ bc).sin().sum().backward()
    assert torch.allclose(at.grad.cpu(), ac.grad, atol=1e-12)
    assert torch.allclose(bt.grad.cpu(), bc.grad, atol=1e-12)
