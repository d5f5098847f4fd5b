"""Property-based fuzzing (hypothesis) of backward passes through random chains of views,
pointwise ops, reductions, concatenations, softmax and in-place writes on clones: the
loss and the leaf's gradient match CPU's in Strict and in DeferAndFuse (float32, within
a tolerance scaled by the gradient's size: summation orders differ). Deterministic."""
import pytest
import torch

import torch_tpu

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402
from fuzzing import MODES, fuzz_settings  # noqa: E402

SETTINGS = fuzz_settings(40)


def _step(x, k, a):
    k %= 12
    if k == 0:
        return x * (a - 2.5)
    if k == 1:
        return x.t() if x.dim() == 2 else x.unsqueeze(0)
    if k == 2:
        return x.tanh()
    if k == 3:
        return x[1:] if x.dim() and x.shape[0] > 1 else x * 2
    if k == 4:
        return x.sum(dim=0) if x.dim() > 1 else x.exp()
    if k == 5:
        y = x.clone()
        y.mul_(a + 1)
        return y
    if k == 6:
        y = x.clone()
        (y[0] if y.dim() and y.shape[0] else y).add_(x.mean())  # a write through a view
        return y
    if k == 7:
        return x.reshape(-1)
    if k == 8:
        return torch.cat([x, x * 2], dim=0) if x.dim() else x.sigmoid()
    if k == 9:
        return x.softmax(dim=-1) if x.dim() else x.relu()
    if k == 10:
        return x.expand(2, *x.shape).sum(0)
    y = x.clone()
    y.masked_fill_(y > 0, 0.5)
    return y


def run(program, device):
    g = torch.Generator().manual_seed(program[0])
    leaf = torch.randn(3, 4, generator=g).to(device).requires_grad_()
    x = leaf
    for k, a in program[1]:
        x = _step(x, k, a)
    w = torch.arange(x.numel(), device=device).reshape(x.shape).float()
    loss = (x * w).sum()
    loss.backward()
    return loss.detach().cpu(), leaf.grad.cpu()


@pytest.mark.parametrize("mode", sorted(MODES))
def test_backward_through_random_chains_matches_cpu(mode):
    @SETTINGS
    @given(st.tuples(st.integers(0, 999), st.lists(st.tuples(st.integers(0, 11), st.integers(0, 5)),
                                                   min_size=1, max_size=8)))
    def check(program):
        want = run(program, "cpu")
        with torch_tpu.set_eager_mode(MODES[mode]):
            got = run(program, "tpu")
        for g, w in zip(got, want):
            finite = torch.isfinite(w)
            scale = float(w[finite].abs().max()) if finite.any() else 1.0
            torch.testing.assert_close(g, w, rtol=1e-4, atol=2e-5 * max(1.0, scale), equal_nan=True,
                                       msg=str(program))

    check()
