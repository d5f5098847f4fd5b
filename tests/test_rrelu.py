"""RReLU (rrelu_with_noise and its in-place and out= forms) runs natively: slopes drawn
from the tpu generator, the noise tensor written as CPU's kernel writes it, evaluation
and gradients equal to CPU's, and CPU's errors for bad arguments."""

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_draws_follow_the_tpu_generator, no_fallbacks

rrelu = torch.ops.aten.rrelu_with_noise


def test_training_scales_non_positive_elements_by_uniform_slopes():
    x = torch.randn(20000)
    x[:4] = torch.tensor([0.0, -0.0, 2.0, -3.0])
    noise = torch.full((20000,), 7.0, device="tpu")
    with no_fallbacks():
        y = rrelu(x.to("tpu"), noise, 0.1, 0.3, True)
        yc, nc = y.cpu(), noise.cpu()
    low = x <= 0
    assert torch.equal(nc[~low], torch.ones(int((~low).sum())))
    s = nc[low]
    assert s.min() >= 0.1 and s.max() < 0.3
    # mean and variance of U(0.1, 0.3) within 5 standard errors
    n = s.numel()
    assert abs(s.mean().item() - 0.2) < 5 * (0.2 / 12 ** 0.5) / n ** 0.5
    assert abs(s.var().item() - 0.04 / 12) < 5 * 0.04 / 12 * (0.8 / n) ** 0.5
    torch.testing.assert_close(yc, torch.where(low, x * nc, x), rtol=0, atol=0)
    assert torch.equal(yc[:2].sign(), x[:2].sign()) and str(yc[1].item()) == "-0.0"


def test_evaluation_is_leaky_relu_and_leaves_the_noise():
    for dt in (torch.float32, torch.float64):
        x = torch.randn(5, 7, dtype=dt)
        noise = torch.full((5, 7), 3.0, dtype=dt, device="tpu")
        with no_fallbacks():
            y = rrelu(x.to("tpu"), noise, 0.1, 0.4, False).cpu()
        torch.testing.assert_close(y, rrelu(x, torch.empty_like(x), 0.1, 0.4, False), rtol=0, atol=0)
        assert torch.equal(noise.cpu(), torch.full((5, 7), 3.0, dtype=dt))


def test_module_and_functional_forms_and_gradients():
    torch.tpu.manual_seed(0)
    x = torch.randn(6, 9)
    for inplace in (False, True):
        m = torch.nn.RReLU(0.05, 0.25, inplace=inplace)
        xt = x.to("tpu").requires_grad_()
        with no_fallbacks():
            y = m(xt * 1)  # (in place on a non-leaf)
            y.backward(torch.arange(54.0).reshape(6, 9).to("tpu"))
            yc, g = y.detach().cpu(), xt.grad.cpu()
        slope = torch.where(x <= 0, yc / x, torch.ones_like(x))
        assert ((slope >= 0.05) & (slope < 0.25) | (x > 0)).all()
        torch.testing.assert_close(g, torch.arange(54.0).reshape(6, 9) * slope)
        m.eval()
        with no_fallbacks():
            torch.testing.assert_close(m(x.to("tpu")).cpu(), F.leaky_relu(x, 0.15), rtol=0, atol=0)
    z = x.to("tpu")
    with no_fallbacks():
        F.rrelu_(z, 0.1, 0.2, training=True)
        zc = z.cpu()
    assert torch.equal(zc[x > 0], x[x > 0]) and ((zc / x)[x <= 0] >= 0.1).all()


def test_half_precision_and_out_form():
    x = torch.randn(64)
    for dt in (torch.bfloat16, torch.float16):
        with no_fallbacks():
            y = F.rrelu(x.to("tpu", dt), 0.1, 0.3, training=True).cpu()
        assert y.dtype == dt and torch.equal(y[x > 0], x.to(dt)[x > 0])
    out = torch.empty(3, device="tpu")
    noise = torch.empty(64, device="tpu")
    with no_fallbacks():
        r = torch.ops.aten.rrelu_with_noise.out(x.to("tpu"), noise, 0.1, 0.3, True, None, out=out)
    assert r is out and out.shape == (64,)
    torch.testing.assert_close(out.cpu(), torch.where(x <= 0, x * noise.cpu(), x), rtol=0, atol=0)


def test_draws_follow_the_tpu_generator():
    def draw_once(g):
        return rrelu(-torch.ones(32, device="tpu"), torch.zeros(32, device="tpu"), 0.1, 0.3, True, g)
    with no_fallbacks():
        assert_draws_follow_the_tpu_generator(draw_once)
    # As for the other lowered random ops (and CUDA's), a CPU generator is refused.
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        draw_once(torch.Generator().manual_seed(5))


def test_bad_arguments_raise_cpus_errors_and_change_nothing():
    x = torch.randn(4)
    cases = [
        (x, torch.zeros(3), 0.1, 0.3, True),
        (x, torch.zeros(4), 0.5, 0.3, True),
        (x, torch.zeros(4, dtype=torch.double), 0.1, 0.3, True),
        (x.long(), torch.zeros(4).long(), 0.1, 0.3, True),
    ]
    for args in cases:
        with pytest.raises(Exception) as want:
            rrelu(*args)
        d = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
        before = d[1].cpu()
        with pytest.raises(type(want.value)) as got:
            rrelu(*d)
        assert str(got.value).split("\n")[0] == str(want.value).split("\n")[0]
        assert torch.equal(d[1].cpu(), before) and torch.equal(d[0].cpu(), args[0])
