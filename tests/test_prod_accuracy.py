"""float32 prod and cumprod over long rows keep CPU's accuracy.

A float32 product of 1e6 values near 1, taken as a tree (XLA's reduce, the blocked scan
of cumprod), drifted 2e-4 from the exact product; CPU's cumprod accumulates in double
(6e-8) and its float prod was 2e-5 off. Products over 1024 or more terms now carry each
multiply's rounding error beside them (csrc/lowering/compensated_sum.cpp). Errors are
against float64; special values (inf, NaN, -0.0, overflow, underflow) must come out as on CPU.
"""
import pytest
import torch

D = "tpu"


def _near_one(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return 1 + 1e-3 * torch.randn(n, generator=g)


def _rel(got, want):
    return ((got.double() - want).abs() / want.abs()).max().item()


@pytest.mark.parametrize("n", [1024, 100_000, 1_000_000])
def test_prod_of_many_values_near_one(n):
    x = _near_one(n)
    want = x.double().prod()
    cpu_err = _rel(x.prod(), want)
    err = _rel(x.to(D).prod().cpu(), want)
    # was 2.2e-4 at 1e6 (CPU 1.7e-5)
    assert err <= max(cpu_err, 2e-7), (err, cpu_err)


def test_prod_along_a_dim_of_long_rows():
    x = _near_one(64 * 4096, seed=1).view(64, 4096)
    want = x.double().prod(1)
    assert _rel(x.to(D).prod(1).cpu(), want) < 2e-7
    # the leading dim, reduced with the rows kept
    assert _rel(x.t().to(D).prod(0).cpu(), want) < 2e-7


@pytest.mark.parametrize("n", [1024, 100_000, 1_000_000])
def test_cumprod_of_many_values_near_one(n):
    x = _near_one(n, seed=2)
    want = x.double().cumprod(0)
    err = _rel(x.to(D).cumprod(0).cpu(), want)
    # was 3.4e-4 at 1e6; CPU (double accumulation) about 6e-8
    assert err < 3e-7, err


def test_cumprod_of_long_rows_along_each_dim():
    x = _near_one(8 * 2048, seed=3).view(8, 2048)
    assert _rel(x.to(D).cumprod(1).cpu(), x.double().cumprod(1)) < 3e-7
    xt = x.t().contiguous()
    assert _rel(xt.to(D).cumprod(0).cpu(), xt.double().cumprod(0)) < 3e-7


def _specials(n):
    x = _near_one(n, seed=4)
    rows = {}
    for name, pos, v in [("inf", 100, float("inf")), ("nan", 700, float("nan")),
                         ("neg_zero", 900, -0.0), ("zero", 5, 0.0), ("neg_inf", 1000, float("-inf"))]:
        r = x.clone()
        r[pos] = v
        rows[name] = r
    rows["overflow"] = torch.full((n,), 3.0)  # 3^n overflows to inf partway
    rows["underflow"] = torch.full((n,), 0.3)  # to 0 (and through subnormals on CPU)
    big = x.clone()
    big[10] = 1e36  # past the split's range; the product stays finite
    big[11] = 1e-36
    rows["huge_factor"] = big
    signs = x.clone()
    signs[::3] *= -1
    rows["signs"] = signs
    return rows


@pytest.mark.parametrize("name", ["inf", "nan", "neg_zero", "zero", "neg_inf", "overflow", "underflow",
                                  "huge_factor", "signs"])
def test_special_values_come_out_as_on_cpu(name):
    x = _specials(2048)[name]
    want, got = x.prod(), x.to(D).prod().cpu()
    if name in ("huge_factor", "signs"):
        assert _rel(got, x.double().prod()) < 2e-7
    else:
        # same class of value: inf/NaN/zero with its sign
        assert torch.equal(got.isnan(), want.isnan()) and (want.isnan() or got == want), (got, want)
        assert torch.equal(got.signbit(), want.signbit()) or want.isnan()
    c_want, c_got = x.cumprod(0), x.to(D).cumprod(0).cpu()
    assert torch.equal(c_got.isnan(), c_want.isnan())
    assert torch.equal(c_got.isinf(), c_want.isinf())
    # exact zeros where CPU's are, with their signs (CPU's float subnormals are flushed here)
    tiny = c_want.abs() < 1.2e-38
    assert torch.equal(c_got[tiny], torch.zeros_like(c_got[tiny]))
    assert torch.equal(c_got[c_want == 0].signbit(), c_want[c_want == 0].signbit())
    # a product's error term underflows (and is flushed) near the smallest normals
    fin = c_want.isfinite() & (c_want.abs() > 1e-30)
    ref = x.double().cumprod(0)
    assert ((c_got[fin].double() - ref[fin]).abs() / ref[fin].abs()).max().item() < 3e-7


def test_short_rows_and_other_dtypes_keep_their_plain_product():
    x = _near_one(1000, seed=5)
    assert _rel(x.to(D).prod().cpu(), x.double().prod()) < 1e-5
    for dt in (torch.float64, torch.bfloat16, torch.float16):
        y = _near_one(4096, seed=6).to(dt)
        want = y.double().prod()
        tol = 1e-12 if dt == torch.float64 else 1e-2
        assert _rel(y.to(D).prod().cpu(), want) < tol, dt
        assert y.to(D).cumprod(0).dtype == dt


def test_gradients_of_long_products_match_cpu():
    x = _near_one(2048, seed=7)
    xt = x.to(D).requires_grad_()
    xc = x.double().requires_grad_()
    xt.prod().backward()
    xc.prod().backward()
    assert _rel(xt.grad.cpu(), xc.grad) < 1e-6
    xt.grad = None
    xc.grad = None
    w = torch.linspace(0, 1, 2048)
    (xt.cumprod(0) * w.to(D)).sum().backward()
    (xc.cumprod(0) * w.double()).sum().backward()
    assert _rel(xt.grad.cpu(), xc.grad) < 1e-5
