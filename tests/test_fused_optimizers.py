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
    torch.manual_seed(0)
    cpu = model()
    tpu = copy.deepcopy(cpu).to("tpu")
    opts = [cls(m.parameters(), lr=1e-2, fused=True, **kw) for m in (cpu, tpu)]
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
    assert compiles[-1] == compiles[1], "a changing learning rate recompiled the step"
    for p, q in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
    for sc, st in zip(opts[0].state.values(), opts[1].state.values()):
        for key in sc:
            torch.testing.assert_close(st[key].cpu(), sc[key], rtol=1e-5, atol=1e-7, msg=key)


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
