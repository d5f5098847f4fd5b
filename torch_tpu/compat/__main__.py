"""The model-compatibility pipeline: every Hugging Face model type, built small from its
config class with random weights, run on CPU and on tpu in each eager mode and compiled.

    python -m torch_tpu.compat [--archs gpt2,bert] [--limit N] [--modes strict,fused,compiled]
        [--jobs 2] [--timeout 300] [--out compat_results] [--resume]
        [--baseline FILE --check] [--write-baseline FILE]
        [--stage 2 [--per-stratum K] [--seed S]]

Stage 1 (the default) runs each model type's representative class. Stage 2 runs a
stratified, deterministic sample of model classes (task head x modality, MoE/dense for
decoders; see sample.py), keys "head/model_type", into OUT/stage2.{json,md,png}.

Each model type runs in a spawned worker under a deadline (a crash or hang is a status);
results go to OUT/compat.{json,md} and a chart OUT/compat.png. Statuses: see
torch_tpu/compat/run.py.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from torch_tpu.compat import models, report  # noqa: E402
from torch_tpu._workers import Pool  # noqa: E402


def run_key(model_type, modes):
    from torch_tpu.compat.run import run_model
    return run_model(model_type, tuple(modes))


def worker_setup():
    from torch_tpu.compat.run import worker_setup as setup
    setup()


def failed(modes, message, key="") -> dict:
    """The entry of a model whose worker died or timed out; a stage-2 key names its head."""
    from torch_tpu.compat.run import classify
    st = {"status": "error", "message": message, "class": classify(message)}
    head = key.split("/", 1)[0] if "/" in key else None
    return {"head": head, "family": "other", "class": None, "modes": {m: dict(st) for m in modes}}


def run(archs=None, limit=None, modes=("strict", "fused"), jobs=2, timeout=300.0, out=None,
        resume=False, progress=True, stage=1, per_stratum=1, seed=0) -> dict:
    t0 = time.monotonic()
    stem = "compat" if stage == 1 else "stage2"
    if stage == 1:
        types = models.model_types(archs)
    else:
        from torch_tpu.compat import sample
        types = [k for k in sample.keys(per_stratum, seed)
                 if not archs or k in archs or k.split("/", 1)[1] in archs]
    types = types[:limit]
    entries = {}
    path = os.path.join(out, stem + ".json") if out else None
    if resume and path and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)["entries"]
        entries = {k: v for k, v in old.items() if k in types and set(modes) <= set(v["modes"])}
    todo = [t for t in types if t not in entries]
    if out:
        os.makedirs(out, exist_ok=True)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(todo), unit="model", file=sys.stderr)

    def save():
        res = results_of(entries, types, modes, jobs, timeout, time.monotonic() - t0)
        res["meta"]["stage"] = stage
        if stage == 2:
            res["meta"].update(per_stratum=per_stratum, seed=seed)
        if out:
            report.write(res, out, stem)
        return res

    pool = Pool(jobs, ("torch_tpu.compat.__main__", "run_key"), (list(modes),),
                os.path.join(out or ".", "workers.log"), max_jobs=20)
    try:
        for i, (key, res, msg) in enumerate(pool.map(todo, timeout), 1):
            entries[key] = res if res is not None else failed(modes, msg, key)
            if bar:
                bar.set_postfix_str(f"{key}: " + " ".join(r["status"] for r in entries[key]["modes"].values()))
                bar.update()
            if out and i % 10 == 0:
                save()  # --resume picks up from here
    finally:
        pool.close()
        if bar:
            bar.close()
    return save()


def results_of(entries, types, modes, jobs, timeout, wall_s) -> dict:
    import torch
    import transformers
    done = {t: entries[t] for t in types if t in entries}
    return {"meta": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "modes": list(modes), "jobs": jobs, "timeout_s": timeout,
                     "wall_s": round(wall_s, 1)},
            "summary": report.summarize(done, modes), "entries": done}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_tpu.compat", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", help="comma-separated model types (default: all)")
    p.add_argument("--limit", type=int, help="only the first N model types")
    p.add_argument("--modes", default="strict,fused",
                   help="subset of strict,fused,compiled (compiled: torch.compile(model, "
                        "backend='tpu')); or cpu: the CPU step alone (triage of "
                        "config-unbuildable and cpu-fails)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per model type")
    p.add_argument("--out", default="compat_results")
    p.add_argument("--resume", action="store_true", help="keep finished model types of OUT")
    p.add_argument("--baseline", help="a previous compat.json or baseline file")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a model type that passed in --baseline does not pass now")
    p.add_argument("--write-baseline", metavar="FILE", help="also write the statuses alone to FILE")
    p.add_argument("--stage", type=int, choices=(1, 2), default=1,
                   help="1: every model type; 2: the stratified sample of model classes")
    p.add_argument("--per-stratum", type=int, default=1, help="stage 2: classes per stratum")
    p.add_argument("--seed", type=int, default=0, help="stage 2: the sample's seed")
    p.add_argument("--report", metavar="BASELINE",
                   help="run nothing: write OUT/compat.{md,png} from a baseline file's statuses")
    a = p.parse_args(argv)
    if a.report:
        with open(a.report) as f:
            res = report.results_of_baseline(json.load(f), models.representative)
        os.makedirs(a.out, exist_ok=True)
        report.write(res, a.out)
        print(report.summary_table(res["summary"]))
        print(f"Report: {os.path.join(a.out, 'compat.md')}, compat.png")
        return 0
    modes = tuple(m for m in a.modes.split(",") if m)
    if bad := [m for m in modes if m not in ("strict", "fused", "compiled", "cpu")]:
        p.error(f"unknown mode {bad}")
    if a.check and not a.baseline:
        p.error("--check needs --baseline")
    archs = [x for x in (a.archs or "").split(",") if x] or None
    res = run(archs, a.limit, modes, a.jobs, a.timeout, a.out, a.resume, stage=a.stage,
              per_stratum=a.per_stratum, seed=a.seed)
    stem = "compat" if a.stage == 1 else "stage2"
    print(report.summary_table(res["summary"]))
    print(f"Results: {os.path.join(a.out, stem + '.md')}, {stem}.json, {stem}.png")
    if a.write_baseline:
        with open(a.write_baseline, "w") as f:
            json.dump(report.baseline_of(res), f, indent=0, sort_keys=True)
    if a.baseline:
        with open(a.baseline) as f:
            lost = report.regressions(json.load(f), res["entries"])
        print(f"{len(lost)} regression(s) against {a.baseline}")
        for line in lost:
            print("  " + line)
        if lost and a.check:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
