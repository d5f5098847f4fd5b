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


# ---- kthvalue / mode: CPU's tie order at any size

def killer(n):
    """Musser's median-of-3 killer: drives std::sort into its heapsort fallback."""
    k, a = n // 2, [0] * n
    for i in range(1, k + 1):
        if i % 2 == 1:
            a[i - 1], a[i] = i, k + i
        a[k + i - 1] = 2 * i
    return torch.tensor(a, dtype=torch.float32)


def test_mode_heapsort_fallback():
    same(torch.mode, killer(256))
    for n, d in [(1000, 3), (1500, 2), (4096, 7)]:
        x = torch.floor(killer(n) / d)  # ties inside the heapsorted ranges
        same(torch.mode, x)
        same(torch.mode, x.flip(0))
    x = torch.floor(killer(1000) / 5)
    x[::13] = NAN
    same(torch.mode, x)
    same(lambda a: torch.mode(a, 1), torch.stack([torch.floor(killer(600) / 3), torch.randint(0, 9, (600,)).float()]))



def test_mode_heapsort_fallback_is_fast():
    """The heapsort steps write their arrays in place (a copy per step took minutes)."""
    x = torch.floor(killer(100000) / 3)
    t0 = time.time()
    same(torch.mode, x)
    assert time.time() - t0 < 30


@pytest.mark.parametrize("seed", range(4))
def test_mode_and_kthvalue_tie_order(seed):
    g = gen(seed)
    for n in [17, 40, 333, 2000]:
        x = torch.randint(0, 6, (3, n), generator=g).float()
        x[torch.rand(3, n, generator=g) < 0.1] = NAN
        same(lambda a: torch.mode(a, 1), x)
        same(lambda a: torch.mode(a, 0), x[:, :17].t().contiguous())
        for k in {1, n // 3 + 1, n}:
            same(lambda a: torch.kthvalue(a, k, 1), x)
        same(lambda a: torch.kthvalue(a, 2, 0), x)
    ints = torch.randint(-5, 5, (4, 500), generator=g)
    same(lambda a: torch.mode(a, 1), ints)
    same(lambda a: torch.kthvalue(a, 123, 1), ints)
    same(lambda a: torch.mode(a, 1), ints.to(torch.bfloat16))
    same(lambda a: torch.kthvalue(a, 7, 1), (ints + 5).to(torch.uint8))
    same(lambda a: torch.kthvalue(a, 250, 1), torch.zeros(2, 500))
    same(lambda a: torch.mode(a, 1), torch.zeros(2, 500))


def test_kthvalue_and_mode_large_rows_are_fast():
    """Each partition step is a pass over the row: 2e5 elements in seconds, not hours."""
    g = gen(5)
    x = torch.randint(0, 1000, (200000,), generator=g).float()
    t0 = time.time()
    same(lambda a: torch.kthvalue(a, 70000), x)
    same(torch.mode, x)
    same(lambda a: torch.kthvalue(a, 12345), torch.randn(200000, generator=g))
    assert time.time() - t0 < 120


def test_compiled():
    x = torch.randint(0, 7, (3, 300), generator=gen()).float()

    def f(a):
        return torch.kthvalue(a, 50, 1), torch.mode(a, 1), a.sum(1, dtype=torch.bfloat16)
    cf = torch.compile(f, backend="tpu")
    for w, g in zip(flat(f(x)), flat(cf(x.to("tpu"))), strict=True):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)
    cq = torch.compile(lambda a, q: torch.quantile(a, q, dim=1), backend="tpu")
    with pytest.raises(RuntimeError, match=r"q values must be in the range \[0, 1\]"):
        cq(x.to("tpu"), torch.tensor([0.2, 1.7], device="tpu")).cpu()
