"""The benchmark's ceilings count the contractions a workload really runs: if the profiler's
op names stopped matching, the fused/strict ceiling would silently become infinite."""
import importlib.util
import os

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
