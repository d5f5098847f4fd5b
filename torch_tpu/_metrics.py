"""Counters of the backend: compiles, caches, executions, fallbacks, transfers."""
from . import _C


def metrics() -> dict:
    m = _C.metrics()
    m["lowered_ops"] = len(_C.lowered_ops())
    # Host round trips taken by decomposition kernels count like the C++ fallback's.
    from . import _decompositions
    for op, n in _decompositions.fallbacks.items():
        m["fallbacks"][op] = m["fallbacks"].get(op, 0) + n
    from ._internal import compile as _compile
    m.update(_compile.counters)
    return m


def metrics_report() -> str:
    m = metrics()
    lines = ["torch_tpu metrics"]
    for k in sorted(m):
        if k in ("fallbacks", "flushes"):
            continue
        v = m[k]
        lines.append(f"  {k:<22} {v:.3f}" if isinstance(v, float) else f"  {k:<22} {v}")
    fb = m["fallbacks"]
    lines.append(f"  fallbacks              {sum(fb.values())}")
    for op, n in sorted(fb.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {op:<30} {n}")
    if m.get("flushes"):
        lines.append("  deferred graph flushes by reason")
        for why, n in sorted(m["flushes"].items(), key=lambda kv: -kv[1]):
            lines.append(f"    {why:<30} {n}")
    return "\n".join(lines)
