"""torch.cuda's graph calls on tpu: make_graphed_callables gives drop-in replacements that
run compiled (values and gradients as eager); capture by hand is a clear error that
leaves the process usable."""
import pytest
import torch

import torch_tpu


def _mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.GELU(), torch.nn.Linear(9, 3))


def _grads(model, x):
    loss = model(x).pow(2).sum()
    loss.backward()
    return loss.detach().cpu(), [p.grad.cpu() for p in model.parameters()]


def test_a_graphed_module_trains_as_eager_and_runs_compiled():
    torch._dynamo.reset()
    x = torch.randn(5, 6)
    eager = _mlp(0).to("tpu")
    graphed = _mlp(0).to("tpu")
    same = torch.tpu.make_graphed_callables(graphed, (x.to("tpu"),))
    assert same is graphed  # the module comes back, its forward replaced
    before = torch_tpu.metrics()["compiled_graphs"]
    for _ in range(2):
        want, got = _grads(eager, x.to("tpu")), _grads(graphed, x.to("tpu"))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch_tpu.metrics()["compiled_graphs"] > before


def test_graphed_functions_in_a_tuple():
    torch._dynamo.reset()
    a = torch.randn(4, 4, device="tpu", requires_grad=True)
    f = lambda t: (t @ t).tanh()  # noqa: E731
    g = lambda t: t.sin() * 2  # noqa: E731
    gf, gg = torch.tpu.make_graphed_callables((f, g), ((a,), (a,)))
    torch.testing.assert_close(gg(gf(a)).cpu(), g(f(a)).cpu())
    (grad_graphed,) = torch.autograd.grad(gg(gf(a)).sum(), a)
    (grad_eager,) = torch.autograd.grad(g(f(a)).sum(), a)
    torch.testing.assert_close(grad_graphed.cpu(), grad_eager.cpu(), rtol=1e-5, atol=1e-6)


def test_sample_args_are_checked_as_on_cuda():
    with pytest.raises(TypeError, match="must contain only Tensors"):
        torch.tpu.make_graphed_callables(lambda t, k: t * k, (torch.ones(2, device="tpu"), 3))
    with pytest.raises(ValueError, match="one tuple of sample args per callable"):
        torch.tpu.make_graphed_callables((abs, abs), ((torch.ones(1, device="tpu"),),))


@pytest.mark.parametrize("call", [lambda: torch.tpu.CUDAGraph(), lambda: torch.tpu.graph(None),
                                  lambda: torch.tpu.graph_pool_handle()])
def test_capture_by_hand_is_a_clear_error(call):
    x = torch.ones(3, device="tpu")
    with pytest.raises(RuntimeError, match="no stream capture and replay.*TPU_DEFER_AND_FUSE=1"):
        call()
    assert (x * 2).sum().item() == 6.0
