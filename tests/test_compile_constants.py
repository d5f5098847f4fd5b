"""A literal tensor in compiled code (`torch.tensor(-inf, device=x.device)` in a mask, a
table of weights) becomes a tensor the graph module holds (`_tensor_constant0`). The
replay of a captured graph declined it ("reads a tpu value that is not among its
inputs"), so such a graph recorded all its ops again at every call (2.7 ms against
0.08 ms for a 3-op graph). It is now a constant of the replayed program; parameters and
buffers, which may change between calls, stay inputs."""
import pytest
import torch

import torch_tpu


def _delta(before, after, key):
    return after[key] - before[key]


def _steady_calls(fn, make_args, calls=3):
    """Warm `fn`, then call it `calls` times on fresh arguments; the metrics' deltas and
    each call's (args, result)."""
    for _ in range(2):
        fn(*make_args(0))
    torch.tpu.synchronize()
    m0 = torch_tpu.metrics()
    seen = []
    for i in range(calls):
        args = make_args(i + 1)
        seen.append((args, fn(*args)))
    torch.tpu.synchronize()
    m1 = torch_tpu.metrics()
    return {k: _delta(m0, m1, k) for k in ("compiled_replays", "op_calls", "compiled_graph_calls")}, seen


def _where_inf(x):
    return torch.where(x > 0, x, torch.tensor(-float("inf"), dtype=x.dtype, device=x.device)).softmax(-1)


def _table(x):
    return x * torch.tensor([1.0, -2.0, 0.5, 3.0], device=x.device) + torch.tensor(1.5, device=x.device)


@pytest.mark.parametrize("fn", [_where_inf, _table], ids=["scalar", "vector"])
def test_literal_tensors_replay_as_constants(fn):
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="tpu")
    gen = torch.Generator().manual_seed(0)
    counts, seen = _steady_calls(cf, lambda i: (torch.randn(3, 4, generator=gen).to("tpu"),))
    for (x,), y in seen:
        torch.testing.assert_close(y.cpu(), fn(x.cpu()))
    assert counts["compiled_replays"] == counts["compiled_graph_calls"] == 3, counts
    assert counts["op_calls"] == 0, counts


class _Masked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x):
        h = self.lin(x) * self.scale
        return torch.where(h > 0, h, torch.tensor(-1e4, device=h.device)).logsumexp(-1).mean()


def test_training_with_a_literal_replays_and_buffers_stay_inputs():
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = _Masked()
    dev = _Masked()
    dev.load_state_dict(ref.state_dict())
    dev.to("tpu")
    step = torch.compile(dev, backend="tpu")
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(dev.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    m0 = None
    for i in range(6):
        if i == 2:
            torch.tpu.synchronize()
            m0 = torch_tpu.metrics()
        if i == 4:  # a buffer changed between calls is read anew, not replayed as a constant
            ref.scale.mul_(-0.5)
            dev.scale.mul_(-0.5)
        x = torch.randn(5, 8, generator=gen)
        lr, ld = ref(x), step(x.to("tpu"))
        opt_r.zero_grad(); lr.backward(); opt_r.step()
        opt_d.zero_grad(); ld.backward(); opt_d.step()
        torch.testing.assert_close(ld.cpu(), lr.detach(), atol=1e-5, rtol=1e-5)
    for a, b in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), atol=1e-5, rtol=1e-5)
    m1 = torch_tpu.metrics()
    # The forward and backward graphs of each of the last 4 steps replay (the backward
    # reads its own copy of the literal, computed while the forward recorded).
    assert _delta(m0, m1, "compiled_replays") == 8, _delta(m0, m1, "compiled_replays")
