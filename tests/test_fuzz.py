"""Property-based fuzzing (hypothesis) of common ops: random shapes (0-size and 0-dim
included), layouts (transposed, sliced, expanded), dtypes and scalar arguments. Every
case either matches CPU or raises the same kind of exception CPU raises; the process never
dies. Deterministic (derandomized) so CI runs the same cases every time."""
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402
from fuzzing import check_outcomes_alike  # noqa: E402

DTYPES = [torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.int32]
SETTINGS = settings(max_examples=8, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))

# name -> (fn(x, y, s, d), number of tensor args, dtypes it makes sense for)
# x, y: tensors; s: a Python scalar; d: a dim index (may be out of range: CPU's error).
F = (torch.float32, torch.bfloat16)
N = (torch.float32, torch.bfloat16, torch.int64, torch.int32)
ALL = tuple(DTYPES)
OPS = {
    "abs": (lambda x, y, s, d: x.abs(), 1, N),
    "neg": (lambda x, y, s, d: -x, 1, N),
    "exp": (lambda x, y, s, d: x.exp(), 1, F),
    "log1p": (lambda x, y, s, d: x.log1p(), 1, F),
    "sin": (lambda x, y, s, d: x.sin(), 1, F),
    "tanh": (lambda x, y, s, d: x.tanh(), 1, F),
    "sigmoid": (lambda x, y, s, d: x.sigmoid(), 1, F),
    "relu": (lambda x, y, s, d: torch.relu(x), 1, N),
    "sqrt": (lambda x, y, s, d: x.sqrt(), 1, F),
    "floor": (lambda x, y, s, d: x.floor(), 1, N),
    "round": (lambda x, y, s, d: x.round(), 1, F),
    "sign": (lambda x, y, s, d: x.sign(), 1, N),
    "reciprocal": (lambda x, y, s, d: x.reciprocal(), 1, F),
    "clamp": (lambda x, y, s, d: x.clamp(min=s), 1, N),
    "logical_not": (lambda x, y, s, d: x.logical_not(), 1, ALL),
    "add": (lambda x, y, s, d: x + y, 2, ALL),
    "add_scalar": (lambda x, y, s, d: x + s, 1, N),
    "sub": (lambda x, y, s, d: x - y, 2, N),
    "mul": (lambda x, y, s, d: x * y, 2, ALL),
    "mul_scalar": (lambda x, y, s, d: x * s, 1, N),
    "div": (lambda x, y, s, d: x / y, 2, F),
    "floor_divide": (lambda x, y, s, d: torch.floor_divide(x, y), 2, F),
    "maximum": (lambda x, y, s, d: torch.maximum(x, y), 2, N),
    "pow_scalar": (lambda x, y, s, d: x.abs() ** 2, 1, N),
    "remainder": (lambda x, y, s, d: torch.remainder(x, y), 2, F),
    "atan2": (lambda x, y, s, d: torch.atan2(x, y), 2, F),
    "eq": (lambda x, y, s, d: x == y, 2, ALL),
    "lt": (lambda x, y, s, d: x < y, 2, N),
    "where": (lambda x, y, s, d: torch.where(x > 0, x, y), 2, N),
    "logical_and": (lambda x, y, s, d: torch.logical_and(x, y), 2, ALL),
    "sum": (lambda x, y, s, d: x.sum(d), 1, N),
    "sum_all": (lambda x, y, s, d: x.sum(), 1, ALL),
    "mean": (lambda x, y, s, d: x.mean(d), 1, F),
    "amax": (lambda x, y, s, d: x.amax(d), 1, N),
    "argmax": (lambda x, y, s, d: x.argmax(d), 1, (torch.float32, torch.int64)),
    "prod": (lambda x, y, s, d: x.prod(d), 1, (torch.float32, torch.int64)),
    "cumsum": (lambda x, y, s, d: x.cumsum(d), 1, N),
    "logsumexp": (lambda x, y, s, d: x.logsumexp(d), 1, (torch.float32,)),
    "var": (lambda x, y, s, d: x.var(d), 1, (torch.float32,)),
    "softmax": (lambda x, y, s, d: x.softmax(d), 1, (torch.float32,)),
    "sort": (lambda x, y, s, d: x.sort(d).values, 1, N),
    "any": (lambda x, y, s, d: x.any(d), 1, ALL),
    "cat": (lambda x, y, s, d: torch.cat([x, y], d), 2, ALL),
    "stack": (lambda x, y, s, d: torch.stack([x, y], d), 2, ALL),
    "transpose": (lambda x, y, s, d: x.transpose(0, d).contiguous(), 1, ALL),
    "flip": (lambda x, y, s, d: x.flip(d), 1, ALL),
    "roll": (lambda x, y, s, d: x.roll(int(s), d), 1, ALL),
    "narrow": (lambda x, y, s, d: x.narrow(d, 0, 1) + 0, 1, N),
    "tril": (lambda x, y, s, d: x.tril(int(s)), 1, N),
    "flatten": (lambda x, y, s, d: x.flatten() * 1, 1, N),
    "unsqueeze": (lambda x, y, s, d: x.unsqueeze(d) + 0, 1, N),
    "matmul": (lambda x, y, s, d: x @ y, 2, (torch.float32,)),
    "index_select": (lambda x, y, s, d: x.index_select(d, torch.arange(x.shape[d] if x.dim() else 1,
                                                                       device=x.device).flip(0)), 1, N),
    "add_": (lambda x, y, s, d: x.clone().add_(y), 2, N),
    "masked_fill": (lambda x, y, s, d: x.masked_fill(y > 0, s), 2, (torch.float32, torch.int64)),
}


def make(draw, shape, dtype, layout):
    """(a contiguous CPU tensor, a function viewing it as `shape`): the view is taken the
    same way on each device, so tpu sees the same strides as CPU."""
    if layout == "transposed" and len(shape) >= 2:
        stored, view = (shape[1], shape[0]) + shape[2:], lambda t: t.transpose(0, 1)
    elif layout == "sliced" and len(shape) >= 1:
        stored, view = (shape[0] * 2,) + shape[1:], lambda t: t[::2]
    elif layout == "expanded" and len(shape) >= 1:
        stored, view = (1,) + shape[1:], lambda t: t.expand(shape)
    else:
        stored, view = shape, lambda t: t
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    base = torch.randn(stored, generator=g) * 4
    if dtype == torch.bool:
        base = base > 0
    else:
        base = base.to(dtype) if dtype.is_floating_point else base.round().to(dtype)
    return base, view


@st.composite
def cases(draw, name):
    fn, nargs, dtypes = OPS[name]
    dtype = draw(st.sampled_from(dtypes))
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.sampled_from([0, 1, 2, 3])) for _ in range(rank))
    if name == "matmul":
        k = draw(st.sampled_from([0, 1, 3]))
        shapes = [(draw(st.sampled_from([1, 2])), k), (k, draw(st.sampled_from([0, 2])))]
    else:
        # The second operand: the same shape, or a broadcastable / mismatched one.
        other = draw(st.sampled_from(["same", "scalar", "broadcast", "other"]))
        oshape = {"same": shape, "scalar": (), "broadcast": shape[-1:] if shape else (),
                  "other": tuple(s + 1 for s in shape)}[other]
        shapes = [shape, oshape]
    layouts = [draw(st.sampled_from(["contiguous", "transposed", "sliced", "expanded"]))
               for _ in shapes]
    tensors = [make(draw, s, dtype, lay) for s, lay in zip(shapes, layouts)]
    s = draw(st.sampled_from([0, 1, -2, 2.5] if dtype.is_floating_point else [0, 1, -2]))
    d = draw(st.integers(-3, 3))
    return fn, tensors[0], tensors[1] if nargs == 2 else None, s, d


def outcome(fn, x, y, s, d, device):
    try:
        args = [None if t is None else t[1](t[0].to(device)) for t in (x, y)]
        out = fn(args[0], args[1], s, d)
        return out.cpu() if device == "tpu" else out
    except Exception as e:  # noqa: BLE001
        return e


@pytest.mark.parametrize("name", sorted(OPS))
def test_fuzz_matches_cpu_or_raises_alike(name):
    assert len(OPS) >= 40

    @SETTINGS
    @given(cases(name))
    def check(case):
        fn, x, y, s, d = case
        want = outcome(fn, x, y, s, d, "cpu")
        got = outcome(fn, x, y, s, d, "tpu")
        xv = x[1](x[0])
        what = (f"{name} x={tuple(xv.shape)}/{xv.stride()} {xv.dtype} "
                f"y={None if y is None else tuple(y[1](y[0]).shape)} s={s} d={d}")
        if check_outcomes_alike(want, got, what):
            return
        assert got.dtype == want.dtype and got.shape == want.shape, what
        tol = dict(rtol=2e-2, atol=2e-2) if want.dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got, want, equal_nan=True, msg=what, **tol)

    check()
