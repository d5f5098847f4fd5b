"""Reductions, scans and order statistics against PyTorch's CPU kernels where the
semantics are subtle: dtype= rounds the input first, CPU's tie order in kthvalue and
mode (its quickselect and std::sort, heapsort fallback included) at sizes where a
step-by-step replay would not finish, and CPU's argument errors (searchsorted side,
quantile's q range, logsumexp over dim=())."""

import time

import pytest
import torch

from conftest import dev, host, native

NAN = float("nan")


def flat(r):
    if isinstance(r, (tuple, list)):
        return [z for y in r for z in flat(y)]
    return [r]


def same(fn, *args):
    """fn on CPU and on tpu give identical tensors (dtype, shape, values, NaN == NaN)."""
    with native():
        want = flat(fn(*args))
        got = flat(fn(*[dev(a) if isinstance(a, torch.Tensor) else a for a in args]))
        for w, g in zip(want, got, strict=True):
            g = host(g)
            assert g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


def raises_like_cpu(fn, *args):
    """fn raises the same exception type and message on CPU and on tpu (at the call or,
    for a value check, at the next read)."""
    with pytest.raises(Exception) as want:
        fn(*args)
    with pytest.raises(type(want.value)) as got:
        r = fn(*[dev(a) if isinstance(a, torch.Tensor) else a for a in args])
        host(r)
    assert str(got.value) == str(want.value)
    assert (torch.ones(3, device="tpu") + 1).cpu().tolist() == [2, 2, 2]  # still usable


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---- dtype= casts the input first

@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_reduction_dtype_rounds_input_first(dt):
    f = torch.full((3000,), 1.001 if dt == torch.bfloat16 else 1.0001)  # rounds to 1.0 in dt
    big = torch.full((1000,), 257, dtype=torch.int32) if dt == torch.bfloat16 else torch.full((3,), 2049, dtype=torch.int32)
    mixed = torch.randint(-300, 300, (6, 50), generator=gen(), dtype=torch.int64)
    same(lambda x: x.prod(dtype=dt), f)
    same(lambda x: x.cumprod(0, dtype=dt)[-1], f)
    same(lambda x: x.sum(dtype=dt), big)
    same(lambda x: x.nansum(dtype=dt), big.float())
    same(lambda x: x.cumsum(0, dtype=dt), big)
    same(lambda x: x.sum(1, dtype=dt), mixed)
    same(lambda x: x.cumsum(1, dtype=dt), mixed)
    same(lambda x: x.prod(1, dtype=dt), torch.randint(1, 3, (4, 9), generator=gen(1)))


def test_mean_dtype_sums_the_input_unrounded():
    """CPU's mean(dtype=f16/bf16) sums in f32 and rounds the quotient only."""
    x = torch.randint(0, 100000, (1000,), generator=gen(), dtype=torch.int32)
    same(lambda a: a.mean(dtype=torch.float16), x)
    same(lambda a: a.mean(dtype=torch.bfloat16), x)
    same(lambda a: a.mean(dtype=torch.bfloat16), torch.rand(4000, generator=gen(2)) * 3 + 1)


# ---- searchsorted side

def test_searchsorted_side_checked():
    b, v = torch.tensor([0., 1., 2.]), torch.tensor([0.5, 1., 3.])
    for kw in [{"side": "foo"}, {"side": "RIGHT"}, {"side": "left", "right": True}]:
        raises_like_cpu(lambda bb, vv: torch.searchsorted(bb, vv, **kw), b, v)
        raises_like_cpu(lambda bb: torch.searchsorted(bb, 1.0, **kw), b)
    same(lambda bb, vv: torch.searchsorted(bb, vv, side="right", right=True), b, v)
    same(lambda bb, vv: torch.searchsorted(bb, vv, side="left"), b, v)
    # A RuntimeError in a compiled graph too (its ops are called through torch.ops).
    cs = torch.compile(lambda bb, vv: torch.searchsorted(bb, vv, side="foo"), backend="tpu")
    with pytest.raises(RuntimeError, match="side can only be 'left' or 'right' but got foo"):
        cs(b.to("tpu"), v.to("tpu"))


# ---- quantile's q range

@pytest.mark.parametrize("op", [torch.quantile, torch.nanquantile])
def test_quantile_q_tensor_out_of_range(op):
    x = torch.randn(6, 11, generator=gen())
    for q in [torch.tensor([0.5, 1.5]), torch.tensor([-0.1]), torch.tensor(NAN), torch.tensor(2.)]:
        raises_like_cpu(lambda a, qq: op(a, qq), x, q)
        raises_like_cpu(lambda a, qq: op(a, qq, dim=1), x, q)
    # Other errors keep their own messages (and leave no flag to fail a later read).
    raises_like_cpu(lambda a, qq: op(a, qq), x, torch.tensor([1.5], dtype=torch.float64))
    raises_like_cpu(lambda a, qq: op(a, qq, dim=5), x, torch.tensor([1.5]))
    same(lambda a, qq: op(a, qq, dim=0), x, torch.tensor([0., 0.3, 1.]))


def test_quantile_check_keeps_autograd():
    x = torch.randn(5, 7, generator=gen(), requires_grad=True)
    q = torch.tensor([0.25, 0.9])
    torch.quantile(x, q, dim=1).sum().backward()
    xt = x.detach().to("tpu").requires_grad_()
    torch.quantile(xt, q.to("tpu"), dim=1).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad)
    with torch.inference_mode():
        xi = x.detach().to("tpu")
        with pytest.raises(RuntimeError, match=r"q values must be in the range \[0, 1\]"):
            torch.quantile(xi, torch.tensor([3.], device="tpu")).cpu()


# ---- logsumexp dim=()

def test_logsumexp_empty_dims():
    for shape in [(2, 3, 4), (5,)]:
        raises_like_cpu(lambda a: torch.logsumexp(a, dim=()), torch.randn(shape, generator=gen()))
    same(lambda a: torch.logsumexp(a, dim=(), keepdim=True), torch.randn(2, 3, 4, generator=gen()))
    same(lambda a: torch.logsumexp(a, dim=()), torch.tensor(2.0))
