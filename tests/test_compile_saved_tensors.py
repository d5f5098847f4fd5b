"""Compiled mode keeps autograd's check on tensors saved for the backward: an input or a
parameter changed in place after the compiled forward makes backward() raise, as in eager
and on CPU, at the first call and at replayed ones (it used to compute the gradient from
the changed values, silently)."""
import pytest
import torch
import torch._dynamo as dynamo

import torch_tpu

CHANGED = "modified by an inplace operation"


def _backends():
    return {"fused": "tpu", "apart": torch_tpu.TpuBackend(fuse_steps=False)}


@pytest.mark.parametrize("backend", ["fused", "apart"])
def test_an_input_changed_after_the_forward_fails_the_backward(backend):
    dynamo.reset()
    m = torch.nn.Linear(4, 2, bias=False).to("tpu")
    f = torch.compile(m, backend=_backends()[backend])
    for call in range(3):  # the first call records, later ones replay
        x = torch.ones(3, 4, device="tpu")
        out = f(x)
        x.mul_(100)
        with pytest.raises(RuntimeError, match=CHANGED):
            out.sum().backward()
        m.zero_grad()
    # Unchanged inputs still train as eager.
    x = torch.ones(3, 4, device="tpu")
    f(x).sum().backward()
    assert m.weight.grad.cpu().tolist() == [[3.0] * 4] * 2


@pytest.mark.parametrize("backend", ["fused", "apart"])
def test_a_parameter_changed_under_no_grad_fails_the_backward(backend):
    # A GAN-style loop writing a weight between a forward and its backward.
    dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 1, bias=False)).to("tpu")
    f = torch.compile(m, backend=_backends()[backend])
    for call in range(3):
        out = f(torch.ones(2, 4, device="tpu"))
        with torch.no_grad():
            m[1].weight.mul_(10)
        with pytest.raises(RuntimeError, match=CHANGED):
            out.sum().backward()
        m.zero_grad()


def test_replayed_calls_train_as_on_the_cpu():
    # The forward saves its input (returned by the graph); replays hand back that tensor.
    dynamo.reset()
    m = torch.nn.Linear(3, 3).to("tpu")
    f = torch.compile(m, backend="tpu")
    x = torch.randn(2, 3, device="tpu")
    grads = []
    for _ in range(3):
        m.zero_grad()
        f(x).pow(2).sum().backward()
        grads.append(m.weight.grad.cpu())
    m_cpu = torch.nn.Linear(3, 3)
    m_cpu.load_state_dict({k: v.cpu() for k, v in m.state_dict().items()})
    m_cpu(x.cpu()).pow(2).sum().backward()
    for g in grads:
        torch.testing.assert_close(g, m_cpu.weight.grad, rtol=1e-5, atol=1e-6)
