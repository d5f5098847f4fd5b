"""torch.autocast("tpu") follows CUDA's op policies, and torch.amp.GradScaler("tpu")
runs its unscale / update ops on the device."""
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT, no_fallbacks

sys.path.insert(0, os.path.join(ROOT, "examples"))
from gpt import GPT, batches  # noqa: E402

LOW = [torch.bfloat16, torch.float16]


def test_autocast_is_available_and_reports_its_dtype():
    assert torch.amp.autocast_mode.is_autocast_available("tpu")
    assert torch.get_autocast_dtype("tpu") == torch.float16  # CUDA's default
    assert torch.bfloat16 in torch.tpu.get_amp_supported_dtype()
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("tpu")
        assert torch.get_autocast_dtype("tpu") == torch.bfloat16
        with torch.autocast("tpu", enabled=False):
            assert not torch.is_autocast_enabled("tpu")
    assert not torch.is_autocast_enabled("tpu")


def _ref64(fn, *xs, dtype):
    """fn in float64 on the CPU over inputs rounded to `dtype`, then rounded to `dtype`."""
    return fn(*(x.to(dtype).double() for x in xs)).to(dtype)


@pytest.mark.parametrize("dtype", LOW)
def test_contractions_run_in_the_autocast_dtype(dtype):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g)
    a3, b3 = torch.randn(2, 8, 16, generator=g), torch.randn(2, 16, 4, generator=g)
    c, c3 = torch.randn(8, 4, generator=g), torch.randn(2, 8, 4, generator=g)
    w, bias = torch.randn(4, 16, generator=g), torch.randn(4, generator=g)
    img, k = torch.randn(1, 3, 8, 8, generator=g), torch.randn(5, 3, 3, 3, generator=g)
    cases = [
        (torch.mm, (a, b)), (torch.matmul, (a3, b3)), (torch.bmm, (a3, b3)),
        (F.linear, (a, w, bias)), (torch.addmm, (c, a, b)), (torch.baddbmm, (c3, a3, b3)),
        (torch.addbmm, (c, a3, b3)), (F.conv2d, (img, k)),
    ]
    with no_fallbacks():
        for fn, xs in cases:
            with torch.autocast("tpu", dtype=dtype):
                got = fn(*(x.to("tpu") for x in xs))
            assert got.dtype == dtype, fn
            want = _ref64(fn, *xs, dtype=dtype)
            # One rounding to `dtype` apart, plus float32 accumulation.
            torch.testing.assert_close(got.cpu().float(), want.float(), atol=0.05, rtol=0.02)


def test_sdpa_runs_in_the_autocast_dtype():
    q = torch.randn(1, 2, 8, 16, device="tpu")
    with no_fallbacks(), torch.autocast("tpu", dtype=torch.bfloat16):
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert out.dtype == torch.bfloat16


def test_touchy_ops_run_in_float32_and_mixed_ops_promote():
    x = torch.randn(4, 8, device="tpu").to(torch.bfloat16)
    y = torch.randn(4, 8, device="tpu")
    with no_fallbacks(), torch.autocast("tpu", dtype=torch.bfloat16):
        for out in (torch.softmax(x, -1), torch.log_softmax(x, -1), torch.exp(x), x.sum(),
                    F.layer_norm(x, (8,)), F.mse_loss(x, x), x.cumsum(0)):
            assert out.dtype == torch.float32
        assert torch.addcmul(y, x, x).dtype == torch.float32  # promote: widest input
        assert (x + y).dtype == torch.float32  # not on any list: ordinary promotion
        h = torch.mm(y, y.t())
        assert h.dtype == torch.bfloat16
        assert F.cross_entropy(h, torch.zeros(4, dtype=torch.long, device="tpu")).dtype == torch.float32
        sm = torch.softmax(x, -1)
    # Computed in float32 from the bf16 input, not in bf16.
    torch.testing.assert_close(sm.cpu(), torch.softmax(x.cpu().double(), -1).float())


def test_binary_cross_entropy_is_refused_under_autocast_as_on_cuda():
    p = torch.rand(4, device="tpu")
    t = torch.rand(4, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, t)
        assert F.binary_cross_entropy_with_logits(p, t).dtype == torch.float32
    F.binary_cross_entropy(p, t)  # outside autocast it is allowed


def _train_gpt(device, steps):
    torch.manual_seed(0)
    m = GPT(vocab=64, d_model=64, n_heads=4, n_layers=2, seq=32).to(device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for x, y in batches(64, 32, 8, steps):
        with torch.autocast(device, dtype=torch.bfloat16):
            logits, loss = m(x.to(device), y.to(device))
        assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
        opt.zero_grad()
        loss.backward()
        assert m.head.weight.grad.dtype == torch.float32  # master weights stay float32
        opt.step()
        losses.append(loss.item())
    return losses


def test_bf16_autocast_gpt_trains_like_cpu_autocast_with_no_fallbacks():
    ref = _train_gpt("cpu", 12)
    with no_fallbacks():
        got = _train_gpt("tpu", 12)
    # CPU's autocast keeps a different (shorter) op list in bf16 and its kernels round
    # differently; measured max difference ~1e-3 over these steps.
    assert max(abs(a - b) for a, b in zip(ref, got)) < 1e-2, (ref, got)
    assert got[-1] < got[0] * 0.5


def _scaler_run(device, poison):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
    x = torch.randn(4, 8).to(device)
    hist = []
    for step in range(5):
        with torch.autocast(device, dtype=torch.float16):
            out = m(x)
            assert out.dtype == torch.float16
            loss = out.float().pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        if step == 2:
            m[0].weight.grad[0, 0] = poison
        scaler.step(opt)
        scaler.update()
        hist.append((scaler.get_scale(), m[0].weight.detach().cpu().clone()))
    return hist


@pytest.mark.parametrize("poison", [float("inf"), float("nan")])
def test_grad_scaler_skips_the_step_with_bad_grads_like_cpu(poison):
    ref = _scaler_run("cpu", poison)
    with no_fallbacks():
        got = _scaler_run("tpu", poison)
    assert [s for s, _ in got] == [s for s, _ in ref] == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0]
    torch.testing.assert_close(got[2][1], got[1][1], rtol=0, atol=0)  # step 2 was skipped
    assert not torch.equal(got[3][1], got[2][1])
    # float16 matmuls may round differently on CPUs with other instruction sets.
    for (_, w_ref), (_, w) in zip(ref, got):
        torch.testing.assert_close(w, w_ref, atol=1e-3, rtol=1e-3)


def test_unscale_op_matches_cpu_and_keeps_a_set_flag():
    grads = [torch.randn(3, 4), torch.randn(5).half(), torch.tensor(2.0)]
    for bad in (None, float("inf")):
        gs = [g.clone() for g in grads]
        if bad is not None:
            gs[1][2] = bad
        for start in (0.0, 1.0):
            want = [g.clone() for g in gs]
            want_found = torch.full((1,), start)
            torch._amp_foreach_non_finite_check_and_unscale_(want, want_found, torch.full((1,), 0.25))
            got = [g.to("tpu") for g in gs]
            found = torch.full((1,), start, device="tpu")
            with no_fallbacks():
                torch._amp_foreach_non_finite_check_and_unscale_(got, found, torch.full((1,), 0.25, device="tpu"))
            assert found.item() == want_found.item() == (1.0 if bad is not None or start else 0.0)
            for g, w in zip(got, want):
                torch.testing.assert_close(g.cpu(), w, equal_nan=True)


@pytest.mark.parametrize("scale,tracker,found", [
    (1024.0, 0, 0.0), (1024.0, 1, 0.0), (1024.0, 1, 1.0), (3e38, 1, 0.0)])
def test_update_scale_op_matches_cpu(scale, tracker, found):
    def run(device):
        s = torch.full((), scale, device=device)
        t = torch.full((1,), tracker, dtype=torch.int32, device=device)
        torch._amp_update_scale_(s, t, torch.full((1,), found, device=device), 2.0, 0.5, 2)
        return s.cpu(), t.cpu()
    want = run("cpu")
    with no_fallbacks():
        got = run("tpu")
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_each_policy_kind_runs_natively():
    # One or more ops of each of CUDA's lists, including the redispatching kinds
    # (norm gains a dtype argument; prod/cumsum/vector_norm get dtype=float32).
    def t(*s):
        return torch.randn(*s, device="tpu")
    x, m, v = t(4, 8), t(8, 8), t(8)
    xb, vb = x.bfloat16(), v.bfloat16()  # float32 ops must widen these
    idx = torch.arange(8, device="tpu")
    cases = [
        (torch.bfloat16, lambda: torch.einsum("ij,jk->ik", x, m)),
        (torch.bfloat16, lambda: torch.addmv(v, m, v)),
        (torch.bfloat16, lambda: F.conv1d(t(1, 3, 8), t(4, 3, 3))),
        (torch.float32, lambda: torch.norm(xb)),
        (torch.float32, lambda: torch.norm(xb, 2, [1])),
        (torch.float32, lambda: torch.linalg.vector_norm(xb)),
        (torch.float32, lambda: xb.prod()),
        (torch.float32, lambda: xb.cumprod(1)),
        (torch.float32, lambda: F.group_norm(t(2, 4, 3).bfloat16(), 2)),
        (torch.float32, lambda: F.binary_cross_entropy_with_logits(xb, xb.sigmoid())),
        # promote: without it these refuse mixed dtypes
        (torch.float32, lambda: torch.zeros(8, device="tpu").scatter_add(0, idx, vb)),
        (torch.float32, lambda: torch.zeros(8, device="tpu").index_put((idx,), vb)),
    ]
    with no_fallbacks():
        for want, fn in cases:
            with torch.autocast("tpu", dtype=torch.bfloat16):
                out = fn()
            assert out.dtype == want, fn
        torch.tpu.synchronize()
