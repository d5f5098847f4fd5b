"""Quantized tensors and matmuls on tpu: the float8 dtypes, aten::_scaled_mm, the int8
matmuls, and torchao's quantized models against the same models on CPU.

CPU's own low-precision matmuls (oneDNN's _scaled_mm and _int_mm) depend on the
instruction set: without AVX-512 VNNI some refuse their inputs and _int_mm's int8 path can
saturate. So matmuls are judged against defined references (float64 and exact integer
products), and torchao's CPU model runs with an exact _int_mm."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import no_fallbacks

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
# Values around each format's edges: rounding, subnormals, overflow, inf, NaN, signed zero.
EDGES = torch.tensor([0.0, -0.0, 1.0, -1.5, 3.14159, 0.3, 1e-2, 1e-3, -1e-5, 1e-9, 239.0, 240.0, 250.0,
                      447.0, 448.0, 464.0, 465.0, 479.0, 480.0, 600.0, 57344.0, 1e6, -1e6,
                      float("inf"), float("-inf"), float("nan"), -float("nan")])


def bits(t):
    return t.cpu().view(torch.uint8)


# ---- float8 dtypes ------------------------------------------------------------------

@pytest.mark.parametrize("dt", FP8, ids=str)
@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_fp8_casts_match_cpu_bit_for_bit(dt, src):
    # CPU saturates e4m3fn's overflow to +-448 and keeps the other formats' inf/NaN; a
    # double is narrowed to float first. The device conversion must give the same bytes.
    x = EDGES.to(src)
    with no_fallbacks():
        got = x.to("tpu").to(dt)
    assert got.dtype == dt and got.device.type == "tpu"
    assert torch.equal(bits(got), bits(x.to(dt)))


@pytest.mark.parametrize("dt", FP8, ids=str)
def test_fp8_round_trips_through_the_host_and_back_to_float(dt):
    x = EDGES.to(dt)
    with no_fallbacks():
        t = x.to("tpu")
        assert torch.equal(bits(t), bits(x))  # host -> device -> host keeps the bytes
        for wide in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            torch.testing.assert_close(t.to(wide).cpu(), x.to(wide), rtol=0, atol=0, equal_nan=True)
        for d2 in (torch.float8_e4m3fn, torch.float8_e5m2):  # fp8 -> fp8 through float, as c10
            assert torch.equal(bits(t.to(d2)), bits(x.to(d2)))


@pytest.mark.parametrize("dt", FP8, ids=str)
def test_fp8_creation_and_copies(dt):
    with no_fallbacks():
        assert torch.equal(bits(torch.zeros(3, 5, dtype=dt, device="tpu")), bits(torch.zeros(3, 5, dtype=dt)))
        assert torch.equal(bits(torch.ones(4, dtype=dt, device="tpu")), bits(torch.ones(4, dtype=dt)))
        assert torch.equal(bits(torch.full((2, 3), 2.7, dtype=dt, device="tpu")), bits(torch.full((2, 3), 2.7, dtype=dt)))
        e = torch.empty(6, dtype=dt, device="tpu")
        assert e.dtype == dt and e.shape == (6,)
        e.copy_(torch.linspace(-3, 3, 6).to("tpu"))  # copy_ casts
        assert torch.equal(bits(e), bits(torch.linspace(-3, 3, 6).to(dt)))
        x = torch.randn(4, 6).to(dt)
        t = x.to("tpu")
        assert torch.equal(bits(t.t().contiguous()), bits(x.t().contiguous()))
        assert torch.equal(bits(t[1:, ::2]), bits(x[1:, ::2]))
        assert torch.equal(bits(torch.cat([t, t])), bits(torch.cat([x, x])))
        assert torch.equal(bits(t.view(torch.uint8)), x.view(torch.uint8))
        assert torch.equal(t.bool().cpu(), x.bool())
        assert torch.equal(bits(torch.zeros(0, 3, dtype=dt, device="tpu")), bits(torch.zeros(0, 3, dtype=dt)))
    torch.empty(2, dtype=dt, device="tpu").zero_()


@pytest.mark.parametrize("dt", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_fp8_elementwise_math_rounds_like_cpu(dt):
    # CPU multiplies fp8 in float and rounds once to fp8 (e4m3fn saturating at 448).
    x = torch.tensor([[0.0, -1.5, 3.25, 200.0, 448.0], [1e-2, 2.0, float("nan"), -0.0, 30.0]]).to(dt)
    with no_fallbacks():
        got = x.to("tpu") * x.to("tpu")
        assert torch.equal(bits(got), bits(x * x))
        assert torch.equal(bits(x.to("tpu").abs()), bits(x.abs()))
        assert torch.equal((x.to("tpu") == x.to("tpu")).cpu(), x == x)


@pytest.mark.parametrize("dt", FP8, ids=str)
def test_fp8_fill_out_of_range_raises_like_cpu(dt):
    with pytest.raises(RuntimeError) as cpu:
        torch.full((2,), 1e6, dtype=dt)
    with pytest.raises(RuntimeError) as tpu:
        torch.full((2,), 1e6, dtype=dt, device="tpu").cpu()
    assert str(cpu.value) in str(tpu.value)


@pytest.mark.parametrize("dt", FP8, ids=str)
def test_fp8_prints_like_cpu(dt):
    x = torch.tensor([[0.0, -1.5, 3.25], [0.01, 2.0, 100.0]]).to(dt)
    assert repr(x.to("tpu")) == repr(x).replace(f"dtype={dt})", f"device='tpu:0',\n       dtype={dt})")
    assert str(x.to("tpu").cpu()) == str(x)


FP8_MIXED = {
    "add_f32": lambda a, f, c: a + f, "mul_bf16": lambda a, f, c: a * f.bfloat16(), "add_int32": lambda a, f, c: a + f.int(),
    "add_": lambda a, f, c: a.clone().add_(f), "cat": lambda a, f, c: torch.cat([a, f]), "stack": lambda a, f, c: torch.stack([a, f]),
    "where": lambda a, f, c: torch.where(c, a, f), "where_f32_first": lambda a, f, c: torch.where(c, f, a),
    "eq": lambda a, f, c: a == f, "maximum": lambda a, f, c: torch.maximum(a, f), "addcmul": lambda a, f, c: torch.addcmul(a, f, f),
    "logical_and": lambda a, f, c: torch.logical_and(a, f), "floor_divide": lambda a, f, c: torch.floor_divide(a, f),
    "mul_bool": lambda a, f, c: a * c, "e4m3fn_e5m2": lambda a, f, c: a + a.to(torch.float8_e5m2),
}


@pytest.mark.parametrize("op", FP8_MIXED)
def test_fp8_mixed_with_another_dtype_raises_like_cpu(op):
    # c10::promoteTypes refuses float8 beside any other dtype; PyTorch's Python meta
    # references would promote to float8 (and round the other operand to it).
    f = FP8_MIXED[op]
    a = torch.tensor([1.3, 300.0, -2.2, 0.1]).to(torch.float8_e4m3fn)
    x, c = torch.tensor([0.0123, 0.5, 1000.0, 7.77]), torch.tensor([True, False, True, False])
    with pytest.raises(RuntimeError, match="^Promotion for Float8 Types is not supported") as cpu:
        f(a, x, c)
    with pytest.raises(RuntimeError) as tpu:
        f(a.to("tpu"), x.to("tpu"), c.to("tpu")).cpu()
    assert str(tpu.value).splitlines()[0] == str(cpu.value).splitlines()[0]


def test_fp8_ops_that_do_not_promote_still_work():
    # Same-dtype fp8 math CPU has kernels for, bool conditions, casting copies and a
    # float8 out=. (fp8 + fp8, fp8 * 2.0 and fp8 + a 0-dim tensor CPU refuses: so does tpu,
    # test_dtype_parity.py.)
    dt = torch.float8_e4m3fn
    a = torch.tensor([1.5, 300.0, -2.25, 0.125]).to(dt)
    x, c = torch.tensor([0.5, 2.0, 1000.0, 7.75]), torch.tensor([True, False, True, False])
    ta, tx, tc = a.to("tpu"), x.to("tpu"), c.to("tpu")
    with no_fallbacks():
        assert torch.equal(bits(ta * ta), bits(a * a))
        assert torch.equal(bits(torch.where(tc, ta, ta * ta)), bits(torch.where(c, a, a * a)))
        assert torch.equal(bits(torch.cat([ta, ta])), bits(torch.cat([a, a])))
        assert torch.equal(bits(ta.clone().copy_(tx)), bits(a.clone().copy_(x)))
        out = torch.empty(4, dtype=dt, device="tpu")
        torch.add(tx, tx, out=out)
        assert torch.equal(bits(out), bits(torch.add(x, x, out=torch.empty(4, dtype=dt))))


@pytest.mark.parametrize("dt", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("op", ["mm", "addmm", "linear", "matmul"])
def test_fp8_matmul_overflow_rounds_like_cpu(dt, op):
    # The f32 accumulator is cast like any other f32: e4m3fn saturates to +-448 (XLA's
    # plain convert gave NaN) and e5m2 overflows to inf.
    m = torch.finfo(dt).max
    x = torch.tensor([[m, m / 2], [2.0, 3.0], [-m, 1.0]]).to(dt)
    f = {"mm": lambda t: torch.mm(t, t.t()), "addmm": lambda t: torch.addmm(t[:, :1].t(), t, t.t()),
         "linear": lambda t: torch.nn.functional.linear(t, t), "matmul": lambda t: t @ t.t()}[op]
    with no_fallbacks():
        got = f(x.to("tpu"))
    assert torch.equal(bits(got), bits(f(x)))


FP8_REDUCTIONS = {
    "amax": lambda t: t.amax(1), "max": lambda t: t.max(), "min": lambda t: t.min(), "argmax": lambda t: t.argmax(),
    "argmin": lambda t: t.argmin(1), "max.dim": lambda t: t.max(1), "aminmax": lambda t: torch.aminmax(t),
    "cummax": lambda t: t.cummax(1), "nonzero": lambda t: t.nonzero(), "unique": lambda t: t.unique(),
    "max_pool1d": lambda t: torch.nn.functional.max_pool1d(t[None], 2),
}


@pytest.mark.parametrize("dt", FP8, ids=str)
def test_fp8_reductions_compile_and_match_float(dt):
    # StableHLO text has no fp8 literal, so the reductions' inits and the zero that
    # any/all test against are spelled in f32 (+-inf as the largest finite value where
    # the format has no inf). any/all match CPU; the rest CPU (and CUDA) has no fp8
    # kernel for: tpu raises as CPU does (it computed them before).
    m = torch.finfo(dt).max
    for x in (torch.tensor([[m, 3.0, -m, 0.0], [2.0, 3.0, 4.0, 5.0]]), torch.full((2, 4), -m), torch.full((2, 4), m)):
        x = x.to(dt)
        with no_fallbacks():
            assert torch.equal(x.to("tpu").any().cpu(), x.any())
            assert torch.equal(x.to("tpu").all(1).cpu(), x.all(1))
        for name, f in FP8_REDUCTIONS.items():
            with pytest.raises(Exception) as cpu:
                f(x)
            with pytest.raises(type(cpu.value), match="not implemented for"):
                f(x.to("tpu"))


# ---- aten::_scaled_mm -----------------------------------------------------------------

def _fp8_operands(m=16, k=32, n=24, dt=torch.float8_e4m3fn, dt2=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 2).to(dt)
    b = (torch.randn(n, k, generator=g) * 2).to(dt2 or dt).t()  # column-major, as CUDA wants
    return a, b


def _scaled_mm_ref(a, b, sa, sb, bias=None, scale_result=None, out_dtype=None):
    """float64 reference: (a . b) * scale_a * scale_b + bias, divided by scale_result when
    out_dtype is given as e4m3fn or e5m2 (CPU's semantics), then cast to out_dtype if given."""
    out = (a.double() @ b.double()) * sa.double().reshape(sa.shape if sa.numel() > 1 else ()) \
        * sb.double().reshape(sb.shape if sb.numel() > 1 else ())
    if bias is not None:
        out = out + bias.double()
    if scale_result is not None and out_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        out = out / scale_result.double()
    return out if out_dtype is None else out.float().to(out_dtype)


def _on_tpu(kw):
    return {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


SCALED_CASES = {
    "tensorwise_f32": dict(scale=(torch.tensor(0.5), torch.tensor(2.0)), out_dtype=torch.float32),
    "tensorwise_1x1_bf16": dict(scale=(torch.tensor([[0.25]]), torch.tensor([[3.0]])), out_dtype=torch.bfloat16),
    "tensorwise_fp8_out": dict(scale=(torch.tensor(0.5), torch.tensor(0.5)), out_dtype=None),
    "tensorwise_bias_bf16": dict(scale=(torch.tensor(0.5), torch.tensor(2.0)), out_dtype=torch.bfloat16,
                                 bias=torch.randn(24).bfloat16()),
    "rowwise_f32": dict(scale=(torch.rand(16, 1) + 0.1, torch.rand(1, 24) + 0.1), out_dtype=torch.float32),
    "rowwise_bias_f16": dict(scale=(torch.rand(16, 1) + 0.1, torch.rand(1, 24) + 0.1), out_dtype=torch.float16,
                             bias=torch.randn(24)),
    "rowwise_bf16": dict(scale=(torch.rand(16, 1) + 0.1, torch.rand(1, 24) + 0.1), out_dtype=torch.bfloat16),
    "scale_result_e4m3": dict(scale=(torch.tensor(1.0), torch.tensor(1.0)), out_dtype=torch.float8_e4m3fn,
                              scale_result=torch.tensor(4.0)),
    "scale_result_e5m2": dict(scale=(torch.tensor(0.5), torch.tensor(1.0)), out_dtype=torch.float8_e5m2,
                              scale_result=torch.tensor(0.5)),
    "scale_result_ignored_for_f32": dict(scale=(torch.tensor(1.0), torch.tensor(1.0)), out_dtype=torch.float32,
                                         scale_result=torch.tensor(4.0)),
}
# Output tolerances: f32 differs from CPU only by the order of f32 roundings; 16-bit and
# fp8 outputs by one rounding of the output type (an f32 difference can cross a tie).
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (1e-3, 1e-3),
       None: (0.125, 0.0), torch.float8_e4m3fn: (0.125, 0.0), torch.float8_e5m2: (0.25, 0.0)}


@pytest.mark.parametrize("case", SCALED_CASES, ids=str)
def test_scaled_mm_matches_cpu_and_float64(case):
    c = dict(SCALED_CASES[case])
    sa, sb = c.pop("scale")
    a, b = _fp8_operands()
    ref = _scaled_mm_ref(a, b, sa, sb, c.get("bias"), c.get("scale_result"), c["out_dtype"] or a.dtype)
    with no_fallbacks():
        got = torch._scaled_mm(a.to("tpu"), b.to("tpu"), sa.to("tpu"), sb.to("tpu"), **_on_tpu(c))
    assert got.dtype == ref.dtype and got.shape == (16, 24)
    rtol, atol = TOL[c["out_dtype"]]
    torch.testing.assert_close(got.cpu().double(), ref.double(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dts", [(torch.float8_e5m2, torch.float8_e5m2), (torch.float8_e4m3fn, torch.float8_e5m2),
                                 (torch.float8_e4m3fnuz, torch.float8_e4m3fnuz),
                                 (torch.float8_e5m2fnuz, torch.float8_e5m2fnuz)], ids=str)
def test_scaled_mm_other_fp8_formats(dts):
    a, b = _fp8_operands(dt=dts[0], dt2=dts[1])
    sa, sb = torch.tensor(0.5), torch.tensor(1.5)
    with no_fallbacks():
        got = torch._scaled_mm(a.to("tpu"), b.to("tpu"), sa.to("tpu"), sb.to("tpu"), out_dtype=torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu().double(), _scaled_mm_ref(a, b, sa, sb))


def test_scaled_mm_compiled():
    # Under torch.compile the fake tensors carry the tpu device, so the meta kernel skips
    # cuBLAS's layout rules too; the graph runs as one program.
    a, b = _fp8_operands(m=8, k=24, n=40)  # K and N not multiples of 16, b row-major
    b = b.contiguous()
    sa, sb = torch.rand(8, 1) + 0.5, torch.rand(1, 40) + 0.5

    def f(a, b, sa, sb):
        return torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16).float().relu()

    torch._dynamo.reset()
    with no_fallbacks():
        got = torch.compile(f, backend="tpu")(*(t.to("tpu") for t in (a, b, sa, sb))).cpu()
    torch._dynamo.reset()
    torch.testing.assert_close(got, f(a, b, sa, sb), rtol=1.6e-2, atol=1e-2)


def test_scaled_mm_takes_fast_accum_as_a_hint():
    # CPU and CUDA accept it (torchao's default fp8 config sets it); tpu accumulates in f32 either way.
    a, b = _fp8_operands()
    one = torch.tensor(1.0)
    with no_fallbacks():
        args = (a.to("tpu"), b.to("tpu"), one.to("tpu"), one.to("tpu"))
        fast = torch._scaled_mm(*args, out_dtype=torch.float32, use_fast_accum=True)
        assert torch.equal(fast.cpu(), torch._scaled_mm(*args, out_dtype=torch.float32).cpu())
    torch.testing.assert_close(fast.cpu().double(), _scaled_mm_ref(a, b, one, one))


@pytest.mark.parametrize("case", ["f32_operand", "row_scales_transposed", "f64_scale", "scale_a_rowwise_only"])
def test_scaled_mm_bad_scales_raise_cpus_value_error(case):
    a, b = _fp8_operands()
    one = torch.tensor(1.0)
    args = {"f32_operand": (a.float(), b, one, one), "row_scales_transposed": (a, b, torch.ones(1, 16), torch.ones(24, 1)),
            "f64_scale": (a, b, torch.ones(16, 1).double(), one), "scale_a_rowwise_only": (a, b, torch.ones(16, 1), one)}[case]
    with pytest.raises(ValueError) as cpu:
        torch._scaled_mm(*args, out_dtype=torch.float32)
    with pytest.raises(ValueError, match="^Invalid scaling configuration") as tpu:
        torch._scaled_mm(*(t.to("tpu") for t in args), out_dtype=torch.float32).cpu()
    got = str(cpu.value).splitlines()
    assert str(tpu.value).splitlines()[-1] == got[-1]  # the "Got ..." line: dtypes, sizes and strides


@pytest.mark.parametrize("out_dtype,out", [(torch.float32, torch.float32), (None, torch.bfloat16),
                                           (torch.float8_e4m3fn, torch.float8_e4m3fn), (None, torch.float8_e4m3fn)],
                         ids=str)
@pytest.mark.parametrize("shape", [(16, 24), (0,)], ids=str)
def test_scaled_mm_out_matches_functional(out_dtype, out, shape):
    # out= writes the functional result of its dtype (out_dtype defaults to out's, as on CPU,
    # and scale_result applies only with an explicit fp8 out_dtype).
    a, b = _fp8_operands()
    sa, sb, sr = torch.tensor(0.5), torch.tensor(2.0), torch.tensor(4.0)
    t = [x.to("tpu") for x in (a, b, sa, sb, sr)]
    with no_fallbacks():
        o = torch.empty(shape, dtype=out, device="tpu")
        r = torch._scaled_mm(*t[:4], scale_result=t[4], out_dtype=out_dtype, out=o)
        assert r is o and o.shape == (16, 24) and o.dtype == out
        want = torch._scaled_mm(*t[:4], scale_result=t[4] if out_dtype else None, out_dtype=out)
    assert torch.equal(bits(o) if out.itemsize == 1 else o.cpu(), bits(want) if out.itemsize == 1 else want.cpu())


def test_scaled_mm_out_checks_like_cpu():
    a, b = _fp8_operands()
    one = torch.tensor(1.0)
    # CPU's generic kernel raises ValueError; its oneDNN kernel (used where the CPU has AMX)
    # raises RuntimeError with the same message. The generic one is our reference.
    with pytest.raises((ValueError, RuntimeError), match="out_dtype must match output matrix type"):
        torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, out=torch.empty(16, 24))
    with pytest.raises(ValueError, match="out_dtype must match output matrix type"):
        t = [x.to("tpu") for x in (a, b, one, one)]
        torch._scaled_mm(*t, out_dtype=torch.bfloat16, out=torch.empty(16, 24, device="tpu")).cpu()
    with pytest.warns(UserWarning, match="was resized"):  # a non-empty out of another shape, as CPU
        torch._scaled_mm(*t, out_dtype=torch.float32, out=torch.empty(3, device="tpu"))


# ---- int8 matmuls ---------------------------------------------------------------------------

@pytest.mark.parametrize("mkn", [(17, 32, 24), (8, 3, 5), (64, 256, 128)], ids=str)
@pytest.mark.parametrize("lhs", [torch.int8, torch.uint8], ids=str)
def test_int_mm_is_exact(mkn, lhs):
    m, k, n = mkn
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8).view(lhs)
    b = torch.randint(-128, 128, (k, n), generator=g, dtype=torch.int8)
    with no_fallbacks():
        got = torch._int_mm(a.to("tpu"), b.to("tpu"))
    assert got.dtype == torch.int32
    assert torch.equal(got.cpu(), (a.long() @ b.long()).int())


def test_int_mm_out_of_another_dtype_raises_as_cpu():
    # An int16 out silently kept the low bits of the int32 products.
    a, b = torch.ones(16, 32, dtype=torch.int8), torch.ones(32, 8, dtype=torch.int8)
    for dt in (torch.int16, torch.int64, torch.float32):
        with pytest.raises(RuntimeError, match="Expected result dtype to be of type kInt"):
            torch._int_mm(a.to("tpu"), b.to("tpu"), out=torch.empty(16, 8, dtype=dt, device="tpu"))
    out = torch.empty(16, 8, dtype=torch.int32, device="tpu")
    assert torch._int_mm(a.to("tpu"), b.to("tpu"), out=out) is out and out.cpu().eq(32).all()


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_weight_int8pack_mm_matches_cpu(dt):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 64, generator=g).to(dt)
    w = torch.randint(-128, 128, (48, 64), generator=g, dtype=torch.int8)
    s = (torch.rand(48, generator=g) / 64).to(dt)
    with no_fallbacks():
        got = torch._weight_int8pack_mm(x.to("tpu"), w.to("tpu"), s.to("tpu"))
    assert got.dtype == dt
    ref = (x.double() @ w.double().t() * s.double()).to(dt)
    tol = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (1e-3, 1e-3)}[dt]
    torch.testing.assert_close(got.cpu(), ref, rtol=tol[0], atol=tol[1])
    torch.testing.assert_close(got.cpu(), torch._weight_int8pack_mm(x, w, s), rtol=tol[0], atol=tol[1])


def test_weight_int8pack_mm_rejects_mixed_scale_dtype():
    x = torch.randn(2, 8, device="tpu", dtype=torch.bfloat16)
    w = torch.ones(4, 8, dtype=torch.int8, device="tpu")
    with pytest.raises(RuntimeError, match="_weight_int8pack_mm: expected scales of x's dtype"):
        torch._weight_int8pack_mm(x, w, torch.ones(4, device="tpu")).cpu()


# ---- torchao ----------------------------------------------------------------------------------

import torchao.quantization as torchao_quant  # noqa: E402  (pinned in the Makefile's setup)


def _gpt(**cfg):
    import sys
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    from gpt import GPT
    torch.manual_seed(0)
    return GPT(**cfg).eval()


AO_CONFIGS = {
    "int8_weight_only": lambda: torchao_quant.Int8WeightOnlyConfig(),
    "int8_dynamic_activation_int8_weight": lambda: torchao_quant.Int8DynamicActivationInt8WeightConfig(),
    "float8_weight_only": lambda: torchao_quant.Float8WeightOnlyConfig(),
}
# tpu vs the same quantized model on CPU. Weight-only configs compute the same float
# math: f32 rounding only. Dynamic activation quantization rounds x / scale to int8, so
# a last-bit f32 difference from an earlier layer (attention, layer norm) can move one
# activation by one int8 step; over the GPT's layers that stays below 3e-2 on logits of
# magnitude ~1, under the quantization's own error against the float model. A single
# quantized Linear on identical inputs matches exactly (test below).
AO_TOL = {"int8_weight_only": 1e-5, "int8_dynamic_activation_int8_weight": 3e-2, "float8_weight_only": 1e-5}
MODES = ["strict", "fused", "compiled"]


class ExactIntMM(TorchDispatchMode):
    """CPU's _int_mm as exact integer products: the reference torchao's CPU model runs with."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._int_mm.default and args[0].device.type == "cpu":
            return (args[0].long() @ args[1].long()).int()
        return func(*args, **(kwargs or {}))


def _run(model, x, mode):
    import torch_tpu
    from torch_tpu import EagerMode
    em = EagerMode.DEFER_AND_FUSE if mode == "fused" else EagerMode.DEFER_NEVER
    with torch.no_grad(), torch_tpu.set_eager_mode(em):
        f = torch.compile(model, backend="tpu") if mode == "compiled" else model
        f(x)  # a first call (compiled: traces), then the call checked
        return f(x).cpu()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config", AO_CONFIGS, ids=str)
def test_torchao_gpt_matches_cpu_with_no_fallbacks(config, mode):
    import copy
    torch._dynamo.reset()
    m = _gpt()
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        y_float = m(x)
    mt = copy.deepcopy(m).to("tpu")
    torchao_quant.quantize_(m, AO_CONFIGS[config]())
    torchao_quant.quantize_(mt, AO_CONFIGS[config]())
    assert type(mt.blocks[0].qkv.weight).__name__ == type(m.blocks[0].qkv.weight).__name__
    assert mt.blocks[0].qkv.weight.qdata.device.type == "tpu"
    assert mt.blocks[0].qkv.weight.qdata.dtype in (torch.int8, torch.float8_e4m3fn)
    # The same quantized weights on both devices.
    assert torch.equal(mt.blocks[0].fc.weight.qdata.cpu().view(torch.uint8), m.blocks[0].fc.weight.qdata.view(torch.uint8))
    with torch.no_grad(), ExactIntMM():
        y_cpu = m(x)
    with no_fallbacks():
        y = _run(mt, x.to("tpu"), mode)
    err = (y - y_cpu).abs().max().item()
    assert err <= AO_TOL[config], f"{config} {mode}: tpu vs CPU max |diff| {err}"
    # The quantization changed the outputs (so the quantized path ran) by more than tpu vs CPU.
    assert (y_cpu - y_float).abs().max().item() > max(err, 1e-4)
    torch._dynamo.reset()


def test_torchao_dynamic_int8_linear_is_exact_on_identical_inputs():
    import copy
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 192)
    x = torch.randn(32, 64)
    lt = copy.deepcopy(lin).to("tpu")
    cfg = torchao_quant.Int8DynamicActivationInt8WeightConfig()
    torchao_quant.quantize_(lin, cfg)
    torchao_quant.quantize_(lt, cfg)
    with torch.no_grad(), no_fallbacks():
        y = lt(x.to("tpu")).cpu()
    with torch.no_grad(), ExactIntMM():
        torch.testing.assert_close(y, lin(x), rtol=1e-6, atol=1e-6)


def test_int8_weight_only_gpt_weight_memory_is_under_0_3x_float32():
    import copy
    import gc

    def allocated():
        gc.collect()
        torch.tpu.synchronize()
        return torch.tpu.memory_allocated()

    m = _gpt(vocab=256, d_model=256, n_heads=4, n_layers=4, seq=128)
    base = allocated()
    mt = copy.deepcopy(m).to("tpu")
    f32 = allocated() - base
    assert f32 >= 4 * sum(p.numel() for p in m.parameters())  # the float32 weights are counted
    torchao_quant.quantize_(mt, torchao_quant.Int8WeightOnlyConfig())
    int8 = allocated() - base
    assert int8 <= 0.3 * f32, f"int8 weight-only {int8} bytes vs float32 {f32} ({int8 / f32:.3f}x)"
    with torch.no_grad(), no_fallbacks():
        assert mt(torch.zeros(1, 8, dtype=torch.long, device="tpu")).shape == (1, 8, 256)


def test_torchao_int8_dynamic_matmul_runs_native_int_mm():
    # torch's out_dtype(aten.mm, int32) sends int8 x int8 to _int_mm on CUDA only; on tpu
    # torch_tpu routes it there too (not an int32 matmul of widened operands).
    import copy
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    lin = copy.deepcopy(torch.nn.Linear(64, 32)).to("tpu")
    torchao_quant.quantize_(lin, torchao_quant.Int8DynamicActivationInt8WeightConfig())
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        lin(torch.randn(16, 64, device="tpu")).cpu()
    names = {e.key for e in prof.key_averages()}
    assert "aten::_int_mm" in names and "aten::mm" not in names, sorted(n for n in names if "mm" in n)


def test_quantized_benchmark_writes_its_table(tmp_path):
    import json
    import subprocess
    import sys
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "quantized.py"), "--quick",
                        "--variants", "float32,int8_weight_only,fp8_weight_only", "--modes", "fused",
                        "--steps", "1", "--warmup", "1", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["variant"]: row for row in json.load(open(tmp_path / "quantized.json"))["rows"]}
    assert set(rows) == {"float32", "int8_weight_only", "fp8_weight_only"}
    assert all(row["fallbacks"] == 0 and row["tokens_per_s"] > 0 for row in rows.values())
    assert rows["int8_weight_only"]["weight_bytes"] < 0.4 * rows["float32"]["weight_bytes"]
    assert "| int8_weight_only | fused |" in (tmp_path / "quantized.md").read_text()


@pytest.mark.parametrize("location", ["tpu", "tpu:0", torch.device("tpu")], ids=str)
def test_torchao_state_dict_loads_with_map_location_tpu(location):
    # map_location="tpu" gave the quantized weight (a wrapper subclass) the index-less
    # device beside inner tensors on tpu:0: detach() and load_state_dict(assign=True) raised.
    import io
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    torchao_quant.quantize_(lin, torchao_quant.Int8WeightOnlyConfig())
    buf = io.BytesIO()
    torch.save(lin.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, map_location=location, weights_only=False)
    w = sd["weight"]
    assert w.device == w.qdata.device == torch.device("tpu:0")
    assert torch.equal(w.detach().qdata.cpu(), lin.weight.qdata)
    lt = torch.nn.Linear(64, 32, device="tpu")
    torchao_quant.quantize_(lt, torchao_quant.Int8WeightOnlyConfig())
    lt.load_state_dict(sd, assign=True)
    x = torch.randn(2, 64)
    with torch.no_grad():
        torch.testing.assert_close(lt(x.to("tpu")).cpu(), lin(x), rtol=1e-5, atol=1e-5)
    buf.seek(0)  # a file saved under torch_tpu names PyTorch's own rebuild function
    assert b"_rebuild_wrapper_subclass" in buf.getvalue() and b"torch_tpu" not in buf.getvalue()
