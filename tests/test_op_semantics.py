"""Semantics that often go wrong in a backend, each compared with CPU PyTorch.

Every test runs with TPU_FALLBACK=error: these ops must run natively, so a CPU fallback
fails the test instead of hiding a wrong lowering. Where tpu deliberately differs from
CPU (integer division by zero), the test asserts the documented tpu behaviour.
"""
import pytest
import torch

from conftest import check, dev, host

I64_MAX, I64_MIN = 2**63 - 1, -(2**63)
I32_MAX, I32_MIN = 2**31 - 1, -(2**31)
NAN = float("nan")


@pytest.fixture(autouse=True)
def native(monkeypatch):
    monkeypatch.setenv("TPU_FALLBACK", "error")


def same(got, want):
    """Exact equality (dtype, shape, values; NaN == NaN) of tpu results with CPU's."""
    torch.testing.assert_close(host(got), want, rtol=0, atol=0, equal_nan=True)


def exact(fn, *args):
    return check(fn, *args, rtol=0, atol=0)


# ---- integer division and rounding modes ---------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8])
def test_integer_division_rounding_modes(dtype):
    a = torch.tensor([7, -7, 7, -7, 0, 6, -6, 1, -1, 5], dtype=dtype)
    b = torch.tensor([2, 2, -2, -2, 3, 3, -3, 4, 4, -5], dtype=dtype)
    for mode in ("trunc", "floor"):
        exact(lambda x, y: torch.div(x, y, rounding_mode=mode), a, b)
        exact(lambda x: torch.div(x, -3, rounding_mode=mode), a)
        exact(lambda x: torch.div(x, 2.5, rounding_mode=mode), a)  # float scalar: float result
    exact(lambda x, y: x / y, a, b)  # true division of ints gives float32
    exact(torch.floor_divide, a, b)
    exact(lambda x: x // -4, a)
    exact(torch.remainder, a, b)
    exact(lambda x: x % -3, a)
    exact(lambda y: torch.remainder(-7, y), b)
    exact(torch.fmod, a, b)
    exact(lambda x: torch.fmod(x, -3), a)


def test_division_into_out_tensors():
    a, b = torch.tensor([7.0, -7.5, 1.0]), torch.tensor([2.0, 2.0, -3.0])
    for mode in (None, "trunc", "floor"):
        want = torch.empty(3)
        torch.div(a, b, rounding_mode=mode, out=want)
        got = dev(torch.zeros(3))
        torch.div(dev(a), dev(b), rounding_mode=mode, out=got)
        same(got, want)
    got = dev(torch.zeros(3))
    torch.div(dev(a), dev(b), out=got)  # `out` is no rounding mode
    same(got, a / b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_float_division_rounding_modes(dtype):
    a = torch.tensor([7.5, -7.5, 7.5, -7.5, 0.0, -0.0, 1.0, -1.0, 5.0, 1e30, 3.0, NAN], dtype=dtype)
    b = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 0.0, 0.0, float("inf"), 3.0, -0.0, 1.0],
                     dtype=dtype)
    for mode in (None, "trunc", "floor"):
        exact(lambda x, y: torch.div(x, y, rounding_mode=mode), a, b)
        exact(lambda x: torch.div(x, -0.3, rounding_mode=mode), a)
    exact(torch.floor_divide, a, b)
    exact(torch.remainder, a, b)
    exact(torch.fmod, a, b)


def test_div_trunc_rounds_the_low_precision_quotient_like_cpu():
    # CPU rounds the quotient to bf16/fp16 before truncating: 2.998 / 1 in bf16 is 3.
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        a = (torch.randn(4000) * 20).to(dtype)
        b = (torch.randn(4000) * 3).to(dtype)
        exact(lambda x, y: torch.div(x, y, rounding_mode="trunc"), a, b)
        exact(lambda x, y: torch.div(x, y, rounding_mode="floor"), a, b)
        exact(torch.floor_divide, a, b)
        # A single-value divisor takes CPU's other path: f32 math, one rounding.
        for m in ("trunc", "floor"):
            exact(lambda x: torch.div(x, -0.3, rounding_mode=m), a)
            exact(lambda x, y: torch.div(x, y[:1], rounding_mode=m), a, b)
            exact(lambda x, y: torch.div(x, y[0], rounding_mode=m), a, b)
        exact(lambda x, y: torch.remainder(x, y), a, b)


def test_integer_min_divided_by_minus_one_wraps():
    """CPU traps (SIGFPE) on INT_MIN / -1; tpu gives the wrapped quotient INT_MIN and 0."""
    for dtype, lo in ((torch.int64, I64_MIN), (torch.int32, I32_MIN)):
        t = torch.tensor([lo, lo, lo + 1], dtype=dtype, device="tpu")
        m = torch.tensor([-1, 1, -1], dtype=dtype, device="tpu")
        for q in (torch.div(t, m, rounding_mode="trunc"), torch.div(t, m, rounding_mode="floor"), t // m):
            assert q.cpu().tolist() == [lo, lo, -(lo + 1)]
        assert torch.remainder(t, m).cpu().tolist() == [0, 0, 0]
        assert torch.fmod(t, m).cpu().tolist() == [0, 0, 0]


def test_integer_division_by_zero_raises_like_cpu():
    """CPU raises ZeroDivisionError; tpu raises it too, at the next synchronization (a
    device check, read like CUDA's device-side asserts), and the tensors stay usable."""
    a = torch.tensor([7, -7, 0, 5], dtype=torch.int64)
    z = torch.zeros(4, dtype=torch.int64)
    t, tz = dev(a), dev(z)
    for f in (lambda x, y: torch.div(x, y, rounding_mode="trunc"), lambda x, y: torch.div(x, y, rounding_mode="floor"),
              lambda x, y: x // y, lambda x, y: x // 0, lambda x, y: x % y, torch.fmod):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            f(a, z)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            f(t, tz).cpu()
    assert t.cpu().tolist() == [7, -7, 0, 5]
    # True division by an integer zero is float division, as on CPU.
    same(t / tz, a / z)


# ---- NaN propagation -------------------------------------------------------------------

def nan_data(dtype=torch.float32):
    x = torch.tensor([[1.0, NAN, 3.0, -2.0],
                      [4.0, 5.0, -1.0, 0.0],
                      [NAN, 2.0, NAN, 7.0]], dtype=dtype)
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_nan_propagates_through_max_min(dtype):
    x = nan_data(dtype)
    for f in (torch.max, torch.min, torch.amax, torch.amin, torch.argmax, torch.argmin):
        exact(f, x)
    for d in (0, 1, -1):
        exact(lambda t: torch.max(t, d), x)
        exact(lambda t: torch.min(t, d), x)
        exact(lambda t: torch.max(t, d, keepdim=True), x)
        exact(lambda t: torch.amax(t, d), x)
        exact(lambda t: torch.amin(t, (d,)), x)
        exact(lambda t: torch.argmax(t, d), x)
        exact(lambda t: torch.argmin(t, d, keepdim=True), x)
    y = torch.tensor([[0.0, 1.0, NAN, NAN], [NAN, -5.0, 2.0, 1.0], [1.0, 2.0, 3.0, NAN]], dtype=dtype)
    for f in (torch.maximum, torch.minimum, torch.fmax, torch.fmin):
        exact(f, x, y)
    exact(lambda t: t.clamp(min=0.0), x)
    exact(lambda t, lo, hi: torch.clamp(t, lo, hi), x, torch.zeros(4, dtype=dtype),
          torch.tensor([NAN, 1.0, 2.0, 5.0], dtype=dtype))
    exact(lambda t, lo: torch.clamp(t, min=lo), x, torch.full((3, 1), NAN, dtype=dtype))


def test_nan_sorts_as_largest():
    x = torch.tensor([[3.0, NAN, 1.0, -float("inf"), NAN, 2.0, float("inf"), -0.0, 0.0]])
    for desc in (False, True):
        exact(lambda t: torch.sort(t, descending=desc, stable=True), x)
        exact(lambda t: torch.argsort(t, descending=desc, stable=True), x)
    x = torch.tensor([[3.0, NAN, 1.0, -float("inf"), 2.0, float("inf"), -0.5]])  # no ties for topk
    for k in (1, 2, 3, 5):
        exact(lambda t: torch.topk(t, k), x)
        exact(lambda t: torch.topk(t, k, largest=False), x)
    exact(lambda t: torch.msort(t.t()), x)


def test_all_nan_rows_reduce_to_nan_and_index_zero():
    x = torch.full((2, 3), NAN)
    exact(lambda t: torch.max(t, 1), x)
    exact(lambda t: torch.argmin(t, 1), x)
    exact(torch.amax, x)


# ---- sort and topk ties -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.bool])
def test_stable_sort_with_ties_matches_cpu(dtype):
    torch.manual_seed(0)
    x = torch.randint(0, 4, (6, 300)).to(dtype)
    for dim in (0, 1):
        for desc in (False, True):
            exact(lambda t: torch.sort(t, dim=dim, descending=desc, stable=True), x)
            exact(lambda t: torch.argsort(t, dim=dim, descending=desc, stable=True), x)


def test_sort_and_topk_ties_are_deterministic_lowest_index_first():
    """CPU's unstable sort and topk order ties by its introsort/select internals; tpu
    always puts equal values in index order, which is what CPU gives for small rows."""
    x = torch.tensor([2, 1, 2, 1, 2, 0, 1, 2])
    t = dev(x)
    v, i = torch.sort(t)
    assert i.cpu().tolist() == [5, 1, 3, 6, 0, 2, 4, 7]
    v, i = torch.sort(t, descending=True)
    assert i.cpu().tolist() == [0, 2, 4, 7, 1, 3, 6, 5]
    v, i = torch.topk(t, 5)
    assert v.cpu().tolist() == [2, 2, 2, 2, 1] and i.cpu().tolist() == [0, 2, 4, 7, 1]
    v, i = torch.topk(t, 3, largest=False)
    assert v.cpu().tolist() == [0, 1, 1] and i.cpu().tolist() == [5, 1, 3]
    # Rows of at most 16 elements: CPU's std::sort is an insertion sort, hence stable too.
    torch.manual_seed(1)
    small = torch.randint(0, 3, (50, 16)).float()
    for desc in (False, True):
        exact(lambda a: torch.sort(a, descending=desc), small)
    # topk over rows of up to 3 elements goes through CPU's insertion sort as well.
    tiny = torch.randint(0, 2, (50, 3))
    for k in (1, 2, 3):
        exact(lambda a: torch.topk(a, k), tiny)
        exact(lambda a: torch.topk(a, k, largest=False), tiny)


def test_topk_values_match_cpu_and_indices_point_at_them():
    torch.manual_seed(2)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        x = torch.randint(-5, 5, (7, 40)).to(dtype)
        for k in (1, 4, 40):
            for largest in (True, False):
                want_v, _ = torch.topk(x, k, largest=largest)
                v, i = torch.topk(dev(x), k, largest=largest)
                same(v, want_v)
                same(dev(x).gather(1, i), want_v)


# ---- scatter / index_put accumulation -------------------------------------------------

def test_index_put_accumulate_with_duplicate_indices():
    x = torch.zeros(5, 3)
    idx = torch.tensor([0, 2, 0, 0, 4, 2])
    vals = torch.arange(18.0).reshape(6, 3)
    exact(lambda t, i, v: t.clone().index_put_((i,), v, accumulate=True), x, idx, vals)
    exact(lambda t, i, v: t.clone().index_put_((i,), v, accumulate=False)[1], x, idx, vals)  # untouched row
    # Two index tensors, duplicates among the (row, col) pairs, broadcast values.
    r, c = torch.tensor([1, 1, 3, 1]), torch.tensor([2, 2, 0, 2])
    exact(lambda t, a, b: t.clone().index_put_((a, b), torch.tensor(1.5), accumulate=True), x, r, c)
    exact(lambda t, a, v: t.clone().index_put_((a,), v, accumulate=True), x, r, torch.ones(3))
    # Integer targets; negative indices among the duplicates.
    xi = torch.zeros(4, dtype=torch.int64)
    exact(lambda t, i: t.clone().index_put_((i,), torch.tensor(3), accumulate=True), xi,
          torch.tensor([3, 3, 3, 0]))
    exact(lambda t, i, v: t.clone().index_put_((i,), v, accumulate=True), xi,
          torch.tensor([-1, -1, 0, 3]), torch.tensor([5, 6, 7, 8]))
    # Through the indexing syntax: x[i] += v reads once, so duplicates count once.
    def plus(t, i, v):
        t = t.clone()
        t[i] += v
        return t
    exact(plus, x, idx, torch.ones(6, 3))


def test_scatter_add_and_index_add_with_duplicates():
    torch.manual_seed(3)
    x = torch.randn(4, 5)
    idx = torch.tensor([[0, 1, 0, 3, 0], [3, 3, 3, 3, 3]])
    src = torch.randn(2, 5)
    exact(lambda t, i, s: t.scatter_add(0, i, s), x, idx, src)
    exact(lambda t, i, s: t.scatter_add(1, i, s), x, idx, src)
    exact(lambda t, i, s: torch.scatter_add(t, 1, i[:, :3], s), x, idx, src)  # src larger than index
    check(lambda t, i, s: t.index_add(0, i, s, alpha=2.5), x, torch.tensor([2, 0, 2, 2]), torch.randn(4, 5))
    check(lambda t, i, s: t.index_add(1, i, s), x, torch.tensor([4, 4, 1]), torch.randn(4, 3))
    xi = torch.zeros(3, dtype=torch.int32)
    exact(lambda t, i, s: t.index_add(0, i, s), xi, torch.tensor([1, 1, 1, 2]),
          torch.tensor([1, 2, 3, 4], dtype=torch.int32))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_scatter_reduce(reduce, include_self, dtype):
    torch.manual_seed(4)
    x = (torch.randn(4, 6) * 4).to(dtype)
    src = (torch.randn(3, 6) * 4).to(dtype)
    idx = torch.tensor([[0, 1, 1, 3, 0, 0], [1, 1, 1, 3, 0, 2], [0, 3, 1, 3, 0, 2]])
    for dim in (0, 1):
        i = idx if dim == 0 else idx[:, :4] % 6
        # Exact: with this data the f32 sums do not depend on the order of the terms.
        exact(lambda t, ix, s: t.scatter_reduce(dim, ix, s, reduce, include_self=include_self),
              x, i, src)


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_accumulation_with_duplicates_matches_cpu(dtype):
    """CPU's scatter kernels accumulate bf16/f16 in f32 and round once; index_add over
    1-D (or alpha != 1, or an inner dim) and index_put_ add slice by slice, rounding
    each step. Many duplicates make the two differ, so the results pin the order."""
    torch.manual_seed(9)
    x = torch.randn(4, 8).to(dtype)
    idx = torch.randint(0, 4, (200,))
    sidx = torch.randint(0, 4, (200, 8))
    src = (torch.randn(200, 8) / 8 + 1).to(dtype)
    exact(lambda a, i, s: a.index_add(0, i, s), x, idx, src)
    exact(lambda a, i, s: a.index_add(0, i, s, alpha=0.3), x, idx, src)
    exact(lambda a, i, s: a.t().index_add(1, i, s.t()), x, idx, src)
    exact(lambda a, i, s: a[0].index_add(0, i % 8, s[:, 0]), x, idx, src)
    exact(lambda a, i, s: a[0].index_add(0, i % 8, s[:, 0], alpha=-2), x, idx, src)
    exact(lambda a, i, s: a.view(2, 4, 4).index_add(1, i[:100] % 4, s.view(2, 100, 8)[:, :, :4]),
          x, idx, src)
    exact(lambda a, i, s: a.index_put((i,), s, accumulate=True), x, idx, src)
    exact(lambda a, i, s: a.scatter_add(0, i, s), x, sidx, src)
    exact(lambda a, i, s: a.scatter(0, i, s, reduce="multiply"), x, sidx, src)
    exact(lambda a, i: a.scatter(0, i, 1.01, reduce="multiply"), x, sidx)
    for reduce in ("sum", "mean", "prod", "amax", "amin"):
        for inc in (True, False):
            exact(lambda a, i, s: a.scatter_reduce(0, i, s, reduce, include_self=inc), x, sidx, src)


def test_scatter_reduce_nan_and_empty_index():
    x = torch.tensor([1.0, 2.0, 3.0])
    src = torch.tensor([NAN, 5.0, -1.0, 0.5])
    idx = torch.tensor([0, 0, 2, 2])
    for reduce in ("amax", "amin", "sum", "prod", "mean"):
        for inc in (True, False):
            exact(lambda t, i, s: t.scatter_reduce(0, i, s, reduce, include_self=inc), x, idx, src)
            exact(lambda t, i, s: t.scatter_reduce(0, i[:0], s, reduce, include_self=inc), x, idx, src)


def test_scatter_reduce_legacy_forms():
    x = torch.ones(3, 4)
    idx = torch.tensor([[0, 1, 2, 0], [0, 0, 0, 0]])
    src = torch.arange(8.0).reshape(2, 4) + 1
    exact(lambda t, i, s: t.scatter(0, i, s, reduce="add"), x, idx, src)
    exact(lambda t, i, s: t.scatter(0, i, s, reduce="multiply"), x, idx, src)
    exact(lambda t, i: t.scatter(0, i, 2.5, reduce="multiply"), x, idx)


# ---- negative indices -------------------------------------------------------------------

def test_negative_indices_wrap_in_advanced_indexing():
    x = torch.arange(24.0).reshape(4, 6)
    T = torch.tensor
    exact(lambda t, i: t[i], x, T([-1, 0, -4]))
    exact(lambda t, i: t[:, i], x, T([[-1, -6], [2, -3]]))
    exact(lambda t, i, j: t[i, j], x, T([-1, 1]), T([-2, -6]))
    exact(lambda t, i: t[-1, i], x, T([-1, 0]))
    exact(lambda t, i: t[1:, i], x, T([-1, 0]))
    exact(lambda t, i: t.clone().index_put_((i,), torch.tensor(9.0)), x, T([-1, -4]))
    exact(lambda t, i, j: t.clone().index_put_((i, j), torch.tensor(5.0), accumulate=True), x,
          T([-2, 2]), T([-1, 5]))
    exact(lambda t, i: t.index_fill(1, i, -7.0), x, T([-1, -2]))
    exact(lambda t: t[-2:][:, -3:] + 0, x)


def test_negative_dims_and_int_arguments():
    x = torch.arange(60.0).reshape(3, 4, 5)
    i = torch.tensor([[[2, 0, 1, 4, 3]]]).expand(3, 2, 5)
    exact(lambda t, ix: t.gather(-2, ix % 4), x, i)
    exact(lambda t, i: t.index_select(-1, i), x, torch.tensor([4, 0, 4]))
    exact(lambda t: t.select(-1, -2) + 0, x)
    exact(lambda t: t.narrow(-2, -3, 2) * 1, x)
    exact(lambda t: torch.roll(t, -7, -1), x)
    exact(lambda t: torch.cumsum(t, -2), x)


# ---- empty tensors and 0-size dims ------------------------------------------------------

def test_broadcasting_with_zero_size_dims():
    a = torch.randn(0, 3)
    b = torch.randn(1, 3)
    exact(torch.add, a, b)
    exact(torch.mul, torch.randn(4, 1, 0), torch.randn(5, 1))
    exact(lambda x, y: torch.where(x > 0, x, y), torch.randn(2, 0, 1), torch.randn(3))
    exact(lambda x: x.expand(3, 0), torch.randn(1, 0))
    exact(lambda x, y: torch.cat([x, y]), torch.randn(0, 3), torch.ones(2, 3))
    exact(lambda x, y: torch.cat([x, y], 1), torch.randn(2, 0), torch.ones(2, 3))
    exact(lambda x: x.sum() + x.mean(0).sum(), torch.randn(0, 4))


def test_reductions_over_empty_dims_give_identities():
    e = torch.randn(3, 0)
    for f in (lambda x: x.sum(1), lambda x: x.prod(1), lambda x: x.sum(), lambda x: x.prod(),
              lambda x: x.sum(0), lambda x: x.any(1), lambda x: x.all(1), lambda x: x.amax(0),
              lambda x: x.cumsum(1), lambda x: x.logsumexp(1), lambda x: x.norm(dim=1)):
        exact(f, e)
    exact(lambda x: x.mean(1), e)   # 0 / 0: NaN
    with pytest.warns(UserWarning):
        exact(lambda x: x.var(1), e)
    exact(lambda x: x.sum(1), torch.zeros(3, 0, dtype=torch.int64))
    exact(lambda x: x.prod(1), torch.zeros(3, 0, dtype=torch.int32))


@pytest.mark.parametrize("fn, msg", [
    (lambda x: x.amax(1), "Expected reduction dim 1 to have non-zero size"),
    (lambda x: x.max(1), "Expected reduction dim 1 to have non-zero size"),
    (lambda x: x.argmin(1), "Expected reduction dim 1 to have non-zero size"),
    (lambda x: x.max(), "Expected reduction dim to be specified"),
    (lambda x: x.argmax(), "Expected reduction dim to be specified"),
])
def test_reductions_without_identity_raise_on_empty_dims_like_cpu(fn, msg):
    e = torch.randn(3, 0)
    with pytest.raises((RuntimeError, IndexError), match=msg):
        fn(e)
    # amax's meta kernel words it differently: "reducing over zero-size dimension".
    with pytest.raises((RuntimeError, IndexError), match=msg + "|zero-size dimension"):
        fn(dev(e))


def empty_index(*shape):
    return torch.zeros(shape, dtype=torch.int64)


def test_gather_and_index_with_empty_index():
    x = torch.arange(5.0)
    y = torch.arange(12.0).reshape(3, 4)
    exact(lambda t, i: t.gather(0, i), x, empty_index(0))
    exact(lambda t, i: t.gather(1, i), y, empty_index(3, 0))
    exact(lambda t, i: t.gather(0, i), y, empty_index(0, 4))
    exact(lambda t, i: t.index_select(0, i), y, empty_index(0))
    exact(lambda t, i: t[i], y, empty_index(0, 2))
    exact(lambda t, i: t.scatter(1, i, 1.0), y, empty_index(3, 0))
    exact(lambda t, i: t.scatter_add(0, i, torch.ones_like(t)), y, empty_index(0, 4))
    exact(lambda t, i: t.index_add(0, i, t[:0]), y, empty_index(0))


def test_gather_with_empty_higher_rank_index():
    # A 1-D input gathered by an empty 2-D index (OpInfo's sample): shape [2, 0].
    x = torch.arange(5.0)
    exact(lambda t, i: torch.gather(t, 0, i), x, empty_index(2, 0))
    exact(lambda t, i: torch.gather(t, 0, i), x, empty_index(0, 3))
    exact(lambda t, i: torch.gather(t, 0, i.to(torch.uint8)), x, empty_index(2, 0))
    y = torch.arange(12.0).reshape(3, 4)
    exact(lambda t, i: torch.gather(t, 1, i), y, empty_index(2, 0))
    # ... and its backward, a scatter_add of the same empty index.
    exact(lambda t, i: t.scatter_add(0, i, i.float()), x, empty_index(2, 0))
    exact(lambda t, i: t.scatter_reduce(0, i, i.float(), "amax", include_self=False), x, empty_index(2, 0))
    exact(lambda t, i: t.scatter(0, i, 1.0), x, empty_index(0, 3))
    g = dev(x).requires_grad_()
    torch.gather(g, 0, dev(empty_index(2, 0))).sum().backward()
    same(g.grad, torch.zeros(5))


# ---- type promotion ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                   torch.bool, torch.float16, torch.bfloat16, torch.float32,
                                   torch.float64])
def test_type_promotion_with_python_scalars(dtype):
    x = torch.tensor([0, 1, 1, 0, 1], dtype=dtype) if dtype == torch.bool else \
        torch.tensor([0, 1, 2, 5, 100]).to(dtype)
    for s in (3, -2, 2.5, True):
        exact(lambda t: t + s, x)
        exact(lambda t: t * s, x)
        if s is not True and dtype != torch.bool:  # CPU forbids subtracting bools
            exact(lambda t: s - t, x)
        exact(lambda t: t > s, x)
        exact(lambda t: torch.where(t > 0, t, s), x)
    exact(lambda t: t / 2, x)
    if dtype != torch.bool:
        exact(lambda t: t.float().clamp(0, 3.5) + t, x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32, torch.uint8,
                                   torch.bool])
def test_type_promotion_with_zero_dim_tensors(dtype):
    x = torch.tensor([1, 0, 1, 1]).to(dtype)
    for z in (torch.tensor(1.5), torch.tensor(2.5, dtype=torch.float64), torch.tensor(3),
              torch.tensor(True), torch.tensor(7, dtype=torch.int8)):
        exact(lambda a, b: a + b, x, z)
        exact(lambda a, b: a * b, x, z)
        exact(lambda a, b: torch.maximum(a, b), x, z)
        exact(lambda a, b: torch.where(a.bool(), a, b), x, z)
    # A 0-dim tensor against another 0-dim tensor promotes as between dimensioned ones.
    exact(lambda a, b: a + b, torch.tensor(2, dtype=dtype), torch.tensor(1.5))
    # Dimensioned tensors of different dtypes promote fully.
    exact(lambda a, b: a + b, x, torch.tensor([2.5, 1, 0, 1], dtype=torch.float32))


def test_in_place_promotion_rules():
    x = torch.tensor([1, 2, 3], dtype=torch.int32)
    exact(lambda t: t.clone().add_(2), x)
    exact(lambda t: t.clone().mul_(torch.tensor(3, dtype=torch.int64)), x)
    for t in (x, dev(x)):   # same error on both
        with pytest.raises(RuntimeError, match="can't be cast|not possible"):
            t.add_(torch.tensor([1.5, 2.5, 0.5], device=t.device))
    h = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    exact(lambda t, o: t.clone().add_(o), h, torch.tensor([1 / 3, 1.0]))  # float32 math, bf16 result
    u = torch.tensor([250, 3], dtype=torch.uint8)
    exact(lambda t: t + 10, u)   # wraps in uint8
    exact(lambda t: t - 5, u)


# ---- integer overflow wraps ---------------------------------------------------------

def test_int64_overflow_wraps():
    a = torch.tensor([I64_MAX, I64_MIN, I64_MAX - 1, 2**62, -(2**62), 3037000500])
    b = torch.tensor([1, -1, 5, 2**62, -(2**62) - 1, 3037000500])
    exact(torch.add, a, b)
    exact(torch.sub, a, b)
    exact(torch.mul, a, b)
    exact(lambda x: x + 1, a)
    exact(lambda x: x * 3, a)
    exact(lambda x: x * (2**40), a)
    exact(lambda x: x + I64_MAX, a)
    exact(lambda x: -x, a)
    exact(torch.abs, a)
    exact(lambda x: x.sum(), a)
    exact(lambda x: x.cumsum(0), a)
    exact(lambda x: x.prod(), a[2:])


def test_int32_int16_uint8_overflow_wraps():
    for dtype, hi, lo in ((torch.int32, I32_MAX, I32_MIN), (torch.int16, 32767, -32768),
                          (torch.int8, 127, -128), (torch.uint8, 255, 0)):
        a = torch.tensor([hi, lo, hi - 1, 3], dtype=dtype)
        b = torch.tensor([1, 1 if lo == 0 else -1, 7, hi], dtype=dtype)
        exact(torch.add, a, b)
        exact(torch.sub, a, b)
        exact(torch.mul, a, b)
        exact(lambda x: x * 100, a)
        exact(lambda x: x.sum(dtype=dtype), a)
        exact(lambda x: x.cumsum(0, dtype=dtype), a)


def test_python_scalars_outside_the_dtype_range_wrap_like_cpu():
    x = torch.tensor([1, -5, I32_MAX], dtype=torch.int32)
    for f in (lambda t: t + 2**40, lambda t: t * 2**31, lambda t: t - 2**31,
              lambda t: t.long() + I64_MIN, lambda t: t.to(torch.uint8) + 300,
              lambda t: t.to(torch.int8) * -129):
        exact(f, x)


# ---- in-place ops on views of views -------------------------------------------------------

def test_in_place_on_views_of_views():
    def run(x):
        x = x.clone()
        x.t()[1:3].add_(100)                 # slice of a transpose
        x[1:, 1:].diagonal().mul_(-1)        # diagonal of a slice
        x.t().add_(0.5)                      # the whole transpose
        x[::2].t()[1].sub_(7)                # row of the transpose of a strided slice
        x.view(-1)[3::5].fill_(42)           # strided view of a flattened view
        x.unsqueeze(0).permute(2, 0, 1)[2].div_(2)
        return x
    exact(run, torch.arange(30.0).reshape(5, 6))


def test_in_place_through_dtype_views():
    def run(x):
        x = x.clone()
        x.view(torch.int32)[1:3].bitwise_or_(1)   # flips the last mantissa bit of two floats
        x[2:].view(torch.int32).add_(2)
        return x
    exact(run, torch.arange(6.0))

    def bytes_(x):
        x = x.clone()
        x.view(torch.uint8)[::4].fill_(255)
        return x
    exact(bytes_, torch.arange(4, dtype=torch.int32))


def test_in_place_chain_keeps_aliases_consistent():
    def run(x):
        x = x.clone()
        a = x[1:]
        b = a.t()
        c = b[2:]
        c.mul_(2)
        b.add_(1)
        a.diagonal().zero_()
        return x, a, b, c
    exact(run, torch.arange(20.0).reshape(5, 4))


def test_out_of_place_on_views_does_not_write():
    def run(x):
        y = x.t()[1:].diagonal()
        return y * 2, x
    exact(run, torch.arange(12.0).reshape(3, 4))


# ---- low-precision reductions accumulate in float32 ------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_reductions_accumulate_in_float32(dtype):
    """CPU accumulates bf16/f16 sums in f32 and rounds once: so do we, bit for bit."""
    torch.manual_seed(5)
    ones = torch.ones(4096, dtype=dtype)
    exact(lambda x: x.sum(), ones)    # a bf16 accumulator would stop at 256 (fp16: 2048)
    exact(lambda x: x.mean(), ones)
    exact(lambda x: x.cumsum(0), ones)
    x = (torch.randn(64, 512) * 3 + 1).to(dtype)
    for f in (lambda t: t.sum(1), lambda t: t.sum(0), lambda t: t.sum(), lambda t: t.mean(1),
              lambda t: t.var(1), lambda t: t.std(0), lambda t: t.norm(dim=1),
              lambda t: t.logsumexp(1), lambda t: t.logsumexp(0)):
        exact(f, x)
    # Scans: the f32 partial sums come in another order (log-depth), so allow one ulp.
    ulp = 2**-7 if dtype == torch.bfloat16 else 2**-10
    check(lambda t: t.cumsum(1), x, rtol=ulp, atol=0)
    check(lambda t: torch.softmax(t, 1), x, rtol=ulp, atol=0)  # exp's last f32 bits
    # f32 dot products against the exact (float64) product: within one rounding of it.
    # (CPU's own half-precision matmul differs by instruction set, so it is no reference.)
    exact64 = (x.double() @ x.double().t()).to(dtype)
    torch.testing.assert_close((x.to("tpu") @ x.to("tpu").t()).cpu(), exact64, rtol=ulp, atol=0)
    # log_softmax: CPU's fused kernel differs from f32-then-round in about 6% of
    # elements by 1-2 ulp (the lowering lives in nn.cpp).
    check(lambda t: torch.log_softmax(t, 1), x, rtol=2 * ulp, atol=2 * ulp)
    # A large row whose bf16 running sum would lose the small terms entirely.
    big = torch.cat([torch.full((1,), 1024.0), torch.full((2048,), 0.25)]).to(dtype)
    exact(lambda t: t.sum(), big)
    exact(lambda t: t @ t, big)


def test_low_precision_prod_accumulates_in_float32_unlike_cpu():
    """CPU's bf16 prod multiplies in bf16 (vector lanes, each step rounded); tpu
    accumulates in f32 like CUDA, so it equals the f32 product rounded once."""
    torch.manual_seed(8)
    x = (torch.randn(16, 300) / 8 + 1).to(torch.bfloat16)
    got = torch.prod(dev(x), 1).cpu()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, x.float().prod(1).bfloat16(), rtol=2**-8, atol=0)
    cpu_err = (x.prod(1).float() - x.double().prod(1)).abs().max()
    tpu_err = (got.float() - x.double().prod(1)).abs().max()
    assert tpu_err <= cpu_err


def test_low_precision_reduction_dtypes_match_cpu():
    x = torch.randn(8, 8).to(torch.bfloat16)
    for f in (lambda t: t.sum(), lambda t: t.sum(dtype=torch.float32), lambda t: t.mean(0),
              lambda t: t.cumsum(0, dtype=torch.float32), lambda t: t.prod(1),
              lambda t: t.var(), lambda t: t.norm()):
        want, got = f(x), f(dev(x))
        assert got.dtype == want.dtype and got.shape == want.shape


# ---- float64 end to end ----------------------------------------------------------------------

def test_float64_end_to_end():
    torch.manual_seed(6)
    x = torch.randn(16, 24, dtype=torch.float64)
    w = torch.randn(24, 8, dtype=torch.float64)
    kw = dict(rtol=1e-12, atol=1e-12)
    check(lambda a, b: a @ b, x, w, **kw)
    check(lambda a: (a.exp() + a.sin() * 3 - a.tanh()) / (a.abs() + 1), x, **kw)
    check(lambda a: (a.sum(), a.mean(1), a.var(0), a.prod(0), a.cumsum(1), a.amax(1)), x, **kw)
    check(lambda a: torch.softmax(a, 1), x, **kw)
    check(lambda a: torch.sort(a, 1), x, **kw)
    # Values only a double can hold survive the round trip and arithmetic.
    tiny = torch.tensor([1e-300, 1 + 2**-50, 1e300], dtype=torch.float64)
    exact(lambda a: a * 1, tiny)
    exact(lambda a: (a - 1) * 2**50, tiny)
    # Autograd in float64.
    p = torch.randn(5, dtype=torch.float64, requires_grad=True)
    q = dev(p.detach()).requires_grad_()
    (p.sin() * p).sum().backward()
    (q.sin() * q).sum().backward()
    torch.testing.assert_close(q.grad.cpu(), p.grad, **kw)
    assert q.grad.dtype == torch.float64


# ---- masked_scatter ---------------------------------------------------------------------------

def test_masked_scatter_broadcasts_self_and_mask():
    torch.manual_seed(7)
    src = torch.arange(1.0, 26.0).reshape(5, 5)
    mask = torch.rand(5, 5) > 0.5
    exact(lambda s, m, v: torch.masked_scatter(s, m, v), torch.zeros(5), mask, src)  # self broadcast
    exact(lambda s, m, v: s.masked_scatter(m, v), torch.zeros(5, 5), mask[0], src)    # mask broadcast
    exact(lambda s, m, v: s.masked_scatter(m, v), torch.zeros(1, 5), mask[:, :1], src)
    exact(lambda s, m, v: s.clone().masked_scatter_(m, v), torch.zeros(5, 5), mask, src)


# ---- out-of-range indices: a clear error, never clamped garbage ----

OOB_CASES = {
    "index": lambda x, i: x[i],
    "index_select": lambda x, i: x.index_select(0, i),
    "gather": lambda x, i: x.gather(0, i),
    "embedding": lambda x, i: torch.nn.functional.embedding(i, x.reshape(5, 2)),
    "scatter_add": lambda x, i: x.scatter_add(0, i, torch.ones_like(x[:2])),
    "index_add": lambda x, i: x.index_add(0, i, torch.ones_like(x[:2])),
}


@pytest.mark.parametrize("op", sorted(OOB_CASES))
def test_out_of_range_index_is_an_error_naming_the_op(op):
    x = torch.arange(10.0, device="tpu")
    bad = torch.tensor([1, 11], device="tpu")
    with pytest.raises(Exception) as on_cpu:  # CPU's type: IndexError, or RuntimeError (gather & co.)
        OOB_CASES[op](x.cpu(), bad.cpu())
    with pytest.raises(on_cpu.type, match=r"out of (bounds|range).*(size 10|0 to 4)"):
        OOB_CASES[op](x, bad).cpu()
    # reported once; the process and the inputs are unharmed
    torch.tpu.synchronize()
    assert x.sum().item() == 45.0
    good = torch.tensor([1, 3], device="tpu")
    assert torch.equal(OOB_CASES[op](x, good).cpu(), OOB_CASES[op](x.cpu(), good.cpu()))


def test_failed_in_place_index_write_leaves_the_tensor_unchanged():
    z = torch.arange(4.0, device="tpu")
    with pytest.raises(IndexError, match=r"index_put_.*size 4"):
        z[torch.tensor([0, 9], device="tpu")] = 5.0  # raised here in Debug mode
        torch.tpu.synchronize()                      # else at the next synchronization
    assert z.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(IndexError, match=r"index_add"):
        z.index_add_(0, torch.tensor([-1], device="tpu"), torch.ones(1, device="tpu"))
        z.cpu()
    assert z.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_negative_indices_in_range_wrap_like_cpu():
    x = torch.arange(10.0)
    i = torch.tensor([-1, -10, 3])
    assert torch.equal(x.to("tpu")[i.to("tpu")].cpu(), x[i])


def test_assert_async_raises_at_the_next_sync_and_loses_nothing():
    # CUDA's device-side assert: the condition stays on the device; a zero raises with
    # its message by the next synchronization (at the op in Debug mode), as on CUDA.
    from torch_tpu.compat.run import fallbacks
    before = fallbacks()
    keep = torch.arange(4.0, device="tpu")
    torch._assert_async(torch.tensor(2.0, device="tpu"))
    torch._assert_async(torch.tensor(float("nan"), device="tpu"), "NaN is nonzero")
    torch.tpu.synchronize()
    with pytest.raises(RuntimeError, match="^the step went wrong$"):
        torch._assert_async(torch.tensor(0, device="tpu"), "the step went wrong")
        torch.tpu.synchronize()
    with pytest.raises(RuntimeError, match="single nonzero value, but got zero"):
        torch._assert_async(torch.tensor(False, device="tpu"))
        torch.tpu.synchronize()
    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        torch._assert_async(torch.ones(2, device="tpu"))
    assert (keep + 1).cpu().tolist() == [1.0, 2.0, 3.0, 4.0]

    def f(a):  # what transformers' compile-friendly checks become in a graph
        torch._assert_async(a.sum() > 0, "sum must be positive")
        return a * 2
    g = torch.compile(f, backend="tpu", fullgraph=True)
    assert g(torch.ones(4, device="tpu")).cpu().tolist() == [2.0] * 4
    with pytest.raises(RuntimeError, match="sum must be positive"):
        g(-torch.ones(4, device="tpu"))
        torch.tpu.synchronize()
    assert fallbacks() == before  # lowered: nothing ran on the host
