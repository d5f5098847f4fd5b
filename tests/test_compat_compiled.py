"""Compiled mode of the model-compatibility pipeline (`python -m torch_tpu.compat --modes
compiled`): tiny architectures pass through torch.compile(model, backend="tpu") by the
tool's own entry point, and a compile that fails is a status in the report, never the end
of the run or of the worker."""
import pytest
import torch

pytest.importorskip("transformers")
from torch_tpu._internal import compile as tpu_compile  # noqa: E402
from torch_tpu.compat import __main__ as compat, compiled as compiled_mode, report  # noqa: E402
from torch_tpu.compat.run import run_model  # noqa: E402


def test_tiny_architectures_pass_compiled_through_the_tool(tmp_path):
    """A vision model and a decoder with graph breaks (Whisper's causal LM; two of the
    quickest to compile) through `main`: outputs, gradients and AdamW-updated parameters
    match CPU's; forward and backward graphs were compiled; the report has the compiled
    column, its rate and its section."""
    assert compat.main(["--archs", "vit,whisper", "--modes", "compiled", "--jobs", "1",
                        "--timeout", "300", "--out", str(tmp_path)]) == 0
    import json
    res = json.loads((tmp_path / "compat.json").read_text())
    for t in ("vit", "whisper"):
        r = res["entries"][t]["modes"]["compiled"]
        assert r["status"] == "pass", (t, r)
        assert r["compiled_graphs"] >= 2 and r["compiled_graph_calls"] >= 2, (t, r)
    s = res["summary"]["compiled"]
    assert s["pass_pct"] == 100.0 and s["compiled_graphs"] >= 4
    md = (tmp_path / "compat.md").read_text()
    assert "| vision | 1/1 |" in md and "| decoder | 1/1 |" in md
    assert "## Compiled mode" in md and "| vit | pass |" in md
    assert (tmp_path / "compat.png").stat().st_size > 0


def test_a_failing_compile_is_a_status_and_the_worker_goes_on(monkeypatch):
    """The backend raising on a graph is the model's error ("compile error", the backend's
    own message, not Dynamo's wrapper); the same process then compiles the next model from
    a fresh Dynamo: its graphs, no recompile of the failed model's frames."""
    def broken(self, gm, example_inputs, **kw):
        raise RuntimeError("the backend refused this graph")
    with monkeypatch.context() as m:
        m.setattr(tpu_compile.TpuBackend, "__call__", broken)
        r = run_model("vit", ("compiled",))["modes"]["compiled"]
    assert r["status"] == "error" and r["class"] == "compile error", r
    assert r["message"] == "RuntimeError: the backend refused this graph"
    assert r["compiled_graphs"] == 0
    again = run_model("vit", ("compiled",))["modes"]["compiled"]
    assert again["status"] == "pass", again
    # ViT has no graph break: one forward and one backward graph, none compiled again.
    assert again["compiled_graphs"] == 2 and again["compiled_recompiles"] == 0, again


def test_unbounded_dynamic_sizes_are_their_own_class(monkeypatch):
    """A size marked dynamic without bounds (torch._dynamo.mark_dynamic) hands the
    backend symbolic sizes it cannot bound: the error names the fixes and is classified
    "dynamic shapes". torch.compile(dynamic=True) is only a hint: it compiles
    per size and passes."""
    def marked(m, backend="tpu"):
        compiled = torch.compile(m, backend=backend)

        def run(*args, **kwargs):
            for t in (*args, *kwargs.values()):
                if isinstance(t, torch.Tensor) and t.dim() > 0:
                    torch._dynamo.mark_dynamic(t, 0)
            return compiled(*args, **kwargs)
        return run
    monkeypatch.setattr(compiled_mode, "wrap", marked)
    r = run_model("vit", ("compiled",))["modes"]["compiled"]
    assert r["status"] == "error" and r["class"] == "dynamic shapes", r
    assert r["message"].startswith("NotImplementedError") and "without bounds" in r["message"]
    assert "mark_dynamic" in r["message"]  # (the fixes it names follow; the report cuts the message)
    monkeypatch.setattr(compiled_mode, "wrap",
                        lambda m, backend="tpu": torch.compile(m, backend=backend, dynamic=True))
    assert run_model("vit", ("compiled",))["modes"]["compiled"]["status"] == "pass"


def test_a_compile_that_fails_on_cpu_too_is_not_ours(monkeypatch):
    """A compile that fails with Dynamo alone on CPU too (backend "eager": no device in
    it) is counted as cpu-fails, with the tpu run's error kept; one that compiles there
    stays our error."""
    def failing_everywhere(m, backend="tpu"):
        def run(*a, **kw):
            raise RuntimeError(f"Dynamo could not trace this model ({backend})")
        return run
    monkeypatch.setattr(compiled_mode, "wrap", failing_everywhere)
    r = run_model("vit", ("compiled",))["modes"]["compiled"]
    assert r["status"] == "cpu-fails", r
    assert r["message"] == ("torch.compile fails on CPU too (backend eager): "
                            "RuntimeError: Dynamo could not trace this model (eager)")
    assert r["tpu_message"] == "RuntimeError: Dynamo could not trace this model (tpu)"

    def failing_on_tpu(m, backend="tpu"):
        return failing_everywhere(m, backend) if backend == "tpu" else torch.compile(m, backend=backend)
    monkeypatch.setattr(compiled_mode, "wrap", failing_on_tpu)
    r = run_model("vit", ("compiled",))["modes"]["compiled"]
    assert r["status"] == "error" and r["message"].endswith("(tpu)"), r


def test_a_model_dynamo_compiles_nothing_is_a_fallback(monkeypatch):
    """A run where no graph reached the backend (here: nothing compiled at all) ran
    eagerly: right values, but counted as a fallback, not a compiled pass."""
    monkeypatch.setattr(compiled_mode, "wrap", lambda m, backend="tpu": m)
    r = run_model("vit", ("compiled",))["modes"]["compiled"]
    assert r["status"] == "fallback" and r["message"] == compiled_mode.EAGER_IN_COMPILED, r


def test_report_rates_and_failure_examples():
    entries = {
        "gpt2": {"family": "decoder", "class": "GPT2LMHeadModel", "modes": {
            "strict": {"status": "pass"},
            "compiled": {"status": "pass", "compiled_graphs": 2, "graph_breaks": 1,
                         "graph_break_reasons": ["Unsupported: data-dependent branching"],
                         "compiled_recompiles": 0}}},
        "llama": {"family": "decoder", "class": "LlamaForCausalLM", "modes": {
            "strict": {"status": "pass"},
            "compiled": {"status": "error", "class": "dynamo", "message": "Unsupported: x",
                         "compiled_graphs": 0, "graph_breaks": 0}}},
        "vit": {"family": "vision", "class": None, "modes": {"strict": {"status": "cpu-fails"},
                                              "compiled": {"status": "cpu-fails"}}}}
    s = report.summarize(entries, ("strict", "compiled"))
    assert s["compiled"]["pass_pct"] == 50.0 and s["compiled"]["runnable"] == 2
    assert s["compiled"]["with_graph_breaks"] == 1 and s["compiled"]["compiled_graphs"] == 2
    md = report.markdown({"summary": s, "entries": entries,
                          "meta": {"modes": ["strict", "compiled"], "transformers": "x", "wall_s": 1}})
    assert "| decoder | 2/2 | 1/2 |" in md and "| vision | - | - |" in md
    assert "- compiled dynamo: 1 (e.g. llama: Unsupported: x)" in md
    assert "- 1: Unsupported: data-dependent branching" in md


def test_zero_gradients_where_cpu_has_none_are_equal_only_in_compiled_mode():
    """AOTAutograd's backward gives zeros where eager autograd leaves a gradient None
    (LLaVA's unused last vision layer); any other value there is still a mismatch."""
    from torch_tpu.compat.run import differences
    want = ([torch.ones(2)], ["w"], [None], [torch.ones(2)])
    zeros = ([torch.ones(2)], ["w"], [torch.zeros(2)], [torch.ones(2)])
    assert differences(zeros, want)[0] == "grad w: unexpected on tpu"
    assert differences(zeros, want, zero_grads_for_none=True) == ("", [])
    some = ([torch.ones(2)], ["w"], [torch.tensor([0.0, 1e-3])], [torch.ones(2)])
    assert differences(some, want, zero_grads_for_none=True)[0] == "grad w: unexpected on tpu"
