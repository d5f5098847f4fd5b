"""uint8 image resizes (bilinear and bicubic, plain and antialiased) equal CPU's integer
kernel exactly, and adaptive average pooling refuses an empty window dim as CPU does."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from conftest import no_fallbacks

MODES = [dict(mode="bilinear"), dict(mode="bilinear", align_corners=True), dict(mode="bicubic"),
         dict(mode="bicubic", align_corners=True), dict(mode="bilinear", antialias=True),
         dict(mode="bicubic", antialias=True), dict(mode="bilinear", antialias=True, align_corners=True)]
SIZES = [(4, 4), (6, 6), (2, 2), (7, 3), (3, 10), (1, 5), (5, 5), (13, 17)]


@pytest.mark.parametrize("kw", MODES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_uint8_resize_equals_cpu(kw):
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (2, 3, 5, 5), generator=g, dtype=torch.uint8),
              torch.randint(0, 256, (1, 5, 9, 4), generator=g, dtype=torch.uint8),
              torch.tensor([[[[10, 200], [50, 100]]]], dtype=torch.uint8),
              torch.randint(0, 256, (1, 3, 8, 6), generator=g, dtype=torch.uint8).to(
                  memory_format=torch.channels_last)]
    bad = []
    for x, size in itertools.product(images, SIZES):
        want = F.interpolate(x, size=size, **kw)
        with no_fallbacks():
            got = F.interpolate(x.to("tpu"), size=size, **kw).cpu()
        assert got.dtype == torch.uint8
        if not torch.equal(got, want):
            bad.append((tuple(x.shape), size, (got.int() - want.int()).abs().max().item()))
    assert not bad, bad


def test_uint8_scale_factors_and_large_downscale():
    x = torch.randint(0, 256, (1, 3, 64, 48), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    for kw in [dict(scale_factor=0.3), dict(scale_factor=2.5), dict(scale_factor=(0.1, 1.7))]:
        for mode in ("bilinear", "bicubic"):
            for aa in (False, True):
                want = F.interpolate(x, mode=mode, antialias=aa, **kw)
                got = F.interpolate(x.to("tpu"), mode=mode, antialias=aa, **kw).cpu()
                assert torch.equal(got, want), (kw, mode, aa)


def test_uint8_linear_and_trilinear_refuse_as_cpu():
    x = torch.randint(0, 256, (1, 2, 5), dtype=torch.uint8)
    for fn in (lambda a: F.interpolate(a, size=7, mode="linear"),
               lambda a: F.interpolate(a[..., None, None], size=(7, 2, 2), mode="trilinear")):
        with pytest.raises(NotImplementedError) as want:
            fn(x)
        with pytest.raises(NotImplementedError) as got:
            fn(x.to("tpu"))
        assert str(got.value).split("\n")[0] == str(want.value).split("\n")[0]


@pytest.mark.parametrize("shape,k", [((1, 1, 0, 3), 2), ((1, 0, 3), 2), ((2, 1, 3, 0), 2),
                                     ((1, 1, 2, 0, 3), 3), ((1, 0, 2, 3), 3)])
def test_adaptive_avg_pool_refuses_empty_window_dims(shape, k):
    pool = F.adaptive_avg_pool2d if k == 2 else F.adaptive_avg_pool3d
    x = torch.empty(shape)
    with pytest.raises(RuntimeError) as want:
        pool(x, 2)
    t = torch.ones(shape, device="tpu")
    with pytest.raises(RuntimeError) as got:
        pool(t, 2)
    assert str(got.value).split("\n")[0] == str(want.value).split("\n")[0]
    assert torch.equal(t.cpu(), torch.ones(shape))  # the process and the tensor stay usable
    assert pool(torch.ones((1, 2) + (4,) * k, device="tpu"), 2).cpu().eq(1).all()


def test_adaptive_avg_pool_empty_batch_and_channels_still_work():
    for shape in [(0, 1, 2, 3), (1, 0, 2, 3), (0, 3, 4)]:
        want = F.adaptive_avg_pool2d(torch.empty(shape), 2)
        got = F.adaptive_avg_pool2d(torch.empty(shape, device="tpu"), 2)
        assert got.shape == want.shape
