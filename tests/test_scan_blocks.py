"""Scans (cumsum, cumprod, cummax, cummin, logcumsumexp, and masked_scatter's count of its
mask) over lengths that cross the blocks they are computed in (16, and 8 for logcumsumexp:
within a block, then the blocks' totals, recursively), along every dim, checked against CPU;
and their device memory, which stays a small multiple of the result."""

import pytest
import torch

from conftest import native

NAN = float("nan")
LENGTHS = [1, 7, 8, 9, 16, 17, 128, 129, 255, 256, 257, 4097]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def check(fn, x, exact):
    with native():
        want = fn(x)
        got = fn(x.to("tpu"))
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for w, g in zip(want, got, strict=True):
        g = g.cpu()
        assert g.dtype == w.dtype and g.shape == w.shape
        if exact:
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-5, equal_nan=True)


def shapes(n):
    # the scanned dim first, in the middle and last
    return [((n,), 0), ((n, 3), 0), ((2, n, 3), 1), ((3, n), 1), ((3, n), -1)]


@pytest.mark.parametrize("n", LENGTHS)
def test_integer_cumsum_and_cumprod_are_exact(n):
    for shape, dim in shapes(n):
        x = torch.randint(-3, 4, shape, generator=gen(n))
        check(lambda a: torch.cumsum(a, dim), x, True)
        check(lambda a: torch.cumsum(a.to(torch.int8), dim, dtype=torch.int8), x, True)  # wraps as CPU's
        check(lambda a: torch.cumsum(a > 0, dim), x, True)  # bool counts as int64
        small = torch.randint(-1, 2, shape, generator=gen(n + 1)) * 2 + 1  # +-1: no overflow
        check(lambda a: torch.cumprod(a, dim), small, True)


@pytest.mark.parametrize("n", LENGTHS)
def test_float_cumsum_and_cumprod_match_cpu(n):
    for shape, dim in shapes(n):
        x = torch.randn(shape, generator=gen(n))
        check(lambda a: torch.cumsum(a, dim), x, False)
        check(lambda a: torch.cumprod(1 + a * 1e-3, dim), x, False)
        check(lambda a: torch.cumsum(a.to(torch.complex64) * (1 - 2j), dim), x, False)
    # a NaN or an infinity stays from its position on, as CPU's sequential sum
    x = torch.randn(n, generator=gen(n))
    x[n // 2] = NAN
    check(lambda a: torch.cumsum(a, 0), x, False)
    x[n // 2] = float("inf")
    check(lambda a: torch.cumsum(a, 0), x, False)


def test_low_precision_cumsum_accumulates_in_float32():
    x = torch.full((4097,), 0.01).to(torch.bfloat16)
    check(lambda a: torch.cumsum(a, 0), x, False)
    check(lambda a: torch.cumsum(a.half(), 0), x, False)


@pytest.mark.parametrize("n", LENGTHS)
def test_cummax_cummin_ties_and_nans_pick_cpus_index(n):
    for shape, dim in shapes(n):
        v = torch.randint(0, 3, shape, generator=gen(n)).float()  # many ties
        v[torch.rand(shape, generator=gen(n + 1)) < 0.05] = NAN  # NaNs take over; later ones move the index
        for x in (v, v.nan_to_num(0.0), v.nan_to_num(0.0).long(), v.nan_to_num(0.0) > 0):
            check(lambda a: torch.cummax(a, dim), x, True)
            check(lambda a: torch.cummin(a, dim), x, True)
    ext = torch.tensor([float("-inf")] * 20 + [1.0] + [float("-inf")] * 5)  # the identity itself
    check(lambda a: torch.cummax(a, 0), ext, True)
    check(lambda a: torch.cummin(-a, 0), ext, True)
    ints = torch.full((40,), torch.iinfo(torch.int64).min)
    check(lambda a: torch.cummax(a, 0), ints, True)


@pytest.mark.parametrize("n", LENGTHS)
def test_logcumsumexp_matches_cpu(n):
    for shape, dim in shapes(n):
        x = torch.randn(shape, generator=gen(n)) * 10
        check(lambda a: torch.logcumsumexp(a, dim), x, False)
    x = torch.randn(n, generator=gen(n))
    x[: n // 2] = float("-inf")
    check(lambda a: torch.logcumsumexp(a, 0), x, False)


def test_scan_gradients_cross_blocks():
    x = torch.randn(3, 300, generator=gen())
    w = torch.randn(3, 300, generator=gen(1))

    def grads(a, op):
        a = a.clone().requires_grad_()
        (op(a) * w.to(a.device)).sum().backward()
        return a.grad
    for op in (lambda a: torch.cumsum(a, 1), lambda a: torch.cumprod(1 + a * 0.01, 1),
               lambda a: torch.cummax(a, 1)[0], lambda a: torch.logcumsumexp(a, 1)):
        check(lambda a: grads(a, op), x, False)


@pytest.mark.parametrize("op", ["cumsum", "cummax", "logcumsumexp"])
def test_scan_memory_is_a_small_multiple_of_the_result(op):
    # Log steps over the whole dim held one array per step: 98 bytes per float for a
    # 2^24 cumsum, 268 for cummax (value and index), 170 for logcumsumexp.
    n = 1 << 20
    x = torch.randn(n, device="tpu")
    fn = {"cumsum": lambda a: torch.cumsum(a, 0), "cummax": lambda a: torch.cummax(a, 0),
          "logcumsumexp": lambda a: torch.logcumsumexp(a, 0)}[op]
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    r = fn(x)
    torch.tpu.synchronize()
    per_element = (torch.tpu.max_memory_allocated() - base) / n
    result = 12 if op == "cummax" else 4  # float value, and an int64 index for cummax
    assert per_element <= 2.5 * result, per_element
    del r


@pytest.mark.parametrize("n", LENGTHS)
def test_masked_scatter_counts_the_mask_across_blocks(n):
    x = torch.randn(2, n, generator=gen(n))
    mask = torch.rand(2, n, generator=gen(n + 1)) < 0.4
    src = torch.randn(2 * n, generator=gen(n + 2))
    with native():
        want = x.masked_scatter(mask, src)
        got = x.to("tpu").masked_scatter(mask.to("tpu"), src.to("tpu")).cpu()
    assert torch.equal(got, want)


def test_masked_scatter_memory_is_a_small_multiple_of_the_result():
    # its mask count was log2(n) shifted adds: 176 bytes per float of a 2^22 result
    n = 1 << 20
    x = torch.randn(n, device="tpu")
    mask = torch.rand(n, device="tpu") < 0.3
    src = torch.randn(n, device="tpu")
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    r = x.masked_scatter(mask, src)
    torch.tpu.synchronize()
    assert (torch.tpu.max_memory_allocated() - base) / n <= 24
    del r
