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
