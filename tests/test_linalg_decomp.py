"""Native QR (geqrf, linalg_qr, householder_product, ormqr), symmetric eigendecomposition
(_linalg_eigh), SVD (_linalg_svd) and lstsq: compared with CPU, and checked for what the
factorizations promise (orthonormal factors, reconstruction), with no CPU fallback."""
import contextlib
import warnings

import pytest
import torch

import torch_tpu
from conftest import all_fallbacks, dev, host, no_fallbacks

F32 = dict(rtol=1e-4, atol=1e-5)
F64 = dict(rtol=1e-10, atol=1e-10)


@contextlib.contextmanager
def native():
    """conftest's check, with this file's expected warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with no_fallbacks():
            yield


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def tol(dtype):
    return F32 if dtype == torch.float32 else F64


def eye_like(x, n):
    return torch.eye(n, dtype=x.dtype).expand(*x.shape[:-2], n, n)


def assert_orthonormal_columns(q, dtype):
    q = host(q)
    torch.testing.assert_close(q.mT @ q, eye_like(q, q.shape[-1]), **tol(dtype))


@pytest.fixture
def metas():
    """geqrf and linalg_lstsq need the Meta kernels torch_tpu registers (PyTorch has none)."""
    for name in ("geqrf", "linalg_lstsq"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "Meta")
    yield


# ---- QR

@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 5), (0, 2)])
def test_geqrf_matches_lapack(metas, shape):
    a = randn(*shape)
    with native():
        f, tau = torch.geqrf(dev(a))
    f0, tau0 = torch.geqrf(a)
    torch.testing.assert_close(host(f), f0, **F32)
    torch.testing.assert_close(host(tau), tau0, **F32)


@pytest.mark.parametrize("shape, mode, dtype", [
    ((5, 3), "complete", torch.float32), ((3, 5), "reduced", torch.float32),
    ((2, 4, 4), "r", torch.float32),
    ((6, 4), "reduced", torch.float64), ((0, 3), "complete", torch.float32),
    ((3, 0), "complete", torch.float32), ((2, 0, 0), "reduced", torch.float32)])
def test_linalg_qr(shape, mode, dtype):
    a = randn(*shape, dtype=dtype)
    with native():
        q, r = torch.linalg.qr(dev(a), mode)
    q0, r0 = torch.linalg.qr(a, mode)
    # LAPACK's sign conventions: Q and R agree with CPU's, not just up to signs.
    torch.testing.assert_close(host(r), r0, **tol(dtype))
    torch.testing.assert_close(host(q), q0, **tol(dtype))
    if mode != "r" and a.numel():
        assert_orthonormal_columns(q, dtype)
        torch.testing.assert_close(host(q) @ host(r), a, **tol(dtype))


def test_householder_product_and_ormqr(metas):
    a = randn(2, 6, 4)
    f, tau = torch.geqrf(a)
    c = randn(2, 6, 3, seed=1)
    cr = randn(2, 3, 6, seed=2)
    with native():
        q3 = torch.linalg.householder_product(dev(f), dev(tau[..., :3]))
        q0 = torch.linalg.householder_product(dev(f), dev(tau[..., :0]))
        outs = [torch.ormqr(dev(f), dev(tau), dev(c), True, True),
                torch.ormqr(dev(f), dev(tau), dev(cr), False, False)]
    torch.testing.assert_close(host(q3), torch.linalg.householder_product(f, tau[..., :3]), **F32)
    torch.testing.assert_close(host(q0), torch.eye(6, 4).expand(2, 6, 4))
    want = [torch.ormqr(f, tau, c, True, True), torch.ormqr(f, tau, cr, False, False)]
    for g, w in zip(outs, want):
        torch.testing.assert_close(host(g), w, **F32)


def test_qr_backward():
    a = randn(5, 3)
    x, y = a.clone().requires_grad_(), dev(a).requires_grad_()
    w = randn(5, 3, seed=3)
    with native():
        q, r = torch.linalg.qr(y)
        ((q * dev(w)).sum() + r.sum()).backward()
    q0, r0 = torch.linalg.qr(x)
    ((q0 * w).sum() + r0.sum()).backward()
    torch.testing.assert_close(host(y.grad), x.grad, **F32)


# ---- symmetric eigendecomposition

@pytest.mark.parametrize("shape, uplo, dtype", [
    ((1, 1), "L", torch.float32), ((5, 5), "U", torch.float32), ((3, 7, 7), "L", torch.float32),
    ((6, 6), "L", torch.float64)])
def test_eigh(shape, uplo, dtype):
    a = randn(*shape, dtype=dtype)  # not symmetric: only the UPLO triangle counts
    with native():
        w, v = torch.linalg.eigh(dev(a), UPLO=uplo)
    w0, v0 = torch.linalg.eigh(a, UPLO=uplo)
    w, v = host(w), host(v)
    torch.testing.assert_close(w, w0, **tol(dtype))
    assert (w[..., 1:] >= w[..., :-1]).all()
    torch.testing.assert_close(v.abs(), v0.abs(), **tol(dtype))
    assert_orthonormal_columns(v, dtype)
    sym = torch.tril(a) + torch.tril(a, -1).mT if uplo == "L" else torch.triu(a) + torch.triu(a, 1).mT
    torch.testing.assert_close(v @ torch.diag_embed(w) @ v.mT, sym, **tol(dtype))


def test_eigh_repeated_eigenvalues_and_empty():
    a = torch.diag(torch.tensor([2.0, -1.0, 2.0, 0.0]))
    q, _ = torch.linalg.qr(randn(4, 4))
    a = q @ a @ q.T
    with native():
        w, v = torch.linalg.eigh(dev(a))
        wv = torch.linalg.eigvalsh(dev(a))
        we, ve = torch.linalg.eigh(dev(torch.zeros(2, 0, 0)))
    torch.testing.assert_close(host(w), torch.tensor([-1.0, 0.0, 2.0, 2.0]), **F32)
    torch.testing.assert_close(host(wv), host(w), **F32)
    assert_orthonormal_columns(v, torch.float32)
    assert host(we).shape == (2, 0) and host(ve).shape == (2, 0, 0)


def test_eigh_backward():
    a = randn(4, 4)
    a = a + a.T
    x, y = a.clone().requires_grad_(), dev(a).requires_grad_()
    with native():
        w, v = torch.linalg.eigh(y)
        (w.sum() + v.abs().sum()).backward()
    w0, v0 = torch.linalg.eigh(x)
    (w0.sum() + v0.abs().sum()).backward()
    torch.testing.assert_close(host(y.grad), x.grad, **F32)


# ---- SVD

@pytest.mark.parametrize("shape, full, dtype", [
    ((5, 3), True, torch.float32), ((3, 5), False, torch.float64), ((1, 6), True, torch.float32),
    ((3, 9, 8), False, torch.float32)])
def test_svd(shape, full, dtype):
    a = randn(*shape, dtype=dtype)
    k = min(shape[-2:])
    with native():
        u, s, vh = torch.linalg.svd(dev(a), full_matrices=full)
    u0, s0, vh0 = torch.linalg.svd(a, full_matrices=full)
    u, s, vh = host(u), host(s), host(vh)
    assert u.shape == u0.shape and vh.shape == vh0.shape
    torch.testing.assert_close(s, s0, **tol(dtype))
    torch.testing.assert_close(u[..., :k].abs(), u0[..., :k].abs(), **tol(dtype))
    torch.testing.assert_close(vh[..., :k, :].abs(), vh0[..., :k, :].abs(), **tol(dtype))
    assert_orthonormal_columns(u, dtype)
    assert_orthonormal_columns(vh.mT, dtype)
    torch.testing.assert_close(u[..., :k] * s.unsqueeze(-2) @ vh[..., :k, :], a, **tol(dtype))


def test_svd_rank_deficient():
    # rank 2 in 6 x 5: three zero singular values, U and V still orthonormal.
    a = randn(6, 2) @ randn(2, 5, seed=1)
    with native():
        u, s, vh = torch.linalg.svd(dev(a), full_matrices=True)
        sv = torch.linalg.svdvals(dev(a))
        p = torch.linalg.pinv(dev(a))
        r = torch.linalg.matrix_rank(dev(a))
    s0 = torch.linalg.svdvals(a)
    torch.testing.assert_close(host(s), s0, **F32)
    torch.testing.assert_close(host(sv), s0, **F32)
    assert (host(s)[2:].abs() < 1e-5).all()
    assert_orthonormal_columns(u, torch.float32)
    assert_orthonormal_columns(host(vh).mT, torch.float32)
    torch.testing.assert_close(host(p), torch.linalg.pinv(a), **F32)
    assert host(r).item() == 2


def test_svd_zero_and_empty():
    with native():
        u, s, vh = torch.linalg.svd(dev(torch.zeros(3, 2)))
        ue, se, vhe = torch.linalg.svd(dev(torch.zeros(0, 3)))
    assert (host(s) == 0).all()
    assert_orthonormal_columns(u, torch.float32)
    assert_orthonormal_columns(host(vh).mT, torch.float32)
    torch.testing.assert_close(host(vhe), torch.eye(3))
    assert host(ue).shape == (0, 0) and host(se).shape == (0,)


def test_svd_derived_ops_and_backward():
    a = randn(2, 4, 3)
    x, y = a.clone().requires_grad_(), dev(a).requires_grad_()
    with native():
        got = [torch.linalg.pinv(y), torch.linalg.cond(y), torch.linalg.matrix_norm(y, "nuc"),
               torch.linalg.matrix_norm(y, 2), torch.pinverse(y)]
        sum(g.sum() for g in got).backward()
    want = [torch.linalg.pinv(x), torch.linalg.cond(x), torch.linalg.matrix_norm(x, "nuc"),
            torch.linalg.matrix_norm(x, 2), torch.pinverse(x)]
    sum(w.sum() for w in want).backward()
    for g, w in zip(got, want):
        torch.testing.assert_close(host(g), w, **F32)
    torch.testing.assert_close(host(y.grad), x.grad, **F32)


def test_hermitian_rank_and_pinv():
    a = randn(5, 3)
    a = a @ a.T  # rank 3, symmetric
    with native():
        r = torch.linalg.matrix_rank(dev(a), hermitian=True)
        p = torch.linalg.pinv(dev(a), hermitian=True)
    assert host(r).item() == 3
    torch.testing.assert_close(host(p), torch.linalg.pinv(a, hermitian=True), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float16])
@pytest.mark.filterwarnings("ignore:.*CPU fallback")
def test_other_dtypes_fall_back(dtype):
    # Only float32/float64 are native; CPU itself rejects these, and so must we.
    a = torch.eye(3, dtype=dtype)
    with pytest.raises(RuntimeError):
        torch.linalg.svd(a)
    with pytest.raises(RuntimeError):
        torch.linalg.svd(dev(a))


# ---- least squares

@pytest.mark.parametrize("shapes, driver", [
    (((4, 3), (4, 2)), "gels"), (((2, 3), (2, 3)), "gelsy"), (((3, 3), (3,)), "gelss"),
(((2, 5, 3), (2, 5, 2)), None), (((4, 3), (4, 2)), "gelss")])
def test_lstsq(metas, shapes, driver):
    (sa, sb), m, n = shapes, shapes[0][-2], shapes[0][-1]
    a, b = randn(*sa), randn(*sb, seed=1)
    if m > n and driver in ("gelss", "gelsd"):
        # Residuals' shape depends on the rank there: the counted fallback, still right.
        before = all_fallbacks().get("aten::linalg_lstsq", 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = torch.linalg.lstsq(dev(a), dev(b), driver=driver)
        assert all_fallbacks().get("aten::linalg_lstsq", 0) == before + 1
    else:
        with native():
            got = torch.linalg.lstsq(dev(a), dev(b), driver=driver)
    want = torch.linalg.lstsq(a, b, driver=driver)
    for g, w in zip(got, want):
        g = host(g)
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_lstsq_rank_deficient_gelsy(metas):
    a = randn(5, 2) @ randn(2, 4, seed=1)
    b = randn(5, 2, seed=2)
    with native():
        x, _, rank, _ = torch.linalg.lstsq(dev(a), dev(b))
    x0, _, rank0, _ = torch.linalg.lstsq(a, b)
    assert host(rank).item() == rank0.item() == 2
    torch.testing.assert_close(host(x), x0, rtol=1e-4, atol=1e-4)


def test_lstsq_refuses_what_cpu_refuses(metas):
    # A B of one row was broadcast to A's rows and solved silently; other dtypes and
    # unknown drivers were accepted.
    a = randn(5, 3)
    for b, kw, msg in ((randn(1, 2), {}, r"input.size\(-2\) should match other.size\(-2\)"),
                       (randn(4, 2), {}, r"input.size\(-2\) should match other.size\(-2\)"),
                       (randn(4), {}, r"input.size\(-2\) should match other.size\(-1\)"),
                       (randn(5, 2).double(), {}, "Expected input and other to have the same dtype"),
                       (randn(5, 2), {"driver": "nonsense"}, "parameter `driver` should be one of")):
        with pytest.raises(RuntimeError, match=msg):
            torch.linalg.lstsq(a, b, **kw)
        with pytest.raises(RuntimeError, match=msg):
            host(torch.linalg.lstsq(dev(a), dev(b), **kw).solution)
    assert host(dev(a).sum()).item() == pytest.approx(a.sum().item(), rel=1e-6)


def test_out_forms_refuse_another_dtype_and_geqrf_takes_out(metas):
    # eigh, eigvalsh, qr and lu_factor cast into a float16 out where CPU raises; geqrf's
    # out form had no meta kernel (NotImplementedError).
    a = randn(3, 3)
    a = a + a.mT
    h = lambda: dev(torch.empty(0, dtype=torch.float16))
    for call in (lambda x, o: torch.linalg.eigh(x, out=(o(), o())), lambda x, o: torch.linalg.eigvalsh(x, out=o()),
                 lambda x, o: torch.linalg.qr(x, out=(o(), o())),
                 lambda x, o: torch.linalg.lu_factor(x, out=(o(), torch.empty(0, dtype=torch.int32, device=x.device)))):
        with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float, but got c10::Half"):
            call(a, lambda: torch.empty(0, dtype=torch.float16))
        with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float, but got c10::Half"):
            call(dev(a), h)
    with native():
        out = (dev(torch.empty(0)), dev(torch.empty(0)))
        got = torch.geqrf(dev(randn(4, 3)), out=out)
        assert got[0] is out[0] and got[1] is out[1]
        w = torch.linalg.eigvalsh(dev(a), out=dev(torch.empty(0)))
    want = torch.geqrf(randn(4, 3))
    torch.testing.assert_close(host(out[0]), want[0], **F32)
    torch.testing.assert_close(host(out[1]), want[1], **F32)
    torch.testing.assert_close(host(w), torch.linalg.eigvalsh(a), **F32)


def test_lstsq_backward(metas):
    a, b = randn(4, 3), randn(4, 2, seed=1)
    xa, ya = a.clone().requires_grad_(), dev(a).requires_grad_()
    xb, yb = b.clone().requires_grad_(), dev(b).requires_grad_()
    with native():
        torch.linalg.lstsq(ya, yb).solution.sum().backward()
    torch.linalg.lstsq(xa, xb).solution.sum().backward()
    torch.testing.assert_close(host(ya.grad), xa.grad, **F32)
    torch.testing.assert_close(host(yb.grad), xb.grad, **F32)


def test_non_finite_inputs():
    # QR spreads NaN like LAPACK (only A(i:, i+1:) changes at step i); SVD and eigh raise.
    a = randn(4, 3)
    a[1, 1] = float("nan")
    with native():
        q, r = torch.linalg.qr(dev(a))
    q0, r0 = torch.linalg.qr(a)
    torch.testing.assert_close(host(q), q0, equal_nan=True, **F32)
    torch.testing.assert_close(host(r), r0, equal_nan=True, **F32)
    # torch.linalg.LinAlgError, as CPU's LAPACK failures (a plain RuntimeError missed
    # `except LinAlgError`).
    with pytest.raises(torch.linalg.LinAlgError, match="linalg.svd: The algorithm failed to converge"):
        torch.linalg.svdvals(dev(a))
        torch_tpu.synchronize()
    with pytest.raises(torch.linalg.LinAlgError, match="linalg.eigh: The algorithm failed to converge"):
        torch.linalg.eigvalsh(dev(a[:3]))
        torch_tpu.synchronize()
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.svdvals(a)
    with pytest.raises(torch.linalg.LinAlgError, match="not positive-definite"):
        torch.cholesky(dev(-torch.eye(3)))
        torch_tpu.synchronize()
    assert host(dev(a[0]).sum()).item() == pytest.approx(a[0].sum().item())
