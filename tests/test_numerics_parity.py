"""CPU parity of rounding in mean-like divisions, pow with a Scalar exponent, and
linspace/logspace (session 62's dtype probe).

Bit-exact comparisons only where CPU's result does not depend on its vector ISA (checked
under ATEN_CPU_CAPABILITY=default, =avx2 and unset); elsewhere a reference computed in
float64 and rounded once, or a bound in ulps. Run in Strict and with TPU_DEFER_AND_FUSE=1.
"""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401

DEV = "tpu"


def bits_equal(a, b):
    a, b = a.detach().cpu(), b.detach().cpu()
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.is_complex():
        return bits_equal(a.real, b.real) and bits_equal(a.imag, b.imag)
    if a.is_floating_point():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return bool((a == b).all())


def mismatches(a, b):
    a, b = a.detach().cpu(), b.detach().cpu()
    return int((~((a == b) | (a.isnan() & b.isnan()))).sum())


def int_rows(rows, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-1000, 1000, (rows, n), generator=g)


# ---- divisions by a count: mean, var, norms, losses, pools ----

def test_mean_of_a_constant_row_is_the_constant():
    # XLA turned mean's division by 1000 into a product with 0.001: 60000.0039.
    x = torch.full((1000,), 60000.0)
    assert x.to(DEV).mean().item() == 60000.0
    assert x.to(DEV).std().item() == 0.0
    assert x.to(DEV).var().item() == 0.0


@pytest.mark.parametrize("n", [3, 10, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_mean_of_exact_sums_is_correctly_rounded(n, dtype):
    # Rows of small integers sum exactly, so the mean is the quotient rounded once.
    y = int_rows(500, n, seed=n)
    if dtype in (torch.bfloat16, torch.float16):
        y = y.clamp(-200, 200)  # exact in the dtype
    x = y.to(dtype)
    want = (y.double().sum(1) / n).to(torch.float32 if dtype != torch.float64 else dtype).to(dtype)
    assert mismatches(x.to(DEV).mean(1), want) == 0
    assert mismatches(x.to(DEV).mean(1), x.mean(1)) == 0


def test_var_mean_uses_a_correctly_rounded_mean():
    y = int_rows(300, 7, seed=1).double()
    v, m = torch.var_mean(y.to(DEV), 1)
    assert mismatches(m, y.sum(1) / 7) == 0
    # Unbiased variance of a constant row with a divisor N - 1 that is not a power of 2.
    assert torch.var(torch.full((4, 1000), 1e5, device=DEV), 1).abs().max().item() == 0.0


def test_layer_norm_of_a_constant_row_is_zero():
    r = torch.full((2, 1000), 60000.0)
    ln = torch.nn.LayerNorm(1000)
    out = ln.to(DEV)(r.to(DEV))
    assert out.abs().max().item() == 0.0
    assert bits_equal(out, ln.cpu()(r))


def test_group_and_batch_norm_of_constant_inputs():
    x = torch.full((2, 6, 10, 10), 60000.0)
    g = F.group_norm(x.to(DEV), 3)
    assert g.abs().max().item() == 0.0
    bias = torch.arange(6.0)
    b = F.batch_norm(x.to(DEV), None, None, None, bias.to(DEV), training=True)
    assert bits_equal(b, bias.view(1, 6, 1, 1).expand_as(x))


def test_mean_reduced_losses_divide_by_the_count():
    y = int_rows(1, 999, seed=2).clamp(-100, 100).float().view(-1)  # sums exact in f32
    zero = torch.zeros_like(y)
    want = (y.double().abs().sum() / 999).float()
    assert F.l1_loss(y.to(DEV), zero.to(DEV)).item() == want.item()
    want = ((y.double() ** 2).sum() / 999).float()
    assert F.mse_loss(y.to(DEV), zero.to(DEV)).item() == want.item()


def test_avg_pool_divides_by_the_window_size():
    # 9 * 60000 / 9 is exact; a product with 1/9 is not.
    x = torch.full((1, 2, 9, 9), 60000.0)
    out = F.avg_pool2d(x.to(DEV), 3)
    assert out.min().item() == 60000.0 and out.max().item() == 60000.0
    out = F.avg_pool2d(x.to(DEV), 3, divisor_override=9)
    assert out.min().item() == 60000.0 and out.max().item() == 60000.0


def test_compiled_mean_and_layer_norm():
    def f(x):
        return x.mean(-1), F.layer_norm(x, (1000,))
    x = torch.full((3, 1000), 60000.0)
    m, ln = torch.compile(f, backend="tpu")(x.to(DEV))
    assert m.cpu().eq(60000.0).all() and ln.abs().max().item() == 0.0


# ---- pow with a Scalar exponent ----

def randoms(dtype, n=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g, dtype=torch.float64) * 50).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_pow_special_exponents_are_products(dtype):
    # CPU (and CUDA): x*x for 2, x*x*x for 3, 1/(x*x) for -2, 1/x for -1, each step
    # rounded to the dtype (bf16 included), not a generic pow.
    x = randoms(dtype)
    xt = x.to(DEV)
    sq = x * x
    assert mismatches(xt ** 2, sq) == 0
    assert mismatches(xt.square(), sq) == 0
    assert mismatches(xt ** 3, sq * x) == 0
    assert mismatches(xt ** -2, 1 / sq) == 0
    assert mismatches(xt ** -1, 1 / x) == 0
    for e in (2, 3, -2, -1, 2.0):
        assert mismatches(xt ** e, x ** e) == 0, e


def test_pow_float16_keeps_pow():
    # CPU's float16 kernel has no special cases: pow(x, half(e)) in float, rounded.
    x = randoms(torch.float16).clamp(-200, 200)
    for e in (2, 3, -2, -1):
        assert mismatches(x.to(DEV) ** e, x ** e) == 0, e


def test_pow_example_from_the_probe():
    x = torch.tensor([81.79197692871094])
    assert (x.to(DEV) ** 2).item() == 6689.92724609375


# ---- linspace / logspace ----

LIN_CASES = [(4.3, -3, 50), (0, 1, 7), (-2.5, 7.25, 101), (1e3, -1e3, 33), (3, 3, 5),
             (0.1, 0.7, 2), (5, 1, 1), (-7.9, 100.2, 1000), (1, 1e4, 4099)]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8,
                                   torch.float16, torch.bfloat16])
def test_linspace_bits_match_cpu(dtype):
    # Integers: start/end truncated first, a double step (was [4, 4, 4, ...] for the
    # first case). bf16/f16: every op rounded to the dtype.
    for a, b, n in LIN_CASES:
        if dtype == torch.uint8 and (min(a, b) < 0 or max(a, b) > 255):
            continue
        if dtype == torch.int16 and max(abs(a), abs(b)) > 30000:
            continue
        want = torch.linspace(a, b, n, dtype=dtype)
        assert bits_equal(torch.linspace(a, b, n, dtype=dtype, device=DEV), want), (a, b, n)


def test_linspace_int_example():
    assert torch.linspace(4.3, -3, 50, dtype=torch.int64, device=DEV)[:4].tolist() == [4, 3, 3, 3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
def test_linspace_floats_within_an_ulp(dtype):
    # CPU's float32/float64 result depends on whether its build contracts to fma: within
    # an ulp of the range's largest end (end - step * k cancels near zero).
    for a, b, n in LIN_CASES:
        want = torch.linspace(a, b, n, dtype=dtype)
        got = torch.linspace(a, b, n, dtype=dtype, device=DEV).cpu()
        parts = [(got.real, want.real), (got.imag, want.imag)] if dtype.is_complex else [(got, want)]
        for g, w in parts:
            top = torch.tensor(max(abs(a), abs(b)), dtype=w.dtype)
            ulp = torch.nextafter(top, torch.tensor(float("inf"), dtype=w.dtype)) - top
            assert bool(((g - w).abs() <= ulp).all()), (a, b, n)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float16, torch.bfloat16,
                                   torch.float32, torch.float64])
def test_logspace_bits_match_cpu(dtype):
    # CPU computes base ** (start + step * i) in double without fma contraction.
    for a, b, n in [(0, 3, 7), (0.5, 3.7, 7), (-2, 2, 33), (1, 4.2, 100), (2, 2, 1)]:
        for base in (10.0, 2.0, 2.5):
            want = torch.logspace(a, b, n, base=base, dtype=dtype)
            got = torch.logspace(a, b, n, base=base, dtype=dtype, device=DEV)
            assert bits_equal(got, want), (a, b, n, base)


# ---- complex sgn ----

@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_sgn_special_values_as_cpu_scalar_loop(dtype):
    # CPU's scalar loop (the same on every ISA) divides by complex(|z|): an infinite part
    # gives NaN + NaN i (was NaN + 0i / 0 + NaN i).
    inf, nan = float("inf"), float("nan")
    z = torch.tensor([complex(inf, 0), complex(0, inf), complex(-inf, 2), complex(3, -inf),
                      complex(inf, inf), complex(nan, 1), complex(-0.0, 1), complex(0, -0.0)], dtype=dtype)
    want = torch.stack([v.sgn() for v in z])  # one element at a time: the scalar loop
    got = z.to(DEV).sgn().cpu()
    assert bits_equal(got.real.nan_to_num(7.0), want.real.nan_to_num(7.0))
    assert bits_equal(got.imag.nan_to_num(7.0), want.imag.nan_to_num(7.0))
