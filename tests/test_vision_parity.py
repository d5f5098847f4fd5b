"""CPU parity of three vision-op edge cases (probe "vision", session 63):
- grid_sample under zeros padding gives NaN, as CPU's 2-d kernel does, for a NaN or
  infinite grid coordinate (its weights are NaN; 3-d skips such taps and gives 0);
- linear/bilinear/bicubic/trilinear upsampling and 2-d grid_sample refuse an empty
  spatial input with CPU's error, and the process stays usable;
- fractional_max_pool3d_backward (no Meta kernel in PyTorch) runs natively.
Each check runs in Strict here and again in DeferAndFuse and Debug in a subprocess."""

import itertools
import os
import sys

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import native, run_python  # noqa: E402

NAN, INF = float("nan"), float("inf")
# Non-finite coordinates, and finite ones in and far outside the input.
GRID_2D = [[NAN, 0.1], [INF, 0.1], [-INF, 0.1], [0.1, NAN], [0.1, INF], [0.1, -INF], [NAN, NAN],
           [INF, -INF], [0.2, 0.1], [1e30, 0.1], [-0.7, 0.9]]
GRID_3D = [[NAN, 0.1, 0.2], [INF, 0.1, 0.2], [-INF, 0.1, 0.2], [0.1, NAN, 0.2], [0.1, 0.2, INF],
           [0.1, 0.2, -INF], [0.1, 0.2, NAN], [0.2, 0.1, 0.3], [1e30, 0.1, 0.2], [-0.7, 0.9, 0.4]]
GRID_CASES = ([(2, m, a) for m in ("bilinear", "nearest", "bicubic") for a in (False, True)]
              + [(3, m, a) for m in ("bilinear", "nearest") for a in (False, True)])


def grid_inputs(nd):
    gen = torch.Generator().manual_seed(nd)
    x = torch.randn((2, 3, 4, 5, 6)[:nd + 2], generator=gen)
    pts = torch.tensor(GRID_2D if nd == 2 else GRID_3D)
    grid = pts.reshape((1,) * nd + pts.shape).expand((2,) + (1,) * (nd - 1) + pts.shape).contiguous()
    return x, grid


def grid_sample_with_grads(x, grid, device, **kw):
    x = x.clone().to(device).requires_grad_()
    grid = grid.clone().to(device).requires_grad_()
    y = F.grid_sample(x, grid, **kw)
    y.backward(torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).to(device) / y.numel() - 0.5)
    return y.detach().cpu(), x.grad.cpu(), grid.grad.cpu()


def check_grid_sample_nonfinite_zeros(nd, mode, align):
    x, grid = grid_inputs(nd)
    want = grid_sample_with_grads(x, grid, "cpu", mode=mode, padding_mode="zeros", align_corners=align)
    with native():
        got = grid_sample_with_grads(x, grid, "tpu", mode=mode, padding_mode="zeros", align_corners=align)
    for name, g, w in zip(("output", "grad_input", "grad_grid"), got, want):
        torch.testing.assert_close(g, w, equal_nan=True, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")
    if nd == 2 and mode != "nearest":  # the probe's case: NaN, not 0
        assert got[0][..., :8].isnan().all()


def check_grid_sample_3d_nan_border(pad, align):
    # CPU's scalar 3-d kernel clips a NaN coordinate to size - 1 (std::min keeps it).
    x, grid = grid_inputs(3)
    for mode in ("bilinear", "nearest"):
        want = F.grid_sample(x, grid, mode=mode, padding_mode=pad, align_corners=align)
        got = F.grid_sample(x.to("tpu"), grid.to("tpu"), mode=mode, padding_mode=pad, align_corners=align).cpu()
        torch.testing.assert_close(got[..., :8], want[..., :8], equal_nan=True, atol=1e-5, rtol=1e-5)


EMPTY_CASES = [
    ("linear", (1, 2, 0), (3,)),
    ("linear", (1, 2, 4), (0,)),
    ("bilinear", (1, 2, 0, 5), (3, 3)),
    ("bilinear", (1, 2, 4, 0), (3, 3)),
    ("bilinear", (1, 0, 4, 5), (3, 3)),  # an empty channel dim: CPU's second check
    ("bicubic", (1, 2, 0, 5), (3, 3)),
    ("trilinear", (1, 2, 0, 5, 4), (3, 3, 3)),
    ("trilinear", (1, 2, 2, 5, 0), (3, 3, 3)),
]


def cpu_error(fn):
    with pytest.raises(RuntimeError) as e:
        fn("cpu")
    return str(e.value).splitlines()[0]


def check_upsample_empty_raises(mode, shape, size):
    for align in (False, True):
        def call(d):
            return F.interpolate(torch.randn(shape, device=d), size=size, mode=mode, align_corners=align)
        want = cpu_error(call)
        with pytest.raises(RuntimeError) as e:
            call("tpu").cpu()
        assert str(e.value).splitlines()[0] == want
    # A batch of 0 is fine on CPU and here; the process stays usable.
    x = torch.randn((0, 2) + (4,) * len(size))
    torch.testing.assert_close(F.interpolate(x.to("tpu"), size=(3,) * len(size), mode=mode).cpu(),
                               F.interpolate(x, size=(3,) * len(size), mode=mode))


def check_grid_sample_2d_empty_raises():
    for shape in ((1, 2, 0, 5), (1, 2, 4, 0)):
        def call(d):
            return F.grid_sample(torch.randn(shape, device=d), torch.zeros(1, 2, 3, 2, device=d), align_corners=False)
        want = cpu_error(call)
        with pytest.raises(RuntimeError) as e:
            call("tpu").cpu()
        assert str(e.value).splitlines()[0] == want
    x, g = torch.randn(1, 2, 4, 5), torch.rand(1, 2, 3, 2) * 2 - 1
    torch.testing.assert_close(F.grid_sample(x.to("tpu"), g.to("tpu"), align_corners=False).cpu(),
                               F.grid_sample(x, g, align_corners=False))


def fractional_grads(nd, device, shape, out):
    gen = torch.Generator().manual_seed(nd)
    x = torch.randn(shape, generator=gen).to(device).requires_grad_()
    samples = torch.rand(shape[0], shape[1], nd, generator=gen).to(device)
    pool = F.fractional_max_pool3d if nd == 3 else F.fractional_max_pool2d
    y = pool(x, 2, output_size=out, _random_samples=samples)
    y.backward(torch.randn(y.shape, generator=gen).to(device))
    return y.detach().cpu(), x.grad.cpu()


def check_fractional_backward_native(nd):
    shape, out = ((2, 4, 11, 13, 9), (5, 6, 4)) if nd == 3 else ((2, 4, 11, 13), (5, 6))
    want = fractional_grads(nd, "cpu", shape, out)
    with native():
        got = fractional_grads(nd, "tpu", shape, out)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def check_fractional3d_backward_bad_args():
    x = torch.randn(1, 2, 6, 6, 6)
    y, i = torch.ops.aten.fractional_max_pool3d(x, [2, 2, 2], [3, 3, 3], torch.rand(1, 2, 3))
    for args in ((y, x, [2, 2, 2], [3, 3, 2], i), (y.double(), x, [2, 2, 2], [3, 3, 3], i)):
        want = cpu_error(lambda d: torch.ops.aten.fractional_max_pool3d_backward(
            *[a.to(d) if isinstance(a, torch.Tensor) else a for a in args]))
        with pytest.raises(RuntimeError) as e:
            torch.ops.aten.fractional_max_pool3d_backward(
                *[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]).cpu()
        assert str(e.value).splitlines()[0] == want


def check_all():
    for case in GRID_CASES:
        check_grid_sample_nonfinite_zeros(*case)
    for pad, align in itertools.product(("border", "reflection"), (False, True)):
        check_grid_sample_3d_nan_border(pad, align)
    for case in EMPTY_CASES:
        check_upsample_empty_raises(*case)
    check_grid_sample_2d_empty_raises()
    check_fractional_backward_native(3)
    check_fractional_backward_native(2)
    check_fractional3d_backward_bad_args()


@pytest.mark.parametrize("nd,mode,align", GRID_CASES)
def test_grid_sample_nonfinite_coordinates_match_cpu(nd, mode, align):
    check_grid_sample_nonfinite_zeros(nd, mode, align)


@pytest.mark.parametrize("pad", ["border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_3d_nan_coordinate_clips_as_cpu(pad, align):
    check_grid_sample_3d_nan_border(pad, align)


@pytest.mark.parametrize("mode,shape,size", EMPTY_CASES)
def test_upsample_empty_spatial_raises_as_cpu(mode, shape, size):
    check_upsample_empty_raises(mode, shape, size)


def test_grid_sample_2d_empty_spatial_raises_as_cpu():
    check_grid_sample_2d_empty_raises()


@pytest.mark.parametrize("nd", [3, 2])
def test_fractional_max_pool_backward_runs_natively(nd):
    check_fractional_backward_native(nd)


def test_fractional_max_pool3d_backward_bad_arguments_raise_as_cpu():
    check_fractional3d_backward_bad_args()


@pytest.mark.parametrize("env", [{"TPU_DEFER_AND_FUSE": "1"}, {"TPU_LAUNCH_BLOCKING": "1"}], ids=["DF", "Debug"])
def test_all_checks_in_other_modes(env):
    code = ("import sys, warnings; sys.path.insert(0, 'tests'); warnings.filterwarnings('ignore');"
            "import torch_tpu, test_vision_parity as t; t.check_all(); print('ok')")
    r = run_python(code, env={"TPU_DEFER_AND_FUSE": "0", "TPU_LAUNCH_BLOCKING": "0", **env})
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
