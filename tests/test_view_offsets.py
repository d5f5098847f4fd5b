"""A view the op reads, starting past its storage's start, takes its offset as a
runtime operand (as a view it writes does: test_view_write_offsets.py): a loop over row blocks of a device-resident dataset, or over a noise
schedule's entries, reuses one program (one fused graph) instead of compiling one per
offset. Values equal CPU's for every view kind, in every mode and compiled."""

import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]


def m():
    return torch_tpu.metrics()


def compiles():
    d = m()
    return d["op_compiles"] + d["graph_compiles"]


@pytest.mark.parametrize("mode", MODES)
def test_a_loop_over_row_blocks_compiles_once(mode):
    torch.manual_seed(0)
    X, Y = torch.randn(96, 8), torch.randn(96, 1)
    lin = torch.nn.Linear(8, 1)
    ref = torch.nn.Linear(8, 1)
    ref.load_state_dict(lin.state_dict())
    Xt, Yt, lin = X.to("tpu"), Y.to("tpu"), lin.to("tpu")
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    counts = []
    with torch_tpu.set_eager_mode(mode):
        for i in range(12):
            rows = slice(i * 8, (i + 1) * 8)
            loss = ((lin(Xt[rows]) - Yt[rows]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rloss = ((ref(X[rows]) - Y[rows]) ** 2).mean()
            ropt.zero_grad()
            rloss.backward()
            ropt.step()
            assert loss.item() == pytest.approx(rloss.item(), rel=1e-5, abs=1e-6)
            counts.append(compiles())
    assert counts[-1] == counts[3], counts  # blocks 4..12 compile nothing new


@pytest.mark.parametrize("mode", MODES)
def test_a_schedule_indexed_by_a_python_int_compiles_once(mode):
    alphas = torch.linspace(0.9, 0.1, 50)
    x = torch.randn(4, 16)
    a_t, x_t = alphas.to("tpu"), x.to("tpu")
    counts = []
    with torch_tpu.set_eager_mode(mode):
        for t in range(2, 40, 3):
            got = (a_t[t].sqrt() * x_t + (1 - a_t[t]).sqrt()).sum().item()
            assert got == pytest.approx((alphas[t].sqrt() * x + (1 - alphas[t]).sqrt()).sum().item(), rel=1e-5)
            counts.append(compiles())
    assert counts[-1] == counts[2], counts


VIEWS = {
    "rows": lambda x, i: x[i:i + 3],
    "columns": lambda x, i: x[:, i:i + 4],
    "strided": lambda x, i: x[i::2, 1::3],
    "transposed": lambda x, i: x[i:i + 5].t(),
    "element": lambda x, i: x[i, i],
    "expanded": lambda x, i: x[i].unsqueeze(0).expand(3, -1),
    "diagonal": lambda x, i: x[i:].diagonal(),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_views_at_every_offset_read_cpus_values(mode, view):
    x = torch.randn(12, 10)
    xt = x.to("tpu")
    fn = VIEWS[view]
    with torch_tpu.set_eager_mode(mode):
        for i in range(1, 6):
            got = (fn(xt, i) * 2 + 1).exp()
            torch.testing.assert_close(got.cpu(), (fn(x, i) * 2 + 1).exp())


def test_an_op_writing_a_view_writes_its_own_rows_with_one_program():
    # A written view's offset is an operand too (test_view_write_offsets.py): the
    # program that one offset compiled writes each later call's own rows.
    x = torch.zeros(7, 5, device="tpu")
    counts = []
    for i in range(7):
        x[i:i + 1].add_(torch.full((1, 5), float(i), device="tpu"))
        counts.append(compiles())
    assert x.cpu().tolist() == [[float(i)] * 5 for i in range(7)]
    assert counts[-1] == counts[2], counts  # offset 0 of an unwritten storage, then one program


def test_a_compiled_function_given_views_at_other_offsets():
    x = torch.randn(20, 6)
    xt = x.to("tpu")
    f = torch.compile(lambda v: (v * 3).sin().sum(0), backend="tpu")
    for i in (2, 5, 2, 9, 5):
        torch.testing.assert_close(f(xt[i:i + 4]).cpu(), (x[i:i + 4] * 3).sin().sum(0))


# Copies that read a view (a dtype change, .to, .contiguous, clone, copy_ into a
# preallocated tensor or into part of one) take its offset as an operand too: a sampler's
# `timesteps[i].expand(B).float()` compiled a new program for every step.
ALL_MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING, EagerMode.DEFER_AND_FUSE]


def _copy_into(dtype, n):
    def f(v):
        out = torch.empty(n, dtype=dtype, device=v.device)
        out.copy_(v)
        return out
    return f


def _copy_into_part(dtype, n):
    def f(v):
        out = torch.full((n + 3,), -1, dtype=dtype, device=v.device)
        out[1:n + 1].copy_(v)
        return out
    return f


# name: (source maker, given n: storage sizes differ by mode, so no mode finds programs
# another compiled; view of it at offset i; what the copy does)
COPIES = {
    "select_float": (lambda n: torch.arange(50 + n) * 20, lambda x, i: x[i], lambda v: v.float()),
    "slice_float": (lambda n: torch.arange(50 + n) * 20, lambda x, i: x[i:i + 1], lambda v: v.float()),
    "expand_float": (lambda n: torch.arange(50 + n) * 20, lambda x, i: x[i].expand(4), lambda v: v.float()),
    "slice_double": (lambda n: torch.randn(41 + n), lambda x, i: x[i:i + 2], lambda v: v.double()),
    "expand_half": (lambda n: torch.randn(43 + n), lambda x, i: x[i].expand(2), lambda v: v.half()),
    "to_bfloat16": (lambda n: torch.randn(45 + n), lambda x, i: x[i:i + 3], lambda v: v.to(torch.bfloat16)),
    "rows_contiguous": (lambda n: torch.randn(17 + n, 6), lambda x, i: x[i:i + 2, 1:4], lambda v: v.contiguous()),
    "rows_clone": (lambda n: torch.randn(19 + n, 5), lambda x, i: x[i:i + 3], lambda v: v.clone()),
    "copy_between_dtypes": (lambda n: torch.arange(47 + n), lambda x, i: x[i:i + 4], _copy_into(torch.float32, 4)),
    "copy_same_dtype": (lambda n: torch.randn(49 + n), lambda x, i: x[i:i + 4], _copy_into(torch.float32, 4)),
    "copy_into_part": (lambda n: torch.arange(51 + n), lambda x, i: x[i:i + 4], _copy_into_part(torch.float64, 4)),
    "dtype_view_float": (lambda n: torch.randn(53 + n), lambda x, i: x.view(torch.int16)[i:i + 3], lambda v: v.float()),
    "conj_to_complex128": (lambda n: torch.randn(31 + n, dtype=torch.complex64), lambda x, i: x[i:i + 2].conj(),
                           lambda v: v.to(torch.complex128)),
}


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("case", sorted(COPIES))
def test_copies_of_views_compile_once_over_offsets(mode, case):
    make, view, copy = COPIES[case]
    x = make(ALL_MODES.index(mode))
    xt = x.to("tpu")
    counts = []
    with torch_tpu.set_eager_mode(mode):
        # The first two calls compile (DeferAndFuse may run a graph of a structure it
        # compiled for other shapes op by op once, then compile it); ten more offsets.
        for i in [11, 12] + list(range(1, 11)):
            got = copy(view(xt, i)).cpu()
            want = copy(view(x, i))
            assert got.dtype == want.dtype and torch.equal(got, want), (i, got, want)
            counts.append(compiles())
    assert counts[-1] == counts[1], counts


@pytest.mark.parametrize("mode", ALL_MODES)
def test_a_sampler_casting_its_timestep_compiles_nothing_in_steady_steps(mode):
    # diffusers' `for t in scheduler.timesteps`: t = timesteps[i].expand(B).float().
    torch.manual_seed(0)
    batch = 3 + ALL_MODES.index(mode)  # no mode finds programs another compiled
    ts = torch.arange(999, -1, -20)
    freqs = torch.randn(8)
    x = torch.randn(batch, 8)
    tst, ft, xt = ts.to("tpu"), freqs.to("tpu"), x.to("tpu")
    counts = []
    with torch_tpu.set_eager_mode(mode):
        for i in range(14):
            t = tst[i].expand(batch).float()
            xt = xt * 0.9 + torch.sin(t[:, None] * ft)
            t_ref = ts[i].expand(batch).float()
            x = x * 0.9 + torch.sin(t_ref[:, None] * freqs)
            torch.testing.assert_close(xt.cpu(), x)
            counts.append(compiles())
    assert counts[-1] == counts[2], counts
