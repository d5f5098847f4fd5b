"""Compiled bounded dynamic shapes: a static index or slice along a marked dimension.

`x[:, 5]`, `x.select(1, 5)`, `x[:, -3]`, `x.narrow(1, 4, 2)`, `x[:, :6]`, `x[:, 2:100]`
under torch.compile(backend=TpuBackend(dynamism=True)) with
`dynamism.mark_dynamic(x, 1, 2, 8)`: the index's guard (the size >= 6) used to conflict
with Dynamo's strict min/max constraint (ConstraintViolationError at every length). Now
the values and gradients are CPU's at each length in range, an index past the true size
raises CPU's exception with CPU's message (the true size, not the symbol), and the
graphs are few: the guard splits the bounds into a bounded number of pieces, and
lengths met again compile nothing.

Each test runs in a fresh interpreter against float64 CPU.
"""
import pytest

from conftest import run_python_json

COMPILED = {"TPU_DEFER_AND_FUSE": "0", "TPU_COMPILE_CACHE": "0"}
LENGTHS = (7, 3, 8, 2, 6, 5, 4, 7, 3, 8)

PRELUDE = """
import json, re, warnings
warnings.filterwarnings("ignore")
import torch, torch_tpu
from torch_tpu import dynamism
torch._dynamo.config.cache_size_limit = 64

def graphs():
    torch_tpu.synchronize()
    return torch_tpu.metrics()["compiled_graphs"]

def diff(a, b):
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1)).item() if b.numel() else 0.0

def run(cases, lengths):
    res = {}
    for name, f in cases.items():
        g = torch.compile(f, backend=torch_tpu.TpuBackend(dynamism=True))
        rows = []
        for t in lengths:
            torch.manual_seed(t)
            x = torch.randn(3, t, 4, dtype=torch.float64)
            xc = x.clone().requires_grad_()
            try:
                want = f(xc)
                (want ** 2).sum().backward()
                cpu_err = None
            except Exception as e:
                cpu_err = (type(e).__name__, str(e))
            before = graphs()
            xt = x.float().to("tpu").requires_grad_()
            dynamism.mark_dynamic(xt, 1, 2, 8)
            row = {"t": t}
            try:
                y = g(xt)
                (y ** 2).sum().backward()
                row["shape_ok"] = cpu_err is None and tuple(y.shape) == tuple(want.shape)
                row["err"] = max(diff(y, want), diff(xt.grad, xc.grad)) if row["shape_ok"] else 1e9
            except Exception as e:
                row["raised"] = [type(e).__name__, str(e).splitlines()[0] if str(e) else "",
                                 isinstance(e, (IndexError, RuntimeError))]
                row["names_symbol"] = bool(re.search(r"\\bs\\d+\\b", str(e).split("from user code")[0]))
                row["cpu_msg_in"] = cpu_err is not None and cpu_err[1] in str(e)
                row["same_type"] = cpu_err is not None and (
                    type(e).__name__ == cpu_err[0] or isinstance(e, RuntimeError) and cpu_err[0] == "RuntimeError")
            row["cpu_err"] = cpu_err
            row["new"] = graphs() - before
            rows.append(row)
        res[name] = rows
    return res
"""


def _check(out, max_graphs):
    for name, rows in out.items():
        for r in rows:
            if r["cpu_err"] is None:
                assert "raised" not in r, (name, r)
                assert r["shape_ok"] and r["err"] < 1e-5, (name, r)
            else:  # CPU raises: the same exception, CPU's message (the true size)
                assert "raised" in r, (name, r)
                assert r["same_type"] and r["cpu_msg_in"] and not r["names_symbol"], (name, r)
        news = [r["new"] for r in rows]
        # a few graphs over the bounds (a piece per side of the index's guard, forward
        # and backward), not one per length; none at lengths met again
        assert sum(news) <= max_graphs, (name, news)
        assert sum(news[-3:]) == 0, (name, news)


def test_static_index_on_a_marked_dim():
    out = run_python_json(PRELUDE + f"""
cases = {{"getitem": lambda x: x[:, 5], "select": lambda x: x.select(1, 5),
         "negative": lambda x: x[:, -3], "narrow": lambda x: x.narrow(1, 4, 2),
         "index_then_sum": lambda x: x[:, 1] * x.sum(1), "last": lambda x: x[:, -1] * 2}}
print(json.dumps(run(cases, {LENGTHS})))
""", env=COMPILED, timeout=900)
    _check(out, max_graphs=4)
    # the out-of-range lengths were met (IndexError at 2..5 for x[:, 5], 2 for x[:, -3])
    assert sum("raised" in r for r in out["getitem"]) == 5
    assert sum("raised" in r for r in out["negative"]) == 1
    assert any(r["cpu_err"] and r["cpu_err"][0] == "RuntimeError" for r in out["narrow"])


def test_static_slice_on_a_marked_dim():
    out = run_python_json(PRELUDE + f"""
cases = {{"head": lambda x: x[:, :6], "past_end": lambda x: x[:, 2:100],
         "tail": lambda x: x[:, 2:], "middle": lambda x: x[:, 1:5].cumsum(1)}}
print(json.dumps(run(cases, {LENGTHS})))
""", env=COMPILED, timeout=900)
    _check(out, max_graphs=6)


def test_sum_last_backward_expanded_gradient():
    # sum(-1)'s gradient is expanded (stride 0): laying it out at the true size copied
    # into a stride-0 tensor ("more than one element of the written-to tensor ...").
    out = run_python_json(PRELUDE + f"""
cases = {{"sum_last": lambda x: x.sum(-1), "mean_last": lambda x: x.mean(-1) * 2}}
print(json.dumps(run(cases, {LENGTHS})))
""", env=COMPILED, timeout=900)
    _check(out, max_graphs=2)
