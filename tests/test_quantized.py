"""Quantized tensors and matmuls on tpu: the float8 dtypes, aten::_scaled_mm, the int8
matmuls, and torchao's quantized models against the same models on CPU."""
import pytest
import torch

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


# ---- aten::_scaled_mm -----------------------------------------------------------------

def _fp8_operands(m=16, k=32, n=24, dt=torch.float8_e4m3fn, dt2=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 2).to(dt)
    b = (torch.randn(n, k, generator=g) * 2).to(dt2 or dt).t()  # column-major, as CUDA wants
    return a, b


def _scaled_mm_ref(a, b, sa, sb, bias=None):
    """float64 reference: (a . b) * scale_a * scale_b + bias."""
    out = (a.double() @ b.double()) * sa.double().reshape(sa.shape if sa.numel() > 1 else ()) \
        * sb.double().reshape(sb.shape if sb.numel() > 1 else ())
    return out if bias is None else out + bias.double()


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
    cpu = torch._scaled_mm(a, b, sa, sb, **c)
    with no_fallbacks():
        got = torch._scaled_mm(a.to("tpu"), b.to("tpu"), sa.to("tpu"), sb.to("tpu"), **_on_tpu(c))
    assert got.dtype == cpu.dtype and got.shape == (16, 24)
    rtol, atol = TOL[c["out_dtype"]]
    torch.testing.assert_close(got.cpu().double(), cpu.double(), rtol=rtol, atol=atol)
    if c.get("scale_result") is None or c["out_dtype"] == torch.float32:
        ref = _scaled_mm_ref(a, b, sa, sb, c.get("bias")).to(cpu.dtype)
        torch.testing.assert_close(got.cpu().double(), ref.double(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dts", [(torch.float8_e5m2, torch.float8_e5m2), (torch.float8_e4m3fn, torch.float8_e5m2),
                                 (torch.float8_e4m3fnuz, torch.float8_e4m3fnuz),
                                 (torch.float8_e5m2fnuz, torch.float8_e5m2fnuz)], ids=str)
def test_scaled_mm_other_fp8_formats(dts):
    a, b = _fp8_operands(dt=dts[0], dt2=dts[1])
    sa, sb = torch.tensor(0.5), torch.tensor(1.5)
    with no_fallbacks():
        got = torch._scaled_mm(a.to("tpu"), b.to("tpu"), sa.to("tpu"), sb.to("tpu"), out_dtype=torch.float32)
    torch.testing.assert_close(got.cpu(), torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32))
    torch.testing.assert_close(got.cpu().double(), _scaled_mm_ref(a, b, sa, sb))


def test_scaled_mm_rejects_fast_accum_and_bad_scales():
    a, b = (t.to("tpu") for t in _fp8_operands())
    one = torch.tensor(1.0, device="tpu")
    with pytest.raises(RuntimeError, match=r"_scaled_mm: use_fast_accum=True is not supported on tpu"):
        torch._scaled_mm(a, b, one, one, out_dtype=torch.float32, use_fast_accum=True).cpu()
    with pytest.raises((RuntimeError, ValueError), match="(?i)invalid scaling configuration"):
        torch._scaled_mm(a, b, torch.ones(16, 1, device="tpu"), one, out_dtype=torch.float32).cpu()
    with pytest.raises((RuntimeError, ValueError), match="(?i)invalid scaling configuration"):
        torch._scaled_mm(a, b, one.double(), one, out_dtype=torch.float32).cpu()


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
    assert torch.equal(got.cpu(), torch._int_mm(a, b))


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
