"""The compat tool's verdict on parameters after the AdamW step: a weight whose distance
from CPU's is its gradient's (AdamW of tpu's own gradient) is judged by that gradient,
and a wrong optimizer step is still a mismatch."""
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
