"""torch.unique(dim=...) and torch.unique_consecutive(dim=...) run natively and return
CPU's values, inverse, counts, dtypes and strides; sorted rows holding NaN (whose order
CPU's std::sort decides) take the counted fallback; bad input raises CPU's errors."""

import pytest
import torch

from conftest import all_fallbacks, dev, host, native

NAN = float("nan")


def flat(r):
    return list(r) if isinstance(r, (tuple, list)) else [r]


def same(fn, x):
    want = flat(fn(x))
    with native():
        got = flat(fn(dev(x)))
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert g.device.type == "tpu"
        assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
        torch.testing.assert_close(host(g), w, rtol=0, atol=0, equal_nan=True)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def cases():
    g = gen()
    yield torch.tensor([[1, 2], [0, 5], [1, 2], [0, 4]])
    yield torch.randint(0, 2, (7, 3, 2), generator=g)
    yield torch.randint(-3, 3, (5, 4), generator=g).to(torch.int8)
    yield torch.randint(0, 2, (6, 4), generator=g).bool()
    yield torch.randint(0, 3, (5, 3), generator=g).to(torch.uint16)
    yield torch.randint(0, 3, (6, 5), generator=g).float() - 1
    yield torch.randint(0, 3, (4, 6), generator=g).to(torch.bfloat16)
    yield torch.randint(0, 2, (3, 5, 4), generator=g).double().transpose(0, 2)  # not contiguous
    yield torch.tensor([[2.5, 1e30], [-1e30, 0.0], [2.5, 1e30], [-1e30, -3.0]])
    yield torch.tensor([[7]])
    yield torch.randint(0, 2, (40, 17), generator=g)  # many columns


@pytest.mark.parametrize("i", range(11))
def test_unique_dim_matches_cpu(i):
    x = list(cases())[i]
    for d in range(-x.dim(), x.dim()):
        same(lambda a: torch.unique(a, dim=d), x)
        same(lambda a: torch.unique(a, dim=d, return_inverse=True, return_counts=True), x)
        same(lambda a: torch.unique(a, sorted=False, dim=d, return_counts=True), x)
        # the aten ops return inverse and counts whatever is asked
        same(lambda a: torch.ops.aten.unique_dim(a, d), x)
        same(lambda a: torch.unique_consecutive(a, dim=d, return_inverse=True, return_counts=True), x)
        same(lambda a: torch.ops.aten.unique_consecutive(a, False, False, d), x)


def test_unique_consecutive_dim_with_nan_and_signed_zeros():
    x = torch.tensor([[NAN, 1.], [NAN, 1.], [0., -0.], [-0., 0.], [1., 1.]])
    same(lambda a: torch.unique_consecutive(a, dim=0, return_inverse=True, return_counts=True), x)
    same(lambda a: torch.unique_consecutive(a, dim=1, return_inverse=True, return_counts=True), x)
    # signed zeros are equal rows: one group either way
    same(lambda a: torch.unique(a, dim=0, return_inverse=True, return_counts=True), x[2:])


def test_sorted_rows_holding_nan_take_the_counted_fallback():
    x = torch.tensor([[2., 1], [1, NAN], [1, NAN], [1, 3], [NAN, 0]])
    want = torch.unique(x, dim=0, return_inverse=True, return_counts=True)
    before = all_fallbacks().get("aten::unique_dim", 0)
    with pytest.warns(UserWarning, match="unique_dim runs on the CPU fallback"):
        got = torch.unique(dev(x), dim=0, return_inverse=True, return_counts=True)
    assert all_fallbacks().get("aten::unique_dim", 0) == before + 1
    for w, g in zip(want, got):
        torch.testing.assert_close(host(g), w, rtol=0, atol=0, equal_nan=True)


def test_empty_inputs_match_cpu():
    for shape, d in [((0, 3), 0), ((3, 0), 1), ((2, 0, 3), 1)]:
        x = torch.empty(shape)
        same(lambda a: torch.unique(a, dim=d, return_inverse=True, return_counts=True), x)
        same(lambda a: torch.unique_consecutive(a, dim=d, return_inverse=True, return_counts=True), x)


def errors(fn, x):
    with pytest.raises(Exception) as want:
        fn(x)
    with pytest.raises(type(want.value)) as got:
        fn(dev(x))
    assert str(got.value).split("\n")[0] == str(want.value).split("\n")[0]


def test_bad_input_raises_cpus_errors_and_leaves_the_input_usable():
    cases = [((0, 3), 1), ((3, 0), 0), ((0, 0), 0), ((2, 0, 3), 2)]
    for shape, d in cases:
        errors(lambda a: torch.unique(a, dim=d), torch.empty(shape))
        errors(lambda a: torch.unique_consecutive(a, dim=d), torch.empty(shape))
    x = torch.tensor([[1, 2], [3, 4]])
    errors(lambda a: torch.unique(a, dim=2), x)
    errors(lambda a: torch.unique_consecutive(a, dim=-3), x)
    errors(lambda a: torch.unique(a, dim=0), torch.tensor(5.))
    errors(lambda a: torch.unique(a, dim=0), torch.ones(2, 2, dtype=torch.cfloat))
    errors(lambda a: torch.unique_consecutive(a, dim=0), torch.ones(2, 2, dtype=torch.cfloat))
    t = dev(x)
    assert host(torch.unique(t, dim=1)).tolist() == [[1, 2], [3, 4]]


def test_computed_inputs():
    # a computed input (deferred in DeferAndFuse), at repeated and new sizes
    with native():
        for n in (4, 4, 9):
            x = torch.randint(0, 2, (n, 3), generator=gen(n))
            y = dev(x) * 2 + 1
            v, inv, c = torch.unique(y, dim=0, return_inverse=True, return_counts=True)
            w = torch.unique(x * 2 + 1, dim=0, return_inverse=True, return_counts=True)
            assert host(v).tolist() == w[0].tolist()
            assert host(inv).tolist() == w[1].tolist() and host(c).tolist() == w[2].tolist()
