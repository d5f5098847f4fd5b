"""Special functions lowered natively (special_*.cpp): orthogonal polynomials, Bessel
functions, i0/i0e, erfcx/log_ndtr/ndtri, zeta, igamma/igammac, nextafter and frexp,
each compared with PyTorch's CPU kernels (edge values included) with no CPU fallback."""

import pytest
import torch

from conftest import dev, host, native

INF, NAN = float("inf"), float("nan")


def check(fn, *args, rtol=1e-4, atol=1e-5):
    with native():
        got = host(fn(*dev(args)))
    want = fn(*args)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)


def t(*v, dtype=torch.float32):
    return torch.tensor(v, dtype=dtype)


# ---- special_poly.cpp

POLYS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
         "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
         "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
         "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
         "laguerre_polynomial_l", "legendre_polynomial_p"]


@pytest.mark.parametrize("name", POLYS)
def test_polynomials_over_x_and_n(name):
    fn = getattr(torch.special, name)
    x = t(-1.5, -1.0, -0.7, -0.2, 0.0, 0.3, 0.5, 0.9, 1.0, 1.2, 2.0, NAN).reshape(-1, 1)
    n = t(-3, -1, 0, 1, 2, 3, 4, 5, 6, 7, 9, 12, 2.7, NAN, INF)
    # Large degrees blow up outside [-1, 1]: compare relatively.
    check(fn, x, n, rtol=2e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["chebyshev_polynomial_t", "laguerre_polynomial_l"])
def test_polynomial_scalar_and_float64_forms(name):
    fn = getattr(torch.special, name)
    x = torch.linspace(-1.2, 1.2, 9, dtype=torch.float64)
    check(lambda a: fn(a, 5), x, rtol=1e-7, atol=1e-7)
    check(lambda n: fn(0.4, n), t(0, 1, 3, 6))
    check(fn, x, torch.tensor([3, 8, 0, 1, 2, 4, 5, 7, 130]).double(), rtol=1e-7, atol=1e-7)


def test_hermite_degree_limit_gives_nan():
    check(torch.special.hermite_polynomial_h, t(0.5, 0.5, 0.5), t(128, 129, 200))


# ---- special_bessel.cpp / special_bessel_mod.cpp

EDGES = [0.0, -0.0, INF, -INF, NAN, 1e-6, -1e-6, 1e-30]
BESSEL = ["bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0",
          "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1",
          "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "spherical_bessel_j0",
          "airy_ai", "i0e"]


@pytest.mark.parametrize("name", BESSEL)
def test_bessel_family(name):
    fn = getattr(torch.special, name)
    x = torch.cat([torch.linspace(-30, 30, 241), torch.linspace(-3, 3, 61),
                   t(-2.09, 2.09, 5.0, -5.0, 8.0, 2.0, 8.3203353, 103.0, 104.0, 150.0), t(*EDGES)])
    check(fn, x, rtol=1e-4, atol=1e-5)


def test_i0_and_kaiser_window():
    x = torch.cat([torch.linspace(-20, 20, 81), t(*EDGES)])
    check(torch.i0, x)
    check(torch.i0, x.bfloat16(), rtol=1.6e-2, atol=1e-2)
    check(torch.special.i0e, x.bfloat16(), rtol=1.6e-2, atol=1e-2)
    with native():
        w = torch.signal.windows.kaiser(12, beta=8.0, device="tpu")
    torch.testing.assert_close(w.cpu(), torch.signal.windows.kaiser(12, beta=8.0))


KAISER_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_NEVER_AND_LAUNCH_BLOCKING", "DEFER_AND_FUSE"])
def test_kaiser_window_is_native_in_every_eager_mode(mode):
    """torch.kaiser_window's composite reaches a DispatchStub with no tpu kernel; it is
    one lowered program (kaiser_window.beta_out) instead."""
    import torch_tpu
    with torch_tpu.set_eager_mode(getattr(torch_tpu.EagerMode, mode)), native():
        got = {(dt, n, per, beta): torch.kaiser_window(n, periodic=per, beta=beta, dtype=dt, device="tpu")
               for dt in KAISER_DTYPES for n in (0, 1, 2, 7, 64) for per in (True, False)
               for beta in (12.0, 0.0, 5.5)}
        default = torch.kaiser_window(8, device="tpu")
        periodic_only = torch.kaiser_window(9, False, device="tpu")
        grad = torch.kaiser_window(5, device="tpu", requires_grad=True)
    for (dt, n, per, beta), w in got.items():
        assert w.device.type == "tpu" and w.dtype == dt
        want = torch.kaiser_window(n, periodic=per, beta=beta, dtype=dt)
        tol = dict(rtol=1e-6, atol=1e-7) if dt == torch.float32 else dict(rtol=1e-13, atol=1e-15) \
            if dt == torch.float64 else dict(rtol=0, atol=0)  # f16/bf16 round to CPU's bits
        torch.testing.assert_close(w.cpu(), want, **tol)
    torch.testing.assert_close(default.cpu(), torch.kaiser_window(8), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(periodic_only.cpu(), torch.kaiser_window(9, False), rtol=1e-6, atol=1e-7)
    assert grad.requires_grad and grad.is_leaf


@pytest.mark.parametrize("kw", [dict(window_length=-1), dict(window_length=4, dtype=torch.int64),
                                dict(window_length=4, dtype=torch.bool),
                                dict(window_length=4, dtype=torch.complex64),
                                dict(window_length=4, layout=torch.sparse_coo)])
def test_kaiser_window_refuses_what_cpu_refuses(kw):
    with pytest.raises(Exception) as cpu:
        torch.kaiser_window(**kw)
    with pytest.raises(type(cpu.value)) as tpu:
        torch.kaiser_window(**kw, device="tpu")
    # (a sparse layout never reaches the tpu kernel: PyTorch's composite names the device)
    assert str(tpu.value).replace("device=tpu", "device=cpu") == str(cpu.value)


def test_i1_backward_uses_native_i0():
    for fn in (torch.special.i1, torch.special.i1e):
        x = torch.linspace(-9, 9, 19)
        xc, xt = x.clone().requires_grad_(), dev(x).requires_grad_()
        fn(xc).sum().backward()
        with native():
            fn(xt).sum().backward()
        torch.testing.assert_close(host(xt.grad), xc.grad, rtol=1e-4, atol=1e-5)


# ---- special_error.cpp

def test_erfcx_and_log_ndtr():
    x = torch.cat([torch.linspace(-30, 60, 181), t(-26.8, -9.0, -6.2, 1e8, 5e7, 1e-20, *EDGES)])
    check(torch.special.erfcx, x)
    check(torch.special.log_ndtr, torch.cat([x, t(-1e20, -1.0, -0.999)]))
    check(torch.special.erfcx, x.double(), rtol=1e-7, atol=1e-12)


def test_ndtri():
    y = torch.cat([torch.linspace(0, 1, 101), t(1e-30, 1e-10, 1e-3, 0.135, 0.8647, 1 - 1e-7,
                                                -0.1, 1.1, NAN, INF)])
    check(torch.special.ndtri, y)


# ---- special_misc.cpp

def test_zeta():
    x = t(1.0, 0.5, 1.5, 2.0, 3.0, 4.5, 10.0, 30.0, 2.0, 3.0, 2.5, 2.0, NAN, 2.0, INF)
    q = t(1.0, 1.0, 0.3, 1.0, 2.5, 7.0, 0.1, 1.5, -2.0, -2.5, -2.5, 0.0, 1.0, NAN, 2.0)
    grid_x, grid_q = x.reshape(-1, 1).expand(-1, 9), torch.linspace(0.05, 20, 9).expand(15, -1)
    check(torch.special.zeta, torch.cat([x, grid_x.flatten()]), torch.cat([q, grid_q.flatten()]))
    check(lambda a: torch.special.zeta(a, 2.0), t(1.5, 2.0, 7.0))


def test_nextafter_bits():
    tiny = torch.finfo(torch.float32).tiny
    a = t(0.0, -0.0, 1.0, 1.0, -1.0, 1e-45, -1e-45, tiny, 3.4028235e38, INF, -INF, NAN, 2.0, 0.0)
    b = t(1.0, -1.0, 2.0, 0.0, -INF, 1.0, 0.0, 0.0, INF, 0.0, 0.0, 1.0, 2.0, -0.0)
    with native():
        got = torch.nextafter(dev(a), dev(b)).cpu()
    want = torch.nextafter(a, b)
    assert torch.equal(got.view(torch.int32)[:11], want.view(torch.int32)[:11])
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(got[13:].view(torch.int32), want[13:].view(torch.int32))  # y's sign
    for dt in (torch.float64, torch.bfloat16):
        with native():
            g = torch.nextafter(dev(a.to(dt)), dev(b.to(dt))).cpu()
        torch.testing.assert_close(g, torch.nextafter(a.to(dt), b.to(dt)), equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_frexp(dtype):
    fi = torch.finfo(dtype)
    x = torch.tensor([0.0, -0.0, 1.0, -1.5, 0.5, 3.0, 1e-3, -7e5, fi.tiny, fi.tiny / 8, -fi.tiny / 3,
                      fi.max, INF, -INF, NAN], dtype=dtype)
    with native():
        m, e = torch.frexp(dev(x))
        m, e = m.cpu(), e.cpu()
    wm, we = torch.frexp(x)
    assert m.dtype == wm.dtype and e.dtype == we.dtype == torch.int32
    torch.testing.assert_close(m, wm, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(e[:-3], we[:-3])


# ---- special_igamma.cpp

@pytest.mark.parametrize("fn", [torch.igamma, torch.igammac])
def test_incomplete_gamma(fn):
    a = torch.tensor([0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 100.0, 250.0]).reshape(-1, 1)
    x = torch.tensor([1e-3, 0.3, 0.9, 1.0, 2.0, 4.5, 9.0, 12.0, 28.0, 35.0, 95.0, 260.0])
    big_a = torch.tensor([1e3, 5e3, 2e4, 1e5]).reshape(-1, 1)
    big_x = torch.tensor([0.95, 1.0, 1.02, 1.1]) * big_a
    edge_a = t(-1.0, 1.0, 0.0, 0.0, 0.0, 2.0, INF, INF, 2.0, NAN, 1.0, INF, NAN)
    edge_x = t(1.0, -1.0, 1.0, 0.0, NAN, 0.0, 1.0, INF, INF, 0.0, NAN, NAN, INF)
    a_all = torch.cat([a.expand(-1, 12).flatten(), big_a.expand(-1, 4).flatten(), edge_a])
    x_all = torch.cat([x.expand(9, -1).flatten(), big_x.flatten(), edge_x])
    check(fn, a_all, x_all, rtol=1e-4, atol=1e-6)
    aa, xx = torch.rand(50) * 20, torch.rand(50) * 25
    check(fn, aa.bfloat16(), xx.bfloat16(), rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("fn", [torch.igamma, torch.igammac])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_incomplete_gamma_of_huge_a(fn, dtype):
    # Past a = 3e5 the loop's series cannot converge near x = a (op_db's reference inputs
    # have a = x = 4,988,429 and 1e20): the asymptotic expansion answers there.
    a = t(3e5, 3e5, 3e5, 2.9e5, 4988429.0, 1e6, 1e6, 1e6, 1e7, 1e8, 1e20, 5e5, dtype=dtype)
    x = t(3e5, 2.99e5, 3.02e5, 2.9e5, 4988429.0, 1.001e6, 0.99e6, 1.1e6, 0.999e7, 1e8 + 3e4, 1e20, 5.2e5,
          dtype=dtype)
    if dtype == torch.float64:
        check(fn, a, x, rtol=1e-8, atol=1e-9)
        return
    # CPU's own float32 kernel is 3e-6 off float64 here: compare with float64 instead.
    with native():
        got = host(fn(*dev((a, x))))
    torch.testing.assert_close(got, fn(a.double(), x.double()).float(), rtol=1e-6, atol=1e-7)


def test_polynomials_of_high_degree():
    x = torch.linspace(-0.99, 0.99, 23, dtype=torch.float64)
    n = torch.tensor([300.0, 1000.0], dtype=torch.float64).reshape(-1, 1)
    for name in ("legendre_polynomial_p", "chebyshev_polynomial_u"):
        check(getattr(torch.special, name), x, n, rtol=1e-6, atol=1e-6)


def test_subnormal_arguments():
    # XLA:CPU reads subnormal operands as zero; these functions look at the bits.
    x = t(1e-40, -1e-40, 3e-45, 1e-38, 0.0, -0.0, 1e-30)
    for fn in (torch.special.ndtri, torch.special.bessel_y0, torch.special.bessel_y1,
               torch.special.modified_bessel_k0, torch.special.modified_bessel_k1,
               torch.special.scaled_modified_bessel_k0, torch.special.scaled_modified_bessel_k1):
        check(fn, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_digamma_pole_at_zero_takes_the_sign_of_minus_zero(dtype):
    # CPU: copysign(inf, -x) at zero, so -inf at +0 and +inf at -0; NaN at negative integers.
    x = torch.tensor([0.0, -0.0, -1.0, -2.0, 1e-30, -1e-30, 1.0, -0.5], dtype=dtype)
    for f in (torch.digamma, lambda t: torch.polygamma(0, t)):
        got, want = f(x.to("tpu")).cpu(), f(x)
        assert torch.equal(torch.signbit(got[:2]), torch.signbit(want[:2]))
        torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_polygamma_far_left_of_zero(n):
    # Past x = -24 the recurrence's shift stays negative; the reflection formula gives these
    # (polygamma(4, -1001.2) was -6e-12 where CPU gives 74,912.6).
    x = torch.tensor([-1001.2, -1001.7, -25.3, -30.5, -100.01, -24.5, -9999.63, -50.25, -40.001], dtype=torch.float64)
    torch.testing.assert_close(torch.polygamma(n, x.to("tpu")).cpu(), torch.polygamma(n, x), rtol=1e-8, atol=0)
    x32 = x.float()  # against float64 at the same (rounded) inputs
    want = torch.polygamma(n, x32.double()).float()
    torch.testing.assert_close(torch.polygamma(n, x32.to("tpu")).cpu(), want, rtol=5e-5, atol=0)
