"""The compat tool hands a device step the CPU step's random draws (torch_tpu/compat/draws.py),
so a model that samples while it trains is compared as one computation, not two generators."""
import pytest
import torch

from torch_tpu.compat import run
from torch_tpu.compat.draws import RandomDraws


class Noisy(torch.nn.Module):
    """Samples the way training-time models do: a functional draw (randn_like), an in-place
    one on a fresh tensor (uniform_, GroupViT's Gumbel noise), a mask (bernoulli_, drop path)
    and an index permutation (ViT-MAE's shuffle via argsort of rand)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x) + 0.1 * torch.randn_like(x)
        g = torch.empty_like(h).uniform_(1e-6, 1.0)
        h = h - torch.log(-torch.log(g))
        keep = torch.empty(h.shape[0], 1, device=h.device).bernoulli_(0.5)
        order = torch.argsort(torch.rand(h.shape[1], device=h.device))
        return {"loss": (h * keep)[:, order].square().mean(), "h": h[:, order]}


def _step(device, draws=None):
    torch.manual_seed(0)
    model = Noisy()
    kw = {"x": torch.randn(4, 8, generator=torch.Generator().manual_seed(1))}
    return run.step(model, kw, device, draws=draws)


def test_replayed_draws_make_the_device_step_equal_to_the_cpu_step():
    rec = RandomDraws()
    want = _step("cpu", rec)
    assert [name for name, _ in rec.values] == [
        "aten::randn_like", "aten::uniform_", "aten::bernoulli_.float", "aten::rand"]
    replay = RandomDraws(rec.values)
    got = _step("tpu", replay)
    assert replay.used == 4
    why, _ = run.verdict(got, want, lambda: pytest.fail("no float64 run needed"))
    assert why == ""
    # Without the replay the device's own generator draws other numbers: the step differs.
    fresh = _step("tpu")
    assert run.differences(fresh, want)[1] or run.differences(fresh, want)[0]


def test_compiled_graphs_get_the_draws_too():
    # Dynamo does not trace under a dispatch mode: the replay runs inside the graphs'
    # calls, where eager's in-place draws are functional ops (bernoulli.p, uniform).
    import torch._dynamo
    rec = RandomDraws()
    want = _step("cpu", rec)
    replay = RandomDraws(rec.values)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Noisy()
    got = run.step(model, {"x": torch.randn(4, 8, generator=torch.Generator().manual_seed(1))}, "tpu",
                   compiled=True, draws=replay)
    torch._dynamo.reset()
    assert replay.used == 4
    why, _ = run.verdict(got, want, lambda: pytest.fail("no float64 run needed"), zero_grads_for_none=True)
    assert why == ""


def _eager_noise(x):
    return torch.randn(x.shape, device=x.device)


class NoisyWithABreak(Noisy):
    """Also draws in code Dynamo leaves to eager (VITS's duration noise, in a frame it
    skips): outside every graph of the compiled forward."""

    def forward(self, x):
        import torch._dynamo
        return super().forward(x + torch._dynamo.disable(_eager_noise)(x))


def test_draws_in_code_dynamo_leaves_to_eager_are_replayed_too():
    import torch._dynamo
    torch.manual_seed(0)
    kw = {"x": torch.randn(4, 8, generator=torch.Generator().manual_seed(1))}
    rec = RandomDraws()
    want = run.step(NoisyWithABreak(), kw, "cpu", draws=rec)
    assert [name for name, _ in rec.values][0] == "aten::randn"
    replay = RandomDraws(rec.values)
    torch._dynamo.reset()
    torch.manual_seed(0)
    got = run.step(NoisyWithABreak(), kw, "tpu", compiled=True, draws=replay)
    torch._dynamo.reset()
    assert replay.used == 5
    why, _ = run.verdict(got, want, lambda: pytest.fail("no float64 run needed"), zero_grads_for_none=True)
    assert why == ""


def test_the_float64_reference_gets_the_same_draws_cast():
    rec = RandomDraws()
    _step("cpu", rec)
    replay = RandomDraws(rec.values)
    torch.manual_seed(0)
    out = run.float64_step(Noisy(), Noisy().state_dict(), {"x": torch.randn(4, 8)}, replay)
    assert replay.used == 4 and out[0][0].dtype == torch.float64


def test_a_step_that_draws_differently_is_an_error_that_names_the_draw():
    class MoreNoise(Noisy):
        def forward(self, x):
            torch.rand(3, device=x.device)
            return super().forward(x)
    rec = RandomDraws()
    _step("cpu", rec)
    with pytest.raises(RuntimeError, match=r"random draw 1 is aten::rand \(3,\) here, "
                                           r"aten::randn_like \(4, 8\) on CPU"):
        torch.manual_seed(0)
        run.step(MoreNoise(), {"x": torch.randn(4, 8)}, "tpu", draws=RandomDraws(rec.values))
    short = RandomDraws(rec.values[:1])
    with pytest.raises(RuntimeError, match="uniform_ is random draw 2, but the CPU step drew only 1"):
        _step("tpu", short)


def test_native_dropout_is_not_replayed_but_a_dropout_mask_is():
    # native_dropout's result carries the input's values, not only a draw; F.dropout
    # under a dispatch mode draws its mask with bernoulli_, a pure sample.
    rec = RandomDraws()
    with rec:
        torch.nn.functional.dropout(torch.ones(4), 0.5, training=True)
        torch.ops.aten.native_dropout(torch.ones(4), 0.5, True)
    assert [n for n, _ in rec.values] == ["aten::bernoulli_.float"]


def test_the_report_counts_the_types_whose_draws_were_replayed():
    from torch_tpu.compat import report
    entries = {"a": {"family": "vision", "modes": {"strict": {"status": "pass", "replayed_draws": 3}}},
               "b": {"family": "vision", "modes": {"strict": {"status": "pass"}}}}
    s = report.summarize(entries, ["strict"])
    assert s["strict"]["replayed_draws"] == 1
    assert report.summary_table(s).splitlines()[2].endswith("| 1 | 0 |")
