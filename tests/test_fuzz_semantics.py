"""Property-based fuzzing (hypothesis) of value semantics where backends most often part
from CPU PyTorch: integer division and remainders (negative operands, zero divisors),
shifts past the bit width, wrap-around of narrow integers, type promotion between
tensors, 0-dim tensors and Python numbers, NaN, infinities and signed zeros through
comparisons, reductions, sorting and selection, ties in selection ops, rounding of
halves. Values come from small pools (duplicates, zeros, extremes), so these cases are
frequent. Every case matches CPU exactly (integers, indices) or within rounding
(floats), or raises the same kind of exception. Deterministic (derandomized) in CI;
TPU_FUZZ_EXAMPLES=N runs N random cases per op and mode instead (a campaign)."""
import pytest
import torch

import torch_tpu

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402
from fuzzing import MODES, check_outcomes_alike, fuzz_settings  # noqa: E402

SETTINGS = fuzz_settings(10)

I = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
F = (torch.float32, torch.bfloat16, torch.float64)
IF = I + F
NAN = float("nan")
INF = float("inf")


def _pool(dtype, extreme):
    if dtype == torch.bool:
        return [False, True]
    if dtype.is_floating_point:
        pool = [-2.5, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0]
        return pool + [NAN, INF, -INF] if extreme else pool
    info = torch.iinfo(dtype)
    pool = [v for v in (-3, -2, -1, 0, 1, 2, 3, 5) if info.min <= v <= info.max]
    return pool + [info.min, info.max, info.max - 1] if extreme else pool


def _tensor(seed, shape, dtype, extreme):
    pool = _pool(dtype, extreme)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(pool), shape, generator=g)
    values = torch.tensor(pool, dtype=torch.float64 if dtype.is_floating_point else torch.int64)
    return values[idx].to(dtype) if dtype != torch.bool else torch.tensor(pool)[idx]


def _int_scalar(dtype):
    return dtype in I


def _no_min(t):
    """An integer tensor without its dtype's minimum: CPU's own kernels trap (SIGFPE) on
    min / -1 (div trunc) and on lcm(min, n), so CPU has no answer to compare with."""
    return t.clamp(min=torch.iinfo(t.dtype).min + 1) if t.dtype in I else t


def _setitem(x, index, value):
    x[index] = value
    return x


# name -> (fn(x, y, s, d), number of tensor args, dtypes of x, dtypes of y or None: x's)
# s: a Python number (an int for integer x); d: a dim (may be out of range: CPU's error).
OPS = {
    "div_floor": (lambda x, y, s, d: torch.div(x, y, rounding_mode="floor"), 2, IF, None),
    "div_trunc": (lambda x, y, s, d: torch.div(_no_min(x), y, rounding_mode="trunc"), 2, IF, None),
    "div_true": (lambda x, y, s, d: x / y, 2, IF, None),
    "div_scalar_floor": (lambda x, y, s, d: torch.div(x, s, rounding_mode="floor"), 1, IF, None),
    "floor_divide": (lambda x, y, s, d: torch.floor_divide(x, y), 2, IF, None),
    "remainder": (lambda x, y, s, d: torch.remainder(x, y), 2, IF, None),
    "remainder_scalar": (lambda x, y, s, d: torch.remainder(x, s), 1, IF, None),
    "fmod": (lambda x, y, s, d: torch.fmod(x, y), 2, IF, None),
    "lshift": (lambda x, y, s, d: x << y.abs(), 2, I, None),
    "rshift": (lambda x, y, s, d: x >> y.abs(), 2, I, None),
    "lshift_scalar": (lambda x, y, s, d: x << abs(s), 1, I, None),
    "bitwise_xor": (lambda x, y, s, d: x ^ y, 2, I + (torch.bool,), None),
    "bitwise_not": (lambda x, y, s, d: ~x, 1, I + (torch.bool,), None),
    "neg": (lambda x, y, s, d: -x, 1, IF, None),
    "abs": (lambda x, y, s, d: x.abs(), 1, IF, None),
    "mul_wrap": (lambda x, y, s, d: x * y, 2, I, None),
    "sub_wrap": (lambda x, y, s, d: x - y, 2, I, None),
    "pow": (lambda x, y, s, d: torch.pow(x, y), 2, IF, None),
    "pow_scalar": (lambda x, y, s, d: torch.pow(x, s), 1, IF, None),
    "add_mixed": (lambda x, y, s, d: x + y, 2, IF + (torch.bool,), IF + (torch.bool,)),
    "mul_mixed_0dim": (lambda x, y, s, d: x * y.reshape(-1)[:1].reshape(()), 2, IF + (torch.bool,), IF),
    "add_python_float": (lambda x, y, s, d: x + 2.5, 1, IF + (torch.bool,), None),
    "lt_python_float": (lambda x, y, s, d: x < 1.5, 1, IF, None),
    "eq_mixed": (lambda x, y, s, d: x == y, 2, IF, IF),
    "where_mixed": (lambda x, y, s, d: torch.where(x > 0, x, y), 2, IF, IF),
    "sum": (lambda x, y, s, d: x.sum(d), 1, IF + (torch.bool,), None),
    "prod": (lambda x, y, s, d: x.prod(d), 1, IF + (torch.bool,), None),
    "cumsum": (lambda x, y, s, d: x.cumsum(d), 1, IF + (torch.bool,), None),
    "mean": (lambda x, y, s, d: x.mean(d), 1, F, None),
    "amax": (lambda x, y, s, d: x.amax(d), 1, IF + (torch.bool,), None),
    "min_dim": (lambda x, y, s, d: x.min(d), 1, IF, None),
    "max_all": (lambda x, y, s, d: x.max(), 1, IF, None),
    "argmax": (lambda x, y, s, d: x.argmax(d), 1, IF, None),
    "argmin": (lambda x, y, s, d: x.argmin(), 1, IF, None),
    "maximum": (lambda x, y, s, d: torch.maximum(x, y), 2, IF, None),
    "fmax": (lambda x, y, s, d: torch.fmax(x, y), 2, F, None),
    "clamp": (lambda x, y, s, d: x.clamp(min=s, max=-s), 1, IF, None),
    "clamp_tensor": (lambda x, y, s, d: x.clamp(min=y), 2, IF, None),
    "sort": (lambda x, y, s, d: x.sort(d, stable=True), 1, IF + (torch.bool,), None),
    "sort_desc": (lambda x, y, s, d: x.sort(d, descending=True, stable=True), 1, IF, None),
    "argsort": (lambda x, y, s, d: x.argsort(d, stable=True), 1, IF, None),
    "topk_values": (lambda x, y, s, d: x.topk(min(2, x.shape[d] if x.dim() else 1), d).values, 1, IF, None),
    "kthvalue": (lambda x, y, s, d: x.kthvalue(1, d).values, 1, IF, None),
    "median": (lambda x, y, s, d: x.median(), 1, IF, None),
    "median_dim_values": (lambda x, y, s, d: x.median(d).values, 1, IF, None),
    "cummax": (lambda x, y, s, d: x.cummax(d), 1, IF, None),
    "unique": (lambda x, y, s, d: torch.unique(x, return_counts=True), 1, IF + (torch.bool,), None),
    "nonzero": (lambda x, y, s, d: x.nonzero(), 1, IF + (torch.bool,), None),
    "masked_select": (lambda x, y, s, d: x.masked_select(y > 0), 2, IF, (torch.float32, torch.int64)),
    "round": (lambda x, y, s, d: x.round(), 1, IF, None),
    "round_decimals": (lambda x, y, s, d: x.round(decimals=1), 1, F, None),
    "sign": (lambda x, y, s, d: x.sign(), 1, IF + (torch.bool,), None),
    "signbit": (lambda x, y, s, d: x.signbit(), 1, IF, None),
    "copysign": (lambda x, y, s, d: torch.copysign(x, y), 2, F, F),
    "trunc_frac": (lambda x, y, s, d: x.frac(), 1, F, None),
    "to_int": (lambda x, y, s, d: x.clamp(-100, 100).nan_to_num(0.0).to(torch.int32), 1, F, None),
    "to_uint8": (lambda x, y, s, d: x.to(torch.uint8), 1, I + (torch.bool,), None),
    "to_bool": (lambda x, y, s, d: x.to(torch.bool), 1, IF, None),
    "nan_to_num": (lambda x, y, s, d: x.nan_to_num(), 1, F, None),
    "logical_or": (lambda x, y, s, d: torch.logical_or(x, y), 2, IF, IF),
    "gather": (lambda x, y, s, d: x.gather(d, y), 2, IF, (torch.int64,)),
    "scatter_add": (lambda x, y, s, d: x.scatter_add(d, y.abs(), x), 2, I, (torch.int64,)),
    "index_add": (lambda x, y, s, d: x.index_add(0, y.reshape(-1)[: x.shape[0] if x.dim() else 1].abs(),
                                                 x), 2, I, (torch.int64,)),
    "take": (lambda x, y, s, d: x.take(y), 2, IF, (torch.int64,)),
    "searchsorted": (lambda x, y, s, d: torch.searchsorted(x.reshape(-1).sort().values, y), 2, IF, None),
    "bucketize_right": (lambda x, y, s, d: torch.bucketize(y, x.reshape(-1).sort().values, right=True),
                        2, IF, None),
    "lerp": (lambda x, y, s, d: torch.lerp(x, y, 0.5), 2, F, None),
    "addcdiv": (lambda x, y, s, d: torch.addcdiv(x, x, y, value=s), 2, F, None),
    "hypot": (lambda x, y, s, d: torch.hypot(x, y), 2, F, None),
    "logaddexp": (lambda x, y, s, d: torch.logaddexp(x, y), 2, F, None),
    "xlogy": (lambda x, y, s, d: torch.xlogy(x, y), 2, F, None),
    # Reductions: dtypes, corrections, empty inputs.
    "sum_dtype": (lambda x, y, s, d: x.sum(d, dtype=torch.float64), 1, IF + (torch.bool,), None),
    "mean_all": (lambda x, y, s, d: x.mean(), 1, IF, None),
    "var_correction": (lambda x, y, s, d: x.var(d, correction=abs(int(s)) % 3), 1, F, None),
    # (finite: CPU's mean here is Welford's, NaN or infinite by the order it meets an infinity)
    "std_mean": (lambda x, y, s, d: torch.std_mean(x.nan_to_num(posinf=7.0, neginf=-7.0), d), 1, F, None),
    "nansum": (lambda x, y, s, d: x.nansum(d), 1, IF, None),
    "nanmean": (lambda x, y, s, d: x.nanmean(d), 1, F, None),
    "aminmax": (lambda x, y, s, d: torch.aminmax(x, dim=d), 1, IF, None),
    "logsumexp": (lambda x, y, s, d: x.logsumexp(d), 1, IF, None),
    # (no NaN order: CPU's result then depends on how its reduction is laid out)
    "norm_p": (lambda x, y, s, d: x.norm(p=s if s == s else 3.0, dim=d), 1, F, None),
    "count_nonzero": (lambda x, y, s, d: x.count_nonzero(d), 1, IF + (torch.bool,), None),
    "cumprod": (lambda x, y, s, d: x.cumprod(d), 1, IF, None),
    "softmax": (lambda x, y, s, d: x.softmax(d), 1, IF, None),
    "log_softmax_dtype": (lambda x, y, s, d: x.log_softmax(d, dtype=torch.float64), 1, IF, None),
    # Promotion across mixed arguments.
    "cat_mixed": (lambda x, y, s, d: torch.cat([x, y], d), 2, IF + (torch.bool,), IF + (torch.bool,)),
    "where_scalar": (lambda x, y, s, d: torch.where(x > 0, x, s), 1, IF, None),
    "clamp_float_bound": (lambda x, y, s, d: x.clamp(min=0.5), 1, IF, None),
    "add_inplace_mixed": (lambda x, y, s, d: x.clone().add_(y), 2, IF + (torch.bool,), IF + (torch.bool,)),
    "float_power": (lambda x, y, s, d: torch.float_power(x, y), 2, IF, None),
    "true_divide_int": (lambda x, y, s, d: torch.true_divide(x, y), 2, I, None),
    "gcd": (lambda x, y, s, d: torch.gcd(_no_min(x), _no_min(y)), 2, I, None),
    "lcm": (lambda x, y, s, d: torch.lcm(_no_min(x), _no_min(y)), 2, I, None),
    "heaviside": (lambda x, y, s, d: torch.heaviside(x, y), 2, IF, None),
    "logical_xor": (lambda x, y, s, d: torch.logical_xor(x, y), 2, IF, IF),
    "bitwise_and_mixed": (lambda x, y, s, d: x & y, 2, I + (torch.bool,), I + (torch.bool,)),
    "isin": (lambda x, y, s, d: torch.isin(x, y), 2, IF, None),
    # Indexing: negative indices, masks, duplicates, reductions into places.
    "index_negative": (lambda x, y, s, d: x[y.clamp(-x.shape[0], x.shape[0] - 1) if x.dim() and x.shape[0]
                                           else y], 2, IF, (torch.int64,)),
    "mask_index": (lambda x, y, s, d: x[x > 0], 1, IF, None),
    "mask_setitem": (lambda x, y, s, d: _setitem(x.clone(), x > 0, s), 1, IF, None),
    "index_put_accumulate": (lambda x, y, s, d: x.clone().index_put_((y.reshape(-1).abs() % max(1, x.shape[0]),),
                                                                      x.new_ones(()), accumulate=True)
                             if x.dim() else x, 2, IF, (torch.int64,)),
    "scatter_reduce_amax": (lambda x, y, s, d: x.scatter_reduce(d, y.abs(), x, "amax", include_self=bool(s)),
                            2, IF, (torch.int64,)),
    "scatter_reduce_mean": (lambda x, y, s, d: x.scatter_reduce(d, y.abs(), x, "mean", include_self=bool(s)),
                            2, IF, (torch.int64,)),
    "scatter_reduce_prod": (lambda x, y, s, d: x.scatter_reduce(d, y.abs(), x, "prod", include_self=bool(s)),
                            2, IF, (torch.int64,)),
    "index_reduce_amin": (lambda x, y, s, d: x.index_reduce(0, y.reshape(-1)[: x.shape[0] if x.dim() else 1].abs(),
                                                            x, "amin", include_self=bool(s)), 2, IF, (torch.int64,)),
    "bincount": (lambda x, y, s, d: torch.bincount(x.reshape(-1).clamp(0, 50)), 1, (torch.int64, torch.int32, torch.uint8),
                 None),
    "repeat_interleave": (lambda x, y, s, d: x.repeat_interleave(abs(int(s)) % 3, dim=d), 1, IF, None),
    "diff": (lambda x, y, s, d: x.diff(dim=d), 1, IF + (torch.bool,), None),
    "unique_consecutive": (lambda x, y, s, d: torch.unique_consecutive(x, return_counts=True), 1, IF, None),
    "histc": (lambda x, y, s, d: torch.histc(x, bins=4, min=-1, max=2), 1, F, None),
    "topk_smallest": (lambda x, y, s, d: x.topk(min(2, x.shape[d] if x.dim() else 1), d, largest=False).values,
                      1, IF, None),
}


@st.composite
def cases(draw, name):
    fn, nargs, xdtypes, ydtypes = OPS[name]
    xd = draw(st.sampled_from(xdtypes))
    yd = draw(st.sampled_from(ydtypes)) if ydtypes else xd
    extreme = draw(st.booleans())
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.sampled_from([0, 1, 2, 3, 4])) for _ in range(rank))
    other = draw(st.sampled_from(["same", "same", "scalar", "broadcast", "other"]))
    oshape = {"same": shape, "scalar": (), "broadcast": shape[-1:] if shape else (),
              "other": tuple(s + 1 for s in shape)}[other]
    x = _tensor(draw(st.integers(0, 2**16)), shape, xd, extreme)
    y = _tensor(draw(st.integers(0, 2**16)), oshape, yd, extreme) if nargs == 2 else None
    if name in ("gather", "take", "scatter_add", "index_add", "index_negative", "index_put_accumulate",
                "scatter_reduce_amax", "scatter_reduce_mean", "scatter_reduce_prod", "index_reduce_amin"):
        # Indices mostly in range (a few past it: CPU's error).
        hi = max(1, min(x.shape) if x.dim() else 1) + draw(st.sampled_from([0, 0, 0, 1]))
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
        y = torch.randint(-1 if draw(st.booleans()) else 0, hi, shape if name == "gather" or
                          name.startswith("scatter_reduce") else oshape, generator=g)
    pool = [0, 1, -2, 3, 7, 40, 70] if _int_scalar(xd) or xd == torch.bool else [0.0, 1.0, -2.5, 0.5, NAN]
    s = draw(st.sampled_from(pool))
    d = draw(st.integers(-3, 3))
    return fn, x, y, s, d


def _outcome(fn, x, y, s, d, device):
    try:
        out = fn(x.to(device), None if y is None else y.to(device), s, d)
        return torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, out)
    except Exception as e:  # noqa: BLE001
        return e


def _same(got, want, what):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), what
        assert got.dtype == want.dtype and got.shape == want.shape, \
            f"{what}: {got.dtype}{tuple(got.shape)} != CPU's {want.dtype}{tuple(want.shape)}"
        if want.dtype.is_floating_point:
            tol = dict(rtol=1e-2, atol=1e-2) if want.dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got, want, equal_nan=True, msg=what, **tol)
            # Signed zeros and infinities where CPU gives them.
            assert torch.equal(got.isinf(), want.isinf()), what
        else:
            assert torch.equal(got, want), f"{what}: {got} != CPU's {want}"
        return
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), what
        for g, w in zip(got, want):
            _same(g, w, what)
        return
    assert got == want, what


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(OPS))
def test_fuzz_semantics_match_cpu(name, mode):
    assert len(OPS) >= 100

    @SETTINGS
    @given(cases(name))
    def check(case):
        fn, x, y, s, d = case
        want = _outcome(fn, x, y, s, d, "cpu")
        with torch_tpu.set_eager_mode(MODES[mode]):
            got = _outcome(fn, x, y, s, d, "tpu")
        what = (f"{name}[{mode}] x={x.dtype}{tuple(x.shape)}={x.flatten()[:8].tolist()} "
                f"y={None if y is None else (y.dtype, tuple(y.shape), y.flatten()[:8].tolist())} s={s} d={d}")
        if not check_outcomes_alike(want, got, what):
            _same(got, want, what)

    check()
