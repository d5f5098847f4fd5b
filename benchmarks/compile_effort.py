"""Compile time and run time of one-op (Strict) programs under each compile effort.

    .venv/bin/python benchmarks/compile_effort.py [--rounds 2]

Each configuration runs in fresh processes with the disk cache off, alternating, so a
busy machine's noise falls on all: "full" compiles one-op programs as fused graphs are
(XLA's defaults, TPU_OP_OPT_LEVEL=-1, the default), "fast" with LLVM -O1
(TPU_OP_OPT_LEVEL=1); EXTRA_XLA_FLAGS="flags|flags" adds configurations. Per op: the
compile seconds of its programs and the median time of a call until the device is done
(no transfer); then a small GPT's Strict training step (compile seconds, steady step).

On the XLA CPU plugin (2 cores, busy) -O1 saved 0-15 % of the one-op compile seconds and
lost vectorization (512x512 add and softmax 1.5-2x slower), so it stays off by default.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = {"full": {"TPU_OP_OPT_LEVEL": "-1"}, "fast": {"TPU_OP_OPT_LEVEL": "1"}}
# More configurations to compare: full effort plus XLA_FLAGS, '|' between configurations.
for i, flags in enumerate(filter(None, os.environ.get("EXTRA_XLA_FLAGS", "").split("|"))):
    CONFIGS[f"flags{i + 1}"] = {"TPU_OP_OPT_LEVEL": "-1", "XLA_FLAGS": flags}


def ops():
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)

    def mk(*s):
        return torch.randn(*s).to("tpu")
    a, b, v = mk(512, 512), mk(512, 512), mk(1 << 20)
    x4, w4 = mk(8, 64, 32, 32), mk(64, 64, 3, 3)
    return {
        "add": lambda: a + b, "mul_scalar": lambda: v * 3.0, "exp": lambda: v.exp(),
        "gelu": lambda: F.gelu(v), "sum": lambda: a.sum(1), "softmax": lambda: a.softmax(-1),
        "mm": lambda: a @ b, "layer_norm": lambda: F.layer_norm(a, (512,)),
        "conv2d": lambda: F.conv2d(x4, w4, padding=1), "transpose_copy": lambda: a.t().contiguous(),
        "cumsum": lambda: v.cumsum(0), "max_pool2d": lambda: F.max_pool2d(x4, 2),
        "where": lambda: a.where(a > 0, b),
    }


def probe():
    import torch
    import torch_tpu
    sys.path.insert(0, HERE)
    from run import small_gpt_train
    out = {}
    for name, fn in ops().items():
        m0 = torch_tpu.metrics()["op_compile_seconds"]
        fn()
        torch.tpu.synchronize()
        c = torch_tpu.metrics()["op_compile_seconds"] - m0
        ts = []
        for _ in range(21):  # device time and launch, no transfer
            t = time.perf_counter()
            fn()
            torch.tpu.synchronize()
            ts.append(time.perf_counter() - t)
        out[name] = {"compile_s": c, "run_s": statistics.median(ts)}
    m0 = torch_tpu.metrics()["op_compile_seconds"]
    t = time.perf_counter()
    step, _, _ = small_gpt_train("tpu", True)
    step()
    first = time.perf_counter() - t
    c = torch_tpu.metrics()["op_compile_seconds"] - m0
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t)
    out["small_gpt_train step"] = {"compile_s": c, "run_s": statistics.median(ts), "first_step_s": first}
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.probe:
        probe()
        return
    runs = {k: [] for k in CONFIGS}
    for _ in range(a.rounds):
        for name, cfg in CONFIGS.items():
            env = dict(os.environ, TPU_COMPILE_CACHE="0", **cfg)
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe"], env=env,
                               capture_output=True, text=True, timeout=1800)
            if r.returncode != 0:
                raise RuntimeError(r.stderr[-2000:])
            runs[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
    names = list(runs["full"][0])
    med = {k: {n: {f: statistics.median(r[n][f] for r in runs[k]) for f in ("compile_s", "run_s")}
               for n in names} for k in CONFIGS}
    print("| program | " + " | ".join(f"compile {k}" for k in CONFIGS) + " | "
          + " | ".join(f"run {k}" for k in CONFIGS) + " |")
    print("|---|" + "---|" * (2 * len(CONFIGS)))
    for n in names:
        print(f"| {n} | " + " | ".join(f"{med[k][n]['compile_s'] * 1e3:.0f} ms" for k in CONFIGS) + " | "
              + " | ".join(f"{med[k][n]['run_s'] * 1e3:.3f} ms" for k in CONFIGS) + " |")
    tot = {k: sum(med[k][n]["compile_s"] for n in names if n != "small_gpt_train step") for k in CONFIGS}
    print("\nsum of the single ops' compile seconds: " + ", ".join(f"{k} {v:.2f} s" for k, v in tot.items()))
    print(json.dumps({"median": med}))


if __name__ == "__main__":
    main()
