"""The benchmark's ceilings count the contractions a workload really runs: if the profiler's
op names stopped matching, the fused/strict ceiling would silently become infinite."""
import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def load_bench():
    spec = importlib.util.spec_from_file_location(
        "bench_run", os.path.join(os.path.dirname(HERE), "benchmarks", "run.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_contraction_time_counts_every_matmul_and_convolution_of_a_step():
    bench = load_bench()
    c = bench.contraction_time("cnn_train", quick=True, warmup=1)
    # Two convolutions and a linear layer: 2 forward + 2 backward convolutions, the
    # linear's addmm and its two gradient mms.
    assert c["contraction_calls"] == 7
    assert 0 < c["contraction_s"] < 10
    assert 0 < c["launch_s"] < 0.1


def test_start_ceiling_is_the_cold_first_step_over_a_steady_step():
    bench = load_bench()
    rows = [{"workload": "gpt_train", "mode": "fused", "median_step_s": 0.5}]
    starts = [{"mode": "fused", "cold": {"first_step_s": 4.0}, "warm": {"first_step_s": 1.0}}]
    (b,) = bench.ceilings(rows, starts, quick=True)  # no strict row: no contraction ceiling
    assert b["mode"] == "fused" and b["warm_over_cold_ceiling"] == 8.0


def test_issue18_targets_are_each_a_value_and_whether_it_is_met():
    bench = load_bench()
    rows = [{"workload": "gpt_train", "mode": "fused", "median_step_s": 0.60},
            {"workload": "small_gpt_train", "mode": "cpu", "median_step_s": 0.010},
            {"workload": "small_gpt_train", "mode": "fused", "median_step_s": 0.009},
            {"workload": "small_gpt_train", "mode": "strict", "median_step_s": 0.020}]
    bounds = [{"workload": "gpt_train", "contraction_s": 0.5}]
    starts = [{"mode": "strict", "cold": {"first_step_s": 2.0}, "warm": {"first_step_s": 1.5}}]
    probes = {"tiny_op": {"strict_per_op_s": 3e-6, "fused_record_per_op_s": 1e-6},
              "tiny_op_cpu": {"per_op_s": 2.9e-6, "cpu_variant": "1 thread",
                              "cpu_variants": {"defaults": 5e-6, "OMP_WAIT_POLICY=PASSIVE": 4e-6,
                                               "1 thread": 2.9e-6}},
              "first_op": {"first_op_s": 0.05, "runs_s": [0.05]}}
    t = bench.issue18_targets(rows, starts, bounds, probes)

    def check(name, value, ok):
        assert t[name] == pytest.approx(value, rel=1e-9) and bench.met(name, t[name]) is ok, (name, t[name])
    check("gpt_train fused step / its contraction floor (<= 1.15)", 1.2, False)
    check("small_gpt_train fused step / native CPU's best step (<= 1.0)", 0.9, True)
    check("small_gpt_train strict step / native CPU's best step (<= 1.5)", 2.0, False)
    check("tiny op (x + 1, 16 floats, chain of 2000): strict / native CPU per op (<= 1.2)", 3 / 2.9, True)
    check("tiny op: DeferAndFuse recording / native CPU per op (<= 0.5)", 1 / 2.9, True)
    check("first tpu op of a fresh process, seconds (<= 0.3)", 0.05, True)
    check("gpt_train strict cold first step / 4.6 s before (<= 0.5)", 2.0 / 4.6, True)
    check("gpt_train strict warm first step / 1.16 s before (<= 1.1)", 1.5 / 1.16, False)
    assert t["cold full conformance run, minutes (<= 20)"] is None
    assert bench.met("cold full conformance run, minutes (<= 20)", None) is None
    # --quick sizes are not comparable with the reference starts.
    assert bench.issue18_targets(rows, starts, bounds, probes, quick=True)[
        "gpt_train strict cold first step / 4.6 s before (<= 0.5)"] is None
    md = bench.markdown([], [], {}, {"date": "d", "machine": "m", "plugin": "p", "steps": 1, "warmup": 1,
                                       "quick": False}, (), t, probes)
    assert "| small_gpt_train fused step / native CPU's best step (<= 1.0) | 0.900 | yes |" in md
    assert "| cold full conformance run, minutes (<= 20) | not measured" in md
    assert "| tiny op (per op) | 5.00 us | 4.00 us | 2.90 us | 1 thread |" in md


def test_native_cpu_baseline_is_the_best_of_its_variants():
    bench = load_bench()
    r = bench.native_cpu("tiny_op", steps=1, warmup=1, quick=True)
    assert set(r["cpu_variants"]) == set(bench.CPU_VARIANTS)
    assert r["cpu_variant"] in bench.CPU_VARIANTS
    assert r["per_op_s"] == min(r["cpu_variants"].values()) > 0
