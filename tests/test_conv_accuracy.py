"""Float32 convolution backward on tpu against float64 references.

grad_bias is a sum over N and the spatial dims: a plain float reduce (XLA:CPU adds the
thousands of terms one by one into one accumulator) drifted up to 30 ulps of the result
where CPU's kernel stays within a few; the rule sums with compensation
(csrc/lowering/compensated_sum.cpp). grad_weight and grad_input are contractions XLA runs
as convolutions: they are held at the few ulps they reach (CPU's level or better on these
shapes). References are float64 on CPU from the same float32 inputs. Shapes are the ones
the mobile vision models and the audio encoders' subsampling use: depthwise, pointwise,
strided stems, 1-D and 2-D (time x frequency) convolutions, batch 2-8.
"""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401
from conftest import no_fallbacks

EPS32 = torch.finfo(torch.float32).eps

# (input shape, weight shape, conv kwargs)
CASES = {
    "depthwise3x3": ((4, 32, 56, 56), (32, 1, 3, 3), dict(padding=1, groups=32)),
    "depthwise3x3_s2": ((4, 64, 56, 56), (64, 1, 3, 3), dict(stride=2, padding=1, groups=64)),
    "depthwise5x5_b8": ((8, 16, 32, 32), (16, 1, 5, 5), dict(padding=2, groups=16)),
    "pointwise": ((4, 32, 56, 56), (64, 32, 1, 1), {}),
    "pointwise_b8": ((8, 64, 28, 28), (16, 64, 1, 1), {}),
    "stem3x3_s2": ((2, 3, 112, 112), (32, 3, 3, 3), dict(stride=2, padding=1)),
    "subsampling2d": ((2, 1, 200, 80), (16, 1, 3, 3), dict(stride=2, padding=1)),
    "subsampling2d_depthwise": ((2, 16, 100, 40), (16, 1, 3, 3), dict(stride=2, padding=1, groups=16)),
    "conv1d": ((2, 80, 400), (64, 80, 5), dict(padding=2)),
    "conv1d_depthwise": ((4, 64, 400), (64, 1, 9), dict(padding=4, groups=64)),
}


def _inputs(xs, ws, seed=0):
    """Positive activations (as after a ReLU) and a grad with a mean: sums that do not
    cancel, where an accumulator's drift shows."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(xs, generator=g, dtype=torch.float64) + 1).abs().float()
    w = (torch.randn(ws, generator=g, dtype=torch.float64) * 0.3).float()
    b = torch.randn(ws[0], generator=g, dtype=torch.float64).float()
    return x, w, b, g


def _backward(x, w, b, grad_of, device, kw, dtype=torch.float32):
    x, w, b = (t.to(dtype).clone().to(device).requires_grad_() for t in (x, w, b))
    conv = F.conv1d if x.dim() == 3 else F.conv2d
    y = conv(x, w, b, **kw)
    y.backward(grad_of(y.shape).to(dtype).to(device))
    return {"dx": x.grad, "dw": w.grad, "db": b.grad}


def _ulps(got, ref):
    """max |got - ref| in float32 eps of ref's rms."""
    return (got.detach().cpu().double() - ref).abs().max().item() / (ref.pow(2).mean().sqrt().item() * EPS32)


# Max error in ulps of each tensor's rms. The plain grad_bias sum gave 3.9-30 on these
# shapes (CPU 3.0-38); the compensated one at most 0.5. grad_weight reaches 4.9 and
# grad_input 30 (conv1d, CPU 10: XLA's convolution accumulates its 400-term dot products
# in one float), CPU 0.9-36 and 4.5-13.
BOUNDS = {"db": 1.0, "dw": 6.0, "dx": 40.0}


@pytest.mark.parametrize("case", sorted(CASES))
def test_conv_backward_float64_accuracy(case):
    xs, ws, kw = CASES[case]
    x, w, b, g = _inputs(xs, ws)
    grads = {}

    def grad_of(shape):  # one grad for every run
        if shape not in grads:
            grads[shape] = (torch.randn(shape, generator=g, dtype=torch.float64) + 0.5).float()
        return grads[shape]
    ref = _backward(x.double(), w.double(), b.double(), grad_of, "cpu", kw, torch.float64)
    with no_fallbacks():
        got = _backward(x, w, b, grad_of, "tpu", kw)
    errs = {k: round(_ulps(got[k], ref[k]), 2) for k in BOUNDS}
    bad = {k: e for k, e in errs.items() if e > BOUNDS[k]}
    assert not bad, f"{case}: ulps beyond {BOUNDS}: {bad}"


def test_conv_bias_grad_sums_exactly_over_many_terms():
    """A grad of one repeated value: its sum over N x spatial is that value times the count
    (exact in float64); float32 must land within an ulp of it (a plain sequential sum of
    8 x 64 x 64 terms drifted by hundreds)."""
    x = torch.rand(8, 4, 66, 66)
    w = torch.randn(4, 4, 3, 3)
    g = torch.full((8, 4, 64, 64), 0.1)
    want = torch.tensor(float(torch.tensor(0.1)) * 8 * 64 * 64, dtype=torch.float64)  # float32(0.1) x count
    with no_fallbacks():
        _, _, db = torch.ops.aten.convolution_backward(
            g.to("tpu"), x.to("tpu"), w.to("tpu"), [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
            [False, False, True])
    err = (db.cpu().double() - want).abs().max().item() / (want.item() * EPS32)
    assert err <= 1.0, f"grad_bias {err:.1f} ulps from the exact sum"
