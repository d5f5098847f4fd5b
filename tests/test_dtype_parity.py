"""CPU parity for the dtypes PyTorch gives limited support (float8, uint16/32/64) and for
bool: tpu refuses, at the call and in every eager mode, what CPU's kernels refuse (the
same exception type, a message naming the op and dtype), and computes CPU's values for
what they take. (Probe: notes/s64/parity/probe.py.)"""
import re

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import EagerMode

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING, EagerMode.DEFER_AND_FUSE]
F8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
UNSIGNED = [torch.uint16, torch.uint32, torch.uint64]


@pytest.fixture(params=MODES, ids=lambda m: m.name)
def mode(request):
    with torch_tpu.set_eager_mode(request.param):
        yield request.param


def x_(dtype, d):
    return torch.tensor([[1., 0., 3.], [2., 5., 4.]]).to(dtype).to(d)


def y_(dtype, d):
    return torch.tensor([[2., 1., 1.], [0., 3., 4.]]).to(dtype).to(d)


def img(dtype, d):
    return (torch.arange(32.).view(1, 2, 4, 4) % 5).to(dtype).to(d)


# op: (call of (dtype, device), dtypes CPU's kernels refuse; each computed on tpu before)
REFUSED = {
    "add": (lambda t, d: x_(t, d) + y_(t, d), F8 + UNSIGNED),
    "sub": (lambda t, d: x_(t, d) - y_(t, d), F8 + UNSIGNED),
    "neg": (lambda t, d: x_(t, d).neg(), F8 + UNSIGNED),
    "exp": (lambda t, d: x_(t, d).exp(), F8),
    "abs": (lambda t, d: x_(t, d).abs(), UNSIGNED),
    "lt": (lambda t, d: x_(t, d) < y_(t, d), F8 + UNSIGNED),
    "ge_scalar": (lambda t, d: x_(t, d) >= 2, F8 + UNSIGNED),
    "logical_and": (lambda t, d: x_(t, d).logical_and(y_(t, d)), F8 + UNSIGNED),
    "signbit": (lambda t, d: x_(t, d).signbit(), F8),
    "clamp": (lambda t, d: x_(t, d).clamp(1, 3), F8 + UNSIGNED),
    "maximum": (lambda t, d: x_(t, d).maximum(y_(t, d)), F8 + UNSIGNED),
    "div_floor": (lambda t, d: torch.div(x_(t, d), y_(t, d), rounding_mode="floor"), UNSIGNED),
    "remainder": (lambda t, d: x_(t, d) % y_(t, d), F8 + UNSIGNED),
    "sum": (lambda t, d: x_(t, d).sum(), F8),
    "cumsum": (lambda t, d: x_(t, d).cumsum(1), F8),
    "argmax": (lambda t, d: x_(t, d).argmax(), F8 + UNSIGNED),
    "sort": (lambda t, d: x_(t, d).sort(1).values, F8),
    "topk": (lambda t, d: x_(t, d).topk(2, 1).values, F8 + UNSIGNED),
    "mm": (lambda t, d: x_(t, d) @ y_(t, d).t(), UNSIGNED),
    "bmm": (lambda t, d: x_(t, d)[None].bmm(y_(t, d).t()[None]), F8 + UNSIGNED),
    "mul_scalar": (lambda t, d: x_(t, d) * 2, F8),
    "masked_fill": (lambda t, d: x_(t, d).masked_fill(torch.ones(2, 3, dtype=torch.bool, device=d), 1),
                    F8 + UNSIGNED),
    "nonzero": (lambda t, d: x_(t, d).nonzero(), F8 + UNSIGNED),
    "unique": (lambda t, d: x_(t, d).unique(), F8),
    "softmax": (lambda t, d: x_(t, d).softmax(1), F8),
    "index_put": (lambda t, d: x_(t, d).index_put((torch.tensor([1], device=d),), y_(t, d)[0]), UNSIGNED),
    "max_pool2d": (lambda t, d: F.max_pool2d(img(t, d), 2), F8 + UNSIGNED),
    "conv2d": (lambda t, d: F.conv2d(img(t, d), img(t, d)[:, :, :3, :3]), F8 + UNSIGNED + [torch.bool]),
    "adaptive_avg_pool2d": (lambda t, d: F.adaptive_avg_pool2d(img(t, d), 2),
                            [torch.bool, torch.uint8, torch.int64]),
    "histc": (lambda t, d: x_(t, d).histc(4), [torch.bool]),  # (integers: CUDA bins them, so does tpu)
    "clamp_tensor": (lambda t, d: x_(t, d).clamp(y_(t, d), y_(t, d)), [torch.bool]),
    "pow_tensor": (lambda t, d: x_(t, d) ** y_(t, d), [torch.bool]),
    "addcdiv": (lambda t, d: x_(t, d).addcdiv(y_(t, d), y_(t, d)), [torch.bool]),
    "var_all": (lambda t, d: x_(t, d).var(), F8),
    "random_": (lambda t, d: x_(t, d).random_(), UNSIGNED),
    "eye": (lambda t, d: torch.eye(2, dtype=t, device=d), UNSIGNED),
    "uint16 + 0-dim int64": (lambda t, d: x_(t, d) + torch.tensor(3, device=d), [torch.uint16]),
    "add_f32_out": (lambda t, d: torch.add(x_(torch.float32, d), y_(torch.float32, d),
                                           out=torch.empty(2, 3, dtype=t, device=d)), UNSIGNED),
    "floor_divide_mixed": (lambda t, d: torch.floor_divide(x_(t, d), y_(torch.float32, d)), F8),
    # foreach ops: their per-tensor op's support
    "foreach_add": (lambda t, d: torch._foreach_add([x_(t, d)], [y_(t, d)]), F8 + UNSIGNED),
    "foreach_add_scalar_": (lambda t, d: torch._foreach_add_([x_(t, d)], 1.0), F8 + UNSIGNED),
    "foreach_neg": (lambda t, d: torch._foreach_neg([x_(t, d)]), F8 + UNSIGNED),
    "foreach_maximum": (lambda t, d: torch._foreach_maximum([x_(t, d)], [y_(t, d)]), F8 + UNSIGNED),
    "foreach_sqrt": (lambda t, d: torch._foreach_sqrt([x_(t, d)]), F8),
    "foreach_norm": (lambda t, d: torch._foreach_norm([x_(t, d)]), F8),
    # out= overloads compute in their inputs' dtype, whatever the out's
    "add_out": (lambda t, d: torch.add(x_(t, d), y_(t, d), out=torch.empty(2, 3, dtype=t, device=d)), F8 + UNSIGNED),
    "neg_out": (lambda t, d: torch.neg(x_(t, d), out=torch.empty(2, 3, dtype=t, device=d)), F8 + UNSIGNED),
    "add_out_f32": (lambda t, d: torch.add(x_(t, d), 1, out=torch.empty(2, 3, device=d)), UNSIGNED),
    "index_fill": (lambda t, d: x_(t, d).index_fill(1, torch.tensor([1], device=d), 1), F8 + UNSIGNED),
    "take_along_sort": (lambda t, d: x_(t, d).argsort(1), F8),
}
REFUSED_CASES = [(op, t) for op, (_, dtypes) in REFUSED.items() for t in dtypes]


def _short(t):
    return str(t).replace("torch.", "")


@pytest.mark.parametrize("op,dtype", REFUSED_CASES, ids=[f"{op}-{_short(t)}" for op, t in REFUSED_CASES])
def test_refused_as_cpu_at_the_call(mode, op, dtype):
    fn = REFUSED[op][0]
    with pytest.raises(Exception) as cpu:
        fn(dtype, "cpu")
    with pytest.raises(type(cpu.value)) as tpu:
        fn(dtype, "tpu")  # at the call: no read of the result needed
    assert type(tpu.value) is type(cpu.value)
    named = re.search(r"not implemented for ('\w+')", str(cpu.value))
    if named:  # CPU's dtype dispatch: the dtype, as c10 names it
        assert f"not implemented for {named.group(1)}" in str(tpu.value)
    a = torch.ones(3, device="tpu")
    assert (a + 1).cpu().tolist() == [2.0, 2.0, 2.0]  # the process stays usable


def _values(r):
    r = r.cpu()
    return r.view(torch.uint8) if r.dtype in F8 else r


# op: (call, dtypes CPU's kernels take): tpu computes CPU's values
ACCEPTED = {
    "mul": (lambda t, d: x_(t, d) * y_(t, d), F8 + UNSIGNED),
    "abs": (lambda t, d: x_(t, d).abs(), F8),
    "eq": (lambda t, d: x_(t, d) == y_(t, d), F8 + UNSIGNED),
    "isnan": (lambda t, d: x_(t, d).isnan(), F8 + UNSIGNED),
    "isinf": (lambda t, d: x_(t, d).isinf(), [torch.float8_e5m2] + UNSIGNED),
    "where": (lambda t, d: torch.where(x_(torch.bool, d), x_(t, d), y_(t, d)), F8 + UNSIGNED),
    "cat": (lambda t, d: torch.cat([x_(t, d), y_(t, d)]), F8 + UNSIGNED),
    "index_select": (lambda t, d: x_(t, d).index_select(1, torch.tensor([2, 0], device=d)), F8 + UNSIGNED),
    "index_put": (lambda t, d: x_(t, d).index_put((torch.tensor([1], device=d),), y_(t, d)[0]), F8),
    "mm": (lambda t, d: x_(t, d) @ y_(t, d).t(), F8),
    "to_float": (lambda t, d: x_(t, d).float(), F8 + UNSIGNED),
    "pad": (lambda t, d: F.pad(x_(t, d), (1, 1)), F8 + UNSIGNED),
    "embedding": (lambda t, d: F.embedding(torch.tensor([1, 0], device=d), x_(t, d)), F8 + UNSIGNED),
    "sum": (lambda t, d: x_(t, d).sum(1), UNSIGNED),
    "cumsum": (lambda t, d: x_(t, d).cumsum(1), UNSIGNED),
    "sort": (lambda t, d: x_(t, d).sort(1).values, UNSIGNED),
    "bitwise_and": (lambda t, d: x_(t, d) & y_(t, d), UNSIGNED),
    "mul_scalar": (lambda t, d: x_(t, d) * 2, UNSIGNED),
    "floor": (lambda t, d: x_(t, d).floor(), UNSIGNED),
    "exp": (lambda t, d: x_(t, d).exp(), UNSIGNED),
    "unique": (lambda t, d: x_(t, d).unique(), UNSIGNED),
    "clamp_scalar": (lambda t, d: x_(t, d).clamp(1, 3), [torch.bool]),
    "pow_scalar": (lambda t, d: x_(t, d) ** 2, [torch.bool]),
    "conv2d": (lambda t, d: F.conv2d(img(t, d), img(t, d)[:, :, :3, :3]), [torch.int64]),
    "var_dim": (lambda t, d: x_(t, d).var(1), [torch.float32]),
    "add_f32_out": (lambda t, d: torch.add(x_(torch.float32, d), y_(torch.float32, d),
                                           out=torch.empty(2, 3, dtype=t, device=d)), F8),
    "mul_f32": (lambda t, d: x_(t, d) * y_(torch.float32, d), UNSIGNED),
    "foreach_mul": (lambda t, d: torch._foreach_mul([x_(t, d)], [y_(t, d)])[0], F8 + UNSIGNED),
    "remainder_out": (lambda t, d: torch.remainder(x_(t, d), 5, out=torch.empty(2, 3, dtype=torch.int64, device=d)),
                      [torch.bool]),
    "mul_out_f32": (lambda t, d: torch.mul(x_(t, d), y_(t, d), out=torch.empty(2, 3, device=d)), F8),
    "addbmm": (lambda t, d: torch.addbmm(x_(t, d)[:, :2], x_(t, d)[None], y_(t, d).t()[None]), F8),
    "matrix_power_0": (lambda t, d: torch.linalg.matrix_power(x_(t, d)[:, :2], 0), F8),
}
ACCEPTED_CASES = [(op, t) for op, (_, dtypes) in ACCEPTED.items() for t in dtypes]


@pytest.mark.parametrize("op,dtype", ACCEPTED_CASES, ids=[f"{op}-{_short(t)}" for op, t in ACCEPTED_CASES])
def test_accepted_computes_cpu_values(mode, op, dtype):
    fn = ACCEPTED[op][0]
    want, got = _values(fn(dtype, "cpu")), _values(fn(dtype, "tpu"))
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.is_floating_point():  # exp: XLA's and CPU's math libraries differ in the last bits
        torch.testing.assert_close(got, want)
    else:
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", UNSIGNED, ids=_short)
def test_unsigned_min_max_follow_cuda(mode, dtype):
    # CPU's min/max kernels have no uint16/32/64; CUDA's reductions take them: tpu computes
    x = x_(dtype, "tpu")
    assert x.max().item() == 5 and x.min().item() == 0
    assert x.amax(1).cpu().tolist() == [3, 5] and x.amin(1).cpu().tolist() == [0, 2]
    assert x.max(1).indices.cpu().tolist() == [2, 1]


# Byte moves CPU's kernels leave out for float8 and uint16/32/64, which tpu keeps moving as
# CUDA does (flip_cuda dispatches AT_FLOAT8_TYPES and AT_BAREBONES_UNSIGNED_TYPES): the
# bits, as the same move of the bits held in an integer dtype says.
CUDA_MOVES = {
    "flip": lambda a: a.flip(1),
    "gather": lambda a: a.gather(1, torch.tensor([[1], [0]], device=a.device)),
    "tril": lambda a: a.tril(),
    "take": lambda a: a.take(torch.tensor([5, 0], device=a.device)),
    "scatter": lambda a: a.scatter(1, torch.tensor([[2, 0]], device=a.device), a.flip(0)),
}


@pytest.mark.parametrize("dtype", F8 + UNSIGNED, ids=_short)
@pytest.mark.parametrize("op", list(CUDA_MOVES))
def test_cuda_moves_keep_bits(mode, op, dtype):
    held = torch.uint8 if dtype in F8 else torch.int64
    x = x_(dtype, "cpu")
    want = CUDA_MOVES[op](x.view(held) if dtype in F8 else x.to(held))
    got = CUDA_MOVES[op](x.to("tpu")).cpu()
    assert got.dtype == dtype
    assert torch.equal(got.view(held) if dtype in F8 else got.to(held), want)


@pytest.mark.parametrize("dtype", UNSIGNED, ids=_short)
def test_unsigned_random_from_to_draws_in_range(mode, dtype):
    # CPU's random_(from, to) takes the unsigned types (a plain random_() it refuses)
    x = torch.zeros(1000, dtype=dtype, device="tpu").random_(3, 10)
    assert x.dtype == dtype and 3 <= x.min().item() and x.max().item() < 10
