"""Fake quantization (torch.ao QAT) lowered natively: every op against CPU, bit for bit
(sums of the learnable ops' scale / zero point gradients to float rounding), CPU's errors
for bad arguments, and a QAT training flow."""
import copy

import pytest
import torch

from conftest import all_fallbacks, no_fallbacks

A = torch.ops.aten
TPU = "tpu"


def to_tpu(v):
    return v.to(TPU) if isinstance(v, torch.Tensor) else v


def same(want, got, sums=()):
    """Equal tensors (dtype, shape, values; NaN == NaN); indices in `sums` are float sums: close."""
    want = want if isinstance(want, (tuple, list)) else (want,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(want) == len(got)
    for i, (w, g) in enumerate(zip(want, got)):
        g = g.cpu()
        assert w.dtype == g.dtype and w.shape == g.shape, (i, w.dtype, g.dtype, w.shape, g.shape)
        if i in sums:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(w, g) or torch.equal(w.isnan(), g.isnan()) and torch.equal(
                w.nan_to_num(), g.nan_to_num()), (i, w, g)


def run_both(fn, *args, sums=()):
    want = fn(*args)
    with no_fallbacks():
        got = fn(*[to_tpu(a) for a in args])
        got = [g.cpu() for g in (got if isinstance(got, (tuple, list)) else (got,))]
    same(want, got, sums)


def inputs(shape, scale, lo, hi, seed=0):
    """Values over [lo, hi] (past the clamping range on both sides) plus exact .5 ties of x / scale."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g) * (hi - lo) + lo
    flat = x.view(-1)
    n = min(flat.numel() // 3, 40)
    ties = (torch.arange(n, dtype=torch.float32) - n // 2 + 0.5) * scale  # x * (1/scale) = k + .5
    flat[:n] = ties
    return x


# ---- per tensor ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("qparams", [(0.25, 0, -128, 127), (0.1, 3, 0, 15), (0.0625, -2, -8, 7)])
def test_per_tensor_cachemask(dtype, qparams):
    scale, zp, qmin, qmax = qparams
    x = inputs((7, 9), scale, (qmin - zp - 5) * scale, (qmax - zp + 5) * scale).to(dtype)
    run_both(lambda x: A.fake_quantize_per_tensor_affine_cachemask(x, scale, zp, qmin, qmax), x)


def test_per_tensor_nonfinite():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 0.5, -0.5, 1.5])
    run_both(lambda x: A.fake_quantize_per_tensor_affine_cachemask(x, 1.0, 2, 0, 255), x)


@pytest.mark.parametrize("zp_dtype", [torch.int32, torch.int64, torch.float32])
@pytest.mark.parametrize("enabled", [1, 0])
def test_per_tensor_tensor_qparams(zp_dtype, enabled):
    x = inputs((5, 8), 0.125, -20, 20, seed=1)
    scale = torch.tensor([0.125])
    zp = torch.tensor([3.7 if zp_dtype.is_floating_point else 3]).to(zp_dtype)  # CPU truncates a float one
    on = torch.tensor([enabled])
    run_both(lambda x, s, z, e: A._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(x, s, z, e, 0, 255),
             x, scale, zp, on)
    run_both(lambda x, s, z, e: A._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(x, s, z, e, -8, 7),
             x.double(), scale.double(), zp, on)


def test_per_tensor_composite_autograd():
    """fake_quantize_per_tensor_affine is CompositeImplicit: the cachemask op and grad * mask."""
    x = inputs((6, 10), 0.05, -8, 8, seed=2)
    g = torch.randn(6, 10)
    outs = []
    for dev in ("cpu", TPU):
        xd = x.detach().to(dev).requires_grad_()
        with no_fallbacks() if dev == TPU else _null():
            y = torch.fake_quantize_per_tensor_affine(xd, 0.05, 4, -64, 63)
            y.backward(g.to(dev))
            y2 = torch.fake_quantize_per_tensor_affine(xd.detach(), torch.tensor([0.05], device=dev),
                                                       torch.tensor([4], device=dev), -64, 63)
        outs.append((y.detach().cpu(), xd.grad.cpu(), y2.cpu()))
    same(outs[0], outs[1])


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# ---- per channel --------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("zp_dtype", [torch.int32, torch.float32, torch.float16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_per_channel_cachemask(axis, zp_dtype, dtype):
    shape = (4, 5, 6)
    c = shape[axis]
    g = torch.Generator().manual_seed(axis)
    scale = (torch.rand(c, generator=g) * 0.2 + 0.02)
    scale[0] = 0.125  # exact ties below
    zp = torch.randint(-4, 5, (c,), generator=g).to(zp_dtype)
    if zp_dtype.is_floating_point:
        zp = zp + 0.25
    x = torch.randn(shape, generator=g) * 3
    ties = (torch.arange(x.numel() // c, dtype=torch.float32) - 10 + 0.5) * 0.125
    x.select(axis, 0).copy_(ties.view(x.select(axis, 0).shape))
    x = x.to(dtype)
    run_both(lambda x, s, z: A.fake_quantize_per_channel_affine_cachemask(x, s, z, axis, -16, 15), x, scale, zp)


def test_per_channel_composite_autograd():
    x = torch.randn(8, 3) * 4
    scale = torch.tensor([0.1, 0.25, 0.05])
    zp = torch.tensor([0, 2, -3], dtype=torch.int32)
    g = torch.randn(8, 3)
    outs = []
    for dev in ("cpu", TPU):
        xd = x.detach().to(dev).requires_grad_()
        with no_fallbacks() if dev == TPU else _null():
            y = torch.fake_quantize_per_channel_affine(xd, scale.to(dev), zp.to(dev), 1, -8, 7)
            y.backward(g.to(dev))
        outs.append((y.detach().cpu(), xd.grad.cpu()))
    same(outs[0], outs[1])


# ---- learnable ----------------------------------------------------------------------------

def _learnable_both(fn, x, scale, zp, g):
    outs = []
    for dev in ("cpu", TPU):
        xd, sd, zd = (t.detach().to(dev).requires_grad_() for t in (x, scale, zp))
        with no_fallbacks() if dev == TPU else _null():
            y = fn(xd, sd, zd)
            y.backward(g.to(dev))
        outs.append((y.detach().cpu(), xd.grad.cpu(), sd.grad.cpu(), zd.grad.cpu()))
    same(outs[0], outs[1], sums=(2, 3))


@pytest.mark.parametrize("zp", [2.5, 3.5, -1.2, 40.0])
@pytest.mark.parametrize("grad_factor", [1.0, 0.5])
def test_learnable_per_tensor(zp, grad_factor):
    x = inputs((16, 12), 0.125, -4, 4, seed=3)
    g = torch.randn(16, 12, generator=torch.Generator().manual_seed(4))
    _learnable_both(lambda x, s, z: torch._fake_quantize_learnable_per_tensor_affine(x, s, z, -16, 15, grad_factor),
                    x, torch.tensor([0.125]), torch.tensor([zp]), g)


def test_learnable_per_tensor_backward_op():
    x = inputs((10, 7), 0.1, -3, 3, seed=5)
    g = torch.randn(10, 7)
    run_both(lambda g, x, s, z: A._fake_quantize_learnable_per_tensor_affine_backward(g, x, s, z, -8, 7, 0.7),
             g, x, torch.tensor([0.1]), torch.tensor([1.49]), sums=(1, 2))
    # forward of a half input
    run_both(lambda x, s, z: A._fake_quantize_learnable_per_tensor_affine(x, s, z, 0, 255, 1.0),
             x.half(), torch.tensor([0.1]), torch.tensor([7.5]))


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("grad_factor", [1.0, 0.25])
def test_learnable_per_channel(axis, grad_factor):
    shape = (6, 5)
    c = shape[axis]
    gen = torch.Generator().manual_seed(axis + 10)
    x = torch.randn(shape, generator=gen) * 2
    scale = torch.rand(c, generator=gen) * 0.2 + 0.05
    zp = torch.tensor([0.5, 1.5, -2.5, 3.2, -0.7, 9.0])[:c]
    g = torch.randn(shape, generator=gen)
    _learnable_both(lambda x, s, z: torch._fake_quantize_learnable_per_channel_affine(
        x, s, z, axis, -8, 7, grad_factor), x, scale, zp, g)


def test_learnable_per_channel_backward_op_bf16():
    x = (torch.randn(4, 3, 5) * 2).bfloat16()
    g = torch.randn(4, 3, 5).bfloat16()
    s = torch.tensor([0.1, 0.2, 0.05]).bfloat16()
    z = torch.tensor([0.0, 1.5, -2.0]).bfloat16()
    run_both(lambda g, x, s, z: A._fake_quantize_learnable_per_channel_affine_backward(g, x, s, z, 1, -8, 7, 1.0),
             g, x, s, z, sums=(1, 2))


# ---- CPU's errors -------------------------------------------------------------------------

def _same_error(fn, *args, match=None):
    with pytest.raises(Exception) as cpu:
        fn(*args)
    with pytest.raises(type(cpu.value), match=match) as dev:
        r = fn(*[to_tpu(a) for a in args])
        for t in (r if isinstance(r, (tuple, list)) else (r,)):
            t.cpu()  # value checks raise at the next synchronization
    return cpu.value, dev.value


X = torch.randn(3, 4)


@pytest.mark.parametrize("case", [
    (lambda x: A.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 0, 10, 5), (X,), "quant_min"),
    (lambda x: A.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 300, 0, 255), (X,), "zero_point"),
    (lambda x: A.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 0, 0, 255), (X.int(),), "not implemented"),
    (lambda x, s, z, e: A._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(x, s, z, e, 9, 1),
     (X, torch.tensor([0.1]), torch.tensor([0]), torch.tensor([1])), "quant_min"),
    (lambda x, s, z: A.fake_quantize_per_channel_affine_cachemask(x, s, z, -1, 0, 255),
     (X, torch.ones(4), torch.zeros(4, dtype=torch.int32)), "axis"),
    (lambda x, s, z: A.fake_quantize_per_channel_affine_cachemask(x, s, z, 2, 0, 255),
     (X, torch.ones(4), torch.zeros(4, dtype=torch.int32)), "Dimension out of range"),
    (lambda x, s, z: A.fake_quantize_per_channel_affine_cachemask(x, s, z, 1, 0, 255),
     (X, torch.ones(1, 4), torch.zeros(4, dtype=torch.int32)), "1-D"),
    (lambda x, s, z: A.fake_quantize_per_channel_affine_cachemask(x, s, z, 1, 0, 255),
     (X, torch.ones(3), torch.zeros(3, dtype=torch.int32)), "not consistent"),
    (lambda x, s, z: A.fake_quantize_per_channel_affine_cachemask(x, s, z, 1, 0, 255),
     (X, torch.ones(4).double(), torch.zeros(4, dtype=torch.int32)), "Scale must be Float"),
    (lambda x, s, z: A.fake_quantize_per_channel_affine_cachemask(x, s, z, 1, 0, 255),
     (X, torch.ones(4), torch.zeros(4, dtype=torch.int64)), "Zero-point must be"),
    (lambda x, s, z: A.fake_quantize_per_channel_affine_cachemask(x, s, z, 1, 10, 5),
     (X, torch.ones(4), torch.zeros(4, dtype=torch.int32)), "quant_min"),
    (lambda x, s, z: A.fake_quantize_per_channel_affine_cachemask(x, s, z, 1, 0, 255),
     (X, torch.ones(4), torch.tensor([0, 1, 300, 2], dtype=torch.int32)), "zero_point"),
    (lambda g, x, s, z: A._fake_quantize_learnable_per_tensor_affine_backward(g, x, s, z, 1, 255, 1.0),
     (X, X, torch.tensor([0.1]), torch.tensor([2.0])), "quantization range should include 0"),
    (lambda g, x, s, z: A._fake_quantize_learnable_per_tensor_affine_backward(g, x, s, z, 0, 255, 1.0),
     (X.half(), X.half(), torch.tensor([0.1]), torch.tensor([2.0])), "ScalarType::Float"),
    (lambda g, x, s, z: A._fake_quantize_learnable_per_channel_affine_backward(g, x, s, z, -1, -8, 7, 1.0),
     (X, X, torch.ones(4), torch.zeros(4)), "axis"),
    (lambda x, s, z: A._fake_quantize_learnable_per_channel_affine(x, s, z, 1, -8, 7, 1.0),
     (X, torch.ones(5), torch.zeros(5)), "not consistent"),
], ids=lambda c: c[2])
def test_errors_match_cpu(case):
    fn, args, key = case
    cpu, dev = _same_error(fn, *args, match=None)
    assert key in str(cpu) and key in str(dev), (str(cpu), str(dev))


# ---- torch.ao QAT -------------------------------------------------------------------------

def _qat_train(qconfig):
    """Linear-ReLU-Linear prepared for QAT, trained 3 steps on CPU and on tpu from the same
    weights: losses and every parameter and buffer close; returns the fallbacks it took."""
    import torch.ao.quantization as tq

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
            self.fc1, self.relu, self.fc2 = torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.dequant(self.fc2(self.relu(self.fc1(self.quant(x)))))

    torch.manual_seed(0)
    m = M().train()
    m.qconfig = qconfig
    m = tq.prepare_qat(m)
    mt = copy.deepcopy(m).to(TPU)
    x, y = torch.randn(32, 8), torch.randn(32, 4)
    losses = {}
    before = all_fallbacks()
    for model, dev in ((m, "cpu"), (mt, TPU)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses[dev] = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
            losses[dev].append(loss.item())
    grown = {k: v - before.get(k, 0) for k, v in all_fallbacks().items() if v != before.get(k, 0)}
    torch.testing.assert_close(torch.tensor(losses[TPU]), torch.tensor(losses["cpu"]), rtol=1e-5, atol=1e-5)
    sd_cpu, sd_tpu = m.state_dict(), mt.state_dict()
    for k, v in sd_cpu.items():
        torch.testing.assert_close(sd_tpu[k].cpu(), v, rtol=1e-5, atol=1e-5, msg=k)
    return grown


def test_qat_flow_fake_quantize():
    """FakeQuantize modules (per-tensor activations, per-channel weights): all native."""
    import torch.ao.quantization as tq
    from torch.ao.quantization.fake_quantize import default_fake_quant, default_per_channel_weight_fake_quant
    grown = _qat_train(tq.QConfig(activation=default_fake_quant, weight=default_per_channel_weight_fake_quant))
    assert grown == {}, grown


def test_qat_flow_fused():
    import torch.ao.quantization as tq
    grown = _qat_train(tq.get_default_qat_qconfig("x86"))  # FusedMovingAvgObsFakeQuantize everywhere
    # The observer/fake-quant step (an in-place op with results besides its written
    # arguments) still runs on the CPU fallback: once per fake-quant module and step
    # (5 modules x 3 steps); nothing else falls back.
    assert grown == {"aten::_fused_moving_avg_obs_fq_helper": 15}, grown
