"""The compatibility pipeline's reports: summary, Markdown tables, the chart, baselines."""
import collections
import json
import os

STATUSES = ("pass", "fallback", "mismatch", "error", "cpu-fails", "config-unbuildable")
NOT_OURS = ("cpu-fails", "config-unbuildable")


def summarize(entries: dict, modes) -> dict:
    """Per mode: counts per status, and the pass rate over the model types that run on CPU."""
    out = {"model_types": len(entries)}
    for mode in modes:
        c = collections.Counter(e["modes"][mode]["status"] for e in entries.values()
                                if mode in e["modes"])
        runnable = sum(n for s, n in c.items() if s not in NOT_OURS)
        judged = sum(1 for e in entries.values() if mode in e["modes"]
                     and e["modes"][mode].get("float64_judged"))
        replayed = sum(1 for e in entries.values() if e["modes"].get(mode, {}).get("replayed_draws"))
        by_grads = sum(1 for e in entries.values() if e["modes"].get(mode, {}).get("params_by_grads"))
        out[mode] = {"counts": {s: c.get(s, 0) for s in STATUSES},
                     "float64_judged": judged,
                     "replayed_draws": replayed,
                     "params_by_grads": by_grads,
                     "runnable": runnable,
                     "pass_pct": round(100 * c.get("pass", 0) / runnable, 1) if runnable else 0.0,
                     "pass_or_fallback_pct": round(100 * (c.get("pass", 0) + c.get("fallback", 0))
                                                   / runnable, 1) if runnable else 0.0}
        if mode == "compiled":
            out[mode].update(compiled_summary(entries))
    return out


def compiled_summary(entries: dict) -> dict:
    """What Dynamo made of the models that ran compiled: graphs, breaks, recompiles."""
    recs = [e["modes"]["compiled"] for e in entries.values() if "compiled" in e["modes"]
            and "compiled_graphs" in e["modes"]["compiled"]]
    return {"with_graph_breaks": sum(1 for r in recs if r.get("graph_breaks")),
            "graph_breaks": sum(r.get("graph_breaks", 0) for r in recs),
            "compiled_graphs": sum(r.get("compiled_graphs", 0) for r in recs),
            "with_recompiles": sum(1 for r in recs if r.get("compiled_recompiles"))}


def family_rates(entries: dict, modes) -> list:
    """Markdown rows: per family, each mode's passes over the types that run on CPU."""
    fams = collections.defaultdict(list)
    for e in entries.values():
        fams[e["family"]].append(e)
    rows = ["| family | " + " | ".join(modes) + " |", "|---" * (len(modes) + 1) + "|"]
    for fam in sorted(fams):
        cells = []
        for m in modes:
            st = [e["modes"][m]["status"] for e in fams[fam] if m in e["modes"]]
            runnable = [x for x in st if x not in NOT_OURS]
            cells.append(f"{st.count('pass')}/{len(runnable)}" if runnable else "-")
        rows.append(f"| {fam} | " + " | ".join(cells) + " |")
    return rows


def failure_classes(entries: dict) -> list:
    """Markdown lines: per mode and error class, the count and one example message."""
    classes, example = collections.Counter(), {}
    for t, e in sorted(entries.items()):
        for m, r in e["modes"].items():
            if r["status"] == "error":
                key = (m, r.get("class", "other"))
                classes[key] += 1
                example.setdefault(key, f"{t}: {r.get('message', '')}"[:200])
    return [f"- {m} {cls}: {n} (e.g. {example[(m, cls)]})" for (m, cls), n in sorted(classes.items())]


def compiled_section(entries: dict) -> list:
    """Markdown: graph breaks and recompiles of the compiled runs, the commonest reasons."""
    s = compiled_summary(entries)
    reasons = collections.Counter()
    for e in entries.values():
        for why in e["modes"].get("compiled", {}).get("graph_break_reasons", []):
            reasons[why] += 1
    out = ["", "## Compiled mode", "",
           "`torch.compile(model, backend=\"tpu\")` on the device copy; forward (train mode) and "
           "backward through the compiled graphs, graph breaks and the AdamW step eager (Strict).",
           "", f"{s['compiled_graphs']} ATen graphs compiled; {s['with_graph_breaks']} model types "
           f"with graph breaks ({s['graph_breaks']} breaks); {s['with_recompiles']} with recompiles.",
           "", "| type | compiled | graphs | graph breaks | recompiles | seconds |", "|---" * 6 + "|"]
    for t, e in sorted(entries.items()):
        r = e["modes"].get("compiled")
        if r is not None and "compiled_graphs" in r:
            out.append(f"| {t} | {r['status']} | {r['compiled_graphs']} | {r.get('graph_breaks', 0)} "
                       f"| {r.get('compiled_recompiles', 0)} | {r.get('seconds', '-')} |")
    if reasons:
        out += ["", "Graph-break reasons (model types):", ""]
        out += [f"- {n}: {why.replace('|', '/')}" for why, n in reasons.most_common(15)]
    return out


def summary_table(s: dict) -> str:
    modes = [m for m in s if m != "model_types"]
    lines = ["| mode | " + " | ".join(STATUSES)
             + " | pass % of runnable | float64-judged | CPU draws replayed | weights judged by gradients |",
             "|---" * (len(STATUSES) + 5) + "|"]
    for m in modes:
        c = s[m]["counts"]
        rate = f"{s[m]['pass_pct']} % of {s[m]['runnable']}" if s[m]["runnable"] else "-"
        lines.append(f"| {m} | " + " | ".join(str(c[x]) for x in STATUSES)
                     + f" | {rate} | {s[m].get('float64_judged', 0)}"
                     f" | {s[m].get('replayed_draws', 0)} | {s[m].get('params_by_grads', 0)} |")
    return "\n".join(lines)


def markdown(res: dict) -> str:
    s, entries = res["summary"], res["entries"]
    modes = res["meta"]["modes"]
    what = "model classes (stage 2)" if res["meta"].get("stage") == 2 else "model types"
    wall = res["meta"]["wall_s"]
    out = [f"# Model compatibility ({s['model_types']} {what}, transformers "
           f"{res['meta']['transformers']}, {wall}{' s' if isinstance(wall, (int, float)) else ''})", "",
           "Pass = forward outputs, gradients and parameters after one AdamW step match CPU's "
           "(float32, rtol 1e-3, atol 1e-4), with no CPU fallback. Float64-judged: a tensor "
           "outside that tolerance is as close to the step run in float64 on CPU as the "
           "conformance tool's rule asks (passes and fallbacks counted apart). CPU draws "
           "replayed: the model samples while it trains, and its device step was handed the "
           "CPU step's random values (compat/draws.py; the device's generators are tested "
           "apart). Weights judged by gradients: a weight outside CPU's tolerance after the "
           "AdamW step that is exactly AdamW applied to tpu's own gradient (within 1e-5) is "
           "judged by that gradient, which is compared on its own (AdamW moves a weight by "
           "about lr x g / (|g| + eps): near zero it multiplies a gradient's rounding by "
           "lr/eps = 10).", "", *([res["meta"]["note"], ""] if res["meta"].get("note") else []),
           summary_table(s), "",
           "## Pass rate per family", "", *family_rates(entries, modes), "",
           "## Per family", "", "| family | mode | " + " | ".join(STATUSES) + " |",
           "|---" * (len(STATUSES) + 2) + "|"]
    fams = collections.defaultdict(list)
    for e in entries.values():
        fams[e["family"]].append(e)
    for fam in sorted(fams):
        for m in modes:
            c = collections.Counter(e["modes"][m]["status"] for e in fams[fam] if m in e["modes"])
            out.append(f"| {fam} | {m} | " + " | ".join(str(c.get(x, 0)) for x in STATUSES) + " |")
    if any("stratum" in e for e in entries.values()):
        out += ["", "## Per task head (stage 2)", "", "| task head | mode | " + " | ".join(STATUSES)
                + " |", "|---" * (len(STATUSES) + 2) + "|"]
        by_head = collections.defaultdict(list)
        for e in entries.values():
            by_head[e["head"]].append(e)
        for head in sorted(by_head, key=str):  # a dead worker's entry may lack one
            for m in modes:
                c = collections.Counter(e["modes"][m]["status"] for e in by_head[head] if m in e["modes"])
                out.append(f"| {head} | {m} | " + " | ".join(str(c.get(x, 0)) for x in STATUSES) + " |")
    if classes := failure_classes(entries):  # errors only: not ours are not classed
        out += ["", "## Failure classes", ""] + classes
    if "compiled" in modes and any("compiled_graphs" in e["modes"].get("compiled", {}) for e in entries.values()):
        out += compiled_section(entries)
    one = "model class" if res["meta"].get("stage") == 2 else "model type"
    out += ["", f"## Every {one}", "", "| type | class | " + " | ".join(modes) + " | detail |",
            "|---" * (len(modes) + 3) + "|"]
    for t, e in sorted(entries.items()):
        details = sorted({r.get("message", "") for r in e["modes"].values() if r.get("message")})
        out.append(f"| {t} | {e['class'] or '-'} | " + " | ".join(e["modes"].get(m, {}).get("status", "-") for m in modes)
                   + f" | {'; '.join(details)[:160].replace('|', '/')} |")
    return "\n".join(out) + "\n"


def chart(res: dict, path: str) -> None:
    """Stacked bars: model types per status, per family × mode."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    modes = res["meta"]["modes"]
    fams = sorted({e["family"] for e in res["entries"].values()})
    bars = [(f, m) for f in fams for m in modes]
    colors = ["#2e7d32", "#9ccc65", "#ffb300", "#e53935", "#90a4ae", "#cfd8dc"]
    fig, ax = plt.subplots(figsize=(max(6, len(bars) * 0.7), 4))
    bottom = [0] * len(bars)
    for st, col in zip(STATUSES, colors):
        h = [sum(1 for e in res["entries"].values() if e["family"] == f and m in e["modes"]
                 and e["modes"][m]["status"] == st) for f, m in bars]
        ax.bar(range(len(bars)), h, bottom=bottom, color=col, label=st)
        bottom = [b + x for b, x in zip(bottom, h)]
    ax.set_xticks(range(len(bars)), [f"{f}\n{m}" for f, m in bars], fontsize=7)
    ax.set_ylabel("model types")
    ax.legend(fontsize=7, ncols=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(res: dict, out: str, stem: str = "compat") -> None:
    """A run's results: OUT/STEM.json, and its rendering."""
    with open(os.path.join(out, stem + ".json"), "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    write_rendering(res, out, stem)


def write_rendering(res: dict, out: str, stem: str = "compat") -> None:
    """OUT/STEM.md and OUT/STEM.png alone (--report: a baseline's statuses are no run's
    results, and must not replace them)."""
    with open(os.path.join(out, stem + ".md"), "w") as f:
        f.write(markdown(res))
    chart(res, os.path.join(out, stem + ".png"))


def results_of_baseline(baseline: dict, representative) -> dict:
    """A results dict, for `markdown` and `chart`, from a baseline file's statuses alone
    (no messages or timings): the checked-in baseline, merged from several runs, reports
    per family and mode like one run. `representative(type)` gives (head, family, class)."""
    modes = [m for m in ("strict", "fused", "compiled")
             if any(m in st for st in baseline["entries"].values())]
    entries = {}
    for t, st in baseline["entries"].items():
        head, family, cls = representative(t)
        entries[t] = {"family": family, "class": cls, "head": head,
                      "modes": {m: {"status": s} for m, s in st.items()}}
    meta = dict(baseline.get("meta", {}), modes=modes, wall_s="several runs, see the note")
    summary = summarize(entries, modes)
    for m in modes:  # a baseline keeps statuses alone: these counts are not known
        summary[m].update(float64_judged="-", replayed_draws="-", params_by_grads="-")
    return {"meta": meta, "summary": summary, "entries": entries}


def baseline_of(res: dict) -> dict:
    return {"meta": res["meta"], "summary": res["summary"],
            "entries": {t: {m: r["status"] for m, r in e["modes"].items()}
                        for t, e in res["entries"].items()}}


def regressions(baseline: dict, entries: dict) -> list:
    """Model types and modes that passed in `baseline` (a baseline file or a compat.json)
    and do not pass now."""
    lost = []
    for t, modes in sorted(baseline.get("entries", {}).items()):
        if "modes" in modes:
            modes = {m: r["status"] for m, r in modes["modes"].items()}
        for m, status in sorted(modes.items()):
            rec = entries.get(t, {}).get("modes", {}).get(m, {})
            now = rec.get("status")
            if status == "pass" and now is not None and now != "pass":
                why = f" ({rec['message'][:160]})" if rec.get("message") else ""
                lost.append(f"{t} {m}: was pass, now {now}{why}")
    return lost
