"""Cases for tests/test_donation.py, each run in a fresh process (the runtime decides at
start whether donation is safe): `python tests/donation_cases.py CASE`."""
import os
import sys

import torch

import torch_tpu
from torch_tpu import EagerMode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from gpt import GPT, batches  # noqa: E402

FUSED = EagerMode.DEFER_AND_FUSE


def donated():
    return torch_tpu.metrics()["donated_buffers"]


def in_place_updates_donate_and_views_see_them():
    with torch_tpu.set_eager_mode(FUSED):
        p = torch.zeros(256, 256, device="tpu")
        torch_tpu.synchronize()
        base = torch.tpu.memory_allocated()
        d0 = donated()
        for _ in range(3):
            p.add_(1)
            p.mul_(2)
        row = p[3]
        row.sub_(1)                       # in-place through a view
        torch_tpu.synchronize()
        assert donated() > d0
        # the parameter's memory was reused: no second copy stays allocated
        assert torch.tpu.memory_allocated() - base < 256 * 256 * 4
        assert p[0, 0].item() == 14.0 and p[3, 5].item() == 13.0


def donation_does_not_depend_on_whether_the_producing_graph_finished():
    # Which inputs a graph donates is part of its program: if that read counts held by a
    # launch still in flight, a training loop would recompile whenever timing changed.
    with torch_tpu.set_eager_mode(FUSED):
        a = torch.randn(384, 384, device="tpu")
        torch_tpu.synchronize()
        for _ in range(3):
            p = a @ a @ a @ a
            torch_tpu.synchronize(wait=False)   # launched; likely still running
            d0 = donated()
            p.add_(1)
            torch_tpu.synchronize()
            assert donated() == d0 + 1


def a_weight_updated_in_place_is_read_anew():
    # The smallest form of the bug donation once had on the XLA CPU plugin: a weight
    # donated to its own update keeps its address, and XNNPACK's dot reused what it
    # had packed from the old values (x.grad of the next step off by hundreds).
    torch.manual_seed(0)
    x_host = torch.randn(8, 16, 128, dtype=torch.float64)
    w_host = torch.randn(384, 128, dtype=torch.float64) * 0.05
    w = w_host.float().to("tpu").requires_grad_()
    d0 = donated()
    with torch_tpu.set_eager_mode(FUSED):
        for _ in range(3):
            x = x_host.float().to("tpu").requires_grad_()
            torch.nn.functional.linear(x, w).pow(2).sum().backward()
            torch_tpu.synchronize()
            xr = x_host.clone().requires_grad_()
            torch.nn.functional.linear(xr, w_host).pow(2).sum().backward()
            scale = xr.grad.abs().max().item()
            torch.testing.assert_close(x.grad.cpu().double(), xr.grad, rtol=1e-4, atol=1e-5 * scale)
            g = w.grad.cpu().double()
            with torch.no_grad():
                w.sub_(0.01 * w.grad)
                w_host -= 0.01 * g
            w.grad = None
            torch_tpu.synchronize()       # the update is a graph of its own: it donates
    assert donated() > d0


def a_cut_between_backward_and_step_gives_strict_gradients():
    def grads(mode):
        torch.manual_seed(0)
        model = GPT(vocab=64, d_model=128, n_heads=4, n_layers=2, seq=64).to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
        with torch_tpu.set_eager_mode(mode):
            for x, y in batches(64, 64, 8, 3):
                loss = model(x.to("tpu"), y.to("tpu"))[1]
                opt.zero_grad()
                loss.backward()
                torch_tpu.synchronize()
                opt.step()
        return [p.grad.cpu() for p in model.parameters()]
    d0 = donated()
    fused = grads(FUSED)
    assert donated() > d0
    for got, want in zip(fused, grads(EagerMode.DEFER_NEVER)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def cpu_plugin_does_not_donate_by_default():
    assert torch_tpu._C.platform() == "cpu"
    with torch_tpu.set_eager_mode(FUSED):
        p = torch.zeros(64, device="tpu")
        torch_tpu.synchronize()
        p.add_(1)
        torch_tpu.synchronize()
        os.environ["TPU_FUSE_DONATE"] = "1"   # too late for this plugin: warned, not used
        p.add_(1)
        torch_tpu.synchronize()
        assert p.sum().item() == 128.0
    assert donated() == 0


if __name__ == "__main__":
    globals()[sys.argv[1]]()
    print("ok")
