"""The OpInfo conformance tool: classification, reports and the regression check."""
import json
import os

import pytest
import torch

from torch_tpu import conformance

# linalg.eigvals: a fallback (no rule for non-symmetric eigenvalues); rand_like, empty_like:
# random and uninitialized outputs.
OPS = ["add", "mul", "sum", "softmax", "nonzero", "linalg.eigvals", "rand_like", "empty_like"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("conf"))
    res = conformance.run(OPS, ("float32", "int64"), max_samples=3, jobs=0, out=out,
                          progress=False)
    return out, res


def test_native_ops_are_native_forward_and_backward(report):
    e = report[1]["entries"]
    assert set(e) == {"add", "mul", "sum", "softmax", "softmax.with_dtype", "nonzero",
                      "linalg.eigvals", "rand_like", "empty_like"}
    for key in ("add", "mul", "sum", "softmax"):
        assert e[key]["float32"]["fwd"]["status"] == "native", e[key]
        assert e[key]["float32"]["bwd"]["status"] == "native", e[key]
    assert e["add"]["int64"]["fwd"]["status"] == "native"
    assert e["nonzero"]["float32"]["fwd"]["status"] == "native"
    assert "bwd" not in e["nonzero"]["float32"]  # not differentiable


def test_fallback_op_is_classified_with_the_op_recorded(report):
    rec = report[1]["entries"]["linalg.eigvals"]["float32"]["fwd"]
    assert rec["status"] == "fallback"
    assert any("linalg_eig" in op for op in rec["fallback_ops"])


def test_random_ops_are_compared_by_shapes_and_dtypes(report):
    e = report[1]["entries"]
    rec = e["rand_like"]["float32"]["fwd"]
    assert rec["status"] == "native" and rec["message"] == conformance.RANDOM, rec
    rec = e["empty_like"]["float32"]["fwd"]
    assert rec["status"] == "native" and rec["message"] == conformance.UNINITIALIZED, rec
    assert report[1]["summary"]["fwd"]["random"] == 2
    with pytest.raises(AssertionError, match="on tpu"):
        conformance.compare_meta([torch.zeros(2, 3)], [torch.zeros(3, 2)])
    with pytest.raises(AssertionError, match="non-finite"):
        conformance.compare_meta(torch.tensor([float("nan")]), torch.tensor([1.0]))
    conformance.compare_meta((torch.ones(2), 3), (torch.zeros(2), 5))


def test_reports_are_written_with_the_summary(report):
    out, res = report
    with open(os.path.join(out, "conformance.json")) as f:
        data = json.load(f)
    s = data["summary"]
    assert s["entries"] == 9 and "wall_s" in s
    for d in ("fwd", "bwd"):
        assert {"native_pct", "fallback_pct", "mismatch_pct", "error_pct",
                "skipped_pct"} <= set(s[d])
    assert s["fwd"]["total"] == 9 and s["bwd"]["total"] == 6  # nonzero, rand_like, empty_like: no grad
    assert abs(sum(s["fwd"][k + "_pct"] for k in conformance.STATUSES) - 100) < 0.5
    md = open(os.path.join(out, "conformance.md")).read()
    assert "via fallback" in md and "| linalg.eigvals | fallback |" in md


def test_check_against_a_baseline_reports_lost_native_entries(report, tmp_path, capsys):
    out, res = report
    base = json.loads(json.dumps(res))
    base["entries"]["linalg.eigvals"]["float32"]["fwd"]["status"] = "native"
    path = tmp_path / "base.json"
    path.write_text(json.dumps(base))
    argv = ["--ops", "linalg.eigvals", "--dtype", "float32", "--max-samples", "2",
            "--jobs", "0", "--out", str(tmp_path / "now"), "--baseline", str(path)]
    assert conformance.main(argv + ["--check"]) == 1
    assert "linalg.eigvals float32 fwd: was native, now fallback" in capsys.readouterr().out
    assert conformance.main(argv) == 0  # without --check it only reports
    path.write_text(json.dumps(res))
    assert conformance.main(argv + ["--check"]) == 0


def test_worker_pool_times_out_a_hanging_entry(tmp_path):
    res = conformance.run(["add"], ("float32",), max_samples=1, jobs=1, timeout=0.01,
                          out=str(tmp_path), progress=False)
    rec = res["entries"]["add"]["float32"]["fwd"]
    assert rec["status"] == "error" and rec["message"] == "timeout"


def test_the_run_says_where_its_time_went(report, tmp_path):
    out, res = report
    t = res["timing"]
    # Every entry timed, in-process: its wall seconds, and the XLA compiles within them.
    assert t["entries_timed"] == len(res["entries"])
    assert t["entry_seconds"] > 0 and t["compile_seconds"] > 0
    assert {k for k, _, _ in t["slowest"]} <= set(res["entries"]) and len(t["slowest"]) == min(15, len(res["entries"]))
    assert all(s > 0 and c >= 0 for _, s, c in t["slowest"])
    assert [s for _, s, _ in t["slowest"]] == sorted((s for _, s, _ in t["slowest"]), reverse=True)
    assert "XLA compiles took" in open(os.path.join(out, "conformance.md")).read()
    logged = [json.loads(line) for line in open(os.path.join(out, "entries.jsonl"))]
    assert all(len(rec["seconds"]) == 2 for rec in logged)
    # Through the worker pool (a compile cache of its own, so some programs compile there).
    env = os.environ.get("TPU_COMPILE_CACHE_DIR")
    os.environ["TPU_COMPILE_CACHE_DIR"] = str(tmp_path / "cache")
    try:
        pooled = conformance.run(["abs"], ("float32",), max_samples=2, jobs=1, out=str(tmp_path / "o"),
                                 progress=False)["timing"]
    finally:
        if env is None:
            os.environ.pop("TPU_COMPILE_CACHE_DIR")
        else:
            os.environ["TPU_COMPILE_CACHE_DIR"] = env
    assert pooled["entries_timed"] == 1 and pooled["slowest"][0][0] == "abs"
    assert pooled["entry_seconds"] > 0 and pooled["compile_seconds"] > 0


def test_each_finished_sample_extends_its_entrys_deadline(monkeypatch):
    # The timeout catches hangs: an entry with thousands of samples (max_pool2d's 7,200)
    # earns time for each one it finishes, on top of its compiles.
    # Only the compiles count as compile seconds in the run's timing.
    reported = []
    monkeypatch.setattr(conformance, "extend_deadline", lambda s, allowance=0.0: reported.append((s, allowance)))
    conformance.run_entry(conformance.op_db()["add"], ("float32",), max_samples=3)
    assert [a for _, a in reported] == pytest.approx([conformance.SAMPLE_ALLOWANCE_S * k for k in (1, 2, 3)])
    compiled = [s for s, _ in reported]
    assert compiled == sorted(compiled) and compiled[-1] <= conformance.compile_seconds()
