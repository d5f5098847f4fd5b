"""What one feature installs for the whole process stays out of unrelated compiled code:
a compiled function called after it runs as it did before it."""
import pytest
import torch
import torch.nn as nn

import torch_tpu
from torch_tpu import EagerMode

ALL_MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def delta(before, after, *keys):
    return {k: after[k] - before[k] for k in keys}


def _bounded_eager_mode_installed():
    """Marks a tensor dynamic in eager DeferAndFuse: the bounded mode (a torch function
    mode, bounded_eager.py) is installed for the rest of the process."""
    from torch_tpu import dynamism
    from torch_tpu._internal import bounded_eager
    with torch_tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE):
        t = torch.arange(12.0).reshape(4, 3).to("tpu")
        dynamism.mark_dynamic(t, 0, 2, 16)
        torch.testing.assert_close((t * 2).sum(0).cpu(), torch.arange(12.0).reshape(4, 3).mul(2).sum(0))
    assert bounded_eager._MODE is not None
    return bounded_eager._BoundedMode


@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.name)
def test_a_compiled_training_step_after_bounded_eager_dynamism_is_still_one_program(mode):
    # The compiled AdamW step breaks its graph (torch.optim's _use_grad) and runs that
    # part eagerly with Dynamo watching for frames to compile: it compiled the bounded
    # mode's __torch_function__ frame as graphs of its own (set_grad_enabled, each
    # parameter's .grad, up to its recompile limit), and the first of them, an inference
    # graph, closed the fused step early: two programs per steady step instead of one.
    mode_class = _bounded_eager_mode_installed()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss_of = torch.compile(lambda x: model(x).square().mean(), backend="tpu")

    @torch.compile(backend="tpu")
    def update():
        opt.step()

    g = torch.Generator().manual_seed(1)
    losses, counts = [], []
    with torch_tpu.set_eager_mode(mode):
        for _ in range(5):
            x = torch.randn(16, 8, generator=g).to("tpu")
            torch_tpu.synchronize()
            before = torch_tpu.metrics()
            loss = loss_of(x)
            opt.zero_grad()
            loss.backward()
            update()
            losses.append(loss.item())
            counts.append(delta(before, torch_tpu.metrics(), "executions", "compiled_graph_calls",
                                "compiled_replays", "compiled_recompiles", "compiled_graphs"))
    # Steady (from the third step): forward, backward and update replayed as one program
    # (three in Debug, where each graph runs at its call), and no other graph called.
    programs = 3 if mode == EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING else 1
    for c in counts[2:]:
        assert c == {"executions": programs, "compiled_graph_calls": 3, "compiled_replays": 3,
                     "compiled_recompiles": 0, "compiled_graphs": 0}, counts
    assert losses[-1] < losses[0]
    # Dynamo inlines the mode where it traces, and never compiles its frames.
    entries = torch._C._dynamo.eval_frame._debug_get_cache_entry_list
    assert entries(mode_class.__torch_function__.__code__) == []
    assert entries(mode_class._bounded_call.__code__) == []
