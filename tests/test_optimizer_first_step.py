"""An optimizer's first step compiles the update its later steps run (Strict and Debug).

Its state starts as zeros (torch.zeros_like), which a tpu storage holds unwritten. An
update program reading such a storage bakes the zeros in, so step 0's update differed
from step 1's and compiled again at step 1 (for fused AdamW its largest program). Inside
an optimizer step the fresh state now gets its zeros first, from one small program for
all the tensors an op updates, and the update program is the later steps' from step 0."""
import copy

import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode

OPTIMIZERS = {
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    "adam_amsgrad_fused": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, fused=True),
    "adam_single_tensor": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, foreach=True),
    "adamax": lambda p: torch.optim.Adamax(p, lr=1e-2, foreach=True),
    "nadam": lambda p: torch.optim.NAdam(p, lr=1e-2, foreach=True),
    "adagrad_fused": lambda p: torch.optim.Adagrad(p, lr=1e-2, fused=True),
}


def _model(width):
    # Each test its own shapes: programs another test compiled would hide a recompile.
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, width), torch.nn.GELU(), torch.nn.Linear(width, 4))


MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING]


@pytest.fixture(params=MODES, ids=["strict", "debug"])
def mode(request):
    old = torch_tpu.get_eager_mode()
    torch_tpu.set_eager_mode(request.param)
    yield request.param
    torch_tpu.set_eager_mode(old)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_second_step_compiles_nothing_and_matches_cpu(name, mode):
    cpu = _model(10 + 2 * list(OPTIMIZERS).index(name) + MODES.index(mode))
    tpu = copy.deepcopy(cpu).to("tpu")
    opts = [OPTIMIZERS[name](m.parameters()) for m in (cpu, tpu)]
    compiles = []
    for step in range(3):
        x = torch.randn(5, 6)
        for m, o, d in ((cpu, opts[0], "cpu"), (tpu, opts[1], "tpu")):
            o.zero_grad()
            m(x.to(d)).square().mean().backward()
            o.step()
        torch_tpu.synchronize()
        compiles.append(torch_tpu.metrics()["compiles"])
    assert compiles[2] == compiles[0], f"steps 1 and 2 compiled {compiles[2] - compiles[0]} programs"
    for p, q in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
    for sc, st in zip(opts[0].state.values(), opts[1].state.values()):
        for key in sc:
            torch.testing.assert_close(st[key].cpu(), sc[key].cpu(), rtol=1e-5, atol=1e-6, msg=key)


def test_fresh_zeros_outside_an_optimizer_stay_folded(mode):
    # torch.zeros then an in-place scatter, every step: the zeros stay a constant of the
    # scatter's program (one launch per step), not a program of their own.
    idx = torch.tensor([0, 2, 2, 4], device="tpu")
    src = torch.ones(4, 3, device="tpu")
    for _ in range(2):
        out = torch.zeros(5, 3, device="tpu").index_add_(0, idx, src)
        torch_tpu.synchronize()
    before = torch_tpu.metrics()["executions"]
    out = torch.zeros(5, 3, device="tpu").index_add_(0, idx, src)
    torch_tpu.synchronize()
    assert torch_tpu.metrics()["executions"] - before == 1
    assert out.cpu().tolist() == [[1.0] * 3, [0.0] * 3, [2.0] * 3, [0.0] * 3, [1.0] * 3]


def test_state_zeros_are_one_program_per_update(mode):
    # All of a fused update's fresh states (exp_avg and exp_avg_sq of every parameter)
    # get their zeros from one program, not one per tensor.
    shapes = [(3, 4), (7,), (2, 5, 2), (11 + MODES.index(mode),)]
    params = [torch.randn(s, device="tpu", requires_grad=True) for s in shapes]
    opt = torch.optim.AdamW(params, lr=1e-2, fused=True)
    for p in params:
        p.grad = torch.randn_like(p)
    torch_tpu.synchronize()
    before = torch_tpu.metrics()["executions"]
    opt.step()
    torch_tpu.synchronize()
    # the steps' zeros, the step increment, the state's zeros and the update itself
    assert torch_tpu.metrics()["executions"] - before <= 4
    for p in params:
        assert opt.state[p]["exp_avg"].abs().sum().item() > 0
