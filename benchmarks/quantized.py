"""Quantized GPT prefill on tpu: float32, bfloat16, and torchao's int8 weight-only, int8
dynamic-activation and fp8 weight-only models, in one run.

    .venv/bin/python benchmarks/quantized.py        (or: make bench-quant)

Per variant and mode: the weight memory the model holds on the device
(torch.tpu.memory_allocated after placing and quantizing it), the median prefill step
(a forward over batch x seq tokens, ending with the next tokens read back), throughput,
peak device memory over the timed steps, executions per step and CPU fallbacks (0
expected), and the largest |logit| difference from the float32 model. Writes
quantized.json and quantized.md to --out (benchmarks/results/ by default).
"""
import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import gpt_config  # noqa: E402  (the GPT sizes of benchmarks/run.py; adds examples/ to the path)
from gpt import GPT, batches  # noqa: E402

import torch_tpu  # noqa: E402
from torch_tpu import EagerMode  # noqa: E402

MODES = {"strict": EagerMode.DEFER_NEVER, "fused": EagerMode.DEFER_AND_FUSE, "compiled": EagerMode.DEFER_NEVER}


def _ao():
    from torchao.quantization import (Float8WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig,
                                      Int8WeightOnlyConfig, quantize_)
    return quantize_, Int8WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig, Float8WeightOnlyConfig


def make_variant(name, model):
    """The float32 tpu `model` turned into the variant, in place."""
    quantize_, I8W, I8DA, F8W = _ao()
    if name == "float32":
        return model
    if name == "bfloat16":
        return model.to(torch.bfloat16)
    quantize_(model, {"int8_weight_only": I8W, "int8_dynamic": I8DA, "fp8_weight_only": F8W}[name]())
    return model


VARIANTS = ["float32", "bfloat16", "int8_weight_only", "int8_dynamic", "fp8_weight_only"]


def allocated():
    gc.collect()
    torch.tpu.synchronize()
    return torch.tpu.memory_allocated()


def fallbacks():
    from torch_tpu import _decompositions
    return sum(torch_tpu.metrics()["fallbacks"].values()) + sum(_decompositions.fallbacks.values())


def measure(variant, mode, cfg, batch, steps, warmup, reference):
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = allocated()
    model = make_variant(variant, GPT(**cfg).eval().to("tpu"))
    weights = allocated() - base
    x = next(batches(cfg["vocab"], cfg["seq"], batch, 1))[0].to("tpu")
    with torch_tpu.set_eager_mode(MODES[mode]), torch.no_grad():
        fwd = torch.compile(model, backend="tpu") if mode == "compiled" else model

        def step():
            logits = fwd(x)
            return logits, logits[:, -1].argmax(-1).sum().item()  # next tokens: the value a decoder needs

        t = time.perf_counter()
        logits, _ = step()
        first = time.perf_counter() - t
        for _ in range(warmup - 1):
            step()
        torch.tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        m0, f0 = torch_tpu.metrics(), fallbacks()
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            logits, _ = step()
            times.append(time.perf_counter() - t)
        m1 = torch_tpu.metrics()
        row = {"variant": variant, "mode": mode, "weight_bytes": weights,
               "median_step_s": statistics.median(times), "first_step_s": first,
               "tokens_per_s": batch * cfg["seq"] / statistics.median(times),
               "peak_bytes": torch.tpu.max_memory_allocated() - base,
               "executions_per_step": (m1["executions"] - m0["executions"]) / steps,
               "fallbacks": fallbacks() - f0}
        out = logits.float().cpu()
    row["max_abs_diff_vs_float32"] = None if reference is None else (out - reference).abs().max().item()
    del model, fwd, logits
    torch._dynamo.reset()
    return row, out


def markdown(rows, meta):
    f32 = {r["mode"]: r for r in rows if r["variant"] == "float32"}
    lines = [f"# Quantized GPT prefill on tpu ({meta['date']}, {meta['machine']})", "",
             f"Plugin: `{meta['plugin']}`; GPT {meta['gpt']}, batch {meta['batch']}; median of {meta['steps']} "
             f"steps after {meta['warmup']} warm-up steps; torchao {meta['torchao']}.", "",
             "| variant | mode | weight MiB | vs float32 | tokens/s | vs float32 | median step | peak MiB | "
             "executions/step | fallbacks | max abs diff vs float32 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = f32.get(r["mode"])
        wrel = f"{r['weight_bytes'] / b['weight_bytes']:.2f}x" if b else ""
        trel = f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}x" if b else ""
        diff = "-" if r["max_abs_diff_vs_float32"] is None else f"{r['max_abs_diff_vs_float32']:.3g}"
        lines.append(f"| {r['variant']} | {r['mode']} | {r['weight_bytes'] / 2**20:.2f} | {wrel} | "
                     f"{r['tokens_per_s']:,.0f} | {trel} | {r['median_step_s'] * 1e3:.1f} ms | "
                     f"{r['peak_bytes'] / 2**20:.1f} | {r['executions_per_step']:.1f} | {r['fallbacks']} | {diff} |")
    lines += ["", "Weight memory is what the placed (and quantized) model holds on the device. On this "
              "machine the device is XLA's CPU plugin: int8/fp8 matmuls have no dedicated units there, so "
              "throughput shows the cost of dequantizing, not a TPU's speed-up."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smaller model (a smoke run)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args()
    cfg, batch = gpt_config(a.quick)
    rows, reference = [], {}
    for mode in a.modes.split(","):
        for v in a.variants.split(","):
            print(f"{v:17s} {mode:8s} ...", end=" ", flush=True)
            r, out = measure(v, mode, cfg, batch, a.steps, a.warmup, reference.get(mode))
            if v == "float32":
                reference[mode] = out
            rows.append(r)
            print(f"{r['tokens_per_s']:,.0f} tokens/s  weights {r['weight_bytes'] / 2**20:.2f} MiB  "
                  f"fallbacks {r['fallbacks']}", flush=True)
    import torchao
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.cpu_count()} CPUs",
            "plugin": torch_tpu._C.plugin_path(), "steps": a.steps, "warmup": a.warmup, "quick": a.quick,
            "gpt": cfg, "batch": batch, "torch": torch.__version__, "torchao": torchao.__version__}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "quantized.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    md = markdown(rows, meta)
    with open(os.path.join(a.out, "quantized.md"), "w") as f:
        f.write(md)
    print()
    print(md)


if __name__ == "__main__":
    main()
