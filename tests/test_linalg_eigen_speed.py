"""Jacobi eigh / SVD (csrc/lowering/linalg_eigen.cpp): accuracy against a float64 reference
at sizes where every index pairs with many others (odd n padded, batches converging at
different sweeps), and the program's shape: rounds move pairs with slices, not gathers."""
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import torch_tpu  # noqa: F401
from conftest import dev, host, no_fallbacks


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def native_call(f, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with no_fallbacks():
            out = f(*args)
    return tuple(host(o) for o in out) if isinstance(out, tuple) else host(out)


# Errors relative to the largest |eigenvalue| / singular value. float32 bounds sit a few
# times above what LAPACK reaches at these sizes; a wrong sign or pair in one rotation
# gives errors of order 1.
BOUNDS = {torch.float32: dict(val=1.5e-6, resid=3e-5, orth=2e-6), torch.float64: dict(val=1e-13, resid=1e-12, orth=1e-13)}


def spectra(n, batch):
    """Random symmetric, repeated eigenvalues, graded spectrum, already diagonal."""
    a = randn(batch, n, n, seed=n)
    q, _ = torch.linalg.qr(randn(batch, n, n, seed=n + 1))
    rep = torch.tensor([1.0] * (n // 2) + [5.0] * (n - n // 2), dtype=torch.float64)
    graded = torch.logspace(-6, 0, n, dtype=torch.float64)
    return [(a + a.mT) / 2, q @ torch.diag_embed(rep) @ q.mT, q @ torch.diag_embed(graded) @ q.mT,
            torch.diag_embed(randn(batch, n, seed=3))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 33, 96])
def test_eigh_accuracy_against_float64(n, dtype):
    bound = BOUNDS[dtype]
    for s in spectra(n, 2):
        w, v = native_call(torch.linalg.eigh, dev(s.to(dtype)))
        wv = native_call(torch.linalg.eigvalsh, dev(s.to(dtype)))
        w, v, wv = w.double(), v.double(), wv.double()
        ref = torch.linalg.eigvalsh(s)
        scale = ref.abs().amax(-1, keepdim=True).clamp_min(1e-30)
        assert ((w - ref).abs() / scale).max() <= bound["val"]
        assert ((wv - ref).abs() / scale).max() <= 4 * bound["val"]  # no Rayleigh quotients here
        resid = (s @ v - v * w[..., None, :]).norm(dim=(-2, -1)) / scale[..., 0]
        assert resid.max() <= bound["resid"]
        assert (v.mT @ v - torch.eye(n, dtype=torch.float64)).abs().max() <= bound["orth"]


def test_eigh_upper_triangle_and_mixed_batch():
    # One matrix of the batch is diagonal (converged before any sweep), the other not; the
    # lower triangle holds garbage that UPLO="U" must ignore.
    s = torch.stack([torch.diag(torch.arange(7.0, dtype=torch.float64)), spectra(7, 1)[0][0]])
    junk = torch.tril(randn(2, 7, 7, seed=9), -1)
    w, v = native_call(lambda x: torch.linalg.eigh(x, UPLO="U"), dev(torch.triu(s) + junk))
    torch.testing.assert_close(w, torch.linalg.eigvalsh(s), rtol=0, atol=1e-13)
    torch.testing.assert_close(s @ v, v * w[..., None, :], rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (7, 3), (3, 8), (33, 33), (80, 65), (64, 96)])
def test_svd_accuracy_against_float64(shape, dtype):
    a = randn(2, *shape, seed=sum(shape))
    a[1, :, 0] = a[1, :, -1]  # rank-deficient member
    ref = torch.linalg.svdvals(a)
    scale = ref.amax(-1, keepdim=True)
    tol = 4 * BOUNDS[dtype]["val"] if dtype == torch.float32 else 1e-13
    for full in (True, False):
        u, s, vh = native_call(lambda x: torch.linalg.svd(x, full_matrices=full), dev(a.to(dtype)))
        u, s, vh = u.double(), s.double(), vh.double()
        assert ((s - ref).abs() / scale).max() <= tol
        k = min(shape)
        recon = u[..., :k] * s[..., None, :] @ vh[..., :k, :]
        assert ((recon - a).norm(dim=(-2, -1)) / scale[..., 0]).max() <= 40 * tol
        for q in (u, vh.mT):
            assert (q.mT @ q - torch.eye(q.shape[-1], dtype=torch.float64)).abs().max() <= 40 * tol
    sv = native_call(torch.linalg.svdvals, dev(a.to(dtype))).double()
    assert ((sv - ref).abs() / scale).max() <= tol


PROGRAM = textwrap.dedent("""
    import torch, torch_tpu
    a = torch.randn(128, 128); a = a + a.T
    torch.linalg.eigh(a.to("tpu"))[0].cpu()
    torch.linalg.svdvals(torch.randn(96, 128).to("tpu")).cpu()
""")


def test_jacobi_programs_hold_no_gather(tmp_path):
    # Each round used to gather every index's partner (O(n^2) scattered reads a round,
    # n-1 rounds a sweep); the pair layout needs only slices. The compile cache keeps each
    # program's StableHLO text in its entry.
    env = dict(os.environ, TPU_COMPILE_CACHE="1", TPU_COMPILE_CACHE_DIR=str(tmp_path))
    env.pop("TPU_DEFER_AND_FUSE", None)
    subprocess.run([sys.executable, "-c", PROGRAM], env=env, check=True, timeout=600)
    loops = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    loops = [t for t in loops if b"stablehlo.while" in t]
    assert len(loops) == 2, "expected one eigh and one svdvals program"
    for text in loops:
        assert b"stablehlo.gather" not in text
        assert text.count(b"stablehlo.while") >= 2  # sweeps, and the rounds of a sweep inside
