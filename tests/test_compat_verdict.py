"""The compat tool's verdict on parameters after the AdamW step: a weight whose distance
from CPU's is its gradient's (AdamW of tpu's own gradient) is judged by that gradient,
and a wrong optimizer step is still a mismatch."""
import types

import torch

from torch_tpu.compat.run import adamw_from, verdict


def _case():
    p0 = torch.tensor([[0.05, -0.025], [0.01, 0.02]])  # small weights, as in XCLIP
    g_cpu = torch.tensor([[1.0, 2.0], [3e-7, -4.0]])
    g_tpu = g_cpu.clone()
    g_tpu[1, 0] = 3e-5  # equal to CPU's within the gradient's tolerance (scale 4)...
    want = ([], ["w"], [g_cpu], [adamw_from(p0, g_cpu).float()])
    return p0, g_tpu, want


def test_a_weight_moved_by_its_gradient_is_judged_by_the_gradient():
    p0, g_tpu, want = _case()
    got = ([], ["w"], [g_tpu], [adamw_from(p0, g_tpu).float()])
    # ...but AdamW's lr x g / (|g| + eps) turns it into a 2e-4 move of that weight: outside
    # the parameters' tolerance, and no float64 run can excuse it (the fake reference has
    # CPU's exact values).
    ref = lambda: want  # noqa: E731
    why, _ = verdict(got, want, ref)
    assert why.startswith("param w: max abs diff 0.000")
    notes = {}
    assert verdict(got, want, ref, initial={"w": p0}, notes=notes) == ("", "")
    assert notes == {"params_by_grads": 1}


def test_a_wrong_optimizer_step_is_still_a_mismatch():
    p0, g_tpu, want = _case()
    wrong = adamw_from(p0, g_tpu).float()
    wrong[0, 0] += 5e-4  # an update off by half the learning rate
    notes = {}
    why, _ = verdict(([], ["w"], [g_tpu], [wrong]), want, lambda: want, initial={"w": p0}, notes=notes)
    assert why.startswith("param w: max abs diff") and notes == {}


def _one_output(t):
    return ([t], [], [], [])


def test_a_chaotic_step_is_held_against_cpu_runs_one_ulp_away():
    """CPU's own float64 error is luck when the step amplifies rounding: tpu may be as far
    from float64 as F64_FACTOR x the worst CPU run from inputs and weights one ulp away."""
    from torch_tpu.conformance import F64_FACTOR
    c = torch.zeros(20, dtype=torch.float64)
    cpu = (c + 1e-4).float()        # 1 tolerance from float64: a lucky run
    tpu = (c - 5e-4).float()        # 5 tolerances
    moved = [_one_output((c + 4e-4).float())]  # a CPU run 1 ulp away: 4 tolerances
    ref = lambda: _one_output(c)  # noqa: E731
    why, _ = verdict(_one_output(tpu), _one_output(cpu), ref)
    assert "tpu 5 tolerances from float64, CPU 1" in why
    why, judged = verdict(_one_output(tpu), _one_output(cpu), ref, spread=lambda: moved)
    assert why == "" and judged.endswith("CPU with inputs and weights 1 ulp away 4")
    calm = [_one_output((c + 1e-4 * F64_FACTOR / 2).float())]
    why, _ = verdict(_one_output(tpu), _one_output(cpu), ref, spread=lambda: calm)
    assert why.startswith("output 0: max abs diff") and "1 ulp away 1" in why


def test_perturbed_step_moves_inputs_and_weights_by_one_ulp():
    from torch_tpu.compat.run import nudge, perturbed_step
    x = torch.tensor([1.0, 0.0, -2.0])
    up, down = nudge(x, 1), nudge(x, -1)
    assert bool((up > x).all()) and bool((down < x).all())
    assert torch.equal(nudge(torch.arange(3), 1), torch.arange(3))  # integers stay
    lin = torch.nn.Linear(3, 1)
    state = {k: v.clone() for k, v in lin.state_dict().items()}

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return types.SimpleNamespace(loss=self.lin(x).sum())
    m = Wrap()
    full = {"lin." + k: v for k, v in state.items()}
    out = perturbed_step(m, full, {"x": x}, 1)
    assert torch.equal(out[2][0], up.unsqueeze(0))  # d loss / d weight = the moved input
    assert torch.equal(lin.weight, state["weight"])  # the caller's model is untouched


def test_the_training_loss_of_a_model_without_one_reaches_below_a_layer_norm():
    """The mean of a LayerNorm's output is its bias: a loss made of it has zero gradient
    for everything above the norm. The weighted mean does not."""
    from torch_tpu.compat import models
    torch.manual_seed(0)
    lin, ln = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16)
    out = ln(lin(torch.randn(4, 8)))
    models.loss_of(out).backward()
    assert lin.weight.grad.abs().max() > 1e-3
    w = models.loss_weights(torch.empty(3, 5))
    assert w.shape == (3, 5) and bool((w >= 0.5).all() and (w < 1.5).all())
    assert torch.equal(w, models.loss_weights(torch.empty(3, 5, device="tpu")).cpu())
