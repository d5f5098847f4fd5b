"""The model-compatibility pipeline's command line and run bookkeeping (python -m
torch_tpu.compat): usage errors, --report, --resume, Ctrl-C, and the entries of model
types that failed or timed out. A stand-in worker pool keeps these free of model runs."""
import json

import pytest

pytest.importorskip("transformers")
from torch_tpu.compat import __main__ as compat, run as compat_run  # noqa: E402

from test_compat import BASELINE  # noqa: E402


class FakePool:
    """Pool's interface; each key's outcome comes from `outcomes` (key -> (result or None,
    message, progress)), a pass in every mode by default."""
    started = []
    outcomes = {}

    def __init__(self, jobs, target, args, log_path, max_jobs=150):
        self.modes = args[0]
        self.progress = {}
        FakePool.started.append(self)

    def map(self, keys, timeout):
        self.keys = list(keys)
        for key in keys:
            res, msg, progress = self.outcomes.get(key, (None, "", None))
            if isinstance(res, BaseException):
                raise res
            if progress is not None:
                self.progress[key] = progress
            if res is None and not msg:
                res = {"head": None, "family": "f", "class": "C",
                       "modes": {m: {"status": "pass"} for m in self.modes}}
            yield key, res, msg

    def close(self):
        pass


@pytest.fixture
def fake_pool(monkeypatch):
    monkeypatch.setattr(compat, "Pool", FakePool)
    FakePool.started, FakePool.outcomes = [], {}
    return FakePool


def write_results(path, entries, wall_s=50.0):
    """An earlier run's OUT/compat.json."""
    entries = {t: {"head": None, "family": "f", "class": "C", **e} for t, e in entries.items()}
    path.mkdir(exist_ok=True)
    (path / "compat.json").write_text(json.dumps({"meta": {"wall_s": wall_s}, "entries": entries}))


@pytest.mark.parametrize("args, says", [
    (["--jobs", "0"], "--jobs: must be at least 1"),  # no worker: it waited forever
    (["--jobs", "-1"], "--jobs: must be at least 1"),
    (["--limit", "0"], "--limit: must be at least 1"),
    (["--modes", ","], "--modes needs at least one mode"),
    (["--archs", "gpt3"], "did you mean"),
    (["--stage", "2", "--archs", "gpt3"], "unknown keys or model types of the stage-2 sample"),
])
def test_usage_errors(args, says, capsys, fake_pool, tmp_path):
    with pytest.raises(SystemExit) as e:
        compat.main(args + ["--out", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not fake_pool.started


def test_unknown_arch_suggests_close_names_and_ignores_case():
    with pytest.raises(compat.UsageError, match="'gpt3' .*gpt2"):
        compat.select(["gpt3"], 1, 1, 0)
    assert compat.select(["GPT2", "Bert"], 1, 1, 0) == ["bert", "gpt2"]


def test_repeated_modes_run_once(fake_pool, tmp_path):
    assert compat.main(["--archs", "gpt2", "--modes", "strict,strict", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "compat.json").read_text())
    assert res["meta"]["modes"] == ["strict"] and fake_pool.started[0].modes == ["strict"]
    assert "| strict | strict |" not in (tmp_path / "compat.md").read_text()


def test_report_leaves_a_runs_json_alone(tmp_path):
    write_results(tmp_path, {"gpt2": {"modes": {"strict": {"status": "pass", "message": "kept"}}}})
    before = (tmp_path / "compat.json").read_text()
    assert compat.main(["--report", BASELINE, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "compat.json").read_text() == before
    assert (tmp_path / "compat.md").stat().st_size > 0


def test_ctrl_c_saves_the_finished_types(fake_pool, tmp_path):
    # Saved every 10 types only, a run of fewer lost everything to Ctrl-C.
    fake_pool.outcomes = {"gpt2": (KeyboardInterrupt(), "", None)}
    with pytest.raises(KeyboardInterrupt):
        compat.run(["bert", "gpt2"], modes=("strict",), out=str(tmp_path), progress=False)
    res = json.loads((tmp_path / "compat.json").read_text())
    assert list(res["entries"]) == ["bert"]
    assert (tmp_path / "compat.md").exists()
    # --resume goes on from there.
    fake_pool.outcomes = {}
    compat.run(["bert", "gpt2"], modes=("strict",), out=str(tmp_path), resume=True, progress=False)
    assert fake_pool.started[-1].keys == ["gpt2"]


def test_resume_retries_timeouts_and_keeps_other_types(fake_pool, tmp_path):
    timeout = {"status": "error", "message": "timeout", "class": "crash or hang"}
    write_results(tmp_path, {
        "gpt2": {"family": "decoder", "modes": {"strict": timeout}},
        "bert": {"family": "encoder", "modes": {"strict": {"status": "pass"}}},
        "t5": {"family": "encoder-decoder", "modes": {"strict": {"status": "pass"}}}})
    res = compat.run(["gpt2", "bert"], modes=("strict",), out=str(tmp_path), resume=True, progress=False)
    assert fake_pool.started[0].keys == ["gpt2"]  # the timed-out type, again
    assert res["entries"]["gpt2"]["modes"]["strict"]["status"] == "pass"
    assert set(res["entries"]) == {"gpt2", "bert", "t5"}  # t5: outside --archs, kept
    assert res["meta"]["wall_s"] >= 50.0  # the earlier run's time counts
    # Nothing left: no worker started.
    res = compat.run(["gpt2"], modes=("strict",), out=str(tmp_path), resume=True, progress=False)
    assert len(fake_pool.started) == 1 and set(res["entries"]) == {"gpt2", "bert", "t5"}


def test_a_timeout_keeps_finished_modes_and_names_the_running_one(fake_pool, tmp_path):
    so_far = {"head": "masked_lm", "family": "encoder", "class": "BertForMaskedLM",
              "modes": {"strict": {"status": "pass"}}}
    fake_pool.outcomes = {"bert": (None, "timeout", (so_far, "fused"))}
    res = compat.run(["bert"], modes=("strict", "fused", "compiled"), timeout=12,
                     out=str(tmp_path), progress=False)
    e = res["entries"]["bert"]
    assert e["family"] == "encoder" and e["modes"]["strict"]["status"] == "pass"
    fused, compiled = e["modes"]["fused"], e["modes"]["compiled"]
    assert fused["message"] == "timeout after 12 s in mode fused" and fused["class"] == "crash or hang"
    assert compiled["message"].startswith("not run: ")


def test_failed_types_keep_their_family_and_class():
    # A dead worker that reported nothing: the family and class a run would give.
    dead = compat.failed(("strict",), "worker died (exit -9)", "gpt2")
    assert (dead["family"], dead["class"]) == ("decoder", "GPT2LMHeadModel")
    assert dead["modes"]["strict"]["class"] == "crash or hang"
    # A model that cannot be built (natten is not installed) stays in its family.
    rec = compat_run.run_model("dinat", ("strict",))
    assert rec["modes"]["strict"]["status"] == "config-unbuildable"
    assert (rec["family"], rec["class"]) == ("vision", "DinatForImageClassification")


def test_a_model_run_reports_each_part_before_it_runs(monkeypatch):
    seen = []
    monkeypatch.setattr(compat_run, "report_progress",
                        lambda value: seen.append((json.loads(json.dumps(value[0]["modes"])), value[1])))
    monkeypatch.setattr(compat_run, "run_mode", lambda *args: {"status": "pass"})  # no device step
    rec = compat_run.run_model("gpt2", ("cpu", "strict"))
    assert [part for _, part in seen] == ["build", "cpu", "strict"]
    assert seen[-1][0] == {"cpu": rec["modes"]["cpu"]}  # the CPU pseudo-mode, done before strict
