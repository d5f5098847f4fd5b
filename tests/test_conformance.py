"""The OpInfo conformance tool: classification, reports and the regression check."""
import json
import os

import pytest

from torch_tpu import conformance

OPS = ["add", "mul", "sum", "softmax", "nonzero", "special.bessel_j0"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("conf"))
    res = conformance.run(OPS, ("float32", "int64"), max_samples=3, jobs=0, out=out,
                          progress=False)
    return out, res


def test_native_ops_are_native_forward_and_backward(report):
    e = report[1]["entries"]
    assert set(e) == {"add", "mul", "sum", "softmax", "softmax.with_dtype", "nonzero",
                      "special.bessel_j0"}
    for key in ("add", "mul", "sum", "softmax"):
        assert e[key]["float32"]["fwd"]["status"] == "native", e[key]
        assert e[key]["float32"]["bwd"]["status"] == "native", e[key]
    assert e["add"]["int64"]["fwd"]["status"] == "native"
    assert e["nonzero"]["float32"]["fwd"]["status"] == "native"
    assert "bwd" not in e["nonzero"]["float32"]  # not differentiable


def test_fallback_op_is_classified_with_the_op_recorded(report):
    rec = report[1]["entries"]["special.bessel_j0"]["float32"]["fwd"]
    assert rec["status"] == "fallback"
    assert any("special_bessel_j0" in op for op in rec["fallback_ops"])


def test_reports_are_written_with_the_summary(report):
    out, res = report
    with open(os.path.join(out, "conformance.json")) as f:
        data = json.load(f)
    s = data["summary"]
    assert s["entries"] == 7 and "wall_s" in s
    for d in ("fwd", "bwd"):
        assert {"native_pct", "fallback_pct", "mismatch_pct", "error_pct",
                "skipped_pct"} <= set(s[d])
    assert s["fwd"]["total"] == 7 and s["bwd"]["total"] == 5  # nonzero, bessel_j0: no grad
    assert abs(sum(s["fwd"][k + "_pct"] for k in conformance.STATUSES) - 100) < 0.5
    md = open(os.path.join(out, "conformance.md")).read()
    assert "via fallback" in md and "| special.bessel_j0 | fallback |" in md


def test_check_against_a_baseline_reports_lost_native_entries(report, tmp_path, capsys):
    out, res = report
    base = json.loads(json.dumps(res))
    base["entries"]["special.bessel_j0"]["float32"]["fwd"]["status"] = "native"
    path = tmp_path / "base.json"
    path.write_text(json.dumps(base))
    argv = ["--ops", "special.bessel_j0", "--dtype", "float32", "--max-samples", "2",
            "--jobs", "0", "--out", str(tmp_path / "now"), "--baseline", str(path)]
    assert conformance.main(argv + ["--check"]) == 1
    assert "special.bessel_j0 float32 fwd: was native, now fallback" in capsys.readouterr().out
    assert conformance.main(argv) == 0  # without --check it only reports
    path.write_text(json.dumps(res))
    assert conformance.main(argv + ["--check"]) == 0


def test_worker_pool_times_out_a_hanging_entry(tmp_path):
    res = conformance.run(["add"], ("float32",), max_samples=1, jobs=1, timeout=0.01,
                          out=str(tmp_path), progress=False)
    rec = res["entries"]["add"]["float32"]["fwd"]
    assert rec["status"] == "error" and rec["message"] == "timeout"
