"""Nearest and nearest-exact upsampling forwards (upsample_nearest{1,2,3}d,
_upsample_nearest_exact{1,2,3}d) run natively: each output reads the input CPU's kernel
picks (the given scale when one is passed, nearest-exact's +0.5, clamped to in - 1), in
every dtype CPU takes, as ONE program with no index bound-check flags read back at sync.
(PyTorch's decomposition, run before, was ~7 index ops: 9 executions per 2x upsample in
Strict and 2 device-to-host flag reads at every synchronize.)"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torch_tpu

from conftest import native

MODES = ["nearest", "nearest-exact"]

# (input spatial shape, interpolate kwargs): integer up, fractional up, down, mixed,
# identity, 2x (CPU's o >> 1 shortcut, also with a scale that rounds to it), size given.
CASES = {
    1: [((7,), dict(scale_factor=2)), ((7,), dict(scale_factor=3)), ((5,), dict(scale_factor=2.9)),
        ((10,), dict(scale_factor=1.3)), ((13,), dict(scale_factor=0.45)), ((9,), dict(scale_factor=0.5)),
        ((8,), dict(scale_factor=0.25)), ((5,), dict(scale_factor=2.1)), ((7,), dict(size=20)),
        ((20,), dict(size=7)), ((6,), dict(size=6)), ((1,), dict(size=5)), ((5,), dict(size=1)),
        ((5,), dict(scale_factor=1.7, recompute_scale_factor=True))],
    2: [((16, 16), dict(scale_factor=2)), ((5, 7), dict(scale_factor=(3, 2))), ((5, 7), dict(scale_factor=1.7)),
        ((9, 10), dict(scale_factor=(0.7, 1.3))), ((12, 9), dict(scale_factor=0.5)), ((5, 7), dict(size=(20, 7))),
        ((20, 7), dict(size=(6, 11))), ((7, 5), dict(scale_factor=(2.9, 0.3))), ((4, 4), dict(size=(4, 12)))],
    3: [((4, 5, 6), dict(scale_factor=2)), ((4, 5, 6), dict(scale_factor=(1.5, 0.7, 3))),
        ((3, 4, 5), dict(size=(7, 4, 2))), ((6, 6, 6), dict(scale_factor=0.5)), ((5, 3, 7), dict(scale_factor=1.3))],
}
ALL = [(n, shape, kw) for n, cases in CASES.items() for shape, kw in cases]


def ids(case):
    n, shape, kw = case
    return f"{n}d-{'x'.join(map(str, shape))}-" + "-".join(f"{k}={v}" for k, v in kw.items())


def randn(shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ALL, ids=[ids(c) for c in ALL])
def test_values_equal_cpu(case, mode):
    n, shape, kw = case
    x = randn((2, 3) + shape)
    want = F.interpolate(x, mode=mode, **kw)
    with native():
        got = F.interpolate(x.to("tpu"), mode=mode, **kw).cpu()
    assert got.shape == want.shape and torch.equal(got, want)


def test_cases_tell_scale_from_size():
    """The cases would catch a rule that used in/out where CPU uses the given scale."""
    differ = 0
    for n, shape, kw in ALL:
        for mode in MODES:
            if "scale_factor" in kw and not kw.get("recompute_scale_factor"):
                x = randn((1, 1) + shape)
                a = F.interpolate(x, mode=mode, **kw)
                differ += not torch.equal(a, F.interpolate(x, mode=mode, size=a.shape[2:]))
    assert differ >= 5


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_dtypes(n, mode, dtype):
    shape, kw = CASES[n][1]
    x = (randn((2, 3) + shape) * 60 + 100).to(dtype) if dtype == torch.uint8 else randn((2, 3) + shape, dtype)
    want = F.interpolate(x, mode=mode, **kw)
    with native():
        got = F.interpolate(x.to("tpu"), mode=mode, **kw).cpu()
    assert got.dtype == dtype and torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.int32, torch.int64, torch.complex64], ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_refuses_what_cpu_refuses(mode, dtype):
    x = torch.ones(1, 2, 4, 4, dtype=dtype)
    with pytest.raises(NotImplementedError):
        F.interpolate(x, scale_factor=2, mode=mode)
    with pytest.raises(NotImplementedError):
        F.interpolate(x.to("tpu"), scale_factor=2, mode=mode).cpu()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(scale_factor=1.7), dict(size=(5, 13))], ids=str)
def test_channels_last_and_non_contiguous(kw, mode):
    base = randn((2, 5, 9, 11))
    inputs = [base.contiguous(memory_format=torch.channels_last), base.transpose(2, 3), base[:, ::2, 1:, ::2]]
    for x in inputs:
        want = F.interpolate(x, mode=mode, **kw)
        with native():
            got = F.interpolate(x.to("tpu"), mode=mode, **kw)
        assert torch.equal(got.cpu(), want)
        assert got.is_contiguous(memory_format=torch.channels_last) == want.is_contiguous(
            memory_format=torch.channels_last)
    x3 = randn((1, 4, 3, 5, 6)).contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(F.interpolate(x3.to("tpu"), mode=mode, scale_factor=2).cpu(),
                       F.interpolate(x3, mode=mode, scale_factor=2))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", [CASES[1][2], CASES[2][3], CASES[2][6], CASES[3][1]], ids=lambda c: str(c))
def test_gradients(case, mode):
    shape, kw = case
    x = randn((2, 3) + shape, torch.float64)
    g = randn(F.interpolate(x, mode=mode, **kw).shape, torch.float64, seed=1)
    xc = x.clone().requires_grad_()
    F.interpolate(xc, mode=mode, **kw).backward(g)
    xt = x.to("tpu").requires_grad_()
    with native():
        F.interpolate(xt, mode=mode, **kw).backward(g.to("tpu"))
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(scale_factor=0.5), dict(size=(20, 7)),
                                dict(scale_factor=1.7)], ids=str)
def test_one_program_no_flag_reads(kw, mode):
    """One upsample is one lowered op, one execution and no device-to-host reads at sync."""
    x = randn((1, 8, 16, 16)).to("tpu")
    F.interpolate(x, mode=mode, **kw)  # compiles
    torch.tpu.synchronize()
    before = torch_tpu.metrics()
    y = F.interpolate(x, mode=mode, **kw)
    torch.tpu.synchronize()
    after = torch_tpu.metrics()
    grown = {k: after[k] - before[k] for k in ("executions", "d2h_transfers", "op_calls")}
    assert grown["executions"] == 1 and grown["d2h_transfers"] == 0, grown
    assert grown["op_calls"] <= 1, grown
    assert torch.equal(y.cpu(), F.interpolate(x.cpu(), mode=mode, **kw))


def random_cases(count=16, seed=0):
    """Sizes and scales (size or scale_factor given) where float rounding decides indices."""
    import random
    rnd = random.Random(seed)
    cases = [((2,), dict(size=41)), ((5,), dict(scale_factor=2.1)), ((3,), dict(scale_factor=1.3))]
    while len(cases) < count:
        i = rnd.randint(1, 40)
        s = rnd.choice([rnd.uniform(0.1, 4), rnd.randint(1, 5) / rnd.randint(1, 5), 1 / rnd.randint(1, 7)])
        if int(i * s) >= 1:
            cases.append(((i,), dict(scale_factor=s) if rnd.random() < 0.6 else dict(size=int(i * s))))
    return cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_indices_at_rounding_edges(n, mode, dtype):
    """CPU's 2-d kernel (o >> 1 and copy shortcuts, float scale) and its 1-d/3-d one (no
    shortcuts, double scale for float64, fused multiply-add) pick differently: both hold."""
    for (i,), kw in random_cases():
        x = torch.arange(i, dtype=dtype).reshape((1, 1) + (1,) * (n - 1) + (i,)).expand((2, 3) + (2,) * (n - 1) + (i,))
        kw = {k: (v if k == "recompute_scale_factor" else (1,) * (n - 1) + (v,)) for k, v in kw.items()}
        got = F.interpolate(x.to("tpu"), mode=mode, **kw).cpu()
        if n != 2 and mode == "nearest-exact" and dtype == torch.float32:
            # CPU's own indices here depend on its instruction set (its AVX2 and AVX-512
            # kernels fuse the multiply-add, its default one does not): compare with the
            # fused rule, computed exactly.
            want = torch.tensor(fused_nearest_exact(i, got.shape[-1], kw.get("scale_factor", (None,))[-1]), dtype=dtype)
            assert torch.equal(got.reshape(-1, got.shape[-1])[0], want), (n, i, kw)
        else:
            assert torch.equal(got, F.interpolate(x, mode=mode, **kw)), (n, i, kw)


def fused_nearest_exact(i, out, scale):
    """Source indices of a float32 nearest-exact resize, i -> out: s = 1 / scale (or
    i / out) in float32, src = s * (o + 0.5) - 0.5 rounded once (a fused multiply-add: the
    product and difference are exact in float64, whose value then rounds once to float32),
    then floor(max(src, 0) + 0.5), clamped to i - 1."""
    s = np.float32(1.0 / scale) if scale else np.float32(i) / np.float32(out)
    idx = []
    for o in range(out):
        src = np.float32(np.float64(s) * (o + 0.5) - 0.5)
        real = np.float32(np.float64(max(src, np.float32(0))) + 0.5)
        idx.append(min(int(np.floor(real)), i - 1))
    return idx
