"""Where one thread beats the thread pool for XLA CPU contractions (TPU_CPU_THREADED_MACS).

    .venv/bin/python benchmarks/eigen_threads.py [--rounds 2] [--out benchmarks/results]

Fresh processes, alternating, so a busy machine's noise falls on both: "threaded" compiles
every one-op program with XLA's default multi-threaded Eigen contractions
(TPU_CPU_THREADED_MACS=0), "one thread" every one-op program with them on one thread. Per
case: the median time of a call until the device is done, for matmuls and convolutions of
growing size (their multiply-adds). The default threshold is the size below which one
thread won every case here. Fused graphs are always threaded (one-threaded, XLA:CPU
compiled each small dot as its own LLVM kernel: the 4-micro-step GPT step's cold compile
took 40 % more CPU, and no steady step measured faster), so no graph is timed here.
Writes eigen_threads.{json,md}.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = {"threaded": {"TPU_CPU_THREADED_MACS": "0"}, "one thread": {"TPU_CPU_THREADED_MACS": str(1 << 62)}}
MATMULS = [32, 64, 128, 192, 256, 384, 512]
CONVS = [(8, 16, 16), (16, 32, 32), (32, 32, 32), (32, 64, 32)]  # batch, channels, side; 3x3


def cases():
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    out = {}
    for n in MATMULS:
        a, b = torch.randn(n, n).to("tpu"), torch.randn(n, n).to("tpu")
        out[f"mm {n}x{n}x{n}"] = (n ** 3, lambda a=a, b=b: a @ b)
    for bt, c, s in CONVS:
        x, w = torch.randn(bt, c, s, s).to("tpu"), torch.randn(c, c, 3, 3).to("tpu")
        out[f"conv3x3 b{bt} c{c} {s}x{s}"] = (bt * c * s * s * c * 9,
                                              lambda x=x, w=w: F.conv2d(x, w, padding=1))
    return out


def probe(steps):
    import torch
    import torch_tpu  # noqa: F401
    res = {}
    for name, (macs, fn) in cases().items():
        fn()
        torch.tpu.synchronize()
        ts = []
        for _ in range(steps):
            t = time.perf_counter()
            fn()
            torch.tpu.synchronize()
            ts.append(time.perf_counter() - t)
        res[name] = {"macs": macs, "ms": 1e3 * statistics.median(ts)}
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.probe:
        return probe(a.steps)
    runs = {k: [] for k in CONFIGS}
    for r in range(a.rounds):
        for name, env in CONFIGS.items():
            e = dict(os.environ, **env, TPU_COMPILE_CACHE="0")
            p = subprocess.run([sys.executable, __file__, "--probe", "--steps", str(a.steps)], env=e,
                               capture_output=True, text=True, check=True)
            runs[name].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {name} done", file=sys.stderr)
    rows = []
    for case in runs["threaded"][0]:
        ms = {k: min(run[case]["ms"] for run in v) for k, v in runs.items()}
        rows.append({"case": case, "macs": runs["threaded"][0][case]["macs"], "threaded_ms": ms["threaded"],
                     "one_thread_ms": ms["one thread"], "one_thread_over_threaded": ms["one thread"] / ms["threaded"]})
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "eigen_threads.json"), "w") as f:
        json.dump({"rows": rows, "rounds": a.rounds, "cpus": os.cpu_count()}, f, indent=1)
    lines = ["| case | multiply-adds | threaded ms | one thread ms | one thread / threaded |", "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["macs"]):
        lines.append(f"| {r['case']} | {r['macs']:,} | {r['threaded_ms']:.3f} | {r['one_thread_ms']:.3f} | "
                     f"{r['one_thread_over_threaded']:.2f} |")
    with open(os.path.join(a.out, "eigen_threads.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
