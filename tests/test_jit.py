"""TorchScript on tpu: torch.jit.trace records our ops (not their results as constants) and
the traced or scripted module runs on tpu as eager does."""

import torch
import torch.nn as nn

from conftest import native


def _conv_net(n):
    conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[n]
    norm = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[n]
    return nn.Sequential(conv(3, 4, 3, padding=1), norm(4), nn.ReLU(),
                         {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}[n](4, 2, 2, stride=2))


def test_trace_after_warm_up_records_the_convolutions():
    # The tracer never records `convolution` (CPU's kernel calls _convolution, which it
    # records); ours did not call it, so a conv that had run before was baked in as a
    # constant: a new input gave the old output, or tracing raised.
    torch.manual_seed(0)
    for n in (1, 2, 3):
        m = _conv_net(n).eval().to("tpu")
        x = torch.randn((2, 3) + (6,) * n, device="tpu")
        with native(), torch.no_grad():
            m(x)  # warm-up: the programs exist before the trace
            traced = torch.jit.trace(m, (x,))
            kinds = [node.kind() for node in traced.inlined_graph.nodes()]
            assert kinds.count("aten::_convolution") == 2, kinds
            x2 = torch.randn_like(x)
            torch.testing.assert_close(traced(x2).cpu(), m(x2).cpu())


def test_traced_conv_trains_as_eager():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 4 * 4, 1)).to("tpu")
    x = torch.randn(2, 3, 6, 6, device="tpu")
    with native():
        m(x)
        traced = torch.jit.trace(m, (x,))
        x2 = torch.randn_like(x)
        traced(x2).sum().backward()
        want = [p.grad.cpu().clone() for p in m.parameters()]
        m.zero_grad()
        m(x2).sum().backward()
        for w, p in zip(want, m.parameters()):
            torch.testing.assert_close(w, p.grad.cpu())


def test_aten_convolution_entry_points_agree():
    # _convolution reaches our rule through convolution_overrideable, as the trace's
    # graph calls it.
    torch.manual_seed(0)
    x, w, b = torch.randn(1, 4, 6, 6), torch.randn(5, 4, 3, 3), torch.randn(5)
    args = ([2, 1], [1, 0], [1, 2], False, [0, 0], 1)
    want = torch.ops.aten.convolution(x, w, b, *args)
    with native():
        t = [a.to("tpu") for a in (x, w, b)]
        got = torch.ops.aten._convolution(*t, *args, False, False, True, True)
        torch.testing.assert_close(got.cpu(), want)
        torch.testing.assert_close(torch.ops.aten.convolution_overrideable(*t, *args).cpu(), want)
