"""Two attention fixes (s61 probe): SDPA with a 0-D or 1-D attn_mask raises CPU's
IndexError where CPU's default choice does, and a compiled flex_attention replays its
captured program on steady calls (its eager body's `torch.tensor(number)` constants no
longer make the capture decline)."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch_tpu
from torch_tpu import EagerMode

B, H, L, S, D = 2, 4, 37, 53, 16
MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]


def _outcome(fn):
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001: the type and message are compared
        return type(e), str(e)
    return "ok", out


def _inputs(seed=0, mask_shape=(S,), dtype=torch.bool, hk=H, dropout=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g)
    k, v = (torch.randn(B, hk, S, D, generator=g) for _ in range(2))
    m = (torch.rand(mask_shape, generator=g) > 0.3) if dtype == torch.bool else torch.randn(mask_shape, generator=g)
    return q, k, v, m


@pytest.mark.parametrize("mode", MODES, ids=["strict", "fused"])
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32], ids=["bool", "float"])
@pytest.mark.parametrize("shape", [(S,), (1,), ()], ids=["1d", "1d_one", "0d"])
def test_sdpa_low_rank_mask_raises_cpus_error(mode, dtype, shape):
    q, k, v, m = _inputs(mask_shape=shape, dtype=dtype)
    want = _outcome(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
    assert want[0] is IndexError  # CPU's flash-choice check reads the mask's size(-2)
    with torch_tpu.set_eager_mode(mode):
        tq, tk, tv, tm = (t.to("tpu") for t in (q, k, v, m))
        got = _outcome(lambda: F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm))
        assert got == want
        # Nothing was queued: the tensors stay usable.
        torch.testing.assert_close((tq * 2 + tm.float().sum()).cpu(), q * 2 + m.float().sum())
        out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm.expand(L, S))
        torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v, attn_mask=m.expand(L, S)))


# Calls CPU runs with a low-rank mask (its math path broadcasts it): the tpu matches.
CPU_RUNS = {
    "math_backend": dict(backend=SDPBackend.MATH),
    "3d_inputs": dict(three_d=True),
    "mask_requires_grad": dict(mask_grad=True),
    "batch_broadcast": dict(kv_batch=1),
    "empty_query": dict(l=0),
    "gqa_kv_heads_differ": dict(gqa=True),
}


@pytest.mark.parametrize("mode", MODES, ids=["strict", "fused"])
@pytest.mark.parametrize("case", list(CPU_RUNS))
@pytest.mark.parametrize("shape", [(S,), ()], ids=["1d", "0d"])
def test_sdpa_low_rank_mask_runs_where_cpu_runs_it(mode, case, shape):
    c = CPU_RUNS[case]
    g = torch.Generator().manual_seed(1)
    lq = c.get("l", L)
    q = torch.randn(B, H, lq, D, generator=g)
    kb = c.get("kv_batch", B)
    k = torch.randn(kb, 2 if c.get("gqa") else H, S, D, generator=g)
    v = torch.randn(kb, 1 if c.get("gqa") else H, S, D, generator=g)
    m = torch.randn(shape, generator=g)
    if c.get("three_d"):
        q, k, v = q[0], k[0], v[0]
    if c.get("mask_grad"):
        m.requires_grad_()
    kw = dict(enable_gqa=True) if c.get("gqa") else {}

    def call(q, k, v, m):
        if "backend" in c:
            with sdpa_kernel(c["backend"]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)

    want = _outcome(lambda: call(q, k, v, m))
    with torch_tpu.set_eager_mode(mode):
        tm = m.detach().to("tpu").requires_grad_(m.requires_grad)
        got = _outcome(lambda: call(q.to("tpu"), k.to("tpu"), v.to("tpu"), tm))
        assert got[0] == want[0], (got, want)
        if want[0] == "ok":
            torch.testing.assert_close(got[1].cpu(), want[1].detach())
        else:
            assert got[1] == want[1]


# --- compiled flex_attention replays -------------------------------------------------

def _causal(b, h, q, kv):
    return q >= kv


def _relbias(score, b, h, q, kv):
    # Integer arithmetic (float score_mods: tests/test_compile_float_constants.py).
    return score + (q - kv)


def _reference(q, k, v, lq):
    q, k, v = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    i = torch.arange(lq)
    s = s + (i[:, None] - i[None, :])
    s = s.masked_fill(i[:, None] < i[None, :], float("-inf"))
    out = s.softmax(-1) @ v
    out.sum().backward()
    return out, q.grad, k.grad, v.grad


def _deltas(fn):
    m0 = dict(torch_tpu.metrics())
    fn()
    torch.tpu.synchronize()
    m1 = torch_tpu.metrics()
    return {k: m1[k] - m0.get(k, 0) for k in ("compiled_graph_calls", "compiled_replays", "op_calls",
                                                "h2d_transfers", "compiled_graphs")}


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_compiled_flex_attention_replays_steady_calls(grad):
    torch.manual_seed(0)
    lq, d = 64, 16
    bm = create_block_mask(_causal, None, None, lq, lq, device="tpu")
    cf = torch.compile(flex_attention, backend="tpu")

    def make():
        return [torch.randn(1, 2, lq, d, device="tpu", requires_grad=grad) for _ in range(3)]

    def call(q, k, v):
        out = cf(q, k, v, score_mod=_relbias, block_mask=bm)
        if grad:
            out.sum().backward()
        return out

    for _ in range(2):  # the first call records and captures; the second is steady
        call(*make())
    for step in range(3):  # new inputs each call: the replay reads their buffers
        q, k, v = make()
        holder = {}
        d_ = _deltas(lambda: holder.setdefault("out", call(q, k, v)))
        graphs = 2 if grad else 1
        assert d_["compiled_graph_calls"] == graphs and d_["compiled_replays"] == graphs, d_
        assert d_["compiled_graphs"] == 0, d_
        # Only the eager sum/backward seed outside the graphs record; no constant upload.
        assert d_["h2d_transfers"] <= (1 if grad else 0), d_
        want = _reference(q, k, v, lq)
        torch.testing.assert_close(holder["out"].detach().cpu().double(), want[0], atol=2e-5, rtol=1e-5)
        if grad:
            for t, w in zip((q, k, v), want[1:]):
                torch.testing.assert_close(t.grad.cpu().double(), w, atol=2e-5, rtol=1e-5)


def test_python_number_tensors_in_a_compiled_graphs_body_are_constants_not_cpu_values():
    """A CPU tensor with a varying value read by a graph's op still records each call: a
    custom op whose Python body draws a CPU random scalar must not replay a frozen draw."""
    @torch.library.custom_op("tpu_test_fixes::add_cpu_noise", mutates_args=())
    def add_cpu_noise(x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand(()) + torch.tensor(1.0)

    @add_cpu_noise.register_fake
    def _(x):
        return torch.empty_like(x)

    cf = torch.compile(lambda x: add_cpu_noise(x) * 2, backend="tpu")
    x = torch.zeros(4, device="tpu")
    outs = [cf(x).cpu() for _ in range(4)]
    assert len({round(o[0].item(), 6) for o in outs}) == 4  # a fresh draw every call
    for o in outs:
        assert torch.all((o >= 2) & (o <= 4))
