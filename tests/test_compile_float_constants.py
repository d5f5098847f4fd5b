"""A compiled graph whose code holds a Python number replays it as a constant.

A flex_attention score_mod with a float (`score * 0.5`, soft-capping
`tanh(score / 30) * 30`, `(q - kv) * 0.1`) recorded all its ops again at every call: under
flex's vmap, functorch's batching rule converts the wrapped Python number to the score's
dtype, a plain CPU 0-D tensor, which the capture took for a CPU value that may vary
("the graph reads a host value that may vary"). Such a number is a constant of the graph
(baked in, or guarded by Dynamo); a CPU tensor the caller passes in must still be read anew.
"""
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch_tpu
from torch_tpu import EagerMode
from torch_tpu._internal import compile as tpu_compile

H, L, D = 2, 128, 16
MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING]
MODE_IDS = ["strict", "fused", "debug"]


def _scale(score, b, h, q, kv):
    return score * 0.5


def _softcap(score, b, h, q, kv):
    return torch.tanh(score / 30) * 30


def _relbias(score, b, h, q, kv):
    return score + (q - kv) * 0.1


SCORE_MODS = {"scale": _scale, "softcap": _softcap, "relbias": _relbias}


def _causal(b, h, q, kv):
    return q >= kv


def _deltas(fn):
    torch.tpu.synchronize()
    m0 = dict(torch_tpu.metrics())
    out = fn()
    torch.tpu.synchronize()
    m1 = torch_tpu.metrics()
    return out, {k: m1[k] - m0.get(k, 0) for k in ("compiled_graph_calls", "compiled_replays", "compiled_graphs")}


def _qkv(seed, grad):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, L, D, generator=g) for _ in range(3)]


def _run(cf, qkv, grad, device="tpu", **kw):
    q, k, v = (t.to(device).requires_grad_(grad) for t in qkv)
    out = cf(q, k, v, **kw)
    if grad:
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(device))
        return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]
    return [out.cpu()]


def _reference(qkv, score_mod, grad, causal=True):
    """Dense attention in float64 on the CPU, score_mod applied with broadcast indices."""
    q, k, v = (t.double().requires_grad_(grad) for t in qkv)
    i = torch.arange(L)
    s = score_mod(q @ k.transpose(-1, -2) / D ** 0.5, None, None, i[:, None], i[None, :])
    if causal:
        s = s.masked_fill(i[:, None] < i[None, :], float("-inf"))
    out = s.softmax(-1) @ v
    if not grad:
        return [out.detach()]
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).double())
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", list(SCORE_MODS))
def test_float_score_mod_replays_bit_equal_to_recording(name, grad, mode):
    torch._dynamo.reset()
    score_mod = SCORE_MODS[name]
    with torch_tpu.set_eager_mode(mode):
        bm = create_block_mask(_causal, None, None, L, L, device="tpu")
        cf = torch.compile(flex_attention, backend="tpu")
        for s in range(2):  # the first call records and captures; the second is steady
            _run(cf, _qkv(s, grad), grad, score_mod=score_mod, block_mask=bm)
        graphs = 2 if grad else 1
        for s in range(2, 4):  # new values each call: the replay reads their buffers
            qkv = _qkv(s, grad)
            got, d = _deltas(lambda: _run(cf, qkv, grad, score_mod=score_mod, block_mask=bm))
            assert d["compiled_graph_calls"] == graphs and d["compiled_replays"] == graphs, d
            assert d["compiled_graphs"] == 0, d
            tpu_compile.REPLAY = False  # the recording path, every op recorded anew
            try:
                want, d = _deltas(lambda: _run(cf, qkv, grad, score_mod=score_mod, block_mask=bm))
            finally:
                tpu_compile.REPLAY = True
            assert d["compiled_replays"] == 0, d
            for a, b in zip(got, want):
                assert torch.equal(a, b)
            # and right (float64 on the CPU)
            ref = _reference(qkv, score_mod, grad)
            for a, b in zip(got, ref):
                torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", MODES[:2], ids=MODE_IDS[:2])
def test_cpu_scalar_tensor_passed_in_is_read_anew(mode):
    """A CPU 0-D tensor the score_mod closes over (a graph input) and the caller changes in
    place between calls: each call uses its new value, next to the float constant."""
    torch._dynamo.reset()
    temp = torch.tensor(1.0)

    def score_mod(score, b, h, q, kv):
        return score * temp * 0.5

    with torch_tpu.set_eager_mode(mode):
        cf = torch.compile(flex_attention, backend="tpu")
        qkv = _qkv(0, False)
        outs = []
        for t in (1.0, 1.0, 2.0, 0.25, 3.0):
            temp.fill_(t)
            outs.append(_run(cf, qkv, False, score_mod=score_mod)[0])
            ref = _reference(qkv, score_mod, False, causal=False)[0]
            torch.testing.assert_close(outs[-1].double(), ref, atol=2e-5, rtol=1e-5)
        assert torch.equal(outs[0], outs[1])
        assert not torch.equal(outs[1], outs[2]) and not torch.equal(outs[2], outs[3])


@pytest.mark.parametrize("mode", MODES[:2], ids=MODE_IDS[:2])
def test_cpu_scalar_argument_with_a_float_constant_is_read_anew(mode):
    """Outside vmap: a CPU scalar argument of a compiled function, with a float constant in
    the same graph, is read at each call."""
    torch._dynamo.reset()

    def fn(x, s):
        return (x * s).softmax(-1) * 0.5 + torch.tanh(x / 30) * 30

    with torch_tpu.set_eager_mode(mode):
        cf = torch.compile(fn, backend="tpu")
        x = torch.randn(4, 8)
        xd = x.to("tpu")
        for v in (1.0, 1.0, -2.0, 0.5):
            s = torch.tensor(v)
            torch.testing.assert_close(cf(xd, s).cpu(), fn(x, s))


def test_changing_python_float_changes_result():
    """A float the score_mod reads from a variable that changes: Dynamo guards on it (or
    passes it in), so a changed value is used, never the captured one."""
    torch._dynamo.reset()
    cfg = {"scale": 0.5}

    def score_mod(score, b, h, q, kv):
        return score * cfg["scale"]

    cf = torch.compile(flex_attention, backend="tpu")
    qkv = _qkv(0, False)
    for v in (0.5, 0.5, 0.125, 0.5, 2.0):
        cfg["scale"] = v
        got = _run(cf, qkv, False, score_mod=score_mod)[0]
        ref = _reference(qkv, score_mod, False, causal=False)[0]
        torch.testing.assert_close(got.double(), ref, atol=2e-5, rtol=1e-5)


def _where_inf(x):
    return torch.where(x > 0, x, torch.tensor(-float("inf"), device=x.device)).softmax(-1)


def _where_table(x):
    w = torch.tensor([1.0, -2.0, 0.5, 3.0] * 4, device=x.device)
    return (torch.where(x > 0, x * w, torch.tensor(-1e4, device=x.device)) * 0.5).logsumexp(-1)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("fn", [_where_inf, _where_table], ids=["where_inf", "table"])
def test_backward_reading_a_literal_replays(fn, mode):
    """A backward graph that reads a literal tensor of the compiled code (AOTAutograd gives
    it a copy of the forward's `_tensor_constant0`, computed while the forward recorded)
    replays too; it recorded all its ops again at every call."""
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    with torch_tpu.set_eager_mode(mode):
        cf = torch.compile(fn, backend="tpu")

        def step():
            x = torch.randn(8, 16, generator=gen)
            g = torch.randn(8, 16, generator=gen)[:, 0] if fn is _where_table else torch.randn(8, 16, generator=gen)
            xd = x.to("tpu").requires_grad_()
            y = cf(xd)
            y.backward(g.to("tpu"))
            return x, g, y.detach().cpu(), xd.grad.cpu()

        for _ in range(2):
            step()
        for _ in range(3):
            (x, g, y, gx), d = _deltas(step)
            assert d["compiled_graph_calls"] == 2 and d["compiled_replays"] == 2, d
            xc = x.clone().requires_grad_()
            yc = fn(xc)
            yc.backward(g)
            torch.testing.assert_close(y, yc.detach())
            torch.testing.assert_close(gx, xc.grad)


@torch.library.custom_op("tpu_test_float_consts::add_scaled_cpu_noise", mutates_args=())
def _add_scaled_cpu_noise(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x + torch.rand(()) * scale


@_add_scaled_cpu_noise.register_fake
def _(x, scale):
    return torch.empty_like(x)


def test_custom_op_with_a_number_still_reads_its_cpu_value_anew():
    """A custom op called with a Python number, whose body draws a CPU random scalar that
    its device op reads: not a number of the graph, so each call draws afresh."""
    torch._dynamo.reset()
    cf = torch.compile(lambda x: _add_scaled_cpu_noise(x, 2.0) * 0.5, backend="tpu")
    x = torch.zeros(4, device="tpu")
    outs = [cf(x).cpu() for _ in range(4)]
    assert len({round(o[0].item(), 6) for o in outs}) == 4  # a fresh draw every call
    for o in outs:
        assert torch.all((o >= 0) & (o <= 1))


def _sin2(x):
    return (x * 2).sin() * 0.5


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("fn", ["sin2", "flex_scale"])
def test_backward_of_a_summed_output_replays(fn, mode):
    """`f(x).sum().backward()`: the backward graph's cotangent is AOTAutograd's contiguous
    copy of the expanded seed, which Debug queues until its first read. Read inside the
    recording, the program read the seed instead of the input and the capture declined
    (every compiled backward recorded at each call in Debug)."""
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    with torch_tpu.set_eager_mode(mode):
        if fn == "sin2":
            cf, ref = torch.compile(_sin2, backend="tpu"), _sin2
            shape = (8, 16)
        else:
            cf = torch.compile(lambda q: flex_attention(q, q, q, score_mod=_scale), backend="tpu")
            shape = (1, H, L, D)

            def ref(q):
                return _scale(q @ q.transpose(-1, -2) / D ** 0.5, None, None, None, None).softmax(-1) @ q

        def step():
            x = torch.randn(shape, generator=gen)
            xd = x.to("tpu").requires_grad_()
            cf(xd).sum().backward()
            return x, xd.grad.cpu()

        for _ in range(2):
            step()
        for _ in range(2):
            (x, gx), d = _deltas(step)
            assert d["compiled_graph_calls"] == 2 and d["compiled_replays"] == 2, d
            xc = x.double().requires_grad_()
            ref(xc).sum().backward()
            torch.testing.assert_close(gx.double(), xc.grad, atol=2e-5, rtol=1e-5)
