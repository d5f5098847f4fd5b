"""torch.func (vmap, grad, jvp, jacrev/jacfwd, hessian, functional_call), forward-mode AD
(dual tensors) and double backward on tpu against a CPU float64 reference, in Strict, Debug
and DeferAndFuse (session 64's probe). The cases live in func_transform_cases.py; each mode
runs all of them in one fresh interpreter.

Fixed here (NotImplementedError on tpu before, values on CPU): forward AD through
nn.LSTM / nn.GRU / LSTMCell / GRUCell (tpu runs PyTorch's fused cells, which have no
forward formula) and through scaled_dot_product_attention (the fused op has none either).
"""
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn as nn
import torch.nn.functional as F
from torch.func import vmap

import func_transform_cases
from conftest import run_python_json

MODES = {
    "strict": {"TPU_DEFER_AND_FUSE": "0", "TPU_LAUNCH_BLOCKING": "0"},
    "debug": {"TPU_DEFER_AND_FUSE": "0", "TPU_LAUNCH_BLOCKING": "1"},
    "fused": {"TPU_DEFER_AND_FUSE": "1", "TPU_LAUNCH_BLOCKING": "0"},
}
RUN_ALL = """
import json, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, "tests")
import torch_tpu, func_transform_cases
print(json.dumps(func_transform_cases.run_all()))
"""
_results = {}


def mode_results(mode):
    if mode not in _results:
        _results[mode] = run_python_json(RUN_ALL, MODES[mode], timeout=240)
    return _results[mode]


@pytest.mark.parametrize("name", sorted(func_transform_cases.CASES))
@pytest.mark.parametrize("mode", sorted(MODES))
def test_matches_float64_reference(mode, name):
    res = mode_results(mode)[name]
    assert not isinstance(res, str), res
    err, ok = res
    assert ok, f"{name} in {mode}: max error {err} against float64"


def test_fused_rnn_cell_keeps_its_autograd_kernel_without_tangents():
    """Without a dual input the call goes on to PyTorch's autograd kernel (its backward node
    and our fused backward lowering); with one the cell runs as separate ops."""
    torch.manual_seed(0)
    m = nn.LSTM(4, 3).to("tpu")
    x = torch.randn(5, 2, 4, device="tpu", requires_grad=True)
    names, fn = set(), m(x)[0].grad_fn
    stack = [fn]
    while stack:
        f = stack.pop()
        if f is None or type(f).__name__ in names:
            continue
        names.add(type(f).__name__)
        stack += [g for g, _ in f.next_functions]
    assert "ThnnFusedLstmCellBackward0" in names
    with fwAD.dual_level():
        out = m(fwAD.make_dual(x.detach(), torch.ones_like(x)))[0]
        assert fwAD.unpack_dual(out).tangent is not None


def test_jacrev_of_rnns_batches_the_cell():
    """jacrev/hessian vmap the cell's backward: with the fused cell that was
    _thnn_differentiable_*_cell_backward, which functorch ran once per batch element."""
    torch.manual_seed(0)
    x = torch.randn(1, 3, 4, device="tpu")
    for kind in ("LSTM", "GRU"):
        m = getattr(nn, kind)(4, 3, batch_first=True).to("tpu")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            torch.func.jacrev(lambda a: m(a)[0][0, -1])(x).cpu()
        slow = [str(m.message)[:120] for m in w if "batching rule" in str(m.message)]
        assert not slow, slow


def test_vmap_randomness():
    x = torch.ones(4, 2000, device="tpu")
    torch.manual_seed(0)
    diff = vmap(lambda a: F.dropout(a, 0.5), randomness="different")(x).cpu()
    same = vmap(lambda a: F.dropout(a, 0.5), randomness="same")(x).cpu()
    assert not torch.equal(diff[0], diff[1]) and all(torch.equal(same[0], same[i]) for i in range(4))
    for out in (diff, same):
        assert ((out == 0) | (out == 2)).all() and abs((out == 0).float().mean().item() - 0.5) < 0.05
    noise = vmap(lambda a: a + torch.randn_like(a), randomness="different")(torch.zeros(4, 4000, device="tpu")).cpu()
    assert abs(noise.mean().item()) < 0.05 and abs(noise.std().item() - 1) < 0.05
    with pytest.raises(RuntimeError, match="randomness"):
        vmap(lambda a: torch.rand_like(a))(x)
