"""nn.LSTM / nn.GRU / nn.RNN (and their cells) on tpu: forward, final states and
gradients match a float64 CPU run, training matches CPU, and nothing falls back
(LSTM and GRU steps are the fused cells of lowering/rnn.cpp)."""
import copy

import pytest
import torch
import torch.nn as nn

from conftest import no_fallbacks

CONFIGS = [  # (num_layers, bidirectional, batch_first, bias)
    (1, False, False, True), (2, True, True, True), (2, False, True, False)]
TOL = dict(atol=2e-5, rtol=1e-4)  # float32 on tpu against float64 on the CPU


def _run(model, x, h0):
    out, h = model(x, h0)
    hs = list(h) if isinstance(h, tuple) else [h]
    # Weigh the outputs so every gradient path (also final states) is exercised.
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view(out.shape)
    loss = (out * w).sum() + sum((s * s).sum() for s in hs)
    loss.backward()
    return [out] + hs + [x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("layers,bidir,batch_first,bias", CONFIGS)
def test_rnn_forward_and_grads_match_cpu(cls, layers, bidir, batch_first, bias):
    torch.manual_seed(0)
    model = cls(6, 5, num_layers=layers, bidirectional=bidir, batch_first=batch_first, bias=bias)
    x = torch.randn((3, 4, 6) if batch_first else (4, 3, 6))
    n = layers * (2 if bidir else 1)
    h0 = torch.randn(n, 3, 5)
    h0 = (h0, torch.randn(n, 3, 5)) if cls is nn.LSTM else h0

    def move(v, device, dtype):
        return tuple(move(t, device, dtype) for t in v) if isinstance(v, tuple) else v.to(device, dtype)

    want = _run(copy.deepcopy(model).double(), x.double().requires_grad_(), move(h0, "cpu", torch.double))
    with no_fallbacks():
        got = _run(copy.deepcopy(model).to("tpu"), x.to("tpu").requires_grad_(), move(h0, "tpu", torch.float))
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w.float(), **TOL)


@pytest.mark.parametrize("cls", [nn.LSTMCell, nn.GRUCell, nn.RNNCell])
def test_cells_match_cpu_with_and_without_state(cls):
    torch.manual_seed(0)
    cell = cls(6, 5)
    x = torch.randn(3, 6)
    for with_state in (False, True):
        state = None
        if with_state:
            state = torch.randn(3, 5)
            state = (state, torch.randn(3, 5)) if cls is nn.LSTMCell else state

        def run(device, dtype):
            c = copy.deepcopy(cell).to(device, dtype)
            xi = x.to(device, dtype).requires_grad_()
            s = None if state is None else (
                tuple(t.to(device, dtype) for t in state) if isinstance(state, tuple) else state.to(device, dtype))
            out = c(xi, s)
            h = out[0] if isinstance(out, tuple) else out
            h.pow(2).sum().backward()  # an LSTM cell's cy gets no gradient here
            return [h, xi.grad] + [p.grad for p in c.parameters()]

        want = run("cpu", torch.double)
        with no_fallbacks():
            got = run("tpu", torch.float)
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w.float(), **TOL)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_rnn_trains_like_cpu(cls):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = cls(4, 8, num_layers=2, batch_first=True)
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])

    g = torch.Generator().manual_seed(0)
    data = [torch.randn(8, 5, 4, generator=g)] * 8  # one batch, fitted step by step

    def train(device):
        torch.manual_seed(0)
        net = Net().to(device)
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        losses = []
        for x in data:
            y = (x.sum((1, 2)) > 0).long()
            loss = nn.functional.cross_entropy(net(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ref = train("cpu")
    with no_fallbacks():
        got = train("tpu")
    assert max(abs(a - b) for a, b in zip(ref, got)) < 1e-4, (ref, got)
    assert got[-1] < got[0]


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_rnn_under_bf16_autocast_runs_natively(cls):
    torch.manual_seed(0)
    model = cls(6, 5, batch_first=True)
    x = torch.randn(3, 4, 6)
    # The reference is the float32 module: CPU's own bf16 autocast of an LSTM is a oneDNN
    # primitive that only some CPUs have (not without AVX-512); tpu's bf16 result must be
    # within bf16 rounding of float32's.
    ref = model(x)[0]
    m = copy.deepcopy(model).to("tpu")
    with no_fallbacks(), torch.autocast("tpu", dtype=torch.bfloat16):
        out = m(x.to("tpu"))[0]
        out.float().sum().backward()
    assert out.dtype == torch.bfloat16
    assert all(p.grad.dtype == torch.float32 for p in m.parameters())
    torch.testing.assert_close(out.float().cpu(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("cls,kw", [(nn.LSTM, {}), (nn.GRU, {}), (nn.RNN, {}), (nn.LSTM, {"proj_size": 3})])
def test_packed_sequences_and_projections_match_cpu(cls, kw):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    torch.manual_seed(0)
    model = cls(6, 5, num_layers=1, bidirectional=True, batch_first=True, **kw)
    x = torch.randn(3, 4, 6)
    lengths = torch.tensor([4, 2, 3])

    def run(m, xi):
        packed = pack_padded_sequence(xi, lengths, batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(m(packed)[0], batch_first=True)
        out.pow(2).sum().backward()
        return [out, xi.grad] + [p.grad for p in m.parameters()]

    want = run(copy.deepcopy(model).double(), x.double().requires_grad_())
    with no_fallbacks():
        got = run(copy.deepcopy(model).to("tpu"), x.to("tpu").requires_grad_())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w.float(), **TOL)
