"""_grouped_mm (MoE expert products) lowered natively: the offsets stay on the device, so
no host read and, in DeferAndFuse, no graph cut. Results are checked against a float64
reference of the grouped products (CPU's kernel sums in an ISA-dependent order) and
against CPU's own kernel, forward and backward, for every operand layout."""
import warnings

import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode
from conftest import no_fallbacks

FUSED = EagerMode.DEFER_AND_FUSE
DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


def bounds(offs):
    ends = [int(v) for v in offs]
    return list(zip([0] + ends[:-1], ends))


def reference(a, b, offs):
    """The grouped product in float64, by its definition (rows/cols of no group: 0)."""
    a, b = a.double(), b.double()
    if a.dim() == 3 and b.dim() == 3:
        return a @ b
    if a.dim() == 2 and b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float64)
        for g, (s, e) in enumerate(bounds(offs)):
            out[s:e] = a[s:e] @ b[g]
        return out
    if a.dim() == 3 and b.dim() == 2:
        out = torch.zeros(a.shape[1], b.shape[1], dtype=torch.float64)
        for g, (s, e) in enumerate(bounds(offs)):
            out[:, s:e] = a[g] @ b[:, s:e]
        return out
    out = torch.zeros(len(offs), a.shape[0], b.shape[1], dtype=torch.float64)
    for g, (s, e) in enumerate(bounds(offs)):
        out[g] = a[:, s:e] @ b[s:e]
    return out


# (a shape, b shape, offs): offs has empty groups and (2d x 3d, 3d x 2d) a tail in no group.
CASES = {
    "2d_3d": ((24, 16), (4, 16, 8), [5, 5, 13, 20]),
    "2d_3d_full": ((16, 16), (3, 16, 8), [0, 9, 16]),
    "3d_2d": ((3, 8, 16), (16, 24), [8, 8, 16]),
    "2d_2d": ((8, 32), (32, 8), [8, 8, 24, 32]),
    "3d_3d": ((3, 8, 16), (3, 16, 8), None),
}


def make(case, dtype, seed=0):
    sa, sb, offs = CASES[case]
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(sa, generator=g).to(dtype)
    b = torch.randn(sb, generator=g).to(dtype)
    return a, b, (None if offs is None else torch.tensor(offs, dtype=torch.int32))


def valid(case, t):
    """The part of a result every group covers (CPU leaves the rest uninitialized)."""
    _, _, offs = CASES[case]
    if case.startswith("2d_3d"):
        return t[: offs[-1]]
    if case == "3d_2d":
        return t[:, : offs[-1]]
    return t


def on_tpu(t):
    return None if t is None else t.to("tpu")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_reference_and_cpu(case, dtype):
    a, b, offs = make(case, dtype)
    with no_fallbacks():
        got = torch._grouped_mm(on_tpu(a), on_tpu(b), offs=on_tpu(offs)).cpu()
    ref = reference(a, b, offs)
    assert got.dtype == dtype and got.shape == ref.shape
    torch.testing.assert_close(got.double(), ref, **TOL[dtype])
    torch.testing.assert_close(valid(case, got), valid(case, torch._grouped_mm(a, b, offs=offs)), **TOL[dtype])
    if case in ("2d_3d", "3d_2d"):  # the part no group covers is zeros here
        rest = got[20:] if case == "2d_3d" else got[:, 16:]
        assert rest.numel() and (rest == 0).all()
    if case == "2d_2d":  # an empty group over K is a zero product
        assert (got[1] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["2d_3d", "2d_3d_full", "3d_3d"])
def test_backward_matches_reference(case, dtype):
    # The 2d x 3d backward runs _grouped_mm twice more: 2d x 3d (input grad) and
    # 2d x 2d grouped over tokens (weight grad).
    a, b, offs = make(case, dtype)
    w = torch.randn(reference(a, b, offs).shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    ta, tb = on_tpu(a).requires_grad_(), on_tpu(b).requires_grad_()
    with no_fallbacks():
        (torch._grouped_mm(ta, tb, offs=on_tpu(offs)) * on_tpu(w)).sum().backward()
    ra, rb = a.double().requires_grad_(), b.double().requires_grad_()
    (valid(case, reference(ra, rb, offs)) * valid(case, w.double())).sum().backward()
    torch.testing.assert_close(ta.grad.cpu().double(), ra.grad, **TOL[dtype])
    torch.testing.assert_close(tb.grad.cpu().double(), rb.grad, **TOL[dtype])
    ca, cb = a.clone().requires_grad_(), b.clone().requires_grad_()
    (torch._grouped_mm(ca, cb, offs=offs) * w).sum().backward()
    torch.testing.assert_close(valid(case, ta.grad.cpu()), valid(case, ca.grad), **TOL[dtype])
    torch.testing.assert_close(tb.grad.cpu(), cb.grad, **TOL[dtype])


def test_is_lowered_natively():
    # Not ATen's CompositeExplicitAutograd kernel (a loop of mm over offsets read on the host).
    assert "_grouped_mm" in torch_tpu._C.lowered_ops()


def test_inf_in_another_group_does_not_leak():
    # Dense products over all groups: an inf in one expert's weights must not reach the
    # rows (or the weight-gradient groups) of the others, as a mask product would.
    a, b, offs = make("2d_3d_full", torch.float32)
    b[0, 3, 2] = float("inf")  # group 0 is empty
    got = torch._grouped_mm(on_tpu(a), on_tpu(b), offs=on_tpu(offs)).cpu()
    assert torch.isfinite(got).all()
    x, y, offs2 = make("2d_2d", torch.float32)
    y[0, 1] = float("inf")  # row 0 of K belongs to group 0 only
    got2 = torch._grouped_mm(on_tpu(x), on_tpu(y), offs=on_tpu(offs2)).cpu()
    assert not torch.isfinite(got2[0]).all() and torch.isfinite(got2[1:]).all()


def test_moe_layer_is_one_fused_graph_in_defer_and_fuse():
    # Routing computed on the device (sort, histc, cumsum) feeds the offsets: the
    # grouped product needs no host value, so forward and backward fuse (nor does the first
    # call of an index signature: its description once printed the index values).
    torch.manual_seed(0)
    tokens, experts = torch.randn(32, 16), torch.randn(4, 16, 8)
    logits = torch.randn(32, 4)
    with torch_tpu.set_eager_mode(FUSED), no_fallbacks():
        x = tokens.to("tpu").requires_grad_()
        w = experts.to("tpu").requires_grad_()
        lg = logits.to("tpu")
        torch_tpu.synchronize()
        e0 = torch_tpu.metrics()["executions"]
        ids, perm = torch.sort(lg.argmax(-1))
        offs = torch.cumsum(torch.histc(ids.float(), bins=4, min=0, max=3), 0, dtype=torch.int32)
        y = torch._grouped_mm(x[perm], w, offs=offs)  # index.Tensor, as transformers gathers
        y.square().sum().backward()
        assert not torch_tpu._C.is_materialized(y)
        torch_tpu.synchronize()
        e1 = torch_tpu.metrics()["executions"]
        got_y, gx, gw = y.cpu(), x.grad.cpu(), w.grad.cpu()
        perm_c, offs_c = perm.cpu(), offs.cpu()  # ties sort in any order: use the device's
    # One graph: DeferAndFuse runs a graph of small ops with a backward as its forward
    # and the rest (tests/test_backward_split.py), two programs.
    assert e1 - e0 == (2 if torch_tpu._C._split_at_backward() else 1)
    ids_c = logits.argmax(-1)[perm_c]
    assert (ids_c[1:] >= ids_c[:-1]).all()
    assert offs_c.tolist() == torch.cumsum(torch.bincount(ids_c, minlength=4), 0).tolist()
    rx, rw = tokens.double().requires_grad_(), experts.double().requires_grad_()
    ry = reference(rx[perm_c], rw, offs_c)
    ry.square().sum().backward()
    torch.testing.assert_close(got_y.double(), ry, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx.double(), rx.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(gw.double(), rw.grad, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("what,call,message", [
    ("float64", lambda a, b, o: torch._grouped_mm(a.double(), b.double(), offs=o),
     "Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double"),
    ("int64 offs", lambda a, b, o: torch._grouped_mm(a, b, offs=o.long()), "Offsets have to be int32"),
    ("no offs", lambda a, b, o: torch._grouped_mm(a, b), "Have to provide offsets"),
    ("bias", lambda a, b, o: torch._grouped_mm(a, b, offs=o, bias=b[:, 0]), "Bias not supported yet"),
    ("batch", lambda a, b, o: torch._grouped_mm(a, b[:3], offs=o), "matrix batch sizes have to match"),
    ("contraction", lambda a, b, o: torch._grouped_mm(a[:, :8], b, offs=o),
     "contraction dimension of mat_a and mat_b must match"),
])
def test_bad_arguments_raise_as_on_cpu(what, call, message):
    a, b, offs = make("2d_3d", torch.float32)
    with pytest.raises(RuntimeError, match=message):
        call(a, b, offs)  # CPU's error
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning either
        with pytest.raises(RuntimeError, match=message):
            call(a.to("tpu"), b.to("tpu"), offs.to("tpu"))
