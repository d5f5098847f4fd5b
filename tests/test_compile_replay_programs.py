"""A compiled training step compiles each shape's programs once, at its first step.

With fuse_steps a steady step's forward, backward (and compiled optimizer step) replay as
calls of one pending graph, flushed as one program. Their first calls used to record and
run each graph as a program of its own, so a shape compiled its forward's and backward's
programs at its first step, then the joined step program at its second (and for bucketed
lengths the DeferAndFuse shape-churn rule sent the later lengths' joined programs op by
op at their second visit, compiling them only at the third). A first call that joins the
step is now recorded apart from the pending graph, explained, and replayed into it: the
first step's program is the one later steps run. (A compiled optimizer's first step also
makes its fresh state's zeros: one small program of its own, at step 0.)"""
import copy

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu._internal import compile as tpu_compile


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Each test compiles `_loss` for its own shapes: Dynamo's per-function recompile
    # limit would otherwise run later tests' calls eagerly.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class _Net(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        # No bias before the BatchNorm: its true gradient is 0, and AdamW scales float
        # noise in it up to the learning rate (on CPU and tpu alike, differently).
        self.inp = torch.nn.Linear(5, width, bias=False)
        self.bn = torch.nn.BatchNorm1d(width)
        self.ln = torch.nn.LayerNorm(width)
        self.out = torch.nn.Linear(width, 3)

    def forward(self, x):  # x: batch, time, 5
        h = F.silu(self.bn(self.inp(x).transpose(1, 2))).transpose(1, 2)
        return self.out(self.ln(h))


def _loss(model, x):
    return model(x).square().mean()


def _mode():
    return torch_tpu.get_eager_mode()


def _new_programs():
    m = torch_tpu.metrics()
    return m.get("compiles", 0) + m.get("disk_cache_hits", 0)


def _run(width, lengths, compiled_optimizer):
    """Trains CPU and tpu copies on batches of the given lengths (one per step); returns
    per step the programs the tpu step compiled (or loaded) and the graphs run op by op."""
    torch.manual_seed(0)
    cpu = _Net(width)
    tpu = copy.deepcopy(cpu).to("tpu")
    oc = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    ot = torch.optim.AdamW(tpu.parameters(), lr=1e-2)
    loss_fn = torch.compile(_loss, backend="tpu")
    step_fn = torch.compile(ot.step, backend="tpu") if compiled_optimizer else ot.step
    gen = torch.Generator().manual_seed(1)
    programs, op_by_op = [], []
    for t in lengths:
        x = torch.randn(4, t, 5, generator=gen)
        before, obo = _new_programs(), torch_tpu.metrics()["fused_graphs_run_op_by_op"]
        lc = _loss(cpu, x)
        oc.zero_grad()
        lc.backward()
        oc.step()
        lt = loss_fn(tpu, x.to("tpu"))
        ot.zero_grad()
        lt.backward()
        step_fn()
        assert abs(lt.item() - lc.item()) <= 1e-5 * max(1.0, abs(lc.item())), (t, lt.item(), lc.item())
        torch_tpu.synchronize()
        programs.append(_new_programs() - before)
        op_by_op.append(torch_tpu.metrics()["fused_graphs_run_op_by_op"] - obo)
    for p, q in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), atol=1e-4, rtol=1e-4)
    for b in ("running_mean", "running_var"):
        torch.testing.assert_close(getattr(tpu.bn, b).cpu(), getattr(cpu.bn, b), atol=1e-5, rtol=1e-5)
    assert tpu.bn.num_batches_tracked.item() == len(lengths)
    return programs, op_by_op


# Each test its own widths: programs another test compiled would hide a recompile.
@pytest.mark.parametrize("compiled_optimizer", [False, True], ids=["eager_adamw", "compiled_adamw"])
def test_fixed_shape_step_compiles_nothing_after_step_0(compiled_optimizer):
    programs, op_by_op = _run(11 + compiled_optimizer, [6] * 4, compiled_optimizer)
    assert programs[0] > 0
    # DeferAndFuse: the compiled update's state, made eagerly while Dynamo traces it,
    # joins step 0's program (pending with the step), so the steady one compiles at step 1.
    late = 1 if compiled_optimizer and _mode() == torch_tpu.EagerMode.DEFER_AND_FUSE else 0
    assert programs[1:] == [late, 0, 0], f"programs compiled per step: {programs}"
    assert op_by_op == [0] * 4


@pytest.mark.parametrize("compiled_optimizer", [False, True], ids=["eager_adamw", "compiled_adamw"])
def test_cycling_lengths_compile_only_on_first_visit(compiled_optimizer):
    lengths = [3, 5, 7, 9] * 3
    programs, op_by_op = _run(13 + compiled_optimizer, lengths, compiled_optimizer)
    assert all(p > 0 for p in programs[:4]), f"programs compiled per step: {programs}"
    late = 1 if compiled_optimizer and _mode() == torch_tpu.EagerMode.DEFER_AND_FUSE else 0  # (as above)
    # The first length's graph is static; the second makes the length dynamic (automatic
    # dynamic shapes: one graph, a program per length). Dynamo tries that newer graph
    # first, so the first length, met again, records through it once: one step program
    # more (Debug's per-graph programs at that length are the static graph's, cached; in
    # DeferAndFuse with the compiled update it is the late one).
    again = 0 if _mode() == torch_tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING else 1
    assert programs[4:] == [max(late, again)] + [0] * 7, f"programs compiled per step: {programs}"
    assert op_by_op == [0] * 12, f"graphs run op by op per step: {op_by_op}"


def test_first_step_joins_forward_and_backward_into_one_program():
    """The first step's forward and backward run as one program (the one later steps
    run), not as a program each (Debug runs each graph at its call: two)."""
    torch.manual_seed(0)
    model = _Net(17).to("tpu")
    loss_fn = torch.compile(_loss, backend="tpu")
    x = torch.randn(2, 4, 5, device="tpu")
    torch_tpu.synchronize()
    graphs = torch_tpu.metrics()["fused_graphs"]
    loss_fn(model, x).backward()
    model.out.weight.grad.sum().item()  # flushes the step
    debug = _mode() == torch_tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    assert torch_tpu.metrics()["fused_graphs"] - graphs == (2 if debug else 1)


class _Dropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return F.dropout(self.lin(x), p=0.5, training=True)


def _dropout_losses(replay):
    torch.manual_seed(0)
    model = _Dropout().to("tpu")
    loss_fn = torch.compile(_loss, backend="tpu")
    torch.manual_seed(123)
    out = []
    old, tpu_compile.REPLAY = tpu_compile.REPLAY, replay
    try:
        for _ in range(3):
            loss = loss_fn(model, torch.ones(3, 8, device="tpu"))
            loss.backward()
            out.append(loss.item())
            out.append(model.lin.weight.grad.sum().item())
            model.lin.weight.grad = None
    finally:
        tpu_compile.REPLAY = old
        torch._dynamo.reset()  # the next run records its first call again
    return out


def test_first_call_draws_the_random_numbers_recording_would():
    """The discarded recording gives its random draws back: the replay draws the same
    numbers a recorded (never replayed) call does, the first step's as the later ones'."""
    torch.testing.assert_close(_dropout_losses(True), _dropout_losses(False), rtol=1e-5, atol=1e-6)


def test_host_read_between_forward_and_backward():
    """A loss read before the backward flushes the deferred forward alone; the backward's
    first call then reads made values, and the step is right."""
    torch.manual_seed(0)
    cpu = _Net(19)
    tpu = copy.deepcopy(cpu).to("tpu")
    loss_fn = torch.compile(_loss, backend="tpu")
    for _ in range(3):
        x = torch.randn(2, 4, 5)
        lc, lt = _loss(cpu, x), loss_fn(tpu, x.to("tpu"))
        assert abs(lt.item() - lc.item()) < 1e-5
        lc.backward()
        lt.backward()
        for p, q in zip(cpu.parameters(), tpu.parameters()):
            torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-4)
            p.grad = q.grad = None
