"""LU-family linear algebra (linalg_lu.cpp, linalg_lu_exp.cpp) and the Cholesky loop
(linalg.cpp): results against PyTorch's CPU kernels, with no CPU fallback."""

import pytest
import torch

from conftest import dev, host, native

F32 = dict(rtol=1e-4, atol=1e-5)


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def same(got, want, **tol):
    got = got if isinstance(got, (tuple, list)) else [got]
    want = want if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(host(g), w, **(tol or F32))


def grads(fn, *args):
    """Gradients of sum(fn(*args) * w) w.r.t. the float args, on CPU and on tpu."""
    out = []
    for where in (lambda t: t, dev):
        xs = [where(a.clone()).requires_grad_() for a in args]
        y = fn(*xs)
        w = where(randn(*y.shape, seed=7, dtype=y.dtype))
        (y * w).sum().backward()
        out.append([host(x.grad) for x in xs])
    return out


def singular(n, seed=0):
    a = randn(n, n, seed=seed)
    a[:, 2] = 0  # a zero column: the third pivot is zero
    return a


# ---- LU factorization

@pytest.mark.parametrize("shape", [(3, 4, 4), (6, 4), (4, 7), (2, 0, 0), (0, 3, 3)])
def test_lu_factor_ex(shape):
    a = randn(*shape)
    with native():
        got = torch.linalg.lu_factor_ex(dev(a))
    want = torch.linalg.lu_factor_ex(a)
    same(got[0], want[0])
    assert torch.equal(host(got[1]), want[1]) and torch.equal(host(got[2]), want[2])


def test_lu_factor_singular_info_and_pivots():
    a = torch.stack([singular(5), randn(5, 5, seed=3), torch.zeros(5, 5)])
    a[0, 4] = a[0, 3]  # ties in |x| pick the first row
    with native():
        got = torch.linalg.lu_factor_ex(dev(a))
    want = torch.linalg.lu_factor_ex(a)
    assert host(got[2]).tolist() == want[2].tolist() and want[2].tolist()[0] == 3
    assert torch.equal(host(got[1]), want[1])
    same(got[0], want[0])


def raises_like_cpu(fn, a):
    """fn(a) raises on tpu exactly what (and as) it raises on CPU."""
    with pytest.raises(Exception) as cpu:
        fn(a)
    with pytest.raises(type(cpu.value)) as tpu:
        host(fn(dev(a)))
    assert type(tpu.value) is type(cpu.value) and str(tpu.value) == str(cpu.value)


def test_lu_factor_raises_on_singular():
    raises_like_cpu(torch.linalg.lu_factor, singular(4))


@pytest.mark.parametrize("shape", [(5, 5), (2, 6, 4), (2, 3, 5)])
def test_linalg_lu_and_unpack(shape):
    a = randn(*shape)
    with native():
        got = torch.linalg.lu(dev(a))
        lu, piv = torch.linalg.lu_factor(dev(a))
        unpacked = torch.lu_unpack(lu, piv)
    same(got, torch.linalg.lu(a))
    same(unpacked, torch.lu_unpack(*torch.linalg.lu_factor(a)))
    p, l, u = (host(t) for t in got)
    torch.testing.assert_close(p @ l @ u, a, **F32)


def test_lu_unpack_flags_and_bad_pivots():
    lu, piv = torch.linalg.lu_factor(randn(4, 4))
    with native():
        for d, p in [(True, False), (False, True)]:
            same(torch.lu_unpack(dev(lu), dev(piv), d, p), torch.lu_unpack(lu, piv, d, p))
    # A device check: CPU's message, raised at the next synchronization (a RuntimeError once
    # device checks honour the "RuntimeError: " tag; an IndexError before).
    with pytest.raises((RuntimeError, IndexError), match="must be between 1 and LU.size"):
        host(torch.lu_unpack(dev(lu), dev(piv + 4))[0])


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
def test_lu_solve(left, adjoint):
    a = randn(2, 4, 4)
    b = randn(3, 2, 4, 3, seed=1) if left else randn(3, 2, 3, 4, seed=1)
    lu, piv = torch.linalg.lu_factor(a)
    with native():
        got = torch.linalg.lu_solve(dev(lu), dev(piv), dev(b), left=left, adjoint=adjoint)
    same(got, torch.linalg.lu_solve(lu, piv, b, left=left, adjoint=adjoint))


def test_lu_solve_backward():
    a, b = randn(4, 4), randn(4, 2, seed=1)
    cpu, tpu = grads(lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b), a, b)
    same(tpu, cpu, rtol=1e-3, atol=1e-4)


# ---- det, slogdet

def test_det_slogdet():
    a = torch.cat([randn(3, 5, 5), singular(5)[None], -torch.eye(5)[None]])
    with native():
        got = (torch.linalg.det(dev(a)),) + tuple(torch.linalg.slogdet(dev(a))) + (torch.logdet(dev(a)),)
    want = (torch.linalg.det(a),) + tuple(torch.linalg.slogdet(a)) + (torch.logdet(a),)
    same(got, want, equal_nan=True, **F32)
    assert host(got[2])[3] == float("-inf") and host(got[1])[3] == 0


def test_nan_entries_stay_nan_through_lu_as_cpu():
    # A masked max turned NaN into -inf (det [[1, 0], [0, nan]] was -inf), and a leading
    # NaN was never taken as the pivot (LAPACK's idamax takes it), so [[nan, 0], [0, 2]]
    # was refused as singular.
    nan = float("nan")
    mats = torch.tensor([[[1.0, 0.0, 0.0], [0.0, nan, 0.0], [0.0, 0.0, 1.0]],
                         [[nan, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0]],
                         [[2.0, 1.0, 1.0], [1.0, nan, 1.0], [1.0, 1.0, 3.0]]])
    with native():
        for m in mats:
            lu, piv = torch.linalg.lu_factor(dev(m))
            want_lu, want_piv = torch.linalg.lu_factor(m)
            same(lu, want_lu, equal_nan=True)
            assert torch.equal(host(piv), want_piv)
            same(torch.linalg.det(dev(m)), torch.linalg.det(m), equal_nan=True)
            same(tuple(torch.linalg.slogdet(dev(m))), tuple(torch.linalg.slogdet(m)), equal_nan=True)
            same(torch.linalg.inv(dev(m)), torch.linalg.inv(m), equal_nan=True)


def test_det_empty_and_float64():
    with native():
        same(torch.linalg.det(dev(torch.zeros(2, 0, 0))), torch.ones(2))
        a = randn(3, 6, 6, dtype=torch.float64)
        same(torch.linalg.det(dev(a)), torch.linalg.det(a), rtol=1e-10, atol=1e-12)


def test_det_slogdet_backward():
    a = randn(2, 4, 4)
    for fn in (torch.linalg.det, lambda x: torch.linalg.slogdet(x)[1],
               lambda x: torch.linalg.det(x.mT), lambda x: torch.linalg.slogdet(x.mT)[1]):
        cpu, tpu = grads(fn, a)  # (x.mT: a non-contiguous input, factored as CPU does)
        same(tpu, cpu, rtol=1e-3, atol=1e-4)


# ---- inv, solve

def test_inv_and_inv_ex():
    a = randn(3, 5, 5)
    with native():
        same(torch.linalg.inv(dev(a)), torch.linalg.inv(a))
        inv, info = torch.linalg.inv_ex(dev(torch.stack([singular(5), randn(5, 5)])))
    assert host(info).tolist() == [3, 0]
    same(inv[1], torch.linalg.inv(randn(5, 5)))


def test_inv_solve_raise_on_singular():
    raises_like_cpu(torch.linalg.inv, singular(4))
    raises_like_cpu(lambda a: torch.linalg.solve(a, a[:, :2]), singular(4))


@pytest.mark.parametrize("bshape,left", [((2, 4, 3), True), ((4,), True), ((2, 4), True), ((3, 4), False)])
def test_solve(bshape, left):
    a, b = randn(2, 4, 4), randn(*bshape, seed=1)
    with native():
        got = torch.linalg.solve(dev(a), dev(b), left=left)
    same(got, torch.linalg.solve(a, b, left=left))


def test_solve_backward_and_tensorsolve():
    a, b = randn(4, 4), randn(4, 3, seed=1)
    for left in (True, False):
        bb = b if left else b.mT
        cpu, tpu = grads(lambda a, b: torch.linalg.solve(a, b, left=left), a, bb)
        same(tpu, cpu, rtol=1e-3, atol=1e-4)
    t, r = randn(2, 3, 6), randn(2, 3, seed=2)
    with native():
        same(torch.linalg.tensorsolve(dev(t), dev(r)), torch.linalg.tensorsolve(t, r))


def test_matrix_power_negative():
    a = randn(2, 4, 4)
    with native():
        same(torch.linalg.matrix_power(dev(a), -3), torch.linalg.matrix_power(a, -3), rtol=1e-3, atol=1e-4)


# ---- Cholesky

def spd(n, batch=(), seed=0, dtype=torch.float32):
    x = randn(*batch, n, n, seed=seed, dtype=dtype)
    return x @ x.mT + n * torch.eye(n, dtype=dtype)


@pytest.mark.parametrize("n", [1, 80])
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_ex_large(n, upper):
    a = spd(n, (2,))
    a[1, n // 2, n // 2] = -1.0  # the second matrix's leading minor n//2+1 is not positive-definite
    with native():
        l, info = torch.linalg.cholesky_ex(dev(a), upper=upper)
    want_l, want_info = torch.linalg.cholesky_ex(a, upper=upper)
    assert host(info).tolist() == want_info.tolist()
    same(l[0], want_l[0])


@pytest.mark.filterwarnings("ignore:torch.cholesky is deprecated")
def test_cholesky_variants():
    a = spd(70, (2,))
    b = randn(2, 70, 3, seed=1)
    with native():
        l = torch.cholesky(dev(a))
        same(l, torch.cholesky(a))
        same(torch.linalg.cholesky(dev(a), upper=True), torch.linalg.cholesky(a, upper=True))
        same(torch.cholesky_solve(dev(b), l), torch.cholesky_solve(b, torch.cholesky(a)), rtol=1e-3, atol=1e-4)
        same(torch.cholesky_inverse(l[0]), torch.cholesky_inverse(torch.cholesky(a)[0]), rtol=1e-3, atol=1e-5)
    d = spd(5, dtype=torch.float64)
    with native():
        same(torch.linalg.cholesky(dev(d)), torch.linalg.cholesky(d), rtol=1e-10, atol=1e-12)


def test_cholesky_raises_when_not_positive_definite():
    a = -torch.eye(3)
    raises_like_cpu(torch.linalg.cholesky, a)
    with pytest.raises((RuntimeError, IndexError),
                       match="cholesky: The factorization could not be completed because the input is not"
                             " positive-definite"):
        host(torch.cholesky(dev(a)))


@pytest.mark.filterwarnings("ignore:torch.triangular_solve is deprecated")
def test_empty_solves():
    with native():
        same(torch.triangular_solve(dev(torch.zeros(2, 0, 3)), dev(torch.zeros(2, 0, 0))),
             torch.triangular_solve(torch.zeros(2, 0, 3), torch.zeros(2, 0, 0)))
        same(torch.cholesky_solve(dev(torch.zeros(0, 2, 2)), dev(torch.zeros(0, 2, 2))), torch.zeros(0, 2, 2))
        same(torch.cholesky_inverse(dev(torch.zeros(0, 0))), torch.zeros(0, 0))


# ---- matrix_exp

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matrix_exp(dtype):
    # Norms from tiny to large in one batch: each matrix gets its own squarings.
    a = randn(4, 5, 5, dtype=dtype) * torch.tensor([1e-3, 0.5, 4.0, 15.0], dtype=dtype)[:, None, None]
    with native():
        got = torch.linalg.matrix_exp(dev(a))
    want = torch.linalg.matrix_exp(a)
    scale = want.abs().amax(dim=(-2, -1), keepdim=True)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert ((host(got) - want).abs() / scale).max() < tol


def test_matrix_exp_backward():
    cpu, tpu = grads(torch.linalg.matrix_exp, randn(3, 3) * 0.5)
    same(tpu, cpu, rtol=1e-4, atol=1e-5)
