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


WHERE = {"build": "while building the model and its inputs", "cpu": "in the CPU step"}


def failed(modes, message, key="", progress=None, timeout=None) -> dict:
    """The entry of a model whose worker died or timed out. `progress` (what the worker last
    reported: the record so far and the part it was running) keeps the modes that finished;
    the mode it was in gets `message`, and so do the modes it did not reach, as "not run".
    Without it, the key's family and class as a finished run would report them."""
    from torch_tpu.compat.run import classify, identity
    cls = classify(message)  # the pool's own words: "timeout", "worker died (...)"
    if message == "timeout" and timeout is not None:
        message = f"timeout after {timeout:g} s"
    if progress is None:
        try:
            rec, running = {**identity(key), "modes": {}}, None
        except Exception:  # noqa: BLE001 -- a key this transformers does not know
            head = key.split("/", 1)[0] if "/" in key else None
            rec, running = {"head": head, "family": "other", "class": None, "modes": {}}, None
    else:
        rec, running = progress
    if running is not None:
        message += " " + WHERE.get(running, f"in mode {running}")
    st = {"status": "error", "message": message, "class": cls}
    later = dict(st, message=f"not run: {message}")
    done = rec["modes"]
    modes_of = {m: done[m] if m in done else st if m == running or running not in modes else later
                for m in modes}
    return {**rec, "modes": modes_of}


def retry(record) -> bool:
    """Whether a --resume runs this mode again: a timeout or a dead worker may not recur
    (a shared machine, a larger --timeout)."""
    return record.get("status") == "error" and record.get("class") == "crash or hang"


class UsageError(ValueError):
    """A command-line value the run cannot use; main() reports it as argparse does."""


def unknown_names(wanted, known, what) -> str:
    """A usage message for the names of `wanted` not in `known`, with close matches."""
    import difflib
    lines = []
    for name in wanted:
        if name not in known:
            close = difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.6)
            lines.append(f"{name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    return f"unknown {what}: " + "; ".join(lines) if lines else ""


def select(archs, stage, per_stratum, seed) -> list:
    """The keys a run covers: model types (stage 1) or the stage-2 sample's keys, narrowed
    to `archs` (names matched case-insensitively); an unknown name is a UsageError."""
    if stage == 1:
        known = models.model_types()
    else:
        from torch_tpu.compat import sample
        known = sample.keys(per_stratum, seed)
    if not archs:
        return known
    # Stage 2 takes a key or a model type, which selects every key of that type.
    names = set(known) | {k.split("/", 1)[1] for k in known if "/" in k}
    by_lower = {n.lower(): n for n in names}
    archs = [by_lower.get(a.lower(), a) for a in archs]
    what = "model types" if stage == 1 else f"keys or model types of the stage-2 sample " \
                                               f"(--per-stratum {per_stratum}, --seed {seed})"
    if bad := unknown_names(archs, sorted(names), what):
        raise UsageError(bad)
    return [k for k in known if k in archs or ("/" in k and k.split("/", 1)[1] in archs)]


def run(archs=None, limit=None, modes=("strict", "fused"), jobs=2, timeout=300.0, out=None,
        resume=False, progress=True, stage=1, per_stratum=1, seed=0) -> dict:
    t0 = time.monotonic()
    stem = "compat" if stage == 1 else "stage2"
    types = select(archs, stage, per_stratum, seed)[:limit]
    entries, earlier, wall_before = {}, {}, 0.0
    path = os.path.join(out, stem + ".json") if out else None
    if resume and path and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        # Every entry stays in the results (those outside --archs too) until rerun.
        earlier = old["entries"]
        wall = old["meta"].get("wall_s")
        wall_before = wall if isinstance(wall, (int, float)) else 0.0
        entries = {k: v for k, v in earlier.items() if k in types
                   and set(modes) <= {m for m, r in v["modes"].items() if not retry(r)}}
    todo = [t for t in types if t not in entries]
    if out:
        os.makedirs(out, exist_ok=True)

    def save():
        res = results_of({**earlier, **entries}, types, modes, jobs, timeout,
                         wall_before + time.monotonic() - t0)
        res["meta"]["stage"] = stage
        if stage == 2:
            res["meta"].update(per_stratum=per_stratum, seed=seed)
        if out:
            report.write(res, out, stem)
        return res

    if not todo:  # nothing left to run: no workers to start
        return save()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(todo), unit="model", file=sys.stderr)
    pool = None
    try:
        pool = Pool(jobs, ("torch_tpu.compat.__main__", "run_key"), (list(modes),),
                    os.path.join(out or ".", "workers.log"), max_jobs=20)
        for i, (key, res, msg) in enumerate(pool.map(todo, timeout), 1):
            if res is None:
                res = failed(modes, msg, key, pool.progress.get(key), timeout)
            # Modes of an earlier run that this one did not ask for stay.
            entries[key] = {**res, "modes": {**earlier.get(key, {}).get("modes", {}), **res["modes"]}}
            if bar:
                bar.set_postfix_str(f"{key}: " + " ".join(entries[key]["modes"][m]["status"] for m in modes))
                bar.update()
            if out and i % 10 == 0:
                save()  # --resume picks up from here
    except KeyboardInterrupt:
        if out:  # keep what finished, so that --resume goes on from it
            save()
            print(f"\ninterrupted: {len(entries)} of {len(types)} model types done, saved in "
                  f"{os.path.join(out, stem + '.json')}; --resume continues", file=sys.stderr)
        raise
    finally:
        if pool is not None:
            pool.close()
        if bar:
            bar.close()
    return save()


def results_of(entries, types, modes, jobs, timeout, wall_s) -> dict:
    import torch
    import transformers
    # This run's keys in order, then those an earlier run (--resume) finished.
    done = {t: entries[t] for t in types if t in entries}
    done.update((t, e) for t, e in sorted(entries.items()) if t not in done)
    return {"meta": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "modes": list(modes), "jobs": jobs, "timeout_s": timeout,
                     "wall_s": round(wall_s, 1)},
            "summary": report.summarize(done, modes), "entries": done}


def at_least_one(text) -> int:
    """argparse type: an integer >= 1 (--jobs 0 would start no worker and wait forever)."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_tpu.compat", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", help="comma-separated model types (default: all)")
    p.add_argument("--limit", type=at_least_one, help="only the first N model types")
    p.add_argument("--modes", default="strict,fused",
                   help="subset of strict,fused,compiled (compiled: torch.compile(model, "
                        "backend='tpu')); or cpu: the CPU step alone (triage of "
                        "config-unbuildable and cpu-fails)")
    p.add_argument("--jobs", type=at_least_one, default=2)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per model type")
    p.add_argument("--out", default="compat_results")
    p.add_argument("--resume", action="store_true",
                   help="keep the model types OUT finished (all of them, also outside "
                        "--archs); run the others, and those that timed out or crashed")
    p.add_argument("--baseline", help="a previous compat.json or baseline file")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a model type that passed in --baseline does not pass now")
    p.add_argument("--write-baseline", metavar="FILE", help="also write the statuses alone to FILE")
    p.add_argument("--stage", type=int, choices=(1, 2), default=1,
                   help="1: every model type; 2: the stratified sample of model classes")
    p.add_argument("--per-stratum", type=at_least_one, default=1, help="stage 2: classes per stratum")
    p.add_argument("--seed", type=int, default=0, help="stage 2: the sample's seed")
    p.add_argument("--report", metavar="BASELINE",
                   help="run nothing: write OUT/compat.{md,png} from a baseline file's "
                        "statuses (OUT/compat.json, a run's results, is left alone)")
    a = p.parse_args(argv)
    if a.report:
        with open(a.report) as f:
            res = report.results_of_baseline(json.load(f), models.representative)
        os.makedirs(a.out, exist_ok=True)
        report.write_rendering(res, a.out)
        print(report.summary_table(res["summary"]))
        print(f"Report: {os.path.join(a.out, 'compat.md')}, compat.png")
        return 0
    if a.timeout <= 0:
        p.error("--timeout must be positive")
    modes = tuple(dict.fromkeys(m.strip() for m in a.modes.split(",") if m.strip()))  # no repeats
    if not modes:
        p.error("--modes needs at least one mode")
    if bad := [m for m in modes if m not in ("strict", "fused", "compiled", "cpu")]:
        p.error(f"unknown mode {bad}")
    if a.check and not a.baseline:
        p.error("--check needs --baseline")
    archs = [x.strip() for x in (a.archs or "").split(",") if x.strip()] or None
    try:
        res = run(archs, a.limit, modes, a.jobs, a.timeout, a.out, a.resume, stage=a.stage,
                  per_stratum=a.per_stratum, seed=a.seed)
    except UsageError as e:
        p.error(str(e))
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
