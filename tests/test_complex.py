"""Complex numbers on tpu: complex views of real storage and back, PyTorch's lazy
conjugate/negative bits, the complex-only ops (complex, polar, angle, conj_physical)
and complex arithmetic, each checked against CPU with no CPU fallback."""
import math
import warnings

import pytest
import torch

from conftest import dev, host, native

C64 = dict(rtol=1e-5, atol=1e-5)


def crandn(*shape, seed=0, dtype=torch.complex64):
    return torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def randn(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def same(got, want, **tol):
    torch.testing.assert_close(host(got), want, equal_nan=True, **(tol or C64))


# ---- views: same storage, dtype reinterpreted

def test_view_as_real_is_a_view_both_ways():
    z = crandn(3, 4)
    with native():
        zt = dev(z)
        r = torch.view_as_real(zt)
        assert r._base is zt and r.untyped_storage().data_ptr() == zt.untyped_storage().data_ptr()
        same(r, torch.view_as_real(z))
        r[1, 2, 1] = 7.0  # a write through the real view changes the complex tensor
        r[0].mul_(2)
        z_cpu = z.clone()
        torch.view_as_real(z_cpu)[1, 2, 1] = 7.0
        torch.view_as_real(z_cpu)[0].mul_(2)
        same(zt, z_cpu)
        zt[2, 0] = 1 - 3j  # and a write to the complex tensor shows in the view
        z_cpu[2, 0] = 1 - 3j
        same(r, torch.view_as_real(z_cpu))


def test_view_as_complex_is_a_view_both_ways():
    x = randn(5, 2)
    with native():
        xt = dev(x)
        c = torch.view_as_complex(xt)
        same(c, torch.view_as_complex(x))
        c.mul_(2j)
        x_cpu = x.clone()
        torch.view_as_complex(x_cpu).mul_(2j)
        same(xt, x_cpu)
        xt[3, 1] = -4.0
        x_cpu[3, 1] = -4.0
        same(c, torch.view_as_complex(x_cpu))
        # real and imag are views through view_as_real
        same(c.real + c.imag, x_cpu[:, 0] + x_cpu[:, 1])


def test_dtype_views_between_real_and_complex():
    x, z = randn(4, 6), crandn(3, 2)
    with native():
        same(dev(x).view(torch.complex64), x.view(torch.complex64))
        same(dev(z).view(torch.float32), z.view(torch.float32))
        same(dev(z).view(torch.float64), z.view(torch.float64))
        same(dev(z.to(torch.complex128)).view(torch.complex64), z.to(torch.complex128).view(torch.complex64))


def test_complex_view_of_odd_length_storage():
    # 5 floats: the complex view addresses the first 4; the 5th must survive writes.
    x = randn(5)
    with native():
        xt = dev(x)
        c = torch.view_as_complex(xt[:4].view(2, 2))
        same(c, torch.view_as_complex(x[:4].view(2, 2)))
        c.add_(1j)
        want = x.clone()
        torch.view_as_complex(want[:4].view(2, 2)).add_(1j)
        same(xt, want)


def test_view_of_unwritten_complex_storage_reads_zeros():
    with native():
        e = torch.zeros(3, dtype=torch.complex64, device="tpu")
        same(torch.view_as_real(e), torch.zeros(3, 2))
        z = torch._efficientzerotensor((2, 3), dtype=torch.complex64, device="tpu")
        same(z, torch.zeros(2, 3, dtype=torch.complex64))


# ---- lazy conjugate / negative bits

def test_conj_bit_reads_and_copies():
    z = crandn(4, 3)
    with native():
        zt = dev(z)
        c = zt.conj()
        assert c.is_conj()
        same(c, z.conj())
        same(c.clone(), z.conj())
        same(c.resolve_conj(), z.conj())
        assert not c.resolve_conj().is_conj()
        same(c * 2 + 1, z.conj() * 2 + 1)  # ops behind the Conjugate fallback
        same(c.imag, z.conj().imag)  # a negative-bit view
        assert c.imag.is_neg()
        same(c.imag * 3, z.conj().imag * 3)
        same(c.imag.resolve_neg(), z.conj().imag.resolve_neg())


def test_conj_bit_seen_by_ops_the_fallback_lets_through():
    a, b, v, w = crandn(3, 4), crandn(4, 2, seed=1), crandn(5, seed=2), crandn(5, seed=3)
    with native():
        same(dev(a).conj() @ dev(b), a.conj() @ b)
        same(dev(a).mH @ dev(a), a.mH @ a)
        same(torch.vdot(dev(v), dev(w)), torch.vdot(v, w))
        same(torch.dot(dev(v).conj(), dev(w)), torch.dot(v.conj(), w))
        same(torch.addmm(dev(a @ b), dev(a).conj(), dev(b)), torch.addmm(a @ b, a.conj(), b))
        same(torch.bmm(dev(a[None]).conj(), dev(b[None])), torch.bmm(a[None].conj(), b[None]))


def test_writes_through_conj_and_neg_views():
    v, w = crandn(5), crandn(5, seed=1)
    with native():
        x, xt = v.clone(), dev(v)
        x.conj().add_(1 + 2j)
        xt.conj().add_(1 + 2j)
        same(xt, x)
        x.conj().imag.mul_(3)
        xt.conj().imag.mul_(3)
        same(xt, x)
        x.conj().copy_(w)  # copy_ into a conj view stores the conjugate
        xt.conj().copy_(dev(w))
        same(xt, x)
        y = dev(v)
        y.conj().copy_(w)  # from the host as well
        same(y, w.conj())
        n = dev(v).conj().imag
        n.copy_(torch.arange(5.0))
        same(n, torch.arange(5.0))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_writes_into_strided_views(dtype):
    # A batched diagonal is no box of its storage: the write scatters the elements that
    # changed, found by comparing both parts by bits (NaN parts equal to themselves).
    nan = complex(math.nan, 1.0)
    with native():
        want = torch.zeros(2, 5, 5, dtype=dtype)
        got = dev(want)
        want.diagonal(dim1=-2, dim2=-1).fill_(1)
        got.diagonal(dim1=-2, dim2=-1).fill_(1)
        same(got, want)
        vals = crandn(2, 5, seed=2, dtype=dtype)
        vals[0, 1] = nan
        want.diagonal(dim1=-2, dim2=-1).copy_(vals)
        got.diagonal(dim1=-2, dim2=-1).copy_(dev(vals))
        same(got, want)
        want[:, ::2, 1::3].mul_(2j)
        got[:, ::2, 1::3].mul_(2j)
        same(got, want)


def test_conj_physical():
    z, x = crandn(3, 4), randn(3, 4)
    with native():
        same(torch.conj_physical(dev(z)), torch.conj_physical(z))
        same(torch.conj_physical(dev(x)), torch.conj_physical(x))
        same(torch.conj_physical(dev(z).conj()), torch.conj_physical(z.conj()))
        out = torch.empty(3, 4, dtype=torch.complex64, device="tpu")
        torch.conj_physical(dev(z), out=out)
        same(out, z.conj_physical())
        y = dev(z)
        y.conj_physical_()
        same(y, z.conj_physical())


# ---- complex-only ops

def test_angle_real_and_complex():
    x = torch.tensor([-2.0, -0.0, 0.0, 3.0, float("nan"), -float("inf"), float("inf")])
    z = torch.tensor([1 + 1j, -1 + 0j, -1 - 0j, 0j, complex(float("nan"), 1), complex(0, -2)],
                     dtype=torch.complex64)
    with native():
        same(torch.angle(dev(x)), torch.angle(x))
        same(torch.angle(dev(z)), torch.angle(z))
        same(torch.angle(dev(torch.tensor([-3, 0, 4]))), torch.angle(torch.tensor([-3, 0, 4])))
        out = torch.empty(6, device="tpu")
        torch.angle(dev(z), out=out)
        same(out, torch.angle(z))


def test_complex_and_polar():
    re, im = randn(3, 1), randn(1, 4, seed=1)
    with native():
        same(torch.complex(dev(re), dev(im)), torch.complex(re, im))
        same(torch.complex(dev(re.double()), dev(im.double())), torch.complex(re.double(), im.double()))
        same(torch.polar(dev(re.abs()), dev(im)), torch.polar(re.abs(), im))
        out = torch.empty(3, 4, dtype=torch.complex64, device="tpu")
        torch.complex(dev(re), dev(im), out=out)
        same(out, torch.complex(re, im))
        torch.polar(dev(re.abs()), dev(im), out=out)
        same(out, torch.polar(re.abs(), im))


def test_complex_and_polar_backward():
    for fn in (torch.complex, lambda a, t: torch.polar(a.abs(), t)):
        a, t = randn(3, 4).requires_grad_(), randn(3, 4, seed=1).requires_grad_()
        at, tt = dev(a.detach()).requires_grad_(), dev(t.detach()).requires_grad_()
        w = crandn(3, 4, seed=2)
        with native():
            torch.view_as_real(fn(a, t) * w).sum().backward()
            torch.view_as_real(fn(at, tt) * dev(w)).sum().backward()
            same(at.grad, a.grad)
            same(tt.grad, t.grad)


# ---- complex arithmetic

BINARY = [
    lambda x, y: x + y, lambda x, y: x - y, lambda x, y: x * y, lambda x, y: x / y,
    lambda x, y: torch.add(x, y, alpha=2), lambda x, y: torch.sub(x, y, alpha=0.5),
    lambda x, y: x * 2.5, lambda x, y: x * (1 - 2j), lambda x, y: x + 1j, lambda x, y: 3 - x,
    lambda x, y: x / (2 + 1j), lambda x, y: x.real + y, lambda x, y: x == y, lambda x, y: x != x.conj(),
    lambda x, y: x == (1 + 1j),
]


@pytest.mark.parametrize("i", range(len(BINARY)))
def test_binary(i):
    x, y = crandn(3, 4), crandn(1, 4, seed=1)
    with native():
        same(BINARY[i](dev(x), dev(y)), BINARY[i](x, y))


def test_complex128():
    x, y = crandn(3, 4, dtype=torch.complex128), crandn(1, 4, seed=1, dtype=torch.complex128)
    with native():
        for fn in BINARY[:8]:
            same(fn(dev(x), dev(y)), fn(x, y), rtol=1e-12, atol=1e-12)
        same(dev(x).abs(), x.abs(), rtol=1e-12, atol=1e-12)


UNARY = [torch.neg, torch.reciprocal, torch.abs, torch.sgn, torch.exp, torch.log, torch.sqrt,
         torch.sin, torch.cos, torch.tanh, torch.tan, torch.sinh, torch.cosh, torch.rsqrt, torch.sigmoid,
         torch.log1p, torch.expm1, torch.log2, torch.log10, torch.exp2, torch.square, lambda z: z ** 3,
         lambda z: z ** 0.5, lambda z: z ** -1, lambda z: z ** 1.5, lambda z: z ** (2 + 1j), lambda z: z ** z,
         lambda z: 2 ** z, lambda z: torch.addcmul(z, z, z.conj(), value=0.5 - 1j),
         lambda z: torch.addcdiv(z, z, z + 1, value=2), lambda z: torch.lerp(z, z * 1j, 0.3),
         lambda z: torch.lerp(z, z * 1j, z), lambda z: z.sum(), lambda z: z.sum(0), lambda z: z.mean(1),
         lambda z: z @ z.mT, lambda z: z.real * z.imag, lambda z: torch.cat([z, z.conj()])]


@pytest.mark.parametrize("i", range(len(UNARY)))
def test_unary(i):
    z = crandn(3, 3)
    with native():
        same(UNARY[i](dev(z)), UNARY[i](z))


def test_special_values():
    z = torch.tensor([0j, 1 + 1j, complex(math.inf, 0), complex(math.nan, 1), complex(0, -0.0)],
                     dtype=torch.complex64)
    zero = torch.zeros(5, dtype=torch.complex64)
    with native():
        for fn in (torch.sgn, torch.abs, torch.angle, torch.reciprocal, lambda t: t == t):
            same(fn(dev(z)), fn(z))
        same(dev(z) / dev(zero), z / zero)


def test_special_values_of_complex_functions():
    # Every pairing of these parts, compared as assert_close compares complex values: a
    # value with a NaN part is NaN (which part is NaN follows C99 on CPU, not on XLA).
    vals = [0.0, -0.0, 1.5, -2.0, math.inf, -math.inf, math.nan, 100.0]
    z = torch.tensor([complex(a, b) for a in vals for b in vals], dtype=torch.complex64)
    with native():
        for fn in (torch.exp, torch.log, torch.sqrt, torch.sin, torch.cos, torch.tanh, torch.tan, torch.sinh, torch.cosh,
                   torch.sgn, torch.neg, lambda t: t * t.conj(), lambda t: t + 1j, torch.abs,
                   torch.angle, torch.isnan, torch.isinf, torch.isfinite):
            same(fn(dev(z)), fn(z))
        # the branch cut follows the sign of a zero imaginary part
        neg0 = torch.tensor([complex(-2.0, -0.0), complex(-2.0, 0.0)])
        same(torch.view_as_real(torch.sqrt(dev(neg0))), torch.view_as_real(torch.sqrt(neg0)))
        same(torch.nan_to_num(dev(z)), torch.nan_to_num(z))
        same(torch.nan_to_num(dev(z), nan=1.0, posinf=2.0, neginf=-3.0),
             torch.nan_to_num(z, nan=1.0, posinf=2.0, neginf=-3.0))


def test_zero_parts_keep_their_sign_as_c99():
    # A signed zero part decides a later sqrt/log's branch (sqrt(sin(-2.5 - 0j)) is +0.77i on
    # CPU, not -0.77i). Reference: Python's cmath (C99 Annex G), whose finite-input signs
    # CPU's vector and scalar kernels share; sgn divides by the real |z|, as CUDA.
    import cmath
    parts = [0.0, -0.0, 1.0, -2.5, 0.5, 3.0]
    zs = [complex(a, b) for a in parts for b in parts if a == 0 or b == 0]
    z = torch.tensor(zs, dtype=torch.complex128)
    sgn = lambda w: 0j if w == 0 else complex(w.real / abs(w), w.imag / abs(w))
    with native():
        for name, ref in (("exp", cmath.exp), ("sin", cmath.sin), ("cos", cmath.cos), ("tanh", cmath.tanh),
                          ("tan", cmath.tan), ("sinh", cmath.sinh), ("cosh", cmath.cosh), ("sgn", sgn)):
            for dtype in (torch.complex64, torch.complex128):
                got = torch.view_as_real(getattr(torch, name)(dev(z.to(dtype)))).cpu().double()
                want = torch.tensor([[ref(w).real, ref(w).imag] for w in zs], dtype=torch.float64)
                torch.testing.assert_close(got, want, rtol=1e-5, atol=0, msg=name)
                assert torch.equal(got.signbit(), want.signbit()), (name, dtype, got, want)
        w = torch.tensor([complex(-2.5, -0.0), complex(-2.5, 0.0)])
        same(torch.sqrt(torch.sin(dev(w))), torch.sqrt(torch.sin(w)))
        same(torch.log(torch.exp(dev(w))), torch.log(torch.exp(w)))


def _parts_match(got, want):
    """Both parts equal within float32 rounding, NaN where NaN, zeros of one sign."""
    for g, w in ((got.real, want.real), (got.imag, want.imag)):
        g, w = g.item(), w.item()
        if math.isnan(g) or math.isnan(w):
            if math.isnan(g) != math.isnan(w):
                return False
        elif not (g == w or math.isclose(g, w, rel_tol=1e-5)) or math.copysign(1, g) != math.copysign(1, w):
            return False
    return True


SPECIAL_PARTS = [0.0, -0.0, 1.0, -2.5, 0.5, math.inf, -math.inf, math.nan]


def test_native_complex_functions_give_cpus_special_values():
    # These ran on the CPU fallback. One element per call: CPU's scalar loop, the same on
    # every instruction set (its vector kernels differ on special values).
    zs = [complex(a, b) for a in SPECIAL_PARTS for b in SPECIAL_PARTS]
    with native():
        for name in ("reciprocal", "rsqrt", "sigmoid", "log1p", "expm1", "log2", "log10", "exp2", "sinh", "cosh"):
            bad = []
            for z in zs:
                x = torch.tensor([z], dtype=torch.complex64)
                want, got = getattr(torch, name)(x), getattr(torch, name)(dev(x)).cpu()
                if not _parts_match(got, want):
                    bad.append((z, want.item(), got.item()))
            assert not bad, (name, bad)


def test_complex_division_gives_cpus_special_values():
    # c10::complex's scaled division (CPU's scalar loop and CUDA): a divisor with an
    # infinite part gave 0 where they give NaN, and zeros lost their signs.
    zs = [complex(a, b) for a in SPECIAL_PARTS[:7] for b in SPECIAL_PARTS[:7]]
    with native():
        bad = []
        for x in (complex(1, 0), complex(-2.5, -0.0), complex(0, 3), complex(math.inf, 1), complex(1e30, -1e30)):
            for y in zs:
                a, b = torch.tensor([x]), torch.tensor([y])
                want, got = a / b, (dev(a) / dev(b)).cpu()
                if not _parts_match(got, want):
                    bad.append((x, y, want.item(), got.item()))
        assert not bad, bad


def test_inplace_and_casts():
    z, x = crandn(3, 4), randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # casting complex to real discards the imaginary part
        with native():
            zt = dev(z)
            zt.mul_(2j).add_(dev(x))
            same(zt, z * 2j + x)
            same(dev(z).to(torch.float32), z.to(torch.float32))
            same(dev(x).to(torch.complex64), x.to(torch.complex64))
            same(dev(z).to(torch.complex128), z.to(torch.complex128))
            same(torch.where(dev(x) > 0, dev(z), 0j), torch.where(x > 0, z, 0j))


# ---- fft with conjugate views and complex backward

def test_fft_of_conj_views():
    z, x = crandn(4, 6), randn(4, 6)
    with native():
        same(torch.fft.ifft(dev(z).conj()), torch.fft.ifft(z.conj()))
        same(torch.fft.ihfft(dev(x)), torch.fft.ihfft(x))
        same(torch.fft.ihfft2(dev(x)), torch.fft.ihfft2(x))
        same(torch.fft.hfft2(dev(z)), torch.fft.hfft2(z), rtol=1e-4, atol=1e-4)
        same(torch.fft.hfftn(dev(z), dim=(0, 1)), torch.fft.hfftn(z, dim=(0, 1)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fn", [torch.fft.irfft, torch.fft.hfft, torch.fft.irfft2, torch.fft.ihfftn])
def test_fft_backward(fn):
    x = randn(4, 6)
    xc = torch.fft.rfft2(x) if fn in (torch.fft.irfft, torch.fft.hfft, torch.fft.irfft2) else x
    a = xc.clone().requires_grad_()
    at = dev(xc).requires_grad_()
    with native():
        out, out_t = fn(a), fn(at)
        w = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
        (torch.view_as_real(out * w) if out.is_complex() else out * w).sum().backward()
        (torch.view_as_real(out_t * dev(w)) if out_t.is_complex() else out_t * dev(w)).sum().backward()
        same(at.grad, a.grad, rtol=1e-4, atol=1e-4)


def test_sgn_backward_uses_native_zeros():
    x = randn(6)
    x[2] = 0.0
    a, at = x.clone().requires_grad_(), dev(x).requires_grad_()
    with native():
        torch.sgn(a).sum().backward()
        torch.sgn(at).sum().backward()
        same(at.grad, a.grad)


def test_complex_half_is_a_clear_error():
    # XLA has no complex<f16>: holding chalf in complex64 would misstate its dtype.
    with pytest.raises(NotImplementedError, match="ComplexHalf is not supported on tpu"):
        dev(randn(3)).chalf()
    with pytest.raises(NotImplementedError, match="ComplexHalf is not supported on tpu"):
        torch.zeros(2, dtype=torch.complex32, device="tpu")


# ---- reductions whose math differs for complex values (they read the real part before)

SPECIAL = torch.tensor([[1 + 2j, complex(math.nan, 1), 3j], [complex(math.inf, 0), 1, 2],
                        [complex(1, math.inf), 0, 0], [0, 0, 0], [-2 - 1j, 0.5j, 4]], dtype=torch.complex64)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("call", [
    lambda z: torch.linalg.vector_norm(z),
    lambda z: torch.linalg.vector_norm(z, 1, dim=1),
    lambda z: torch.linalg.vector_norm(z, 3, dim=0),
    lambda z: torch.linalg.vector_norm(z, math.inf, dim=1),
    lambda z: torch.linalg.vector_norm(z, 0, dim=1),
    lambda z: torch.linalg.vector_norm(z[:, :1], dim=1),
    lambda z: z.norm(),
    lambda z: torch.dist(z, z.flip(0), 3),
    lambda z: torch.nn.functional.normalize(z),
    lambda z: torch.linalg.matrix_norm(z, 1),
    lambda z: torch.var(z),
    lambda z: torch.std(z, 1, correction=0, keepdim=True),
    lambda z: torch.var_mean(z, 0),
    lambda z: torch.std_mean(z, 1),
    lambda z: torch.logsumexp(z, 1),
    lambda z: torch.logsumexp(z * 40, (0, 1)),
], ids=["norm2", "norm1", "norm3", "norminf", "norm0", "norm_one", "norm_method", "dist3", "normalize",
        "matrix_norm1", "var", "std", "var_mean", "std_mean", "logsumexp", "logsumexp_large"])
def test_complex_reductions_use_magnitudes_as_cpu(call, dtype):
    z = crandn(4, 5, dtype=dtype)
    with native():
        same(call(dev(z)), call(z))


@pytest.mark.parametrize("call", [
    lambda z: torch.linalg.vector_norm(z, dim=1),
    lambda z: torch.linalg.vector_norm(z, 1, dim=1),
    lambda z: torch.var(z, 1),
    lambda z: torch.logsumexp(z, 1),
], ids=["norm2", "norm1", "var", "logsumexp"])
def test_complex_reductions_of_special_values_as_cpu(call):
    with native():
        same(call(dev(SPECIAL)), call(SPECIAL))


def test_complex_norm_gradient_as_cpu():
    z = crandn(3, 4)
    zt = dev(z).requires_grad_()
    zc = z.clone().requires_grad_()
    (torch.linalg.vector_norm(zt) + torch.var(zt, 1).sum()).backward()
    (torch.linalg.vector_norm(zc) + torch.var(zc, 1).sum()).backward()
    same(zt.grad, zc.grad)


# ---- ops whose CPU kernels refuse complex values: an error of CPU's type, not a value

@pytest.mark.parametrize("call", [
    lambda z: z < z, lambda z: z >= 1, lambda z: z.max(), lambda z: z.max(1), lambda z: z.amin(0),
    lambda z: z.argmax(), lambda z: z.aminmax(), lambda z: z.median(), lambda z: z.mode(), lambda z: z.kthvalue(1),
    lambda z: z.cummax(0), lambda z: z.sort(), lambda z: z.topk(2), lambda z: torch.unique(z), lambda z: z.signbit(),
    lambda z: torch.bitwise_not(z), lambda z: torch.bitwise_and(z, z), lambda z: z.nansum(), lambda z: z.nanmean(), lambda z: torch.softmax(z, 1),
    lambda z: torch.log_softmax(z, 0), lambda z: torch.nn.functional.mse_loss(z, z), lambda z: torch.nn.functional.huber_loss(z, z),
    lambda z: torch.nn.functional.avg_pool1d(z[None], 2), lambda z: torch.nn.functional.max_pool1d(z[None], 2),
    lambda z: torch.nn.functional.interpolate(z[None], scale_factor=2.0), lambda z: torch.histc(z),
    lambda z: torch.bucketize(z, z[0]), lambda z: torch.nn.functional.group_norm(z[None], 1),
    lambda z: torch.nn.functional.batch_norm(z, None, None, training=True),
    lambda z: torch.arange(0, 4, dtype=z.dtype, device=z.device),
    lambda z: torch.nn.functional.dropout(z, 0.5), lambda z: torch.nn.functional.dropout1d(z, 0.5),
    lambda z: z.bernoulli_(0.5), lambda z: torch.bernoulli(z), lambda z: z.random_(0, 5),
    lambda z: torch.randint_like(z, 5),
], ids=["lt", "ge", "max", "max_dim", "amin", "argmax", "aminmax", "median", "mode", "kthvalue", "cummax", "sort",
        "topk", "unique", "signbit", "bitwise_not", "bitwise_and", "nansum", "nanmean", "softmax", "log_softmax", "mse",
        "huber", "avg_pool1d", "max_pool1d", "interpolate", "histc", "bucketize", "group_norm", "batch_norm", "arange",
        "dropout", "dropout1d", "bernoulli_", "bernoulli", "random_", "randint_like"])
def test_ops_cpu_refuses_for_complex_raise_its_error(call):
    z = crandn(3, 4)
    with pytest.raises(Exception) as want:
        call(z)
    zt = dev(z)
    with pytest.raises(type(want.value)) as got:
        host(call(zt))
    assert "ComplexFloat" in str(got.value) or "complex" in str(got.value).lower()
    same(zt, z)  # the operand is intact and usable


def test_foreach_norm_and_grad_clipping_take_the_magnitude():
    # The imaginary part was dropped (clip_grad_norm_ under-clipped complex models).
    xs = [torch.tensor([3 + 4j, 1j, 2]), torch.tensor([[1 - 1j]], dtype=torch.complex128)]
    for p in (1, 2, float("inf")):
        got = torch._foreach_norm([x.to("tpu") for x in xs], p)
        for g, w in zip(got, torch._foreach_norm(xs, p)):
            torch.testing.assert_close(g.cpu(), w)
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3, dtype=torch.complex64)
    tlin = torch.nn.Linear(4, 3, dtype=torch.complex64).to("tpu")
    tlin.load_state_dict(lin.state_dict())
    x = torch.randn(5, 4, dtype=torch.complex64)
    for m, inp in ((lin, x), (tlin, x.to("tpu"))):
        m(inp).abs().sum().backward()
    want = torch.nn.utils.clip_grad_norm_(lin.parameters(), 0.5)
    got = torch.nn.utils.clip_grad_norm_(tlin.parameters(), 0.5)
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(tlin.weight.grad.cpu(), lin.weight.grad)


def test_scatter_reduce_of_complex_as_cpu():
    # mean emitted an integer floor (remainder, ordering) on complex values: the XLA
    # compiler crashed the process; amax/amin/index_reduce have no complex kernel on CPU.
    x = torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex64)
    i, src = torch.tensor([0, 1, 0]), torch.tensor([3 + 0j, 0 + 3j, 0 + 0j], dtype=torch.complex64)
    want = x.scatter_reduce(0, i, src, "mean")
    torch.testing.assert_close(x.to("tpu").scatter_reduce(0, i.to("tpu"), src.to("tpu"), "mean").cpu(), want)
    for red in ("amax", "amin"):
        with pytest.raises(NotImplementedError):
            x.to("tpu").scatter_reduce(0, i.to("tpu"), src.to("tpu"), red)
    with pytest.raises(NotImplementedError):
        x.to("tpu").index_reduce(0, torch.tensor([0, 1], device="tpu"), src[:2].to("tpu"), "prod")


def test_log_and_sqrt_keep_nan_parts_as_cpu():
    # A NaN part gave a finite log of the magnitude (torch.log(z).real.isnan() was False).
    nan, inf = float("nan"), float("inf")
    z = torch.tensor([complex(1.5, nan), complex(-2, nan), complex(0, nan), complex(nan, inf),
                      complex(inf, nan), complex(-inf, nan), complex(nan, 1), complex(2, 3),
                      complex(-4, 0), complex(-4, -0.0), complex(0, inf)], dtype=torch.complex64)
    for fn in (torch.log, torch.sqrt):
        got, want = torch.view_as_real(fn(z.to("tpu")).cpu()), torch.view_as_real(fn(z))
        torch.testing.assert_close(got, want, equal_nan=True)


def test_foreach_ops_and_optimizers_on_complex_lists():
    # Each list position takes the element op's complex rule: they all ran on the CPU
    # fallback (foreach optimizers on complex parameters).
    a, b = [crandn(3, seed=1), crandn(2, 2, seed=2)], [crandn(3, seed=3), crandn(2, 2, seed=4)]
    c = [x.abs() + 0.5 + 0j for x in (crandn(3, seed=5), crandn(2, 2, seed=6))]
    calls = [lambda a, b, c: torch._foreach_add(a, b, alpha=0.5), lambda a, b, c: torch._foreach_add(a, 2.0),
             lambda a, b, c: torch._foreach_sub(a, b), lambda a, b, c: torch._foreach_mul(a, b),
             lambda a, b, c: torch._foreach_mul(a, 0.3), lambda a, b, c: torch._foreach_div(a, c),
             lambda a, b, c: torch._foreach_neg(a), lambda a, b, c: torch._foreach_sqrt(c),
             lambda a, b, c: torch._foreach_addcmul(a, b, c, value=0.5),
             lambda a, b, c: torch._foreach_addcdiv(a, b, c, value=0.5),
             lambda a, b, c: torch._foreach_lerp(a, b, 0.3), lambda a, b, c: torch._foreach_abs(a)]
    with native():
        for fn in calls:
            for w, g in zip(fn(a, b, c), fn(dev(a), dev(b), dev(c))):
                same(g, w)
        for cls, kw in ((torch.optim.Adam, {}), (torch.optim.SGD, dict(momentum=0.9)),
                        (torch.optim.RMSprop, {})):
            ps = []
            for d in ("cpu", "tpu"):
                p = torch.nn.Parameter(crandn(4, seed=7).to(d))
                opt = cls([p], lr=0.1, foreach=True, **kw)
                for i in range(3):
                    p.grad = (crandn(4, seed=10 + i)).to(d)
                    opt.step()
                ps.append(p.detach())
            same(ps[1], ps[0])
