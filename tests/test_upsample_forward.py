"""Linear/bilinear/trilinear/bicubic upsampling forwards and 3-d adaptive average pooling
in bfloat16/float16 round as CPU's kernels do: CPU keeps the interpolation weights in the
dtype (PyTorch's decomposition, run before, kept float weights, so results near zero were
far from CPU's) and sums 3-d adaptive-average windows in the dtype. float32 stays within
a few float ulps of CPU, channels_last inputs, scale factors and gradients included."""

import pytest
import torch
import torch.nn.functional as F

from conftest import native

MODES = [("linear", (2, 3, 60), (180,)), ("bilinear", (2, 3, 30, 40), (90, 70)),
         ("bicubic", (2, 3, 20, 30), (45, 70)), ("trilinear", (2, 3, 6, 7, 9), (13, 5, 20))]
REDUCED = [torch.bfloat16, torch.float16]


def randn(shape, dtype, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def mismatch(got, want):
    """The fraction of elements that differ, and the largest relative difference."""
    got, want = got.double(), want.double()
    rel = (got - want).abs() / want.abs().clamp_min(1e-2)
    return (got != want).double().mean().item(), rel.max().item()


@pytest.mark.parametrize("dtype", REDUCED, ids=str)
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("mode,shape,size", MODES, ids=[m[0] for m in MODES])
def test_reduced_forward_rounds_as_cpu(mode, shape, size, align, dtype):
    x = randn(shape, dtype)
    want = F.interpolate(x, size=size, mode=mode, align_corners=align)
    with native():
        got = F.interpolate(x.to("tpu"), size=size, mode=mode, align_corners=align).cpu()
    assert got.dtype == dtype
    frac, rel = mismatch(got, want)
    # Only float sums' order differs from CPU's: a rare 1-ulp tie, never a large error.
    assert frac <= 0.01 and rel <= 2 * torch.finfo(dtype).eps, (frac, rel)


@pytest.mark.parametrize("dtype", REDUCED, ids=str)
@pytest.mark.parametrize("mode,shape,size,layout", [
    ("bilinear", (2, 3, 60, 80), (45, 70), torch.contiguous_format),  # height + width <= 128
    ("bilinear", (2, 3, 345, 456), (270, 270), torch.contiguous_format),  # the conformance sample
    ("bilinear", (2, 4, 30, 40), (90, 70), torch.channels_last),  # more than 3 channels
    ("bilinear", (2, 3, 30, 40), (90, 70), torch.channels_last),
    ("trilinear", (2, 4, 6, 7, 9), (13, 5, 20), torch.channels_last_3d),
    ("trilinear", (2, 3, 6, 7, 9), (13, 5, 20), torch.channels_last_3d)])
def test_cpu_kernel_choice(mode, shape, size, layout, dtype):
    # CPU's vectorized linear kernel keeps float weights, its generic one the dtype's.
    x = randn(shape, dtype, seed=7).contiguous(memory_format=layout)
    want = F.interpolate(x, size=size, mode=mode)
    with native():
        got = F.interpolate(x.to("tpu"), size=size, mode=mode).cpu()
    frac, rel = mismatch(got, want)
    assert frac <= 0.01 and rel <= 2 * torch.finfo(dtype).eps, (frac, rel)


@pytest.mark.parametrize("dtype", REDUCED + [torch.float32], ids=str)
@pytest.mark.parametrize("mode,shape,size", MODES, ids=[m[0] for m in MODES])
def test_scale_factor_and_channels_last(mode, shape, size, dtype):
    x = randn(shape, dtype, seed=1)
    scale = [2.5] * (len(shape) - 2)
    if len(shape) > 3:
        x = x.to(memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d)
    for kw in (dict(scale_factor=scale), dict(scale_factor=scale, recompute_scale_factor=True),
               dict(size=size)):
        want = F.interpolate(x, mode=mode, align_corners=False, **kw)
        with native():
            got = F.interpolate(x.to("tpu"), mode=mode, align_corners=False, **kw).cpu()
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        else:
            frac, rel = mismatch(got, want)
            assert frac <= 0.01 and rel <= 2 * torch.finfo(dtype).eps, (kw, frac, rel)


@pytest.mark.parametrize("mode,shape,size", MODES, ids=[m[0] for m in MODES])
def test_float32_as_accurate_as_cpu(mode, shape, size):
    x = randn(shape, torch.float32, seed=2)
    for align in (False, True):
        exact = F.interpolate(x.double(), size=size, mode=mode, align_corners=align)
        cpu = F.interpolate(x, size=size, mode=mode, align_corners=align)
        with native():
            got = F.interpolate(x.to("tpu"), size=size, mode=mode, align_corners=align).cpu()
        assert (got.double() - exact).abs().max() <= 2 * (cpu.double() - exact).abs().max() + 1e-6


@pytest.mark.parametrize("dtype", REDUCED + [torch.float32], ids=str)
@pytest.mark.parametrize("mode,shape,size", MODES, ids=[m[0] for m in MODES])
def test_gradients(mode, shape, size, dtype):
    x = randn(shape, dtype, seed=3)
    g = randn((shape[0], shape[1]) + size, dtype, seed=4)
    c = x.clone().requires_grad_()
    t = x.to("tpu").requires_grad_()
    F.interpolate(c, size=size, mode=mode, align_corners=False).backward(g)
    with native():
        F.interpolate(t, size=size, mode=mode, align_corners=False).backward(g.to("tpu"))
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(t.grad.cpu(), c.grad, **tol)


@pytest.mark.parametrize("dtype", REDUCED + [torch.float32], ids=str)
@pytest.mark.parametrize("shape,size", [((2, 3, 6, 7, 9), (3, 5, 4)), ((1, 2, 9, 5, 11), (4, 5, 3)),
                                        ((2, 4, 5, 6), (3, 4))])
def test_adaptive_avg_pool_rounds_as_cpu(shape, size, dtype):
    x = randn(shape, dtype, seed=5)
    pool = F.adaptive_avg_pool3d if len(shape) == 5 else F.adaptive_avg_pool2d
    for inp in (x, x.to(memory_format=torch.channels_last_3d if len(shape) == 5 else torch.channels_last)):
        want = pool(inp, size)
        with native():
            got = pool(inp.to("tpu"), size).cpu()
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        else:
            frac, rel = mismatch(got, want)
            assert frac <= 0.01 and rel <= 2 * torch.finfo(dtype).eps, (frac, rel)


def test_interpolate_area_matches_cpu():
    x = randn((2, 3, 6, 7, 9), torch.bfloat16, seed=6)
    want = F.interpolate(x, size=(3, 5, 4), mode="area")
    with native():
        got = F.interpolate(x.to("tpu"), size=(3, 5, 4), mode="area").cpu()
    assert torch.equal(got, want)
