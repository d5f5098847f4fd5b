"""Bounded dynamic shapes: valid code that crashed (session 59's probe).

Each test runs in a fresh interpreter: eager DeferAndFuse (its bounded tensors) or
compiled mode with TpuBackend(dynamism=True), against CPU at several lengths.
"""
import pytest

from conftest import run_python_json

FUSED = {"TPU_DEFER_AND_FUSE": "1", "TPU_COMPILE_CACHE": "0"}
COMPILED = {"TPU_DEFER_AND_FUSE": "0", "TPU_COMPILE_CACHE": "0"}

PRELUDE = """
import copy, json, os, warnings
warnings.filterwarnings("ignore")
import torch, torch.nn as nn, torch.nn.functional as F, torch_tpu
from torch_tpu import dynamism
torch._dynamo.config.cache_size_limit = 64
COMPILED = os.environ.get("TPU_DEFER_AND_FUSE") != "1"

def marked(x, lo=4, hi=32):
    xt = x.to("tpu")
    dynamism.mark_dynamic(xt, 1, lo, hi)
    return xt

def wrap(f):
    if not COMPILED:
        return f
    torch._dynamo.reset()
    return torch.compile(f, backend=torch_tpu.TpuBackend(dynamism=True))

def diff(a, b):
    return (a.detach().cpu().double() - b.detach().cpu().double()).abs().max().item()

def inner_error(e):
    while getattr(e, "inner_exception", None) or e.__cause__:
        e = getattr(e, "inner_exception", None) or e.__cause__
    return e
"""


def test_a_transposed_bounded_tensor_reshapes_views_and_multiplies():
    # The wrapper claimed contiguous strides whatever its padded value's layout: a
    # transposed one's .contiguous() returned itself and the view of the padded value
    # failed ("view size is not compatible"), as did reshape, linear and matmul.
    out = run_python_json(PRELUDE + """
cases = {
    "linear": lambda a, w, b: F.linear(a.transpose(0, 1), w, b),
    "contiguous_view": lambda a, w, b: a.transpose(0, 1).contiguous().view(-1, 32).sum(0),
    "reshape": lambda a, w, b: a.transpose(0, 1).reshape(-1, 32).sum(0),
    "matmul": lambda a, w, b: a.transpose(0, 1) @ w.t(),
    "permute_reshape": lambda a, w, b: a.permute(2, 0, 1).reshape(32, -1).sum(1),
}
torch.manual_seed(0)
w, b = torch.randn(16, 32), torch.randn(16)
res = {k: [] for k in cases}
layout = []
for t in (5, 9, 32):
    x = torch.randn(2, t, 32)
    xt = marked(x)
    y = xt.transpose(0, 1)
    layout.append([y.is_contiguous(), y.contiguous().is_contiguous(), xt.is_contiguous()])
    for k, f in cases.items():
        res[k].append(diff(f(xt, w.to("tpu"), b.to("tpu")), f(x, w, b)))
print(json.dumps({"res": res, "layout": layout}))
""", env=FUSED)
    assert out["layout"] == [[False, True, True]] * 3, out["layout"]
    for k, errs in out["res"].items():
        assert max(errs) < 1e-4, (k, errs)


def test_stock_encoder_layer_and_multihead_attention_train_at_every_length():
    # nn.MultiheadAttention(batch_first=True) transposes its input; linear's bias is an
    # in-place add_ on the matmul's result; the packed projection's gradient goes through
    # select_backward with plain-int sizes. All failed at every length.
    out = run_python_json(PRELUDE + """
torch.manual_seed(0)
ref = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).double()
enc = copy.deepcopy(ref).float().to("tpu")
mha_ref = nn.MultiheadAttention(32, 4, batch_first=True).double()
mha = copy.deepcopy(mha_ref).float().to("tpu")
res = {"enc": [], "grad": [], "mha": [], "kind": []}
for t in (9, 32, 5):
    x = torch.randn(2, t, 32, dtype=torch.float64)
    xt = marked(x.float())
    enc.zero_grad(); ref.zero_grad()
    y = enc(xt)
    res["kind"].append(type(y).__name__)
    (y ** 2).mean().backward()
    (ref(x) ** 2).mean().backward()
    res["enc"].append(diff(y, ref(x)))
    res["grad"].append(max(diff(p.grad, q.grad) for p, q in zip(enc.parameters(), ref.parameters())))
    res["mha"].append(diff(mha(xt, xt, xt, need_weights=False)[0], mha_ref(x, x, x, need_weights=False)[0]))
print(json.dumps(res))
""", env=FUSED)
    assert out["kind"] == ["BoundedTensor"] * 3, out
    assert max(out["enc"]) < 1e-5 and max(out["mha"]) < 1e-5, out
    assert max(out["grad"]) < 1e-5, out


def test_in_place_pointwise_ops_on_bounded_tensors():
    # In-place pointwise ops write the padded value (views see it); a write into the
    # padded copy of a marked tensor would not reach the tensor: refused by name.
    out = run_python_json(PRELUDE + """
res = []
for t in (5, 11):
    x = torch.randn(2, t, 4)
    xt = marked(x)
    h = xt * 2
    v = h.transpose(1, 2)
    h.add_(1.0).mul_(torch.arange(4.).to("tpu"))
    h += xt
    want = (x * 2 + 1) * torch.arange(4.) + x
    res.append([diff(h, want), diff(v, want.transpose(1, 2)), diff(h.sum(1), want.sum(1))])
errors = []
for f in (lambda: xt.add_(1.0), lambda: xt[:, :2].mul_(2.0), lambda: xt.transpose(0, 1).relu_()):
    try:
        f()
        errors.append("no error")
    except NotImplementedError as e:
        errors.append(str(e))
errors.append(diff(xt, x))
print(json.dumps({"res": res, "errors": errors}))
""", env=FUSED)
    assert max(max(r) for r in out["res"]) < 1e-5, out["res"]
    assert all("marked with mark_dynamic" in e for e in out["errors"][:3]), out["errors"]
    assert out["errors"][3] == 0.0


def test_requires_grad_set_after_mark_dynamic_reaches_the_gradient():
    # mark_dynamic made the padded copy at once; requires_grad_() after it left that copy
    # outside autograd (no gradient for x, "does not require grad" at backward).
    out = run_python_json(PRELUDE + """
res = []
for t in (6, 13):
    x = torch.randn(2, t, 4)
    xt = marked(x)
    xt.requires_grad_()
    y = (xt * xt).logsumexp(-1).sum()
    y.backward()
    xc = x.clone().requires_grad_()
    (xc * xc).logsumexp(-1).sum().backward()
    res.append([y.requires_grad, diff(xt.grad, xc.grad)])
print(json.dumps(res))
""", env=FUSED)
    assert all(r[0] for r in out) and max(r[1] for r in out) < 1e-5, out
