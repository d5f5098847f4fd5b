"""gather / scatter / scatter_add / scatter_reduce with a 1-D index broadcast along the
other dims (PyG's `dst.unsqueeze(-1).expand(E, F)`, s54 GNN probe) lower as the row
gather/scatter index_select and index_add use, told from the index's layout (stride 0).
Before, each index element became a coordinate tuple (an s64[E, F, 2] tensor): 5-23x
slower, and the GraphSAGE step 3-4x slower in DeferAndFuse than in Strict. Values,
gradients and errors are CPU's; the CPU reference reads a contiguous copy of the index
(CPU's own gather of an expanded int32 index returns wrong rows in torch 2.13)."""
import glob
import json
import os
import shutil
import tempfile

import pytest
import torch

import torch_tpu
from conftest import native, run_python
from torch_tpu import EagerMode

MODES = {"strict": EagerMode.DEFER_NEVER, "debug": EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING,
         "fused": EagerMode.DEFER_AND_FUSE}
REDUCES = ["sum", "prod", "mean", "amax", "amin"]


@pytest.fixture(params=list(MODES))
def mode(request):
    with torch_tpu.set_eager_mode(MODES[request.param]):
        yield request.param


def _graph(n=7, e=12, f=5, itype=torch.int64, seed=0, unique=False):
    g = torch.Generator().manual_seed(seed)
    dst = torch.randperm(n, generator=g)[:e] if unique else torch.randint(0, n, (e,), generator=g)
    if not unique:
        dst[:3] = dst[0]  # duplicates for sure
    return dst.to(itype), torch.randn(e, f, generator=g), torch.randn(n, f, generator=g)


def _both(fn, dst, *tensors, expand):
    """fn(index, *tensors) on CPU (contiguous index) and on tpu (the expanded view)."""
    want = fn(expand(dst).contiguous(), *tensors)
    t_idx = expand(dst.to("tpu"))
    assert 0 in t_idx.stride()  # the layout this is about
    got = fn(t_idx, *(t.to("tpu") for t in tensors))
    return want, got.cpu()


def _expand2(dst, f=5):
    return dst.unsqueeze(-1).expand(dst.numel(), f)


@pytest.mark.parametrize("itype", [torch.int64, torch.int32])
@pytest.mark.parametrize("red", REDUCES)
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_matches_cpu(mode, itype, red, include_self):
    dst, src, self_ = _graph(itype=itype)
    with native():
        want, got = _both(lambda i, s, x: s.scatter_reduce(0, i, x, red, include_self=include_self),
                          dst, self_, src, expand=_expand2)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("itype", [torch.int64, torch.int32])
def test_scatter_add_gather_scatter_match_cpu(mode, itype):
    dst, src, self_ = _graph(itype=itype)
    with native():
        for fn in (lambda i, s, x: s.scatter_add(0, i, x),
                   lambda i, s, x: s.gather(0, i),
                   lambda i, s, x: s.scatter(0, i, x, reduce="add"),
                   lambda i, s, x: s.scatter(0, i, 2.5, reduce="multiply"),
                   lambda i, s, x: torch.zeros_like(s).scatter_add_(0, i, x)):
            want, got = _both(fn, dst, self_, src, expand=_expand2)
            torch.testing.assert_close(got, want)
    # A plain scatter with duplicates keeps any one of them: unique targets here.
    dst, src, self_ = _graph(itype=itype, unique=True, e=6)
    with native():
        for fn in (lambda i, s, x: s.scatter(0, i, x), lambda i, s, x: s.scatter(0, i, -1.0)):
            want, got = _both(fn, dst, self_, src, expand=_expand2)
            assert torch.equal(got, want)


def test_index_narrower_than_self_and_other_dims(mode):
    """The index may be shorter than self along the other dims (only its leading part is
    read or written); dim 1 of a 3-D tensor; an index repeated along dim too."""
    g = torch.Generator().manual_seed(3)
    dst = torch.tensor([0, 3, 3, 1, 0, 2, 3])
    self_ = torch.randn(4, 6, generator=g)
    src = torch.randn(7, 6, generator=g)
    narrow = lambda d: d.unsqueeze(-1).expand(7, 4)  # noqa: E731
    with native():
        for fn in (lambda i, s, x: s.scatter_add(0, i, x),
                   lambda i, s, x: s.scatter_reduce(0, i, x, "mean", include_self=False),
                   lambda i, s, x: s.scatter_reduce(0, i, x, "amax"),
                   lambda i, s, x: torch.cat([s, s]).gather(0, i)):
            want, got = _both(fn, dst, self_, src, expand=narrow)
            torch.testing.assert_close(got, want)
        x3 = torch.randn(2, 4, 3, generator=g)
        s3 = torch.randn(2, 7, 3, generator=g)
        mid = lambda d: d.view(1, 7, 1).expand(2, 7, 3)  # noqa: E731
        for fn in (lambda i, s, x: s.scatter_add(1, i, x),
                   lambda i, s, x: s.scatter_reduce(1, i, x, "prod", include_self=False),
                   lambda i, s, x: s.gather(1, i)):
            want, got = _both(fn, dst, x3, s3, expand=mid)
            torch.testing.assert_close(got, want)
        one = lambda d: d[1].expand(5, 6)  # noqa: E731  (index 3 everywhere)
        want, got = _both(lambda i, s, x: s.scatter_add(0, i, x[:5]), dst, self_, src, expand=one)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.float64])
def test_other_dtypes_every_reduce(mode, dtype):
    """Integer means floor; bool sums are ors. A narrow index: the counts stop where it ends."""
    dst, src, self_ = _graph(seed=6, f=6)
    src, self_ = (src * 5).to(dtype), (self_ * 5).to(dtype)
    narrow = lambda d: d.unsqueeze(-1).expand(12, 4)  # noqa: E731
    reduces = ["sum", "amax", "amin"] if dtype == torch.bool else REDUCES
    for red in reduces:
        for inc in (True, False):
            want, got = _both(lambda i, s, x: s.scatter_reduce(0, i, x, red, include_self=inc),
                              dst, self_, src, expand=narrow)
            assert torch.equal(got, want), (red, inc)


def test_float_sums_match_the_per_element_scatter_bitwise(mode):
    """The row scatter adds in the same (index) order as the per-element one."""
    dst, src, self_ = _graph(n=50, e=400, f=16, seed=5)
    d, s, x = dst.to("tpu"), src.to("tpu"), self_.to("tpu")
    rows = d.unsqueeze(-1).expand(400, 16)
    for fn in (lambda i: x.scatter_add(0, i, s),
               lambda i: x.scatter_reduce(0, i, s, "mean", include_self=False)):
        assert torch.equal(fn(rows).cpu(), fn(rows.contiguous()).cpu())


def test_bf16_accumulates_in_f32(mode):
    dst, src, self_ = _graph(n=3, e=64, f=4, seed=2)
    src, self_ = src.bfloat16(), self_.bfloat16()
    for fn in (lambda i, s, x: s.scatter_add(0, i, x),
               lambda i, s, x: s.scatter_reduce(0, i, x, "mean", include_self=False)):
        want, got = _both(fn, dst, self_, src, expand=lambda d: _expand2(d, 4))
        assert torch.equal(got, want)


@pytest.mark.parametrize("shape", [(0, 5), (4, 0)])
def test_empty_index(mode, shape):
    e, f = shape
    dst = torch.tensor([1, 0, 2, 2])[:e]
    self_ = torch.randn(3, 5)
    src = torch.randn(4, 5)
    exp = lambda d: d.unsqueeze(-1).expand(e, f)  # noqa: E731
    for fn in (lambda i, s, x: s.scatter_add(0, i, x),
               lambda i, s, x: s.scatter_reduce(0, i, x, "amin", include_self=False),
               lambda i, s, x: s.gather(0, i)):
        want, got = _both(fn, dst, self_, src, expand=exp)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("itype", [torch.int64, torch.int32])
def test_gradients_match_cpu(mode, itype):
    """Each backward runs its gather/scatter_add with the saved expanded index."""
    dst, src, self_ = _graph(itype=itype, seed=4)
    src[5] = src[4]  # ties for amax/amin
    g = torch.Generator().manual_seed(9)
    w = torch.randn(7, 5, generator=g)
    cases = [("add", lambda i, s, x: s.scatter_add(0, i, x))]
    cases += [(f"{r} {inc}", (lambda r, inc: lambda i, s, x: s.scatter_reduce(0, i, x, r, include_self=inc))(r, inc))
              for r in REDUCES for inc in (True, False)]
    cases += [("gather", lambda i, s, x: s.gather(0, i).sum(0, keepdim=True) * x[:1])]

    def grads(fn, idx, s, x, wt):
        s = s.detach().requires_grad_()
        x = x.detach().requires_grad_()
        out = fn(idx, s, x)
        (out * wt[: out.shape[0]]).sum().backward()
        return s.grad, x.grad

    for name, fn in cases:
        want = grads(fn, _expand2(dst).contiguous(), self_, src, w)
        got = grads(fn, _expand2(dst.to("tpu")), self_.to("tpu"), src.to("tpu"), w.to("tpu"))
        for a, b in zip(got, want):
            torch.testing.assert_close(a.cpu(), b, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("bad", [7, -1])
def test_out_of_range_index_raises_cpus_error(mode, bad):
    dst, src, self_ = _graph()
    dst[4] = bad
    for fn in (lambda i, s, x: s.scatter_add(0, i, x),
               lambda i, s, x: s.scatter_reduce(0, i, x, "mean"),
               lambda i, s, x: s.gather(0, i)):
        with pytest.raises(RuntimeError, match="out of bounds"):
            fn(_expand2(dst), self_, src)
        with pytest.raises(RuntimeError, match="index out of bounds for dimension 0 with size 7"):
            fn(_expand2(dst.to("tpu")), self_.to("tpu"), src.to("tpu")).cpu()


@pytest.mark.parametrize("fused", ["0", "1"])
def test_programs_have_no_per_element_coordinates(fused):
    """The programs XLA receives (forward and backward): no s64[E, F, 2] coordinates."""
    code = """
import glob, json, os, torch, torch_tpu
dst = torch.tensor([0, 3, 3, 1, 6, 2], device="tpu")
idx = dst.unsqueeze(-1).expand(6, 5)
x = torch.randn(6, 5, device="tpu", requires_grad=True)
s = torch.randn(7, 5, device="tpu", requires_grad=True)
out = s.scatter_reduce(0, idx, x, "mean", include_self=False) + s.scatter_add(0, idx, x)
(out.gather(0, idx) * x).sum().backward()
torch.tpu.synchronize()
texts = [open(f).read() for f in glob.glob(os.path.join(os.environ["DUMP"], "*before_optimizations.txt"))]
print(json.dumps([sum(" scatter(" in t for t in texts), sum(" gather(" in t for t in texts),
                  sum("s64[6,5,2]" in t for t in texts)]))
"""
    dump = tempfile.mkdtemp(prefix="tpu_rowscatter_dump_")
    try:
        r = run_python(code, env={"XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text",
                                  "DUMP": dump, "TPU_COMPILE_CACHE": "0",
                                  "TPU_DEFER_AND_FUSE": fused, "TPU_LAUNCH_BLOCKING": "0"})
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    scatters, gathers, coords = json.loads(r.stdout.strip().splitlines()[-1])
    assert scatters > 0 and gathers > 0  # the dump holds the programs
    assert coords == 0
