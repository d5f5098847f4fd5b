"""Bounded dynamic shapes: causal masks (tril/triu on the marked length) and the backward
of value-selecting reductions (max/sort/topk) and prod/norm along a static dimension.

Each test runs in a fresh interpreter: eager DeferAndFuse (bounded tensors), compiled
mode with TpuBackend(dynamism=True), or Strict (marks ignored: true sizes), against CPU
at several lengths under one bound; the bounded modes build no program after the first
lengths (one program for the bound).
"""
import pytest

from conftest import run_python_json

FUSED = {"TPU_DEFER_AND_FUSE": "1", "TPU_COMPILE_CACHE": "0"}
COMPILED = {"TPU_DEFER_AND_FUSE": "0", "TPU_COMPILE_CACHE": "0", "TPU_GAPS_COMPILE": "1"}
STRICT = {"TPU_DEFER_AND_FUSE": "0", "TPU_COMPILE_CACHE": "0"}
MODES = {"fused": FUSED, "compiled": COMPILED, "strict": STRICT}

PRELUDE = """
import json, os, warnings
warnings.filterwarnings("ignore")
import torch, torch_tpu
from torch_tpu import dynamism
torch._dynamo.config.cache_size_limit = 64
FUSED = os.environ.get("TPU_DEFER_AND_FUSE") == "1"
COMPILED = os.environ.get("TPU_GAPS_COMPILE") == "1"
LENGTHS = (5, 16, 3, 7, 11, 6, 13)  # (not 2 or 4: the batch and the width)

def marked(x, grad=False):
    xt = x.to("tpu")
    if grad:
        xt.requires_grad_()
    dynamism.mark_dynamic(xt, 1, 2, 16)
    return xt

def builds():  # programs compiled (eager), or graphs compiled (torch.compile)
    torch_tpu.synchronize()
    m = torch_tpu.metrics()
    return m["compiled_graphs"] if COMPILED else m["graph_compiles"]

def diff(a, b):
    return (a.detach().cpu().double() - b.detach().cpu().double()).abs().max().item()

def run(cases, grad):
    res = {}
    for name, f in cases.items():
        g = torch.compile(f, backend=torch_tpu.TpuBackend(dynamism=True)) if COMPILED else f
        errs, new = [], []
        for t in LENGTHS:
            torch.manual_seed(t)
            x = torch.randn(2, t, 4, dtype=torch.float64)
            before = builds()
            xt = marked(x.float(), grad)
            y = g(xt)
            if grad:
                (y ** 2).sum().backward()
            new.append(builds() - before)  # (the reads below copy prefixes per size)
            xc = x.clone().requires_grad_(grad)
            want = f(xc)
            e = [diff(y, want)]
            if grad:
                (want ** 2).sum().backward()
                e.append(diff(xt.grad, xc.grad))
            e = max(e)
            errs.append(e if e == e else 1e9)  # a nan counts as wrong
        res[name] = {"err": errs, "new": new}
    return res
"""


@pytest.mark.parametrize("mode", list(MODES))
def test_causal_masks_from_the_marked_length(mode):
    # tril/triu on a size of the marked length was refused ("not in the list of ops
    # supported across a dynamic dimension") in DeferAndFuse and compiled mode.
    out = run_python_json(PRELUDE + """
def ones_triu(x):
    T = x.shape[1]
    return x @ x.transpose(1, 2) + torch.ones(T, T, dtype=x.dtype, device=x.device).triu(1)

def neg_inf_triu(x):
    T = x.shape[1]
    mask = torch.full((T, T), float("-inf"), dtype=x.dtype, device=x.device).triu(1)
    return torch.softmax(x @ x.transpose(1, 2) / 2 + mask, -1) @ x

cases = {"ones_triu": ones_triu, "neg_inf_triu": neg_inf_triu,
         "tril_scores": lambda x: (x @ x.transpose(1, 2)).tril().sum(-1),
         "triu_offset": lambda x: (x @ x.transpose(1, 2)).triu(-1),
         "tril_offset": lambda x: (x @ x.transpose(1, 2)).tril(2)}
res = run(cases, grad=False)
res["grad"] = run({"tril_grad": lambda x: (x @ x.transpose(1, 2)).tril(),
                   "causal_grad": neg_inf_triu}, grad=True)
print(json.dumps(res))
""", env=MODES[mode], timeout=600)
    grads = out.pop("grad")
    for k, r in list(out.items()) + list(grads.items()):
        assert max(r["err"]) < 1e-4, (k, r)
        if mode != "strict":
            # one program for the bound: none built at the last new lengths (the first
            # steps build theirs as a plain step's do, its gradient's first accumulation)
            assert r["new"][-3:] == [0, 0, 0], (k, r)


@pytest.mark.parametrize("mode", list(MODES))
def test_backward_of_selecting_reductions_along_a_static_dim(mode):
    # The backward of max/sort/topk along a static dimension of a marked tensor scatters
    # the gradient into zeros: refused (scatter) in both modes, and in DeferAndFuse the
    # zeros had the true sizes as plain ints. prod's and norm's backward were refused in
    # DeferAndFuse (a cat with plain-int ones; an in-place masked_fill_).
    out = run_python_json(PRELUDE + """
cases = {
    "max": lambda x: x.max(-1).values,
    "max_keepdim": lambda x: x.max(-1, keepdim=True).values * x,
    "min": lambda x: torch.min(x, dim=2)[0],
    "sort": lambda x: x.sort(-1).values,
    "sort_desc": lambda x: x.sort(-1, descending=True).values[..., :2],
    "topk": lambda x: x.topk(2, -1).values,
    "prod": lambda x: x.prod(-1),
    "prod_keepdim": lambda x: x.prod(-1, keepdim=True),
    "norm": lambda x: x.norm(dim=-1),
    "vector_norm": lambda x: torch.linalg.vector_norm(x, dim=-1),
}
res = run(cases, grad=True)
# prod's gradient with a zero in a row (the product of the others), as CPU's
x = torch.randn(2, 5, 4)
x[0, 1, 2] = 0.0
xt = marked(x, grad=True)
xc = x.clone().requires_grad_()
xt.prod(-1).sum().backward(); xc.prod(-1).sum().backward()
res["prod_zero"] = {"err": [diff(xt.grad, xc.grad)], "new": [0, 0, 0]}  # (values only)
print(json.dumps(res))
""", env=MODES[mode], timeout=600)
    for k, r in out.items():
        assert max(r["err"]) < 1e-4, (k, r)
        if mode == "compiled":
            assert r["new"][-3:] == [0, 0, 0], (k, r)  # one graph for the bound


def test_selecting_backward_builds_one_program_for_the_bound():
    # DeferAndFuse: one step using them all compiles nothing at new lengths once its
    # first steps have (as a plain step's gradient accumulation does).
    out = run_python_json(PRELUDE + """
def step(x):
    return x.max(-1).values + x.sort(-1).values[..., 1] + x.topk(2, -1).values.sum(-1) + \\
        x.prod(-1) + x.norm(dim=-1)
print(json.dumps(run({"step": step}, grad=True)))
""", env=FUSED, timeout=600)
    assert max(out["step"]["err"]) < 1e-4, out
    assert out["step"]["new"][-3:] == [0, 0, 0], out
