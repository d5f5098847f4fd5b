"""Property-based fuzzing (hypothesis) of short programs over aliased tensors: views
(slices, transposes, selects, diagonals, reshapes), in-place writes through them, copies
between overlapping views, new tensors computed from them, and reads in the middle. The
same program runs on CPU and on tpu, in Strict and in DeferAndFuse: every read, every
final tensor and every error must match CPU's (a write that raises on CPU raises the same
kind on tpu and changes nothing). Silent wrong results from aliasing and deferred writes
are what this looks for. Deterministic (derandomized) so CI runs the same programs."""
import warnings

import pytest
import torch

import torch_tpu

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402
from fuzzing import MODES, fuzz_settings  # noqa: E402

SETTINGS = fuzz_settings(40)


def _cells(t):
    """The storage elements a tensor's view covers, in its order."""
    cells = [t.storage_offset()]
    for size, stride in zip(t.shape, t.stride()):
        cells = [c + i * stride for c in cells for i in range(size)]
    return cells


def _unordered_overlap(dst, src):
    """Whether writing dst while reading src has no defined result: CPU's kernels then
    give whatever their loop order gives (it can differ by instruction set), and so does
    any backend. Views of one storage that share an element, not as the same view."""
    if dst.untyped_storage().data_ptr() != src.untyped_storage().data_ptr():
        return False
    a, b = _cells(dst), _cells(src)
    return bool(set(a) & set(b)) and (a != b or dst.dtype != src.dtype)


def _bits_of_another_dtype(t, ts):
    """An integer view of a float tensor's bytes (view(torch.int32): autograd does not
    track it as a view): its writes can make subnormal floats (XLA:CPU flushes them to
    zero, as TPUs do; CPU keeps them) and NaNs whose payload differs. Read only."""
    if t.is_floating_point():
        return False
    mine = t.untyped_storage().data_ptr()
    return any(u.is_floating_point() and u.untyped_storage().data_ptr() == mine for u in ts)


def _dim(t, k):
    return k % t.dim() if t.dim() else None


# Each step: fn(tensors, a, b, c) -> a new tensor to keep, a read (("read", t)), or None.
# a, b, c are small non-negative draws, folded into valid arguments where one is needed;
# an argument that stays invalid makes CPU raise, and tpu must raise alike.
def _narrow(ts, a, b, c):
    t = ts[a % len(ts)]
    d = _dim(t, b)
    if d is None or t.shape[d] == 0:
        return None
    start = c % t.shape[d]
    return t.narrow(d, start, 1 + (a + c) % (t.shape[d] - start))


def _step_view(ts, a, b, c):
    t = ts[a % len(ts)]
    kind = b % 6
    if kind == 0 and t.dim() >= 2:
        return t.transpose(0, t.dim() - 1)
    if kind == 1 and t.dim() >= 1 and t.shape[0] > 0:
        return t.select(0, c % t.shape[0])
    if kind == 2 and t.dim() >= 2:
        return t.diagonal(offset=c % 2 - 1 if min(t.shape[-2:]) > 1 else 0, dim1=-2, dim2=-1)
    if kind == 3:
        return t.reshape(-1)  # a view where CPU's is one, a copy where CPU's is one
    if kind == 4:
        return t.unsqueeze(c % (t.dim() + 1))
    return _narrow(ts, a, b, c)


def _step_view_more(ts, a, b, c):
    t = ts[a % len(ts)]
    kind = b % 6
    if kind == 0 and t.dim() >= 1:
        return t[::2]
    if kind == 1:
        return t.unsqueeze(0).expand(2, *t.shape)  # writes through it raise on CPU
    if kind == 2 and t.dtype == torch.float32:
        return t.view(torch.int32)  # the same bytes as another dtype
    if kind == 3 and t.dim() >= 1 and t.shape[0] > 0:
        return t.unbind(0)[c % t.shape[0]]
    if kind == 4 and t.dim() >= 1:
        parts = t.chunk(2, dim=c % t.dim())
        return parts[a % len(parts)]
    return t.detach()


def _step_indexed_inplace(ts, a, b, c):
    t = ts[a % len(ts)]
    if t.dim() == 0 or t.shape[0] == 0 or _bits_of_another_dtype(t, ts):
        return None
    idx = torch.tensor([c % t.shape[0], (c + b) % t.shape[0]], device=t.device)
    kind = b % 3
    if kind == 0:
        t.index_fill_(0, idx, float(c % 3))
    elif kind == 1:
        t[idx] = ts[c % len(ts)].to(t.dtype).sum()
    else:
        src = ts[c % len(ts)].to(t.dtype)[:1] if ts[c % len(ts)].dim() else t[:1]
        if _unordered_overlap(t, src):
            return None
        t.index_add_(0, idx[:1], src)
    return None


def _step_out(ts, a, b, c):
    out, x = ts[a % len(ts)], ts[b % len(ts)]
    if _bits_of_another_dtype(out, ts):
        return None
    if out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() and out.shape != x.shape:
        return None  # a resize can make out overlap x any which way
    torch.add(x, float(c % 3), out=out)  # resizes, raises or writes as CPU does
    return None


def _step_metadata_inplace(ts, a, b, c):
    t = ts[a % len(ts)]  # the same tensor object gets a new view of its storage
    kind = b % 5
    if kind == 0:
        t.unsqueeze_(c % (t.dim() + 1))
    elif kind == 1:
        t.squeeze_()
    elif kind == 2 and t.dim() >= 1:
        t.transpose_(0, t.dim() - 1)
    elif kind == 3 and t.dim() <= 2:
        t.t_()
    elif kind == 4 and t.numel() >= 2:
        t.as_strided_((2,), (c % 2 + 1,), t.storage_offset())
    return None


def _step_inplace(ts, a, b, c):
    t = ts[a % len(ts)]
    if _bits_of_another_dtype(t, ts):
        return None
    kind = b % 7
    s = float(c % 5 - 2)
    if kind == 0:
        t.add_(s)
    elif kind == 1:
        t.mul_(-1.0 if c % 2 else 2.0)
    elif kind == 2:
        t.fill_(s)
    elif kind == 3:
        t.clamp_(min=s)
    elif kind == 4:
        t.masked_fill_(t > 0, s)
    elif kind == 5:
        t.neg_()
    else:
        t.zero_()
    return None


def _step_binary_inplace(ts, a, b, c):
    dst, src = ts[a % len(ts)], ts[b % len(ts)]
    if _bits_of_another_dtype(dst, ts):
        return None
    if _unordered_overlap(dst, src):
        return None  # CPU raises where the overlap is simple enough to find (tests/test_edges.py)
    kind = c % 3
    if kind == 0:
        dst.copy_(src)  # may overlap: CPU's rules decide (copies of views of one base)
    elif kind == 1:
        dst.add_(src)
    else:
        dst.mul_(src.sum())
    return None


def _step_compute(ts, a, b, c):
    t = ts[a % len(ts)]
    kind = b % 5
    if kind == 0:
        return t * 2 + 1
    if kind == 1:
        # exact ops only: a bitcast view would show a last-bit difference as another integer
        # (XLA:CPU's f32 sqrt is off by an ulp on about a fifth of inputs; CPU's is exact)
        return t.abs() - 1
    if kind == 2 and t.dim() >= 1:
        return t.sum(dim=c % t.dim())
    if kind == 3:
        return t.to((torch.float32, torch.int64, torch.bfloat16, torch.bool)[c % 4])
    if c % 2:
        return torch.where(t > 0, t, ts[(a + c) % len(ts)])  # promotes, broadcasts or raises
    return t + ts[c % len(ts)]  # broadcasts, or raises as CPU does


def _step_read(ts, a, b, c):
    t = ts[a % len(ts)]
    if b % 3 == 0 and t.numel():  # one element, as a Python number read back
        return ("read", torch.tensor(t.reshape(-1)[c % t.numel()].item()))
    return ("read", t)


def _step_resize(ts, a, b, c):
    t = ts[a % len(ts)]  # shrinks or grows its storage; views of it keep the old one's size
    if _bits_of_another_dtype(t, ts):
        return None
    t.resize_((b % 4 + 1, c % 5 + 1))
    if t.numel() and t.is_floating_point():
        t.fill_(float(b))  # grown elements are uninitialized: written before any read
    elif t.numel():
        t.fill_(b)
    return None


STEPS = [_step_view, _step_view, _step_inplace, _step_inplace, _step_binary_inplace,
         _step_compute, _step_read, _step_view_more, _step_indexed_inplace, _step_out,
         _step_metadata_inplace, _step_resize]


def run(program, device):
    """Runs `program` on `device`: (reads and errors in order, the final tensors)."""
    g = torch.Generator().manual_seed(program[0])
    ts = [(torch.randint(-4, 5, (4, 6), generator=g).float()).to(device),
          (torch.randint(-4, 5, (6,), generator=g).float()).to(device),
          (torch.randint(-4, 5, (3, 2, 2), generator=g).float()).to(device),
          torch.randint(-4, 5, (2, 3), generator=g).to(device),  # int64: promotions, refusals
          torch.randint(-4, 5, (5,), generator=g).to(torch.bfloat16).to(device)]
    trace = []
    for step, a, b, c in program[1]:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # out= resizes warn alike on both
                r = STEPS[step](ts, a, b, c)
        except (RuntimeError, IndexError, ValueError, TypeError) as e:
            trace.append(("error", type(e).__name__))
            continue
        if isinstance(r, tuple):
            trace.append(("read", r[1].cpu().clone()))
        elif r is not None:
            ts.append(r)
    return trace, [t.cpu().clone() for t in ts]


programs = st.tuples(st.integers(0, 2**16),
                     st.lists(st.tuples(st.integers(0, len(STEPS) - 1), st.integers(0, 7),
                                        st.integers(0, 7), st.integers(0, 7)),
                              min_size=1, max_size=12))


def _describe(program):
    return "; ".join(f"{STEPS[s].__name__[6:]}({a},{b},{c})" for s, a, b, c in program[1])


@pytest.mark.parametrize("mode", sorted(MODES))
def test_programs_over_aliased_tensors_match_cpu(mode):
    @SETTINGS
    @given(programs)
    def check(program):
        want_trace, want = run(program, "cpu")
        with torch_tpu.set_eager_mode(MODES[mode]):
            got_trace, got = run(program, "tpu")
        what = f"seed {program[0]}: {_describe(program)}"
        assert [k for k, _ in got_trace] == [k for k, _ in want_trace], (what, got_trace, want_trace)
        for (kind, g), (_, w) in zip(got_trace, want_trace):
            if kind == "error":
                assert g == w, (what, g, w)
            else:
                torch.testing.assert_close(g, w, equal_nan=True, msg=what)
        assert len(got) == len(want), what
        for i, (g, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(g, w, equal_nan=True, msg=f"{what}: tensor {i}")

    check()
