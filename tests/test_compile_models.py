"""Compiled mode on what Hugging Face models do, each case found by the compatibility
pipeline's compiled runs (python -m torch_tpu.compat --modes compiled)."""
import torch

import torch_tpu  # noqa: F401


def _grouped_mm_reference(x, w, offs):
    """Per expert in float64: rows offs[i-1]:offs[i] of x times w[i]."""
    out, start = [], 0
    for i, end in enumerate(offs.tolist()):
        out.append(x[start:end].double() @ w[i].double())
        start = end
    return torch.cat(out)


def test_float32_grouped_mm_compiles_forward_and_backward():
    """transformers' MoE experts call torch._grouped_mm on float32: PyTorch's fake-tensor
    rule (CUDA's: bfloat16 only) stopped Dynamo before any graph reached the backend
    (Mixtral, Qwen2-MoE, OLMoE: "Expected inputs of BF16 type")."""
    torch.manual_seed(0)
    x = torch.randn(10, 8)
    w = torch.randn(3, 8, 4)
    offs = torch.tensor([3, 3, 10], dtype=torch.int32)  # an empty group too
    xt = x.to("tpu").requires_grad_()
    wt = w.to("tpu").requires_grad_()
    f = torch.compile(lambda a, b, o: torch._grouped_mm(a, b, offs=o), backend="tpu")
    before = torch_tpu.metrics()["compiled_graphs"]
    y = f(xt, wt, offs.to("tpu"))
    (y * y).sum().backward()
    assert torch_tpu.metrics()["compiled_graphs"] - before == 2  # forward and backward
    xr = x.double().requires_grad_()
    wr = w.double().requires_grad_()
    yr = _grouped_mm_reference(xr, wr, offs)
    (yr * yr).sum().backward()
    torch.testing.assert_close(y.cpu().double(), yr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xt.grad.cpu().double(), xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wt.grad.cpu().double(), wr.grad, rtol=1e-5, atol=1e-5)


def test_grouped_mm_fake_rule_keeps_pytorchs_checks_elsewhere():
    """The tpu rule answers for tpu tensors only, and states the lowering's own errors."""
    import pytest
    from torch._subclasses.fake_tensor import FakeTensorMode
    torch.compile(lambda t: t, backend="tpu")  # installs the rules, as any compile does
    with FakeTensorMode() as mode:
        a = mode.from_tensor(torch.empty(4, 8))
        b = mode.from_tensor(torch.empty(2, 8, 3))
        o = mode.from_tensor(torch.tensor([1, 4], dtype=torch.int32))
        with pytest.raises(RuntimeError, match="BF16"):
            torch._grouped_mm(a, b, offs=o)  # CPU: PyTorch's rule
        at, bt = (mode.from_tensor(t.to("tpu")) for t in (torch.empty(4, 8), torch.empty(2, 8, 3)))
        ot = mode.from_tensor(torch.tensor([1, 4], dtype=torch.int32).to("tpu"))
        out = torch._grouped_mm(at, bt, offs=ot)
        assert out.shape == (4, 3) and out.device.type == "tpu" and out.dtype == torch.float32
        with pytest.raises(RuntimeError, match="matrix batch sizes have to match"):
            torch._grouped_mm(at, bt, offs=mode.from_tensor(torch.tensor([4], dtype=torch.int32).to("tpu")))


def test_a_frame_met_at_a_second_size_is_compiled_not_refused():
    """Dynamo makes a size dynamic when a frame meets it at a second value (automatic
    dynamic shapes); without bounds the backend once could only refuse the graph. M2M-100's
    layers, compiled apart after a graph break, meet the encoder's and the decoder's
    lengths in one step. The second size's graph keeps it symbolic, a program per size
    (test_compile_dynamic_sizes.py): one recompile, right values."""
    torch.manual_seed(0)
    w = torch.randn(8, 8)
    f = torch.compile(lambda x, w: torch.tanh(x @ w).sum(0), backend="tpu")
    wt = w.to("tpu")
    before = torch_tpu.metrics()
    for n in (4, 6, 6):
        x = torch.randn(n, 8)
        torch.testing.assert_close(f(x.to("tpu"), wt).cpu(), torch.tanh(x @ w).sum(0), rtol=1e-5, atol=1e-5)
    after = torch_tpu.metrics()
    assert after["compiled_graphs"] - before["compiled_graphs"] == 2  # one per size
    assert after["compiled_recompiles"] - before["compiled_recompiles"] == 1
