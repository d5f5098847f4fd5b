"""Op coverage: rules and decompositions added to raise OpInfo conformance, each checked
against PyTorch's CPU kernels with no CPU fallback (neither the C++ one nor a
decomposition kernel's host round trip)."""
import contextlib
import warnings

import pytest
import torch
import torch.nn.functional as F

from torch_tpu import _decompositions
from conftest import dev, host, native

F32 = dict(rtol=1e-4, atol=1e-5)


def randn(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def check(fn, *args, grad=True, **tol):
    """fn on CPU vs on tpu (forward, and the gradients of float args), natively."""
    tol = tol or F32
    cpu = [a.clone().requires_grad_(grad) if isinstance(a, torch.Tensor) and a.is_floating_point()
           else a for a in args]
    tpu = [dev(a.detach()).requires_grad_(grad) if isinstance(a, torch.Tensor)
           and a.is_floating_point() else dev(a) for a in args]
    with native():
        want, got = fn(*cpu), fn(*tpu)
        torch.testing.assert_close(host(got), want, **tol)
        if grad:
            w = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
            (want * w).sum().backward()
            (got * dev(w)).sum().backward()
            for c, t in zip(cpu, tpu):
                if isinstance(c, torch.Tensor) and c.requires_grad:
                    torch.testing.assert_close(host(t.grad), c.grad, **tol)


# ---- pooling.cpp

@pytest.mark.parametrize("out", [(3, 4), (1, 1), (7, 9), (5, 2)])
def test_adaptive_avg_pool2d(out):
    check(lambda x: F.adaptive_avg_pool2d(x, out), randn(2, 3, 7, 9))


def test_adaptive_avg_pool1d_and_3d():
    check(lambda x: F.adaptive_avg_pool1d(x, 4), randn(3, 5, 9))
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)), randn(2, 3, 5, 7, 9))


@pytest.mark.parametrize("kw", [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(2, 3, 2), stride=(1, 2, 3), padding=(1, 1, 0), ceil_mode=True,
         count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, divisor_override=5),
])
def test_avg_pool3d(kw):
    check(lambda x: F.avg_pool3d(x, **kw), randn(2, 3, 6, 7, 8))


# ---- fft.cpp

@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_fft_forward_transforms(norm):
    x = randn(4, 6, 5)
    for fn in (lambda z: torch.fft.rfft(z, norm=norm),
               lambda z: torch.fft.fft(z, dim=1, norm=norm),
               lambda z: torch.fft.rfftn(z, dim=(0, 2), norm=norm),
               lambda z: torch.fft.fft2(z, norm=norm),
               lambda z: torch.fft.irfft(torch.fft.rfft(z), n=5, norm=norm),
               lambda z: torch.fft.irfftn(torch.fft.rfftn(z, dim=(0, 1)), dim=(0, 1), s=(4, 6),
                                          norm=norm),
               lambda z: torch.fft.ifft(torch.fft.fft(z, dim=0), dim=0, norm=norm)):
        check(fn, x, grad=False)


# ---- decompositions

def test_decomposition_kernels_run_natively():
    assert "aten::nansum" in _decompositions.registered
    x = randn(4, 5)
    x[0, 0] = float("nan")
    check(lambda t: torch.nansum(t, 1), x, grad=False)
    with native():
        torch.testing.assert_close(torch.linspace(-1, 2, 7, device="tpu").cpu(),
                                   torch.linspace(-1, 2, 7))


def test_decompositions_skip_ops_with_kernels():
    for name in _decompositions.registered:
        for key in ("CompositeImplicitAutograd", "CompositeExplicitAutograd"):
            assert not torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)


def test_declined_or_recursing_decomposition_takes_a_counted_host_round_trip():
    x = randn(5)
    op = torch.ops.aten.nansum.default
    for decomp, why in ((lambda *a, **k: NotImplemented, "declined"),
                        (lambda t, *a, **k: op(t), "calls it again"),
                        (lambda *a, **k: 1 / 0, "failed")):
        before = _decompositions.fallbacks.get("aten::nansum", 0)
        with pytest.warns(UserWarning, match=why) if before == 0 else contextlib.nullcontext():
            y = _decompositions._kernel(op, decomp)(x.to("tpu"))
        assert y.device.type == "tpu"
        torch.testing.assert_close(y.cpu(), torch.nansum(x))
        assert _decompositions.fallbacks["aten::nansum"] == before + 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_reflect_and_replicate_padding_write_their_out_in_every_float_dtype(dtype, mode, dims):
    # The functional pads reach their out= decomposition, whose upcasting wrapper
    # computes into a float32 copy of `out`: in half precision `out` stayed as allocated
    # (zeros) unless the kernel writes the result into it.
    x = randn(2, *([3] * (dims + 1))).to(dtype)
    pad = (1, 2) * dims
    with native():
        got = F.pad(dev(x), pad, mode=mode)
        out = dev(torch.full([2, 3] + [6] * dims, 7.0, dtype=dtype))
        name = ("reflection" if mode == "reflect" else "replication") + f"_pad{dims}d"
        ret = getattr(torch.ops.aten, name).out(dev(x), list(pad), out=out)
    assert ret is out
    torch.testing.assert_close(host(got), F.pad(x, pad, mode=mode), rtol=0, atol=0)
    torch.testing.assert_close(host(out), F.pad(x, pad, mode=mode), rtol=0, atol=0)


def test_always_recursing_decompositions_are_not_registered():
    assert "aten::special_bessel_j0.out" not in _decompositions.registered


# ---- normalization.cpp

@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (6, 3), (2, 3, 7)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(shape, training):
    rm, rv = randn(3, seed=2), randn(3, seed=3).abs() + 0.5
    stats = {}

    def fn(x, w, b):
        m, v = dev(rm) if x.device.type == "tpu" else rm.clone(), \
            dev(rv) if x.device.type == "tpu" else rv.clone()
        y = F.batch_norm(x, m, v, w, b, training=training)
        stats[x.device.type] = (host(m), host(v))
        return y
    check(fn, randn(*shape), randn(3, seed=4), randn(3, seed=5))
    torch.testing.assert_close(stats["tpu"], stats["cpu"])
    check(lambda x: F.batch_norm(x, None, None, training=True), randn(*shape))


def test_inference_batch_norm_ops_save_empty_stats_like_cpu():
    a = torch.ops.aten
    x, rm, rv = randn(3, 2, 4), randn(2, seed=1), randn(2, seed=2).abs() + 0.5
    for op in (a.native_batch_norm, a._native_batch_norm_legit):
        want = op(x, None, None, rm, rv, False, 0.1, 1e-5)
        with native():
            got = host(op(dev(x), None, None, dev(rm), dev(rv), False, 0.1, 1e-5))
        torch.testing.assert_close(tuple(got), tuple(want))


# ---- distance.cpp

@pytest.mark.parametrize("p", [0, 0.5, 1, 1.5, 2, 3, float("inf")])
def test_cdist_and_pdist(p):
    check(lambda a, b: torch.cdist(a, b, p=p), randn(2, 5, 3), randn(2, 4, 3, seed=1))
    check(lambda a, b: torch.cdist(a, b, p=p), randn(5, 3), randn(4, 3, seed=1))
    check(lambda a: torch.pdist(a, p=p), randn(6, 3))


# ---- linalg.cpp

def spd(*batch, n=4, seed=0):
    a = randn(*batch, n, n, seed=seed) + 4 * torch.eye(n)
    return a @ a.mT


@pytest.mark.filterwarnings("ignore:torch.triangular_solve is deprecated")
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("unit", [True, False])
def test_triangular_solves(upper, unit):
    a, b, bl = randn(2, 4, 4) + 4 * torch.eye(4), randn(2, 4, 3, seed=1), randn(3, 4, seed=2)
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=upper, unitriangular=unit), a, b)
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=upper, left=False,
                                                     unitriangular=unit), a, bl)
    for tr in (True, False):
        check(lambda a, b: torch.triangular_solve(b, a, upper=upper, transpose=tr,
                                                  unitriangular=unit)[0], a, b, grad=False)


@pytest.mark.parametrize("upper", [True, False])
def test_cholesky_family(upper):
    s, b = spd(2), randn(2, 4, 3, seed=1)
    check(lambda s: torch.linalg.cholesky(s, upper=upper), s)
    f = torch.linalg.cholesky(s, upper=upper)
    check(lambda f, b: torch.cholesky_solve(b, f, upper=upper), f, b)
    check(lambda f: torch.cholesky_inverse(f[0], upper=upper), f)


def test_cholesky_info_names_the_first_failing_minor():
    s = spd(3, n=5)
    s[1, 2, 2], s[2, 0, 0] = -100, float("nan")
    with native():
        got = torch.linalg.cholesky_ex(s.to("tpu")).info.cpu()
    assert got.tolist() == torch.linalg.cholesky_ex(s).info.tolist() == [0, 3, 1]
    with pytest.raises(RuntimeError, match="positive-definite"):
        torch.linalg.cholesky(s.to("tpu"))


# ---- random.cpp

def test_randperm_is_a_seeded_permutation():
    with native():
        torch.manual_seed(3)
        a = torch.randperm(50, device="tpu").cpu()
        torch.manual_seed(3)
        b = torch.randperm(50, device="tpu").cpu()
        c = torch.randperm(50, device="tpu", dtype=torch.float32).cpu()
    assert sorted(a.tolist()) == list(range(50)) and torch.equal(a, b)
    assert sorted(c.tolist()) == list(range(50)) and c.dtype == torch.float32


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("extra", [{}, {"padding_idx": 2}, {"include_last_offset": True}])
def test_embedding_bag_runs_natively(mode, extra):
    # Forward natively; the backward (_embedding_bag_backward) has no rule yet and takes
    # the counted fallback, so it is compared outside native().
    w = randn(10, 3)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    off = torch.tensor([0, 4, 4, 6])  # an empty bag; include_last_offset: CPU's edge rules
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, **extra), w, idx, off, grad=False)
    check(lambda w, i: F.embedding_bag(i, w, mode=mode), w, idx.reshape(2, 4), grad=False)
    if mode == "sum":
        psw = torch.rand(8)
        check(lambda w, i, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p), w, idx, off, psw,
              grad=False)
    if extra.get("include_last_offset"):
        off = torch.tensor([0, 4, 4, 6, 8])  # the documented form: the last offset ends the input
        check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, **extra), w, idx, off, grad=False)
    wc, wt = w.clone().requires_grad_(), dev(w).requires_grad_()
    F.embedding_bag(idx, wc, off, mode=mode, **extra).pow(2).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's once-per-op warning
        F.embedding_bag(dev(idx), wt, dev(off), mode=mode, **extra).pow(2).sum().backward()
    torch.testing.assert_close(host(wt.grad), wc.grad, **F32)


# ---- special.cpp

SPECIAL_X = torch.tensor([-9.3, -4.7, -2.2, -0.5, -0.1, 1e-3, 0.3, 1.0, 2.5, 5.5, 7.1, 30.0])


@pytest.mark.parametrize("fn", [torch.lgamma, torch.digamma, lambda t: torch.polygamma(1, t),
                                lambda t: torch.polygamma(2, t), lambda t: torch.polygamma(3, t)],
                         ids=["lgamma", "digamma", "polygamma1", "polygamma2", "polygamma3"])
def test_gamma_family_natively(fn):
    check(fn, SPECIAL_X.clone(), rtol=1e-4, atol=1e-4)


def test_special_function_edge_values_match_cpu():
    x = torch.tensor([0.0, -1.0, -3.0, float("inf"), float("nan")])
    with native():
        for fn in (torch.digamma, torch.lgamma):
            torch.testing.assert_close(fn(x.to("tpu")).cpu(), fn(x), equal_nan=True)
        for n in (1, 2):
            got, want = torch.polygamma(n, x.to("tpu")).cpu(), torch.polygamma(n, x)
            # At the poles CPU's series gives +-inf or a huge value of the same sign;
            # we give the infinity.
            assert torch.equal(got[:3].sign(), want[:3].sign()) and got[:3].abs().min() > 1e15
            assert got[4].isnan()


def test_erfinv_and_bessel_i1_natively():
    check(torch.erfinv, torch.linspace(-0.99, 0.99, 11), rtol=1e-4, atol=1e-5)
    x = torch.linspace(-6, 6, 13)
    check(torch.special.i1, x, grad=False, rtol=1e-4, atol=1e-5)
    check(torch.special.i1e, x, grad=False, rtol=1e-4, atol=1e-5)


# ---- fractional_pool.cpp

@pytest.mark.parametrize("shape,k,out", [((2, 3, 9, 11), (2, 3), (4, 5)), ((3, 8, 8), (3, 3), (3, 4)),
                                         ((2, 2, 6, 7, 8), (2, 2, 3), (3, 4, 2)),
                                         ((1, 2, 9, 11), (2, 3), (1, 1))])
def test_fractional_max_pool_with_given_samples(shape, k, out):
    nd = len(k)
    x = randn(*shape)
    x.view(-1)[5] = float("nan")  # NaN wins its windows, like CPU
    planes = (shape[0] if len(shape) == nd + 2 else 1, shape[-nd - 1], nd)
    samples = torch.rand(planes, generator=torch.Generator().manual_seed(2))
    fn = torch.ops.aten.fractional_max_pool2d if nd == 2 else torch.ops.aten.fractional_max_pool3d
    with native():
        got = fn(dev(x), k, out, dev(samples))
        want = fn(x, k, out, samples)
        torch.testing.assert_close(host(got[0]), want[0], equal_nan=True, rtol=0, atol=0)
        assert torch.equal(host(got[1]), want[1])
    if nd == 2:  # (the 3-d backward has no meta kernel: it takes the fallback)
        check(lambda t: fn(t, k, out, dev(samples) if t.device.type == "tpu" else samples)[0],
              torch.nan_to_num(x))


# ---- attention.cpp and backend/attention_ops.cpp

def sdpa_grads(device, q, k, v, **kw):
    q, k, v = (t.detach().to(device).requires_grad_() for t in (q, k, v))
    kw = {a: (b.to(device) if isinstance(b, torch.Tensor) else b) for a, b in kw.items()}
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    w = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device)
    (out * w).sum().backward()
    return [t.cpu() for t in (out, q.grad, k.grad, v.grad)], type(out.grad_fn).__name__


@pytest.mark.parametrize("lq,lk,kw", [
    (16, 16, dict(is_causal=True)), (8, 12, {}), (8, 8, dict(scale=0.3, is_causal=True)),
    (8, 8, dict(attn_mask=torch.rand(8, 8, generator=torch.Generator().manual_seed(3)) > 0.3)),
    (8, 12, dict(attn_mask=randn(2, 1, 8, 12, seed=4)))])
def test_attention_is_one_op_that_recomputes_in_backward(lq, lk, kw):
    q, k, v = randn(2, 3, lq, 8, seed=1), randn(2, 3, lk, 8, seed=2), randn(2, 3, lk, 8, seed=3)
    want, _ = sdpa_grads("cpu", q, k, v, **kw)
    with native():
        got, node = sdpa_grads("tpu", q, k, v, **kw)
    assert node == "ScaledDotProductFusedAttentionOverrideableBackward0"
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **F32)


def test_attention_other_cases_take_the_math_path_and_rows_with_no_key_give_zeros():
    q, k, v = randn(2, 4, 6, 8, seed=1), randn(2, 2, 6, 8, seed=2), randn(2, 2, 6, 5, seed=3)
    want, _ = sdpa_grads("cpu", q, k, v, enable_gqa=True)
    with native():
        got, node = sdpa_grads("tpu", q, k, v, enable_gqa=True)  # grouped heads, other head size
    assert node != "ScaledDotProductFusedAttentionOverrideableBackward0"
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **F32)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[1] = False
    x = randn(1, 1, 4, 8)
    with native():
        got = F.scaled_dot_product_attention(dev(x), dev(x), dev(x), attn_mask=dev(mask))
    torch.testing.assert_close(host(got), F.scaled_dot_product_attention(x, x, x, attn_mask=mask))
    assert host(got)[0, 0, 1].abs().sum() == 0
