"""The add* matrix products (addmm, baddbmm, addbmm, addmv, addr) refuse bad arguments as
CPU does: the same error type and message, in CPU's order of checks, raised at the call
with every tensor untouched, in each eager mode and compiled.

tpu ran PyTorch's Python meta functions and a kernel check that expanded self before
anything compared the operands: `W.addmm_(A, B)` with swapped LoRA factors said "The
expanded size of the tensor (3) must match ..." where CPU says "mat1 and mat2 shapes
cannot be multiplied (3x12 and 8x3)"; an in-place self of the wrong shape, a 3-D self
or a 2-D addmv self got expand's or an internal error; out= forms got the meta
functions' words; addr (a composite: self + outer) resized an in-place self that
broadcasts, broadcast a 3-D self, and took a floating beta for integers."""
import re

import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING, EagerMode.DEFER_AND_FUSE]
F, D, L, B = torch.float32, torch.float64, torch.int64, torch.bool


@pytest.fixture(params=MODES, ids=lambda m: m.name)
def mode(request):
    with torch_tpu.set_eager_mode(request.param):
        yield request.param


def inputs(*specs):
    """CPU tensors of (shape, dtype) specs (a bare shape is float32), with fixed values."""
    g = torch.Generator().manual_seed(0)
    out = []
    for s in specs:
        shape, dtype = s if len(s) == 2 and isinstance(s[1], torch.dtype) else (s, F)
        t = torch.randn(shape, generator=g)
        out.append(t.to(dtype) if dtype != B else t > 0)
    return out


def call(op, form, *specs, out=((0,), F), **kw):
    """(inputs, run): op(self, a, b, **kw) as `form` ('fn', 'inplace' or 'out')."""
    ts = inputs(*specs, *([out] if form == "out" else []))
    if form == "fn":
        return ts, lambda t: getattr(torch, op)(*t, **kw)
    if form == "inplace":
        return ts, lambda t: getattr(t[0], op + "_")(*t[1:], **kw)
    return ts, lambda t: getattr(torch, op)(*t[:-1], out=t[-1], **kw)


FORMS = ("fn", "inplace", "out")
CASES = {}


def cases(name, op, *specs, forms=FORMS, **kw):
    for form in forms:
        CASES[f"{name}-{form}"] = (op, form, specs, kw)


# addmm(self, mat1, mat2): the LoRA merge with its factors swapped, and its neighbours
cases("addmm_inner", "addmm", (8, 12), (3, 12), (8, 3))
cases("addmm_inner_bias", "addmm", (3,), (3, 12), (8, 3))
cases("addmm_inner_bad_self", "addmm", (5, 7), (3, 12), (8, 3))
cases("addmm_bad_self", "addmm", (5, 7), (8, 3), (3, 12))
cases("addmm_self_too_narrow", "addmm", (8, 10), (8, 3), (3, 12))
cases("addmm_3d_self", "addmm", (2, 8, 12), (8, 3), (3, 12))
cases("addmm_1d_mat1", "addmm", (8, 12), (3,), (3, 12))
cases("addmm_3d_mat2", "addmm", (8, 12), (8, 3), (1, 3, 12))
cases("addmm_dtype_and_inner", "addmm", ((8, 12), D), (3, 12), (8, 3))
cases("addmm_mat2_dtype_and_bad_self", "addmm", (5, 7), (8, 3), ((3, 12), D))
cases("addmm_self_broadcasts", "addmm", (12,), (8, 3), (3, 12), forms=("inplace",))
cases("addmm_0d_self", "addmm", (), (8, 3), (3, 12), forms=("inplace",))
cases("addmm_out_dtype", "addmm", (8, 12), (8, 3), (3, 12), out=((0,), D), forms=("out",))
cases("addmm_out_dtype_and_bad_self", "addmm", (5, 7), (8, 3), (3, 12), out=((0,), L), forms=("out",))
cases("addmm_out_dtype_and_inner", "addmm", (8, 12), (3, 12), (8, 3), out=((0,), D), forms=("out",))
# baddbmm(self, batch1, batch2)
cases("baddbmm_inner", "baddbmm", (2, 8, 12), (2, 8, 3), (2, 4, 12))
cases("baddbmm_batches", "baddbmm", (2, 8, 12), (2, 8, 3), (3, 3, 12))
cases("baddbmm_bad_self", "baddbmm", (2, 8, 10), (2, 8, 3), (2, 3, 12))
cases("baddbmm_2d_batch1", "baddbmm", (2, 8, 12), (8, 3), (2, 3, 12))
cases("baddbmm_self_dtype", "baddbmm", ((2, 8, 12), D), (2, 8, 3), (2, 3, 12))
cases("baddbmm_batch2_dtype", "baddbmm", (2, 8, 12), (2, 8, 3), ((2, 3, 12), D))
cases("baddbmm_batch_dtypes", "baddbmm", (2, 8, 12), ((2, 8, 3), D), ((2, 3, 12), D))
cases("baddbmm_self_dtype_and_bad_self", "baddbmm", ((2, 8, 10), D), (2, 8, 3), (2, 3, 12))
cases("baddbmm_batch2_dtype_and_inner", "baddbmm", (2, 8, 12), (2, 8, 3), ((2, 4, 12), D))
cases("baddbmm_self_broadcasts", "baddbmm", (8, 12), (2, 8, 3), (2, 3, 12), forms=("inplace",))
cases("baddbmm_out_dtype", "baddbmm", (2, 8, 12), (2, 8, 3), (2, 3, 12), out=((0,), D), forms=("out",))
# addbmm(self, batch1, batch2)
cases("addbmm_inner", "addbmm", (8, 12), (2, 8, 3), (2, 4, 12))
cases("addbmm_batches", "addbmm", (8, 12), (2, 8, 3), (3, 3, 12))
cases("addbmm_bad_self", "addbmm", (8, 10), (2, 8, 3), (2, 3, 12))
cases("addbmm_3d_self", "addbmm", (2, 8, 12), (2, 8, 3), (2, 3, 12))
cases("addbmm_dtype_and_inner", "addbmm", ((8, 12), D), (2, 8, 3), (2, 4, 12))
cases("addbmm_dtype_and_bad_self", "addbmm", ((8, 10), D), (2, 8, 3), (2, 3, 12))
cases("addbmm_dtype_and_2d_batch1", "addbmm", ((8, 12), D), (8, 3), (2, 3, 12))
cases("addbmm_self_dtype", "addbmm", ((8, 12), D), (2, 8, 3), (2, 3, 12), forms=("fn", "inplace"))
cases("addbmm_out_dtype", "addbmm", (8, 12), (2, 8, 3), (2, 3, 12), out=((0,), D), forms=("out",))
# addmv(self, mat, vec)
cases("addmv_vec", "addmv", (8,), (8, 3), (5,))
cases("addmv_bad_self", "addmv", (5,), (8, 3), (3,))
cases("addmv_2d_self", "addmv", (8, 8), (8, 3), (3,))
cases("addmv_1d_mat", "addmv", (8,), (8,), (3,))
cases("addmv_dtype_and_vec", "addmv", ((8,), D), (8, 3), (4,))
cases("addmv_dtype_and_2d_self", "addmv", ((8, 8), D), (8, 3), (3,))
cases("addmv_vec_dtype", "addmv", (8,), (8, 3), ((3,), D))
cases("addmv_one_element_self", "addmv", (1,), (8, 3), (3,), forms=("inplace",))
cases("addmv_out_dtype", "addmv", (8,), (8, 3), (3,), out=((0,), D), forms=("out",))
# addr(self, vec1, vec2)
cases("addr_bad_self", "addr", (8, 12), (8,), (5,))
cases("addr_bad_self_rows", "addr", (7, 5), (8,), (5,))
cases("addr_3d_self", "addr", (3, 8, 5), (8,), (5,))
cases("addr_2d_vec1", "addr", (8, 5), (8, 1), (5,))
cases("addr_bad_self_and_2d_vec2", "addr", (8, 12), (8,), (5, 1))
cases("addr_self_broadcasts", "addr", (5,), (8,), (5,), forms=("inplace",))
cases("addr_self_row_broadcasts", "addr", (1, 5), (8,), (5,), forms=("inplace",))
cases("addr_float_beta_for_integers", "addr", ((8, 5), L), ((8,), L), ((5,), L), beta=0.5)
cases("addr_float_alpha_for_bools", "addr", ((8, 5), B), ((8,), B), ((5,), B), alpha=2.5)
cases("addr_bool_beta_for_integers", "addr", ((8, 5), L), ((8,), L), ((5,), L), beta=True)


def normalized(e):
    """An error's type and message, less what names the device: expand names a tensor's
    type as its device does (torch.FloatTensor on CPU, tpuFloatType on tpu), and a failed
    compile its backend."""
    msg = re.sub(r"torch\.(\w+)Tensor\{|tpu(\w+)Type\{", lambda m: (m.group(1) or m.group(2)) + "{", str(e))
    return type(e).__name__, re.sub(r"backend='\w+'", "backend=...", msg)


def error_of(run, args):
    try:
        run(args)
    except Exception as e:  # noqa: BLE001 - the error is what is compared
        return normalized(e)
    return None


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_matches_cpu_and_leaves_the_tensors_untouched(mode, case):
    op, form, specs, kw = CASES[case]
    ts, run = call(op, form, *specs, **kw)
    want = error_of(run, [t.clone() for t in ts])
    assert want is not None, "CPU accepts the call"
    args = [t.to("tpu") for t in ts]
    assert error_of(run, args) == want
    for t, a in zip(ts, args):
        assert a.shape == t.shape and a.dtype == t.dtype
        assert torch.equal(a.cpu(), t)


VALID = {  # calls CPU accepts beside the refused ones: selves that broadcast, integers
    "addmm": ("addmm", FORMS, (8, 12), (8, 3), (3, 12)),
    "addmm_bias": ("addmm", ("fn", "out"), (12,), (8, 3), (3, 12)),
    "addmm_0d_self": ("addmm", ("fn", "out"), (), (8, 3), (3, 12)),
    "baddbmm": ("baddbmm", FORMS, (2, 8, 12), (2, 8, 3), (2, 3, 12)),
    "baddbmm_bias": ("baddbmm", ("fn", "out"), (8, 12), (2, 8, 3), (2, 3, 12)),
    "addbmm": ("addbmm", FORMS, (8, 12), (2, 8, 3), (2, 3, 12)),
    "addbmm_bias": ("addbmm", ("fn", "out"), (12,), (2, 8, 3), (2, 3, 12)),
    "addmv": ("addmv", FORMS, (8,), (8, 3), (3,)),
    "addmv_one_element_self": ("addmv", ("fn", "out"), (1,), (8, 3), (3,)),
    "addr": ("addr", FORMS, (8, 5), (8,), (5,)),
    "addr_row": ("addr", ("fn", "out"), (1, 5), (8,), (5,)),
    "addr_integers": ("addr", FORMS, ((8, 5), L), ((8,), L), ((5,), L)),
}


@pytest.mark.parametrize("case", sorted(VALID))
def test_valid_calls_compute_as_cpu_after_a_refusal(mode, case):
    op, forms, *specs = VALID[case]
    bad_op, bad_form, bad_specs, kw = CASES[f"{op}_bad_self-fn"]
    ts, run = call(bad_op, bad_form, *bad_specs, **kw)
    with pytest.raises(RuntimeError):
        run([t.to("tpu") for t in ts])
    dtype = inputs(specs[-1])[0].dtype  # the result's (an operand's, but for addr)
    if op == "addr":
        dtype = torch.promote_types(inputs(specs[0])[0].dtype, dtype)
    for form in forms:
        ts, run = call(op, form, *specs, out=((0,), dtype), beta=2, alpha=3)
        want = run([t.clone() for t in ts])
        got = run([t.to("tpu") for t in ts])
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)


PRODUCTS = {  # op, its operands' shapes
    "addmm": (torch.addmm, (4, 5), (4, 3), (3, 5)),
    "addmm_": (torch.Tensor.addmm_, (4, 5), (4, 3), (3, 5)),
    "linear": (torch.nn.functional.linear, (4, 3), (5, 3), (5,)),
    "bmm": (torch.bmm, (2, 4, 3), (2, 3, 5)),
    "baddbmm": (torch.baddbmm, (2, 4, 5), (2, 4, 3), (2, 3, 5)),
    "addbmm": (torch.addbmm, (4, 5), (2, 4, 3), (2, 3, 5)),
    "mv": (torch.mv, (4, 3), (3,)),
    "addmv": (torch.addmv, (4,), (4, 3), (3,)),
}


@pytest.mark.parametrize("case", sorted(PRODUCTS))
def test_bool_products_are_refused_as_on_cpu(mode, case):
    # CPU's kernels (and CUDA's) have no bool case; tpu computed one. (tpu's message names
    # the op where CPU's names its kernel: "addmm_impl_cpu_" not implemented for 'Bool'.)
    op, *shapes = PRODUCTS[case]
    bools = inputs(*((s, B) for s in shapes))
    for device in ("cpu", "tpu"):
        args = [t.to(device) for t in bools]
        with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
            op(*args)
        assert all(torch.equal(a.cpu(), t) for a, t in zip(args, bools))
    ints = [t.long() for t in bools]  # integers still compute
    torch.testing.assert_close(op(*(t.to("tpu") for t in ints)).cpu(), op(*(t.clone() for t in ints)))


def test_addr_backward_still_flows_through_the_checked_kernel(mode):
    s, v1, v2 = (t.requires_grad_() for t in inputs((8, 5), (8,), (5,)))
    torch.addr(s, v1, v2, beta=0.5, alpha=2).sum().backward()
    ts = [t.detach().to("tpu").requires_grad_() for t in (s, v1, v2)]
    torch.addr(*ts, beta=0.5, alpha=2).sum().backward()
    for t, c in zip(ts, (s, v1, v2)):
        torch.testing.assert_close(t.grad.cpu(), c.grad)


COMPILED = ["addmm_inner-fn", "addmm_inner-inplace", "addmm_3d_self-fn", "addmm_3d_self-inplace",
            "addmm_self_broadcasts-inplace", "addmv_2d_self-fn", "addmv_one_element_self-inplace",
            "baddbmm_self_dtype-fn", "addbmm_dtype_and_inner-fn", "addr_bad_self-fn", "addr_3d_self-fn",
            "addr_self_row_broadcasts-inplace", "addr_float_beta_for_integers-fn"]


def compiled_error(run, args, backend):
    torch._dynamo.reset()
    try:
        torch.compile(lambda *t: run(list(t)), backend=backend)(*args)
    except Exception as e:  # noqa: BLE001 - the error is what is compared
        # Dynamo wraps an error its fake tensors raise in its own, which names the backend
        # and the tensors' devices: the error inside is compared.
        inner = re.search(r"got (\w+)\((['\"])(.*?)\2\)", str(e), re.S)
        return (type(e).__name__, inner.group(1), inner.group(3)) if inner else normalized(e)
    return None


@pytest.mark.parametrize("case", COMPILED)
def test_compiled_error_matches_cpus_compiled_error(case):
    # Compiled, an error surfaces where Dynamo runs the call on fake tensors (PyTorch's
    # meta functions, on every device) or else where the graph runs: CPU's kernels, and
    # tpu's kernel checks.
    op, form, specs, kw = CASES[case]
    ts, run = call(op, form, *specs, **kw)
    want = compiled_error(run, [t.clone() for t in ts], "aot_eager")
    assert want is not None, "CPU accepts the compiled call"
    args = [t.to("tpu") for t in ts]
    assert compiled_error(run, args, "tpu") == want
    for t, a in zip(ts, args):
        assert a.shape == t.shape and torch.equal(a.cpu(), t)
