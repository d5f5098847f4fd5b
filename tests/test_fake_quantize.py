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
    (lambda x, s, z: A.fake_quantize_per_channel_affine(x, s, z, 0, 0, 255),
     (torch.empty(0, 4), torch.empty(0), torch.zeros(0, dtype=torch.int32)), "numel() == 0"),
    (lambda x, s, z: A._fake_quantize_learnable_per_tensor_affine(x, s, z, 0, 255, 1.0),
     (X, torch.tensor(0.1), torch.tensor(2.0)), "0-dim"),
    (lambda g, x, s, z: A._fake_quantize_learnable_per_tensor_affine_backward(g, x, s, z, 0, 255, 1.0),
     (X, X, torch.tensor(0.1), torch.tensor(2.0)), "0-dim"),
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
    # The observer/fake-quant step (5 modules x 3 steps) runs natively too.
    assert grown == {}, grown


# ---- the fused moving-average observer + fake quantization ---------------------------------

INF = float("inf")


def _fused_state(per_row, c, zp_dtype=torch.int32, fresh=True):
    """running_min, running_max, scale, zero_point as torch.ao keeps them: uninitialized
    stats are +inf / -inf (per channel: [C] of them)."""
    n = c if per_row else 1
    rmin = torch.full((n,), INF if fresh else -1.0)
    rmax = torch.full((n,), -INF if fresh else 1.0)
    return rmin, rmax, torch.ones(n), torch.zeros(n, dtype=zp_dtype)


def _fused_calls(xs, state, flags, c, qmin, qmax, axis, per_row, sym):
    """The in-place op called once per (x, observer_on, fake_quant_on), on CPU and on tpu
    from the same state: every output and written argument equal after every call."""
    cpu = [t.clone() for t in state]
    dev = [t.clone().to(TPU) for t in state]
    for x, (obs, fq) in zip(xs, flags):
        on = (torch.tensor([obs]), torch.tensor([fq], dtype=torch.uint8))
        want = A._fused_moving_avg_obs_fq_helper(x, *on, *cpu, c, qmin, qmax, axis, per_row, sym)
        with no_fallbacks():
            got = A._fused_moving_avg_obs_fq_helper(x.to(TPU), *(t.to(TPU) for t in on), *dev, c, qmin, qmax,
                                                    axis, per_row, sym)
            got = [g.cpu() for g in got]
        same(tuple(want) + tuple(cpu), tuple(got) + tuple(t.cpu() for t in dev))


def _fused_inputs(shape, n, seed, lo=-3.0, hi=3.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(shape, generator=g) * (hi - lo) * (1 + 0.3 * i) + lo for i in range(n)]


QRANGES = [(0, 255), (-128, 127), (0, 127), (-64, 63), (0, 15), (-8, 7)]


@pytest.mark.parametrize("qrange", QRANGES)
@pytest.mark.parametrize("sym", [False, True])
def test_fused_obs_fq_per_tensor(qrange, sym):
    qmin, qmax = qrange
    xs = _fused_inputs((6, 7), 5, seed=qmin + 300)
    flags = [(1, 1), (1, 1), (0, 1), (1, 0), (1, 1)]
    _fused_calls(xs, _fused_state(False, 1), flags, 0.01, qmin, qmax, 0, False, sym)


@pytest.mark.parametrize("qrange", QRANGES)
@pytest.mark.parametrize("sym", [False, True])
def test_fused_obs_fq_per_channel(qrange, sym):
    qmin, qmax = qrange
    xs = _fused_inputs((5, 3, 4), 4, seed=qmin + 500)
    xs[1][2] += 4.0  # a channel all positive
    xs[2][3] -= 6.0  # one all negative
    flags = [(1, 1), (1, 1), (1, 0), (1, 1)]
    _fused_calls(xs, _fused_state(True, 5), flags, 0.1, qmin, qmax, 0, True, sym)


def test_fused_obs_fq_per_channel_empty_stats():
    """torch.ao's per-channel observer starts with empty stats: the op sizes them."""
    xs = _fused_inputs((4, 6), 3, seed=7)
    state = (torch.tensor([]), torch.tensor([]), torch.tensor([1.0]), torch.tensor([0], dtype=torch.int32))
    _fused_calls(xs, state, [(1, 1)] * 3, 0.01, -128, 127, 0, True, True)


@pytest.mark.parametrize("observe", [0, 1])
def test_fused_obs_fq_per_channel_axis1(observe):
    """Axis 1: CPU's observer refuses it (nothing is updated), the fake quantization works."""
    xs = _fused_inputs((3, 4), 1, seed=8)
    state = (torch.tensor([-1.0, -2.0, 0.5, -0.25]), torch.tensor([1.0, 0.5, 2.0, 3.0]), torch.ones(4),
             torch.zeros(4, dtype=torch.int32))
    if not observe:
        _fused_calls(xs, state, [(0, 1), (0, 0)], 0.01, 0, 255, 1, True, False)
        return
    on = (torch.tensor([1]), torch.tensor([1]))
    dev = [t.clone().to(TPU) for t in state]
    _same_error(lambda x, o, f, *s: A._fused_moving_avg_obs_fq_helper(x, o, f, *s, 0.01, 0, 255, 1, True, False),
                xs[0], *on, *state, match="only supported on axis == 0")
    with pytest.raises(RuntimeError, match="only supported on axis == 0"):
        r = A._fused_moving_avg_obs_fq_helper(xs[0].to(TPU), *(t.to(TPU) for t in on), *dev, 0.01, 0, 255, 1,
                                              True, False)
        r[0].cpu()
    for want, got in zip(state, dev):
        assert torch.equal(want, got.cpu())


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("sym", [False, True])
def test_fused_obs_fq_special_inputs(per_row, sym):
    """Constant input (min == max, 0 included), all positive, all negative, zeros (scale
    0 -> 0.1), tiny ranges (the small-scale cut), huge ones."""
    shape = (3, 8)
    base = torch.randn(shape, generator=torch.Generator().manual_seed(9))
    xs = [torch.full(shape, 0.75), torch.zeros(shape), base.abs() + 0.5, -base.abs() - 0.5,
          base * 1e-6, base * 1e-6 + 1e-5, base.abs() * 1e-7, base * 1e30, torch.full(shape, -2.5)]
    for x in xs:  # each from uninitialized stats, then two more calls
        _fused_calls([x, x * 0.5, x + 1e-3], _fused_state(per_row, 3), [(1, 1)] * 3, 0.01, -128, 127, 0,
                     per_row, sym)
        _fused_calls([x], _fused_state(per_row, 3), [(1, 1)], 0.01, 0, 255, 0, per_row, sym)


@pytest.mark.parametrize("per_row", [False, True])
def test_fused_obs_fq_flags_off_from_fresh(per_row):
    """Neither observer nor fake quantization, then fake quantization of +inf / -inf
    stats (scale 0.1), then the observer alone."""
    xs = _fused_inputs((3, 5), 3, seed=10)
    _fused_calls(xs, _fused_state(per_row, 3), [(0, 0), (0, 1), (1, 0)], 0.01, 0, 255, 0, per_row, False)


@pytest.mark.parametrize("c", [0.01, 1.0, 0.3333333333])
def test_fused_obs_fq_averaging_const(c):
    xs = _fused_inputs((16, 9), 6, seed=11, lo=-10, hi=7)
    _fused_calls(xs, _fused_state(True, 16), [(1, 1)] * 6, c, -128, 127, 0, True, True)
    _fused_calls(xs, _fused_state(False, 1), [(1, 1)] * 6, c, 0, 255, 0, False, False)


def test_fused_obs_fq_zero_point_dtype_and_stats_set():
    """Per tensor with an int64 zero point, from stats already set."""
    xs = _fused_inputs((4, 4), 3, seed=12)
    _fused_calls(xs, _fused_state(False, 1, torch.int64, fresh=False), [(1, 1)] * 3, 0.2, -8, 7, 0, False, False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("per_row", [False, True])
def test_fused_obs_fq_low_precision_input(dtype, per_row):
    """CPU fake-quantizes a bf16/f16/f64 input, but its observer reads the minima as float:
    with the observer on it raises (nothing is updated)."""
    x = _fused_inputs((3, 6), 1, seed=13)[0].to(dtype)
    state = (torch.full((3 if per_row else 1,), -1.5), torch.full((3 if per_row else 1,), 2.0),
             torch.ones(3 if per_row else 1), torch.zeros(3 if per_row else 1, dtype=torch.int32))
    _fused_calls([x, x], state, [(0, 1), (0, 0)], 0.01, 0, 255, 0, per_row, False)
    on = (torch.tensor([1]), torch.tensor([1]))
    dev = [t.clone().to(TPU) for t in state]
    name = {torch.bfloat16: "BFloat16", torch.float16: "Half", torch.float64: "Double"}[dtype]
    with pytest.raises(RuntimeError, match="expected scalar type Float but found " + name):
        A._fused_moving_avg_obs_fq_helper(x.clone(), *on, *(t.clone() for t in state), 0.01, 0, 255, 0, per_row,
                                          False)
    with pytest.raises(RuntimeError, match="expected scalar type Float but found " + name):
        r = A._fused_moving_avg_obs_fq_helper(x.to(TPU), *(t.to(TPU) for t in on), *dev, 0.01, 0, 255, 0,
                                              per_row, False)
        r[0].cpu()
    for want, got in zip(state, dev):
        assert torch.equal(want, got.cpu())


def test_fused_obs_fq_nan_stats():
    """NaN stats: per tensor a NaN scale and INT32_MIN zero point (NaN output); per channel
    CPU's zero-point check fails."""
    x = torch.randn(3, 4)
    nan = float("nan")
    state = (torch.tensor([nan]), torch.tensor([1.0]), torch.ones(1), torch.zeros(1, dtype=torch.int32))
    _fused_calls([x], state, [(0, 1)], 0.01, 0, 255, 0, False, False)
    state = (torch.tensor([nan, -1, -1]), torch.tensor([1.0, 1, 1]), torch.ones(3), torch.zeros(3, dtype=torch.int32))
    on = (torch.tensor([0]), torch.tensor([1]))
    _same_error(lambda x, o, f, *s: A._fused_moving_avg_obs_fq_helper(x, o, f, *s, 0.01, 0, 255, 0, True, False),
                x, *on, *state, match="zero_point")


def test_fused_obs_fq_refused_calls_match_cpu():
    """Calls the lowering leaves to CPU (f64 stats, an empty input with the observer on,
    a 1-d per-channel input) still give CPU's results and errors."""
    x = torch.randn(3, 4)
    on = (torch.tensor([1]), torch.tensor([1]))
    state = (torch.tensor([INF], dtype=torch.float64), torch.tensor([-INF], dtype=torch.float64), torch.ones(1),
             torch.zeros(1, dtype=torch.int32))
    _same_error(lambda *a: A._fused_moving_avg_obs_fq_helper(*a, 0.01, 0, 255, 0, False, False), x, *on, *state)
    _same_error(lambda *a: A._fused_moving_avg_obs_fq_helper(*a, 0.01, 0, 255, 0, False, False),
                torch.randn(0, 3), *on, *_fused_state(False, 1))
    _same_error(lambda *a: A._fused_moving_avg_obs_fq_helper(*a, 0.01, 0, 255, 0, True, False),
                torch.randn(5), *on, torch.tensor([]), torch.tensor([]), torch.ones(1),
                torch.zeros(1, dtype=torch.int32))


@pytest.mark.parametrize("backend", ["x86", "fbgemm", "qnnpack"])
def test_fused_obs_fq_module(backend):
    """torch.ao's FusedMovingAvgObsFakeQuantize modules of the default QAT qconfigs (forward
    and backward), their buffers equal to CPU's."""
    import torch.ao.quantization as tq
    qc = tq.get_default_qat_qconfig(backend)
    g = torch.Generator().manual_seed(14)
    for make, shape in ((qc.activation, (8, 6)), (qc.weight, (6, 5))):
        m_cpu = make()
        m_dev = copy.deepcopy(m_cpu).to(TPU)
        for step in range(4):
            x = torch.randn(shape, generator=g) * (1 + step)
            xc = x.clone().requires_grad_()
            xd = x.to(TPU).requires_grad_()
            yc = m_cpu(xc)
            with no_fallbacks():
                yd = m_dev(xd)
                yd.sum().backward()
            yc.sum().backward()
            same((yc.detach(), xc.grad), (yd.detach().cpu(), xd.grad.cpu()))
            for k, v in m_cpu.state_dict().items():
                same(v, m_dev.state_dict()[k].cpu())


QUANTIZED_TENSOR_MAKERS = {
    "quantize_per_tensor": lambda x: torch.quantize_per_tensor(x.to("tpu"), 0.1, 3, torch.quint8),
    "quantize_per_tensor_qparams": lambda x: torch.quantize_per_tensor(
        x.to("tpu"), torch.tensor(0.1, device="tpu"), torch.tensor(3, device="tpu"), torch.qint8),
    "quantize_per_channel": lambda x: torch.quantize_per_channel(
        x.to("tpu"), torch.full((4,), 0.1, device="tpu"), torch.zeros(4, dtype=torch.long, device="tpu"), 0,
        torch.qint8),
    "quantize_per_tensor_dynamic": lambda x: torch.quantize_per_tensor_dynamic(x.to("tpu"), torch.quint8, False),
    "cpu_quantized_to_tpu": lambda x: torch.quantize_per_tensor(x, 0.1, 3, torch.quint8).to("tpu"),
    "empty_affine_quantized": lambda x: torch._empty_affine_quantized(
        (2,), scale=0.1, zero_point=0, dtype=torch.quint8, device="tpu"),
    "quantize_dynamic_model": lambda x: torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(torch.nn.Linear(6, 3)).to("tpu"), {torch.nn.Linear}, dtype=torch.qint8)(x.to("tpu")),
}


@pytest.mark.parametrize("name", sorted(QUANTIZED_TENSOR_MAKERS))
def test_pytorch_quantized_tensors_on_tpu_are_refused_at_the_call_pointing_to_torchao(name):
    """quint8/qint8 tensors have no tpu kernels: refused, naming the op, before any work
    (it was the CPU fallback, then an error about a 'Quantizedtpu' backend), and the
    process stays usable."""
    x = torch.randn(4, 6)
    with pytest.raises(NotImplementedError, match=r"torch_tpu: aten::\w+: quantized tensors .* torchao"):
        QUANTIZED_TENSOR_MAKERS[name](x)
    assert torch.allclose((x.to("tpu") + 1).cpu(), x + 1)
