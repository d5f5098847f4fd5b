"""Elementwise, activation, foreach and random ops on tpu against PyTorch's CPU kernels.

Every test runs under `native`: none of the ops may take the CPU fallback.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from conftest import check, dev, host, no_fallbacks, run_python

DEV = "tpu"
INF, NAN = math.inf, math.nan
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.5, 1e-30, -1e-30, 1e30, -1e30, 88.0, -88.0,
           100.0, -100.0, INF, -INF, NAN, 3.7, -3.7, 1e-4, -1e-4, 0.99, -0.99, 10.0, -10.0, 25.0]


@pytest.fixture(autouse=True)
def native():
    with no_fallbacks():
        yield


def floats(shape=(8, 16), scale=3.0, seed=0, special=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    if special:
        flat = x.view(-1)
        n = min(len(SPECIAL), flat.numel())
        flat[:n] = torch.tensor(SPECIAL[:n])
    return x.to(dtype)


def ints(shape=(8, 16), lo=-50, hi=50, seed=0, dtype=torch.int64, nonzero=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(lo, hi, shape, generator=g, dtype=dtype)
    if nonzero:
        x[x == 0] = 7
    return x


def tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype in (torch.bfloat16, torch.float16) else {}


# ---- unary math -----------------------------------------------------------------

UNARY = {
    "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log, "log2": torch.log2,
    "log10": torch.log10, "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh,
    "cosh": torch.cosh, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
    "erf": torch.erf, "erfc": torch.erfc, "floor": torch.floor, "ceil": torch.ceil,
    "round": torch.round, "trunc": torch.trunc, "frac": torch.frac, "neg": torch.neg,
    "abs": torch.abs, "sign": torch.sign, "sgn": torch.sgn, "deg2rad": torch.deg2rad,
    "rad2deg": torch.rad2deg, "logit": torch.logit, "nan_to_num": torch.nan_to_num,
    "relu": torch.relu,
}
# Periodic functions: XLA and libm reduce huge arguments differently; keep them moderate.
PERIODIC = {"sin": torch.sin, "cos": torch.cos, "tan": torch.tan}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unary_float(name, dtype):
    check(UNARY[name], floats(dtype=dtype), **tol(dtype))


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_in_open_unit_interval(name):  # asin/atanh/logit/erf's interesting range
    x = torch.linspace(-0.999, 0.999, 301)
    check(UNARY[name], x)


@pytest.mark.parametrize("name", sorted(PERIODIC))
def test_periodic(name):
    x = floats(special=False)
    x.view(-1)[:3] = torch.tensor([INF, NAN, 0.0])
    check(PERIODIC[name], x)


def test_erf_erfc_accuracy_sweep():
    x = torch.linspace(-9, 9, 20001)
    check(torch.erf, x, rtol=0, atol=1e-6)
    check(torch.erfc, x, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["abs", "neg", "sign", "floor", "ceil", "round", "trunc", "exp", "sqrt",
                                  "sigmoid", "reciprocal"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_unary_on_integers(name, dtype):
    x = ints(lo=0 if dtype == torch.uint8 else -50, dtype=dtype)
    check(UNARY[name], x)


def test_special_value_tests():
    x = floats()
    for fn in (torch.isnan, torch.isinf, torch.isfinite, torch.isposinf, torch.isneginf, torch.signbit):
        check(fn, x)
        check(fn, ints())
    check(lambda t: torch.nan_to_num(t, nan=1.5, posinf=7.0, neginf=-9.0), x)
    check(torch.nan_to_num, floats(dtype=torch.bfloat16))


def test_round_decimals():
    x = floats(special=False) * 100
    for d in (0, 1, 3, -1, -2):
        check(lambda t: torch.round(t, decimals=d), x)


# ---- binary arithmetic ------------------------------------------------------------

def test_add_sub_rsub_mul_with_alpha_and_broadcast():
    a, b = floats((4, 1, 5)), floats((3, 1), seed=1)
    check(lambda x, y: torch.add(x, y, alpha=2.5), a, b)
    check(lambda x, y: torch.sub(x, y, alpha=-0.5), a, b)
    check(lambda x, y: torch.rsub(x, y, alpha=3), a, b)
    check(torch.mul, a, b)
    check(lambda x: x + 2, a)
    check(lambda x: x - 1.25, a)
    check(lambda x: 3 - x, a)
    check(lambda x: x * 0.5, a)
    check(lambda x: torch.add(x, 2.0, alpha=3), a)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool,
                                   torch.bfloat16, torch.float16])
def test_arith_dtypes(dtype):
    if dtype == torch.bool:
        a, b = ints(seed=1) > 0, ints(seed=2) > 0
        check(torch.add, a, b)
        check(torch.mul, a, b)
        return
    lo = 0 if dtype == torch.uint8 else -50
    a = ints(lo=lo, dtype=dtype) if not dtype.is_floating_point else floats(dtype=dtype)
    b = ints(lo=lo, seed=3, dtype=dtype) if not dtype.is_floating_point else floats(seed=3, dtype=dtype)
    check(lambda x, y: torch.add(x, y, alpha=2), a, b, **tol(dtype))
    check(lambda x, y: torch.sub(x, y, alpha=3), a, b, **tol(dtype))
    check(torch.mul, a, b, **tol(dtype))
    check(lambda x: x * 3 + 1, a, **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_rounds_as_cpu(dtype):
    # CPU casts a Scalar (and alpha) to bf16/f16 before add, sub, remainder, fmod and pow's
    # base (mul and div read it unrounded), and rounds log's result inside xlogy, xlog1py
    # and entr and 1 - x and the quotient inside logit. Exact equality on 4,096 elements
    # (a multiple of every vector width, so CPU's scalar tail does not take part).
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4096, generator=g) * 3).to(dtype)
    y = (torch.rand(4096, generator=g) * 3 + 0.01).to(dtype)
    u = torch.rand(4096, generator=g).to(dtype)
    fns = [lambda a, b, c: a + 0.11, lambda a, b, c: a - 0.11, lambda a, b, c: 0.11 - a,
           lambda a, b, c: torch.add(a, b, alpha=0.3), lambda a, b, c: torch.sub(a, b, alpha=0.3),
           lambda a, b, c: torch.rsub(a, 1.37, alpha=0.3), lambda a, b, c: a + torch.tensor(0.11, device=a.device),
           lambda a, b, c: a.clone().add_(0.11), lambda a, b, c: torch._foreach_add([a], 0.11)[0],
           lambda a, b, c: torch.remainder(a, 0.37), lambda a, b, c: torch.fmod(a, 0.37),
           lambda a, b, c: torch.pow(1.37, a), lambda a, b, c: a * 1.37, lambda a, b, c: a / 1.37,
           lambda a, b, c: torch.xlogy(a, b), lambda a, b, c: torch.xlogy(a, 1.37),
           lambda a, b, c: torch.special.xlog1py(a, b), lambda a, b, c: torch.special.entr(c),
           lambda a, b, c: torch.logit(c), lambda a, b, c: torch.logit(c, eps=0.1)]
    for i, fn in enumerate(fns):
        want = fn(x, y, u)
        got = fn(dev(x), dev(y), dev(u)).cpu()
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"fn {i}: {m}")


def test_entr_and_xlog1py_special_values():
    v = torch.tensor([0.0, -0.0, 1.0, 2.5, -1.0, INF, -INF, NAN, 1e-30, 1e30])
    check(torch.special.entr, v)
    for a, b in ((v, v.flip(0)), (v.flip(0), v)):
        check(torch.special.xlog1py, a, b)
    check(lambda t: torch.special.xlog1py(t, 2.0), v)
    check(lambda t: torch.special.xlog1py(2.0, t), v)


def test_type_promotion():
    i, f, h = ints(), floats(), floats(dtype=torch.bfloat16)
    check(torch.add, i, f)
    check(torch.mul, h, f)
    check(lambda x: x * 2.5, i)           # int tensor * float scalar -> float32
    check(lambda x: x / 4, i)              # true division of ints -> float
    check(torch.div, i, ints(seed=5, nonzero=True))
    check(lambda x, y: x + y, h, torch.tensor(3.0))  # 0-dim tensor keeps bf16
    check(lambda x: x.add(torch.tensor(2, dtype=torch.int32)), ints(dtype=torch.int16))


def test_integer_division_modes():
    a = ints(lo=-100, hi=100)
    b = ints(lo=-9, hi=9, seed=1, nonzero=True)
    for m in ("trunc", "floor"):
        check(lambda x, y: torch.div(x, y, rounding_mode=m), a, b)
        check(lambda x: torch.div(x, -3, rounding_mode=m), a)
    check(torch.floor_divide, a, b)
    check(lambda x: x // 4, a)
    check(torch.remainder, a, b)
    check(lambda x: x % -3, a)
    check(torch.fmod, a, b)
    check(lambda x: torch.fmod(x, 4), a)
    check(lambda y: torch.remainder(7, y), b)
    check(torch.remainder, ints(lo=0, hi=200, dtype=torch.uint8), ints(lo=1, hi=20, seed=2, dtype=torch.uint8))


def test_float_division_modes():
    a = floats()
    b = floats(seed=1)
    b.view(-1)[40:44] = torch.tensor([0.0, -0.0, INF, -INF])
    for m in (None, "trunc", "floor"):
        check(lambda x, y: torch.div(x, y, rounding_mode=m), a, b)
        check(lambda x: torch.div(x, 0.3, rounding_mode=m), a)
    check(torch.remainder, a, b)
    check(torch.fmod, a, b)
    check(torch.floor_divide, floats(dtype=torch.bfloat16), floats(seed=1, dtype=torch.bfloat16), **tol(torch.bfloat16))


def test_pow():
    base = floats(special=False)
    check(torch.pow, base.abs(), floats(seed=1, special=False))
    for e in (2, 3, 0.5, -1, -2.5, 0):
        check(lambda x: torch.pow(x, e), base)
    check(lambda y: torch.pow(2.0, y), floats(seed=1))
    check(lambda x: x ** 3, ints(lo=-10, hi=10))
    check(torch.pow, ints(lo=-5, hi=5), ints(lo=0, hi=5, seed=1))


def test_binary_math():
    a, b = floats(), floats(seed=1)
    for fn in (torch.atan2, torch.hypot, torch.logaddexp, torch.logaddexp2, torch.maximum, torch.minimum,
               torch.fmax, torch.fmin, torch.copysign, torch.xlogy):
        check(fn, a, b)
    check(torch.xlogy, torch.tensor([0.0, 0.0, 1.0, 2.0]), torch.tensor([0.0, NAN, 0.0, 3.0]))
    check(lambda x: torch.xlogy(2.0, x), b.abs())
    check(lambda x: torch.copysign(x, -1.0), a)
    check(torch.heaviside, a, b)
    check(torch.logaddexp, torch.tensor([INF, -INF, INF, 1.0]), torch.tensor([INF, -INF, -INF, 2.0]))
    check(torch.maximum, ints(), ints(seed=1))


def test_lerp_addcmul_addcdiv():
    a, b, w = floats(), floats(seed=1), torch.rand(8, 16)
    check(lambda x, y: torch.lerp(x, y, 0.3), a, b)
    check(lambda x, y: torch.lerp(x, y, 0.8), a, b)
    check(torch.lerp, a, b, w)
    c = floats(seed=2, special=False)
    check(lambda x, y, z: torch.addcmul(x, y, z, value=0.5), a, b, c)
    check(lambda x, y, z: torch.addcdiv(x, y, z, value=-2), a, b, c)
    check(lambda x, y, z: torch.addcmul(x, y, z), ints(), ints(seed=1), ints(seed=2))


# ---- clamp / comparisons / logic / bits -------------------------------------------

def test_clamp():
    x = floats()
    check(lambda t: torch.clamp(t, -1, 2), x)
    check(lambda t: torch.clamp(t, min=0.5), x)
    check(lambda t: torch.clamp(t, max=-0.5), x)
    check(lambda t: torch.clamp(t, 2, -1), x)  # min > max: max wins
    lo, hi = floats((16,), seed=1) - 1, floats((16,), seed=2) + 1
    check(torch.clamp, x, lo, hi)
    check(lambda t, l: torch.clamp(t, min=l), x, lo)
    check(lambda t, h: torch.clamp_max(t, h), x, hi)
    check(lambda t: torch.clamp_min(t, 0.25), x)
    check(lambda t: torch.clamp(t, -3, 3), ints())


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons(op):
    fn = getattr(torch, op)
    a, b = floats(), floats(seed=1)
    b.view(-1)[:10] = a.view(-1)[:10]
    check(fn, a, b)
    check(fn, a, floats((16,), seed=2))
    check(lambda x: fn(x, 0.5), a)
    check(lambda x: fn(x, 2), ints())
    check(lambda x: fn(x, 2.5), ints())  # compared as float
    check(fn, ints(), floats(seed=3))
    check(fn, floats(dtype=torch.bfloat16), floats(seed=1))


def test_logical_and_bitwise():
    a, b = ints(), ints(seed=1)
    for fn in (torch.logical_and, torch.logical_or, torch.logical_xor):
        check(fn, a, b)
        check(fn, floats(), a > 0)
    check(torch.logical_not, floats())
    for fn in (torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor):
        check(fn, a, b)
        check(lambda x: fn(x, 6), a)
        check(fn, a > 0, b > 0)
    check(torch.bitwise_not, a)
    check(torch.bitwise_not, a > 0)
    check(lambda x: x & 3 | 8 ^ x, ints(dtype=torch.int32))
    s = ints(lo=0, hi=70, seed=4)
    check(torch.bitwise_left_shift, a, s)
    check(torch.bitwise_right_shift, a, s)
    check(lambda x: x << 3, ints(dtype=torch.int32))
    check(lambda x: x >> 2, ints(lo=0, hi=255, dtype=torch.uint8))


def test_where_and_masked_fill():
    c = floats(seed=5) > 0
    a, b = floats(), floats((16,), seed=1)
    check(torch.where, c, a, b)
    check(torch.where, c, ints(), floats())        # promoted
    check(lambda m, x: torch.where(m, x, 0.0), c, a)
    check(lambda x, m: x.masked_fill(m, -1.5), a, c)
    check(lambda x, m: x.masked_fill(m[0], 7), ints(), c)  # broadcast mask
    check(lambda x, m, v: x.masked_fill(m, v), a, c, torch.tensor(3.0))


# ---- fills, copies, in-place and out= ---------------------------------------------

def test_fill_zero_clone_copy():
    x = floats()
    check(lambda t: t.clone().fill_(2.5), x)
    check(lambda t: t.clone().zero_(), x)
    check(lambda t: t.clone().fill_(torch.tensor(4.0)), x)
    check(lambda t: torch.fill(t, 1.0), x)
    check(lambda t: t.clone(), x)
    check(lambda t, s: torch.ops.aten.copy(t, s), x, floats((16,), seed=1).to(torch.bfloat16))
    check(lambda t: t.to(torch.bfloat16).to(torch.int32), x.nan_to_num().clamp(-1e4, 1e4))
    check(lambda t: t.to(torch.float16), x)
    check(lambda t: t.to(torch.bool), x)


def test_inplace_variants_and_views():
    def run(x, y):
        x = x.clone()
        x.add_(y, alpha=2).mul_(0.5).sub_(1).div_(3)
        x.clamp_(-1, 1).neg_().abs_().sqrt_()
        x[:, ::2].exp_()  # strided view written back into the storage
        x.t()[1].sigmoid_()
        return x
    check(run, floats(), floats((16,), seed=1))

    def run_int(x):
        x = x.clone()
        x.floor_divide_(3).remainder_(5).bitwise_and_(6)
        return x
    check(run_int, ints())


def test_out_variants():
    def run(x, y):
        outs = [torch.empty(8, 16, device=x.device) for _ in range(5)]
        torch.add(x, y, alpha=2, out=outs[0])
        torch.exp(x, out=outs[1])
        torch.div(x, y, rounding_mode="floor", out=outs[2])
        torch.clamp(x, -1, 1, out=outs[3])
        torch.where(x > y, x, y, out=outs[4])
        b = torch.empty(8, 16, dtype=torch.bool, device=x.device)
        torch.lt(x, y, out=b)
        return outs + [b]
    check(run, floats(), floats(seed=1))


# ---- activations -------------------------------------------------------------------

ACT = {
    "relu": F.relu, "relu6": F.relu6, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu, "mish": F.mish, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1), "elu": lambda x: F.elu(x, 0.7),
    "celu": lambda x: F.celu(x, 1.3), "selu": F.selu, "hardtanh": lambda x: F.hardtanh(x, -0.5, 1.5),
    "softplus": lambda x: F.softplus(x, beta=2, threshold=10), "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish, "logsigmoid": F.logsigmoid, "threshold": lambda x: F.threshold(x, 0.2, -3.0),
    "softshrink": lambda x: F.softshrink(x, 0.4), "hardshrink": lambda x: F.hardshrink(x, 0.4),
    "glu": lambda x: F.glu(x, -1), "glu0": lambda x: F.glu(x, 0), "logit": lambda x: torch.logit(x, 1e-3),
}


def fwd_bwd(fn):
    def run(x, g):
        x = x.detach().requires_grad_(True)
        y = fn(x)
        (gx,) = torch.autograd.grad(y, x, g[..., : y.shape[-1]][: y.shape[0]])
        return y.detach(), gx
    return run


@pytest.mark.parametrize("name", sorted(ACT))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_forward_backward(name, dtype):
    x = floats(scale=3.0, special=False, dtype=dtype)
    x.view(-1)[:6] = torch.tensor([0.0, -3.0, 3.0, 0.4, -0.4, 20.0], dtype=dtype)
    if name == "logit":
        x = torch.rand(8, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    g = floats(seed=1, special=False, dtype=dtype)
    check(fwd_bwd(ACT[name]), x, g, **tol(dtype))


def test_activation_special_values_forward():
    """Against float64 on the CPU: CPU's float32 kernels differ by instruction set at the
    special values (vectorized GELU gives NaN for +inf with AVX-512; its definition, inf)."""
    x = floats()
    for name in ("relu", "gelu", "gelu_tanh", "silu", "elu", "softplus", "hardswish", "logsigmoid", "mish"):
        want = ACT[name](x.double()).float()
        got = ACT[name](x.to("tpu")).cpu()
        torch.testing.assert_close(got, want, equal_nan=True, msg=name)
    assert F.gelu(torch.tensor([INF], device="tpu")).item() == INF


def test_prelu_and_inplace_activations():
    x, w = floats(scale=2, special=False).view(2, 4, 16), torch.tensor([0.1, 0.2, -0.3, 0.4])

    def run(x, w):
        x = x.detach().requires_grad_(True)
        w = w.detach().requires_grad_(True)
        y = F.prelu(x, w)
        gx, gw = torch.autograd.grad(y.sum(), (x, w))
        return y.detach(), gx, gw
    check(run, x, w)
    check(lambda t: F.relu(t.clone(), inplace=True), x)
    check(lambda t: F.leaky_relu(t.clone(), 0.2, inplace=True), x)
    check(lambda t: F.hardtanh(t.clone(), inplace=True), x)


def test_dropout_eval_is_identity():
    x = floats(special=False)
    check(lambda t: F.dropout(t, 0.5, training=False), x)


# ---- foreach and optimizers ------------------------------------------------------------

def tensors(n=3, seed=0, positive=False):
    out = [floats((5 + i, 3), seed=seed + i, special=False) for i in range(n)]
    return [t.abs() + 0.1 for t in out] if positive else out


def test_foreach_binary_forms():
    a, b, c = tensors(), tensors(seed=10), tensors(seed=20, positive=True)
    s = torch.tensor(1.5)
    check(lambda x, y: torch._foreach_add(x, y, alpha=0.3), a, b)
    check(lambda x: torch._foreach_add(x, 2.0), a)
    check(lambda x: torch._foreach_add(x, [1.0, 2.0, 3.0]), a)
    check(lambda x, t: torch._foreach_add(x, t, alpha=2), a, s)
    check(lambda x, y: torch._foreach_sub(x, y, alpha=2), a, b)
    check(lambda x: torch._foreach_sub(x, 1), a)
    check(lambda x, y: torch._foreach_mul(x, y), a, b)
    check(lambda x: torch._foreach_mul(x, 0.5), a)
    check(lambda x: torch._foreach_mul(x, [0.5, -1.0, 2.0]), a)
    check(lambda x, t: torch._foreach_mul(x, t), a, s)
    check(lambda x, y: torch._foreach_div(x, y), a, c)
    check(lambda x: torch._foreach_div(x, 3.0), a)
    check(lambda x, t: torch._foreach_div(x, t), a, s)
    check(lambda x, y: torch._foreach_maximum(x, y), a, b)
    check(lambda x, y: torch._foreach_minimum(x, y), a, b)
    check(lambda x: torch._foreach_clamp_min(x, 0.1), a)
    check(lambda x: torch._foreach_clamp_max(x, 0.1), a)
    check(lambda x, y: torch._foreach_pow(x, y), c, b)
    check(lambda x: torch._foreach_pow(x, 2.0), a)
    check(lambda y: torch._foreach_pow(0.9, y), b)


def test_foreach_ternary_and_unary():
    a, b, c = tensors(), tensors(seed=10), tensors(seed=20, positive=True)
    check(lambda x, y, z: torch._foreach_addcmul(x, y, z, value=0.5), a, b, c)
    check(lambda x, y, z: torch._foreach_addcmul(x, y, z, [0.1, 0.2, 0.3]), a, b, c)
    check(lambda x, y, z: torch._foreach_addcdiv(x, y, z, value=-0.5), a, b, c)
    check(lambda x, y, z: torch._foreach_addcdiv(x, y, z, [0.1, 0.2, 0.3]), a, b, c)
    check(lambda x, y: torch._foreach_lerp(x, y, 0.1), a, b)
    check(lambda x, y, w: torch._foreach_lerp(x, y, w), a, b, tensors(seed=30, positive=True))
    for fn in (torch._foreach_sqrt, torch._foreach_neg, torch._foreach_reciprocal, torch._foreach_sign,
               torch._foreach_abs, torch._foreach_exp):
        check(fn, c)
    check(lambda x: torch._foreach_norm(x), a)
    check(lambda x: torch._foreach_norm(x, 1), a)
    check(lambda x: torch._foreach_norm(x, INF), a)
    check(lambda x: torch._foreach_norm(x, 3), a)
    check(lambda x: torch._foreach_norm(x, 0), a)
    check(lambda x: torch._foreach_norm(x, -INF), a)
    check(lambda x: torch._foreach_norm(x, 2.0), a)
    check(lambda x: torch._foreach_norm(x, 2.0), [t.to(torch.bfloat16) for t in a], **tol(torch.bfloat16))


def test_foreach_inplace():
    def run(a, b, c):
        a = [t.clone() for t in a]
        torch._foreach_add_(a, b, alpha=0.5)
        torch._foreach_mul_(a, 0.9)
        torch._foreach_addcmul_(a, b, c, value=0.1)
        torch._foreach_lerp_(a, b, 0.2)
        torch._foreach_maximum_(a, c)
        torch._foreach_sqrt_(a)
        z = [t.clone() for t in b]
        torch._foreach_zero_(z)
        w = [t.clone() for t in b]
        torch._foreach_copy_(w, c)
        return a + z + w + list(torch._foreach_max(c))
    check(run, tensors(), tensors(seed=10), tensors(seed=20, positive=True))


def optimizer_run(make_opt, steps=4, clip=None):
    def run(*params):
        params = [p.detach().clone().requires_grad_(True) for p in params]
        opt = make_opt(params)
        for s in range(steps):
            opt.zero_grad()
            loss = sum(((p * p).sum() * (i + 1) + p.sum() * (s + 1)) for i, p in enumerate(params))
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
        return [p.detach() for p in params]
    return run


@pytest.mark.parametrize("kind", ["sgd", "sgd_nesterov", "adam", "adamw", "adamw_amsgrad"])
def test_optimizer_steps_match_cpu(kind):
    make = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01, foreach=True),
        "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, foreach=True),
        "adam": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1, foreach=True),
        "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, foreach=True),
        "adamw_amsgrad": lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True, foreach=True),
    }[kind]
    check(optimizer_run(make, clip=1.0 if kind == "adamw" else None), *tensors(), rtol=1e-5, atol=1e-6)


# ---- random ------------------------------------------------------------------------------

def seeded(fn, seed=0):
    torch.manual_seed(seed)
    return fn().cpu()


def test_random_is_reproducible_under_manual_seed():
    makers = [
        lambda: torch.rand(1000, device=DEV),
        lambda: torch.randn(1000, device=DEV),
        lambda: torch.empty(1000, device=DEV).uniform_(-2, 3),
        lambda: torch.empty(1000, device=DEV).exponential_(2.0),
        lambda: torch.bernoulli(torch.full((1000,), 0.3, device=DEV)),
        lambda: torch.randint(0, 10, (1000,), device=DEV),
        lambda: F.dropout(torch.ones(1000, device=DEV), 0.4),
    ]
    for make in makers:
        a, b, c = seeded(make, 0), seeded(make, 0), seeded(make, 1)
        assert torch.equal(a, b)
        assert not torch.equal(a, c)
        torch.manual_seed(0)
        first, second = make().cpu(), make().cpu()
        assert not torch.equal(first, second)


N = 200_000


def moments(x):
    x = x.double()
    return x.mean().item(), x.std().item()


def test_uniform_moments_and_range():
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        x = torch.empty(N, device=DEV, dtype=dtype).uniform_(-1, 3).cpu()
        assert x.dtype == dtype
        assert x.min() >= -1 and x.max() < 3
        m, s = moments(x)
        assert abs(m - 1) < 0.02 and abs(s - 4 / math.sqrt(12)) < 0.02
    u = torch.rand(N, device=DEV).cpu()
    assert 0 <= u.min() and u.max() < 1
    assert len(torch.unique(u)) > N * 0.99  # 24 random bits per sample


def test_normal_moments():
    m, s = moments(torch.randn(N, device=DEV).cpu())
    assert abs(m) < 0.01 and abs(s - 1) < 0.01
    x = torch.empty(N, device=DEV).normal_(2.0, 0.5).cpu()
    m, s = moments(x)
    assert abs(m - 2) < 0.01 and abs(s - 0.5) < 0.01
    # Tails: the fraction beyond 2 sigma matches the normal law.
    z = torch.randn(N, device=DEV).cpu()
    assert abs((z.abs() > 2).double().mean().item() - 0.0455) < 0.003
    # Low-precision outputs still get full-precision draws: bf16 keeps the far tails.
    zb = torch.randn(N, device=DEV, dtype=torch.bfloat16).cpu().float()
    assert abs(zb.mean().item()) < 0.01 and abs(zb.std().item() - 1) < 0.01
    assert (zb.abs() > 3.6).sum() > 20 and zb.abs().max() > 4.0
    eb = torch.empty(N, device=DEV, dtype=torch.float16).exponential_().cpu().float()
    assert eb.max() > 8.0 and abs(eb.mean().item() - 1) < 0.02
    mean = torch.linspace(-5, 5, N).to(DEV)
    y = torch.normal(mean, 0.1).cpu()
    assert (y - mean.cpu()).abs().max() < 1.0
    y = torch.normal(mean, torch.full((N,), 2.0, device=DEV)).cpu()
    assert abs((y - mean.cpu()).std().item() - 2) < 0.03


def test_bernoulli_exponential_random_int():
    p = torch.bernoulli(torch.full((N,), 0.3, device=DEV)).cpu()
    assert set(p.unique().tolist()) <= {0.0, 1.0} and abs(p.mean().item() - 0.3) < 0.01
    q = torch.empty(N, device=DEV).bernoulli_(0.8).cpu()
    assert abs(q.mean().item() - 0.8) < 0.01
    probs = torch.linspace(0, 1, 11).repeat(N // 11).to(DEV)
    r = torch.empty_like(probs).bernoulli_(probs).cpu().view(-1, 11).mean(0)
    torch.testing.assert_close(r, torch.linspace(0, 1, 11), atol=0.02, rtol=0)
    e = torch.empty(N, device=DEV).exponential_(4.0).cpu()
    m, s = moments(e)
    assert e.min() >= 0 and abs(m - 0.25) < 0.01 and abs(s - 0.25) < 0.01
    i = torch.randint(-3, 7, (N,), device=DEV).cpu()
    assert i.dtype == torch.int64 and set(i.unique().tolist()) == set(range(-3, 7))
    assert abs(i.double().mean().item() - 1.5) < 0.05
    j = torch.empty(N, dtype=torch.int32, device=DEV).random_(5).cpu()
    assert set(j.unique().tolist()) == set(range(5))
    k = torch.empty(N, dtype=torch.uint8, device=DEV).random_().cpu()
    assert k.min() == 0 and k.max() == 255
    big = torch.empty(N, dtype=torch.int64, device=DEV).random_().cpu()
    assert big.min() >= 0 and big.double().mean().item() > 2 ** 61
    f = torch.empty(N, device=DEV).random_(0, 100).cpu()
    assert f.dtype == torch.float32 and set(f.unique().tolist()) == set(float(v) for v in range(100))


def test_dropout_mask_and_scale():
    x = floats((400, 500), special=False)
    p = 0.3
    t = x.to(DEV).requires_grad_(True)
    y, mask = torch.ops.aten.native_dropout(t.detach(), p, True)
    y, mask = y.cpu(), mask.cpu()
    assert mask.dtype == torch.bool
    assert abs(1 - mask.double().mean().item() - p) < 0.005
    torch.testing.assert_close(y, x * mask / (1 - p))
    g = torch.ops.aten.native_dropout_backward(torch.ones_like(t), mask.to(DEV), 1 / (1 - p)).cpu()
    torch.testing.assert_close(g, mask.float() / (1 - p))
    # Through autograd: the gradient is zero exactly where the output was dropped.
    out = F.dropout(t, p, training=True)
    out.sum().backward()
    kept = out.detach().cpu() != 0
    torch.testing.assert_close(t.grad.cpu(), kept.float() / (1 - p))
    y0, m0 = torch.ops.aten.native_dropout(t.detach(), 1.0, True)
    assert (y0.cpu() == 0).all() and not m0.cpu().any()
    y1, m1 = torch.ops.aten.native_dropout(t.detach(), 0.5, False)
    assert torch.equal(y1.cpu(), x) and m1.cpu().all()


# ---- fallback accounting ------------------------------------------------------------------

def test_fallback_error_mode():
    ops = """
import torch, torch_tpu
x = torch.randn(64, device='tpu')
y = (torch.nn.functional.gelu(x) * 2 + torch.erf(x)).clamp(-1, 1)
torch.manual_seed(0); torch.rand(10, device='tpu').cpu()
torch._foreach_add_([x, y], [y, x], alpha=0.1)
print(y.cpu().shape)
"""
    # (non-symmetric eigenvalues have no rule)
    unsupported = "torch.linalg.eigvals(torch.tensor([[2.0, 0.0], [0.0, 3.0]], device='tpu')).cpu()"
    r = run_python(ops + unsupported, env={"TPU_FALLBACK": "error"})
    assert r.returncode != 0 and "TPU_FALLBACK=error" in r.stderr, r.stderr
    assert "torch.Size([64])" in r.stdout  # the supported ops ran before it
    # Without the error mode the same call runs on the CPU fallback and is counted.
    r = run_python(ops + "print(" + unsupported + ".tolist(), torch_tpu.metrics()['fallbacks'])",
                   env={"TPU_FALLBACK": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[(2+0j), (3+0j)] {'aten::_linalg_eigvals': 1}"


def test_scalars_are_runtime_operands():
    """Changing a Scalar (lr, alpha, clamp bounds) reuses the compiled program."""
    x, y = floats(special=False).to(DEV), floats(seed=1, special=False).to(DEV)

    def step(s):
        return (torch.add(x, y, alpha=s) * s).clamp(-s, s).addcmul(x, y, value=s).cpu()
    step(0.5)
    before = torch_tpu.metrics()["compiles"]
    xc, yc = x.cpu(), y.cpu()
    for s in (0.1, 0.25, 3.0):
        want = (torch.add(xc, yc, alpha=s) * s).clamp(-s, s).addcmul(xc, yc, value=s)
        torch.testing.assert_close(step(s), want)
    assert torch_tpu.metrics()["compiles"] == before

    params = [p.to(DEV).requires_grad_(True) for p in tensors()]
    opt = torch.optim.AdamW(params, lr=0.01)
    for i in range(3):
        for p in params:
            p.grad = torch.ones_like(p)
        opt.param_groups[0]["lr"] = 0.01 / (i + 1)
        opt.step()
        if i == 1:
            before = torch_tpu.metrics()["compiles"]
    assert torch_tpu.metrics()["compiles"] == before


def test_foreach_max_and_inf_norm_propagate_nan():
    xs = [torch.tensor([1.0, float("nan"), 3.0]), torch.tensor([-2.0, 5.0])]
    got = [t.cpu() for t in torch._foreach_max([x.to("tpu") for x in xs])]
    torch.testing.assert_close(got, list(torch._foreach_max(xs)), equal_nan=True)
    got = [t.cpu() for t in torch._foreach_norm([x.to("tpu") for x in xs], float("inf"))]
    torch.testing.assert_close(got, list(torch._foreach_norm(xs, float("inf"))), equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8, torch.bool, torch.complex64])
def test_isclose_matches_cpu_in_one_program(dtype):
    # Tolerances at and around the values' gaps, NaN and infinities on either side,
    # integers whose difference a uint8 would wrap: every element as CPU's composite.
    g = torch.Generator().manual_seed(1)
    if dtype == torch.bool:
        a, b = torch.randint(0, 2, (2, 40), generator=g).bool(), torch.randint(0, 2, (2, 40), generator=g).bool()
    elif not (dtype.is_floating_point or dtype.is_complex):
        a = torch.randint(0, 100, (2, 40), generator=g)
        b = (a + torch.randint(-3, 4, (2, 40), generator=g)).clamp(0, 120)
        a, b = a.to(dtype), b.to(dtype)
    else:
        a = torch.randn(2, 40, generator=g, dtype=torch.float64)
        b = a + torch.randn(2, 40, generator=g, dtype=torch.float64) * 1e-3
        if dtype.is_complex:
            a = torch.complex(a, a.flip(1))
            b = torch.complex(b, b.flip(1))
        else:
            a[0, :4], b[0, :2] = NAN, NAN
            a[1, :2], b[1, :3] = INF, torch.tensor([INF, -INF, INF], dtype=torch.float64)
        a, b = a.to(dtype), b.to(dtype)
    da, db = a.to(DEV), b.to(DEV)
    # (Each tolerance is a constant of its own program: a few keep the test short.)
    for rtol, atol, equal_nan in [(0, 0, True), (1e-5, 1e-8, True), (1e-3, 0, False),
                                  (0.03, 1e-3, False), (1.0, 2.5, True)]:
        equal_nan = equal_nan and not dtype.is_complex  # CPU refuses it for complex
        want = torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
        before = torch_tpu.metrics()["executions"]
        got = torch.isclose(da, db, rtol=rtol, atol=atol, equal_nan=equal_nan)
        assert torch_tpu.metrics()["executions"] - before <= 1
        assert torch.equal(got.cpu(), want), (rtol, atol, equal_nan)
    assert torch.allclose(da, da, equal_nan=not dtype.is_complex) and not torch.allclose(da, db, 0, 0)
