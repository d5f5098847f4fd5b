"""Search, order statistics, scans, histograms, index reductions and value-shaped ops
(searchsorted, median, kthvalue, mode, cummax, logcumsumexp, histc/histogram,
index_reduce, segment_reduce, take/put, unique, repeat_interleave, equal), each checked
exactly against PyTorch's CPU kernels (values, dtypes, tied indices, NaN), natively."""

import pytest
import torch

from conftest import dev, host, native

NAN = float("nan")


def flat(r):
    if isinstance(r, (tuple, list)):
        return [z for y in r for z in flat(y)]
    return [r]


def same(fn, *args, exact=True):
    """fn on CPU and on tpu give the same tensors (dtype, shape, values; NaN == NaN)."""
    with native():
        want = flat(fn(*args))
        got = flat(fn(*[dev(a) if isinstance(a, torch.Tensor) else a for a in args]))
        for w, g in zip(want, got, strict=True):
            if not isinstance(w, torch.Tensor):
                assert w == g
                continue
            g = host(g)
            assert g.dtype == w.dtype and g.shape == w.shape
            if exact:
                torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
            else:
                torch.testing.assert_close(g, w, equal_nan=True)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def ties(*shape, seed=0, nan=0.0, hi=4):
    """Small integers as floats (many ties), with a fraction `nan` of NaN."""
    x = torch.randint(0, hi, shape, generator=gen(seed)).float()
    x[torch.rand(shape, generator=gen(seed + 1)) < nan] = NAN
    return x


# ---- searchsorted / isin

@pytest.mark.parametrize("kw", [{}, {"right": True}, {"side": "right", "out_int32": True}])
def test_searchsorted_nan_boundaries(kw):
    same(lambda b, v: torch.searchsorted(b, v, **kw), torch.tensor([0., 1, 1, 2, 3, NAN]),
         ties(5, 12, nan=0.2))


def test_searchsorted_rows_sorter_scalar():
    bd = torch.sort(torch.randn(5, 7, generator=gen()), dim=1).values
    same(torch.searchsorted, bd, torch.randn(5, 3, generator=gen(1)))
    perm = torch.randn(5, 7, generator=gen(2))
    same(lambda b, v, s: torch.searchsorted(b, v, sorter=s), perm, torch.randn(5, 3), perm.argsort(1))
    same(lambda b: torch.searchsorted(b, 0.5, right=True), torch.arange(4.))
    same(torch.searchsorted, torch.arange(10), torch.randint(-2, 12, (4,), generator=gen()))
    same(torch.isin, torch.randint(0, 10, (20,), generator=gen()), torch.randint(0, 10, (5,)))


# ---- order statistics

@pytest.mark.parametrize("n", [5, 30])
def test_median_nanmedian_indices(n):
    x = ties(40, n, nan=0.25, seed=n)
    x[0] = NAN  # an all-NaN row: CPU's nth_element decides its index
    same(lambda a: torch.median(a, 1), x)
    same(lambda a: torch.nanmedian(a, 1), x)
    same(torch.median, x)
    same(torch.nanmedian, x)
    same(lambda a: torch.median(a, 0, keepdim=True), ties(n, 6, seed=n))


def test_kthvalue_ties_and_nan():
    for seed, n, k in [(0, 5, 3), (1, 12, 1), (2, 12, 12), (3, 23, 11)]:
        same(lambda a: torch.kthvalue(a, k, 1), ties(3, n, nan=0.1, seed=seed))
    same(lambda a: torch.kthvalue(a, 3, 0, keepdim=True), torch.randint(0, 3, (7, 4, 2), generator=gen()))
    same(lambda a: torch.kthvalue(a, 1), torch.tensor(2.))


@pytest.mark.parametrize("n", [1, 5, 16])
def test_mode_ties_and_nan(n):
    same(lambda a: torch.mode(a, 1), torch.randint(0, 3, (30, n), generator=gen(n)))
    same(lambda a: torch.mode(a, 0), ties(n, 12, nan=0.2, seed=n))
    same(lambda a: torch.mode(a, 1), torch.randint(0, 2, (6, n), generator=gen(n)).bool())


def test_mode_long_rows_introsort():
    """Rows over 16 go through std::sort's introsort on CPU: replayed, ties included."""
    same(lambda a: torch.mode(a, 1), torch.randint(-3, 3, (4, 40), generator=gen()))
    x = ties(3, 40, nan=0.1, seed=3)
    same(lambda a: torch.mode(a, 1), x)
    same(torch.mode, torch.randint(-9, 9, (3000,), generator=gen()))
    same(torch.mode, (torch.arange(300) // 4).flip(0))


# ---- scans

@pytest.mark.parametrize("dim", [0, 1])
def test_cummax_cummin(dim):
    for x in (ties(5, 12, nan=0.2), torch.randint(0, 4, (5, 12), generator=gen()),
              torch.randint(0, 2, (5, 12), generator=gen()).bool()):
        same(lambda a: torch.cummax(a, dim), x)
        same(lambda a: torch.cummin(a, dim), x)


def test_logcumsumexp_and_grad():
    y = torch.randn(5, 33, generator=gen())
    y[0, 3], y[1, 4], y[2, :], y[3, 5] = float("inf"), -float("inf"), -float("inf"), NAN
    same(lambda a: torch.logcumsumexp(a, 1), y, exact=False)

    def grad(a):
        a = a.clone().requires_grad_()
        (torch.logcumsumexp(a, 1) * torch.arange(6.).to(a.device)).sum().backward()
        return a.grad
    same(grad, torch.randn(4, 6, generator=gen()), exact=False)


# ---- take / put / nonzero_static / hash_tensor

def test_take_put():
    x = torch.randn(4, 5, generator=gen())
    same(torch.take, x, torch.tensor([[0, -1], [19, -20]]))
    same(lambda a, i, s: a.put(i, s), x, torch.tensor([0, -1, 3, 3]), torch.randn(4))
    same(lambda a, i, s: a.put(i, s, accumulate=True), x, torch.tensor([0, -1, 3, 3]), torch.randn(4))
    with pytest.raises(IndexError):
        host(torch.take(dev(x), dev(torch.tensor([20]))))


@pytest.mark.parametrize("size", [0, 3, 30])
def test_nonzero_static(size):
    m = torch.randint(0, 2, (4, 5), generator=gen())
    same(lambda a: torch.nonzero_static(a, size=size), m)
    same(lambda a: torch.nonzero_static(a, size=size, fill_value=7), m.float())


def test_hash_tensor():
    h = torch.ops.aten.hash_tensor
    same(h, torch.randn(4, 5, generator=gen()))
    same(lambda a: h(a, [1]), torch.randn(4, 5, generator=gen()).bfloat16())
    same(lambda a: h(a, [0], keepdim=True), torch.randint(-9, 9, (4, 5), generator=gen()))


# ---- histograms

def test_histc_and_histogram():
    x = torch.randn(50, generator=gen()) * 3
    same(lambda a: torch.histc(a, 10), torch.randn(100, generator=gen()))
    same(lambda a: torch.histc(a, 7, -1, 2), x)
    same(lambda a: torch.histc(a, 5), torch.full((4,), 3.))
    same(lambda a: torch.histogram(a, 11, range=(-1., 1.)), torch.randn(1000, generator=gen()))
    same(lambda a, w: torch.histogram(a, 6, weight=w, density=True), x, torch.rand(50), exact=False)
    same(lambda a, b: torch.histogram(a, b), x, torch.tensor([-1., -0.5, 0., 0.3, 2.]))


def test_histogramdd():
    same(lambda a: torch.histogramdd(a, [3, 4]), torch.randn(100, 2, generator=gen()))
    same(lambda a, w: torch.histogramdd(a, [3, 4, 2], range=[-1., 1., 0., 1., -2., 0.], weight=w,
                                        density=True), torch.randn(100, 3), torch.rand(100), exact=False)
    same(lambda a, b1, b2: torch.histogramdd(a, [b1, b2]), torch.randn(5, 20, 2, generator=gen()),
         torch.tensor([-1., 0, 1]), torch.tensor([-2., 0.5, 1, 3]))


# ---- index_reduce / segment_reduce

@pytest.mark.parametrize("red", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.filterwarnings("ignore:index_reduce\\(\\) is in beta")
def test_index_reduce(red, include_self):
    x = torch.randn(5, 3, generator=gen())
    x[1, 1] = NAN
    idx = torch.tensor([0, 2, 2, 4, 0, 1])
    same(lambda a, i, s: a.index_reduce(0, i, s, red, include_self=include_self), x, idx,
         torch.randn(6, 3, generator=gen(1)), exact=False)
    same(lambda a, i, s: a.index_reduce(1, i, s, red, include_self=include_self),
         torch.randint(-5, 5, (3, 5), generator=gen()), idx, torch.randint(-5, 5, (3, 6), generator=gen(1)))


@pytest.mark.parametrize("red", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 1.5])
def test_segment_reduce_and_grad(red, initial):
    d = torch.randn(8, 3, generator=gen())
    d[2, 0], d[5, 1] = NAN, 0.
    d[7] = d[6]  # ties in the last segment
    lengths, offsets = torch.tensor([2, 0, 3, 3]), torch.tensor([0, 2, 2, 5, 8])
    same(lambda a, l: torch.segment_reduce(a, red, lengths=l, initial=initial), d, lengths, exact=False)
    same(lambda a, o: torch.segment_reduce(a, red, offsets=o, initial=initial), d, offsets, exact=False)

    def grad(a, l):
        a = a.clone().requires_grad_()
        w = torch.tensor([[1., -2, 3], [0.5, 1, 1], [-1, 2, 2], [1, 1, -1]]).to(a.device)
        (torch.segment_reduce(a, red, lengths=l, initial=initial) * w).nan_to_num().sum().backward()
        return a.grad
    same(grad, d, lengths, exact=False)


# ---- value-shaped ops

def test_unique_family():
    x = torch.tensor([3., 1, NAN, 2, 1, NAN, 3, -0.0, 0.0])
    same(lambda a: torch.unique(a, return_inverse=True, return_counts=True), x)
    same(lambda a: torch.ops.aten._unique(a, True, True), torch.randint(0, 5, (4, 6), generator=gen()))
    same(lambda a: torch.unique(a, return_counts=True), torch.randint(0, 2, (4, 6), generator=gen()).bool())
    same(lambda a: torch.unique_consecutive(a, return_inverse=True, return_counts=True),
         torch.randint(0, 2, (4, 6), generator=gen()))
    same(torch.unique_consecutive, x)


def test_repeat_interleave_and_equal():
    same(torch.repeat_interleave, torch.tensor([1, 0, 3, 2]))
    same(torch.repeat_interleave, torch.tensor([0, 0, 3, 2], dtype=torch.int32))
    same(lambda a, r: torch.repeat_interleave(a, r, dim=0), torch.randn(3, 2), torch.tensor([2, 0, 1]))
    with pytest.raises(RuntimeError, match="negative"):
        torch.repeat_interleave(dev(torch.tensor([1, -1])))
    x = torch.tensor([1., NAN])
    with native():
        assert torch.equal(dev(torch.arange(6.)), dev(torch.arange(6.)))
        assert torch.equal(dev(torch.ones(3)), dev(torch.ones(3, dtype=torch.long)))
        assert not torch.equal(dev(x), dev(x))
        assert not torch.equal(dev(torch.ones(3)), dev(torch.ones(2)))


def test_bincount_counts_and_weights_natively():
    x = torch.tensor([0, 1, 1, 3, 7, 2])
    same(torch.bincount, x)
    same(lambda a: torch.bincount(a, minlength=10), x.int())
    same(lambda a: torch.bincount(a, minlength=3), torch.tensor([], dtype=torch.uint8))
    for w in (torch.arange(6.0), torch.arange(6.0).half(), torch.arange(6), torch.rand(6, dtype=torch.float64)):
        same(torch.bincount, x, w)  # float weights sum as float, the others as double (CPU's types)
    same(torch.bincount, torch.randint(0, 1000, (50_000,), generator=gen()))
    for bad, w, ml, err in [(torch.tensor([[0, 1]]), None, 0, RuntimeError), (torch.tensor([-1, 2]), None, 0, RuntimeError),
                            (x, torch.ones(3), 0, RuntimeError), (x, None, -1, RuntimeError),
                            (torch.tensor([0.5]), None, 0, NotImplementedError)]:
        with pytest.raises(err):
            torch.bincount(bad, w, ml)
        with native(), pytest.raises(err):
            torch.bincount(dev(bad), dev(w), ml)


def test_nonzero_and_masked_select_out_forms_natively():
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0]])
    same(lambda a: torch.nonzero(a, out=torch.empty(0, dtype=torch.long, device=a.device)), x)
    same(lambda a: torch.masked_select(a, a > 0, out=torch.empty(0, device=a.device)), x)
    with native():
        for fn in (lambda a: torch.nonzero(a, out=torch.empty(0, dtype=torch.int32, device=a.device)),
                   lambda a: torch.masked_select(a, a > 0, out=torch.empty(0, dtype=torch.long, device=a.device))):
            with pytest.raises(RuntimeError, match="scalar type"):
                fn(dev(x))


def test_histc_range_errors_are_runtime_errors_like_cpu():
    bad = torch.tensor([0.0, float("inf")])
    with pytest.raises(RuntimeError):
        torch.histc(bad, 4)
    with pytest.raises(RuntimeError, match="not finite"):
        host(torch.histc(dev(bad), 4))
    assert host(torch.histc(dev(torch.tensor([1.0, 2.0])), 2)).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_of_integers_counts_like_cuda(dtype):
    """CPU refuses integer histc; CUDA bins them (transformers' MoE counts tokens per expert
    this way on every device but cpu/mps). Reference: the float histogram, in the int dtype."""
    x = torch.tensor([0, 1, 1, 3, 2, 3, 3, 0, 7, 5], dtype=dtype)
    for kw in (dict(bins=4, min=0, max=3), dict(bins=3), dict(bins=8, min=0, max=7)):
        got = torch.histc(x.to("tpu"), **kw).cpu()
        want = torch.histc(x.double(), **kw).to(dtype)
        assert got.dtype == dtype
        assert torch.equal(got, want), kw
