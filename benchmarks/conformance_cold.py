"""Cold full conformance run: `python -m torch_tpu.conformance --jobs 2` over every op_db
entry with an empty compile cache, timed by the wall clock, into
benchmarks/results/conformance_cold.json, the run's own results beside it in
conformance_cold/ (run.py quotes it in its issue-18 table, with its
date, since it takes half an hour and is not part of run.py's own minutes).

    python benchmarks/conformance_cold.py [--jobs 2] [--ops OPS] [--out DIR]
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _git_commit():
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() or None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(jobs, out, ops=None):
    """Wall seconds of one conformance run whose processes start with an empty compile
    cache, and the run's own summary (its results stay in `out`)."""
    with tempfile.TemporaryDirectory(prefix="tpu_cold_cache_") as cache:
        env = dict(os.environ, TPU_COMPILE_CACHE_DIR=cache)
        env.pop("TPU_COMPILE_CACHE", None)  # the cache on, as a user has it; empty, so cold
        cmd = [sys.executable, "-m", "torch_tpu.conformance", "--jobs", str(jobs), "--out", out]
        if ops:
            cmd += ["--ops", ops]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        with open(os.path.join(out, "conformance.json")) as f:
            results = json.load(f)
        cached = sum(len(files) for _, _, files in os.walk(cache))
    return wall, results["summary"], results.get("timing", {}), cached


# A fresh process compiles `x + 1` on 24 sizes, one program each, on its own thread with
# the cache off: the median is XLA's fixed cost of one program, which every program the
# run compiles pays at least.
_FIXED_COST_PROBE = r"""
import json, statistics, torch, torch_tpu
each = []
for n in range(3, 27):
    x = torch.ones(n).to("tpu")
    before = torch_tpu.metrics()["op_compile_seconds"]
    (x + 1).cpu()
    each.append(torch_tpu.metrics()["op_compile_seconds"] - before)
print(json.dumps(statistics.median(each)))
"""


def fixed_compile_seconds():
    """XLA's compile seconds for the simplest one-op program (median of 24)."""
    env = dict(os.environ, TPU_COMPILE_CACHE="0", TPU_COMPILE_THREADS="0")
    r = subprocess.run([sys.executable, "-c", _FIXED_COST_PROBE], cwd=ROOT, env=env, check=True,
                       capture_output=True, text=True)
    return float(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--ops", help="a subset (a smoke run; the result then says it is partial)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    wall, summary, timing, cached = measure(args.jobs, os.path.join(args.out, "conformance_cold"), args.ops)
    fixed = fixed_compile_seconds()
    result = {
        "minutes": wall / 60.0,
        "jobs": args.jobs,
        "ops": args.ops,  # None: every op_db entry
        "entries": summary["entries"],
        "fwd_native": summary["fwd"]["native"],
        "fwd_value_verified_native": summary["fwd"]["value_verified_native"],
        "bwd_native": summary["bwd"]["native"],
        "cache_files_written": cached,
        # Entries' own wall time and the XLA compile time in it, summed over the workers:
        # compiles over the jobs estimate the least a cold run can take (compiles on
        # threads of their own overlap other work, so it is an estimate).
        "entry_minutes": timing.get("entry_seconds", 0.0) / 60.0,
        "compile_minutes": timing.get("compile_seconds", 0.0) / 60.0,
        "slowest_entries": timing.get("slowest", []),
        # Every program written pays at least the simplest program's compile: that, times
        # the programs, over the jobs, is a floor of the run's wall set by XLA alone.
        "simplest_program_compile_seconds": fixed,
        "fixed_compile_floor_minutes": cached * fixed / args.jobs / 60.0,
        "fwd_error": summary["fwd"]["error"],
        "fwd_mismatch": summary["fwd"]["mismatch"],
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": _git_commit(),
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores",
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "conformance_cold.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
