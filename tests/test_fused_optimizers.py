"""torch.optim's fused Adam/AdamW (fused=True, the default of Hugging Face Trainer) run as
one native program per step, match CPU's fused kernels, and a learning-rate schedule
does not recompile."""
import copy

import pytest
import torch

import torch_tpu
from conftest import no_fallbacks


def model():
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


@pytest.mark.parametrize("cls,kw", [
    (torch.optim.AdamW, dict(weight_decay=0.1)),
    (torch.optim.Adam, dict(weight_decay=0.05, amsgrad=True)),
    (torch.optim.Adam, dict(maximize=True)),
    (torch.optim.AdamW, dict(amsgrad=True, betas=(0.8, 0.95), eps=1e-6)),
], ids=["adamw", "adam-amsgrad-wd", "adam-maximize", "adamw-amsgrad"])
def test_fused_adam_matches_cpu_and_schedules_do_not_recompile(cls, kw):
    _optimizer_matches_cpu(cls, dict(lr=1e-2, **kw), steady_after=1, state_atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_adam_bias_corrections_as_cpus_double(dtype):
    # 1 - beta2 ** step in float was 100 ulps off (1 - 0.999f), so every update was
    # 6.6e-6 short of CPU's fused step; float64 parameters got a float32 lr.
    grads = [torch.tensor([1.0, -2.0, 3.0, -4.0], dtype=dtype) * (k + 1) for k in range(12)]
    for cls in (torch.optim.Adam, torch.optim.AdamW):
        ps = {}
        for dev in ("cpu", "tpu"):
            p = torch.zeros(4, dtype=dtype, device=dev, requires_grad=True)
            opt = cls([p], lr=0.1, fused=True)
            for g in grads:
                p.grad = g.to(dev)
                opt.step()
            ps[dev] = p.detach().cpu()
        tol = dict(rtol=1e-6, atol=0) if dtype == torch.float32 else dict(rtol=1e-14, atol=0)
        torch.testing.assert_close(ps["tpu"], ps["cpu"], **tol)


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
def test_fused_adamw_grad_scale_and_found_inf_match_cpu(found_inf):
    """GradScaler's arguments: grads are unscaled in place, and a step with found_inf is
    skipped entirely."""
    torch.manual_seed(1)
    shapes = [(3, 4), (5,)]
    state = [[torch.randn(s) for s in shapes] for _ in range(4)]   # params, grads, avgs, sqs
    state[3] = [t.abs() for t in state[3]]
    steps = [torch.tensor(3.0) for _ in shapes]
    scale, inf = torch.tensor(8.0), torch.tensor(found_inf)

    def run(dev):
        lists = [[t.to(dev).clone() for t in l] for l in state]
        torch._fused_adamw_(*lists, [], [s.to(dev) for s in steps], lr=0.01, beta1=0.9, beta2=0.99,
                            weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False,
                            grad_scale=scale.to(dev), found_inf=inf.to(dev))
        return [[t.cpu() for t in l] for l in lists]

    with no_fallbacks():
        got = run("tpu")
    want = run("cpu")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    changed = not torch.equal(want[0][0], state[0][0])
    assert changed == (found_inf == 0.0)


def test_fused_adamw_bfloat16_parameters():
    torch.manual_seed(2)
    cpu = torch.nn.Linear(8, 8).to(torch.bfloat16)
    tpu = copy.deepcopy(cpu).to("tpu")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True) for m in (cpu, tpu)]
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with no_fallbacks():
        for m, o, d in zip((cpu, tpu), opts, ("cpu", "tpu")):
            m(x.to(d)).float().square().sum().backward()
            o.step()
    for p, q in zip(cpu.parameters(), tpu.parameters()):
        assert q.dtype == torch.bfloat16
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-2, atol=1e-2)


# ---- SGD and Adagrad (fused=True): lowered _fused_sgd_ / _fused_adagrad_

SGD_KW = [dict(lr=0.1), dict(lr=0.1, weight_decay=0.05, maximize=True),
          dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
          dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.1, maximize=True)]
SGD_IDS = ["plain", "wd-maximize", "momentum", "nesterov-wd", "dampening-wd-maximize"]
ADAGRAD_KW = [dict(lr=0.1), dict(lr=0.05, lr_decay=0.013, weight_decay=0.01),
              dict(lr=0.05, maximize=True, eps=1e-5, initial_accumulator_value=0.1)]


def _states(dtype, shapes, n, seed):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g).to(dtype) for s in shapes] for _ in range(n)]


def _sgd_steps(dev, state, lr_tensor=False, grad_scale=None, found_inf=None, steps=3, **kw):
    p, g, b = [[t.to(dev).clone() for t in l] for l in state]
    momentum = kw.get("momentum", 0.0)
    for i in range(steps):
        lr = torch.tensor(kw["lr"], device=dev) if lr_tensor else kw["lr"]
        torch._fused_sgd_(p, g, b if momentum else [], weight_decay=kw.get("weight_decay", 0.0), momentum=momentum,
                          lr=lr, dampening=kw.get("dampening", 0.0), nesterov=kw.get("nesterov", False),
                          maximize=kw.get("maximize", False), is_first_step=i == 0,
                          grad_scale=None if grad_scale is None else torch.tensor(grad_scale, device=dev),
                          found_inf=None if found_inf is None else torch.tensor(found_inf, device=dev))
    return [[t.cpu() for t in l] for l in (p, g, b)]


def _adagrad_steps(dev, state, lr_tensor=False, grad_scale=None, found_inf=None, steps=3, **kw):
    p, g, s = [[t.to(dev).clone() for t in l] for l in state]
    s = [t.abs() for t in s]
    counts = [torch.tensor(2.0, device=dev) for _ in p]
    for _ in range(steps):
        torch._foreach_add_(counts, 1)
        lr = torch.tensor(kw.get("lr", 0.1), device=dev) if lr_tensor else kw.get("lr", 0.1)
        torch._fused_adagrad_(p, g, s, counts, lr=lr, lr_decay=kw.get("lr_decay", 0.0),
                              weight_decay=kw.get("weight_decay", 0.0), eps=kw.get("eps", 1e-10),
                              maximize=kw.get("maximize", False),
                              grad_scale=None if grad_scale is None else torch.tensor(grad_scale, device=dev),
                              found_inf=None if found_inf is None else torch.tensor(found_inf, device=dev))
    return [[t.cpu() for t in l] for l in (p, g, s)]


# Within an ulp of CPU's: its compiler contracts multiply-adds into fused ones, differently
# in its vector and scalar loops and per instruction set (the lowering computes plainly).
@pytest.mark.parametrize("kw", SGD_KW, ids=SGD_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lr_tensor", [False, True], ids=["float-lr", "tensor-lr"])
def test_fused_sgd_op_matches_cpu(kw, dtype, lr_tensor):
    state = _states(dtype, [(3, 4), (5,), (70,), (33, 9)], 3, 0)
    with no_fallbacks():
        got = _sgd_steps("tpu", state, lr_tensor, **kw)
    want = _sgd_steps("cpu", state, lr_tensor, **kw)
    tol = 1e-6 if dtype == torch.float32 else 1e-14
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kw", SGD_KW, ids=SGD_IDS)
def test_fused_sgd_low_precision_matches_cpu_scalar_loop(kw, dtype):
    """CPU's f16/bf16 fused SGD vectorized loop never writes the parameters (and reads the
    momentum buffers as float32), so its results are compared on tensors short enough
    for its scalar loop alone (within rounding of the low-precision type); longer ones
    against CPU's float32 step."""
    state = _states(dtype, [(3,), (5,), (2, 3)], 3, 0)
    with no_fallbacks():
        got = _sgd_steps("tpu", state, grad_scale=4.0, **kw)
    want = _sgd_steps("cpu", state, grad_scale=4.0, **kw)
    torch.testing.assert_close(got, want)
    big = _states(dtype, [(40, 40), (70,)], 3, 1)
    with no_fallbacks():
        got = _sgd_steps("tpu", big, **kw)
    want = _sgd_steps("cpu", [[t.float() for t in l] for l in big], **kw)
    torch.testing.assert_close(got, [[t.to(dtype) for t in l] for l in want], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kw", ADAGRAD_KW, ids=["plain", "lr-decay-wd", "maximize-eps"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("lr_tensor", [False, True], ids=["float-lr", "tensor-lr"])
def test_fused_adagrad_op_matches_cpu(kw, dtype, lr_tensor):
    state = _states(dtype, [(3, 4), (5,), (70,), (33, 9)], 3, 1)
    with no_fallbacks():
        got = _adagrad_steps("tpu", state, lr_tensor, grad_scale=8.0, **kw)
    want = _adagrad_steps("cpu", state, lr_tensor, grad_scale=8.0, **kw)
    if dtype == torch.bfloat16:  # CPU's scalar loop (each tensor's tail) rounds its rate less
        torch.testing.assert_close(got, want, rtol=1e-2, atol=4e-3)
    else:
        tol = 1e-6 if dtype == torch.float32 else 1e-14
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
@pytest.mark.parametrize("which", ["sgd", "adagrad"])
def test_fused_sgd_adagrad_grad_scale_and_found_inf_match_cpu(which, found_inf):
    """GradScaler's arguments: grads are unscaled in place, and a step with found_inf is
    skipped entirely (buffers, sums and grads untouched)."""
    state = _states(torch.float32, [(3, 4), (5,)], 3, 2)
    run = _sgd_steps if which == "sgd" else _adagrad_steps
    kw = dict(lr=0.05, momentum=0.9, weight_decay=0.01) if which == "sgd" else dict(lr=0.05, lr_decay=0.01)
    with no_fallbacks():
        got = run("tpu", state, grad_scale=8.0, found_inf=found_inf, steps=1, **kw)
    want = run("cpu", state, grad_scale=8.0, found_inf=found_inf, steps=1, **kw)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert (not torch.equal(want[0][0], state[0][0])) == (found_inf == 0.0)
    assert (not torch.equal(want[1][0], state[1][0])) == (found_inf == 0.0)


@pytest.mark.parametrize("cls,kw", [
    (torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (torch.optim.SGD, dict(lr=0.1)),
    (torch.optim.Adagrad, dict(lr=0.05, lr_decay=0.01, weight_decay=0.01)),
], ids=["sgd-nesterov", "sgd", "adagrad"])
@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_fused_sgd_adagrad_optimizers_match_cpu_and_schedules_do_not_recompile(cls, kw, mode):
    with torch_tpu.set_eager_mode(getattr(torch_tpu.EagerMode, mode)):
        _optimizer_matches_cpu(cls, kw)


def _optimizer_matches_cpu(cls, kw, steady_after=2, state_atol=1e-6):
    """Five fused steps under a changing learning rate: parameters and state as CPU's,
    and no program compiled after step `steady_after` (the rate is an operand)."""
    torch.manual_seed(0)
    cpu = model()
    tpu = copy.deepcopy(cpu).to("tpu")
    opts = [cls(m.parameters(), fused=True, **kw) for m in (cpu, tpu)]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1 / (s + 1)) for o in opts]
    compiles = []
    with no_fallbacks():
        for _ in range(5):
            x = torch.randn(4, 5)
            for m, o, s, d in zip((cpu, tpu), opts, scheds, ("cpu", "tpu")):
                o.zero_grad()
                m(x.to(d)).square().sum().backward()
                o.step()
                s.step()
            compiles.append(torch_tpu.metrics().get("compiles", 0))
    assert compiles[-1] == compiles[steady_after], "a changing learning rate recompiled the step"
    for p, q in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
    for sc, st in zip(opts[0].state.values(), opts[1].state.values()):
        for key in sc:
            torch.testing.assert_close(st[key].cpu(), sc[key], rtol=1e-5, atol=state_atol, msg=key)
