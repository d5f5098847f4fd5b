"""torch.func / forward-mode AD cases for test_func_transforms.py: each case(dev, dtype)
builds its inputs on the CPU and returns tensors; run_all() compares tpu float32 against a
CPU float64 reference (CPU float32's own error sets the tolerance). Run in a fresh
interpreter per eager mode."""
import math

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, grad_and_value, hessian, jacfwd, jacrev, jvp, stack_module_state, vjp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def on(x, d, dt):
    return x.to(device=d, dtype=dt)


def dual_outputs(out):
    """Primal and tangent of each dual output (a missing tangent as zeros)."""
    res = []
    for o in out if isinstance(out, (tuple, list)) else (out,):
        p, t = fwAD.unpack_dual(o)
        res += [p, torch.zeros_like(p) if t is None else t]
    return res


def rnn(kind, d, dt, **kw):
    torch.manual_seed(7)
    return getattr(nn, kind)(4, 3, **kw).to(d, dt)


# ---- fixed: forward AD through the fused RNN cells (NotImplementedError on tpu before) ----
@case
def fwd_ad_lstm_bidirectional(d, dt):
    m = rnn("LSTM", d, dt, bidirectional=True, batch_first=True)
    with fwAD.dual_level():
        out, (h, c) = m(fwAD.make_dual(on(rnd(2, 3, 4), d, dt), on(rnd(2, 3, 4, seed=1), d, dt)))
        return dual_outputs((out, h, c))


@case
def fwd_ad_gru_2layer(d, dt):
    m = rnn("GRU", d, dt, num_layers=2, batch_first=True)
    with fwAD.dual_level():
        out, h = m(fwAD.make_dual(on(rnd(2, 3, 4), d, dt), on(rnd(2, 3, 4, seed=1), d, dt)))
        return dual_outputs((out, h))


@case
def fwd_ad_lstm_cell_tangent_on_state(d, dt):
    m = rnn("LSTMCell", d, dt)
    x, h, c = on(rnd(2, 4), d, dt), on(rnd(2, 3, seed=1), d, dt), on(rnd(2, 3, seed=2), d, dt)
    with fwAD.dual_level():
        hc = (fwAD.make_dual(h, on(rnd(2, 3, seed=3), d, dt)), fwAD.make_dual(c, on(rnd(2, 3, seed=4), d, dt)))
        return dual_outputs(m(x, hc))


@case
def fwd_ad_gru_cell_no_bias(d, dt):
    torch.manual_seed(8)
    m = nn.GRUCell(4, 3, bias=False).to(d, dt)
    with fwAD.dual_level():
        return dual_outputs(m(fwAD.make_dual(on(rnd(2, 4), d, dt), on(rnd(2, 4, seed=1), d, dt))))


@case
def jvp_lstm(d, dt):
    m = rnn("LSTM", d, dt, batch_first=True)
    return jvp(lambda a: m(a)[0], (on(rnd(2, 3, 4), d, dt),), (on(rnd(2, 3, 4, seed=1), d, dt),))


@case
def jacfwd_gru_wrt_weights(d, dt):
    m = rnn("GRU", d, dt, batch_first=True)
    params = {k: v.detach() for k, v in m.named_parameters()}
    x = on(rnd(1, 3, 4), d, dt)
    return jacfwd(lambda p: functional_call(m, p, (x,))[0].sum(1))(params)


# ---- fixed (speed): under a torch.func transform the cell runs as separate ops, which batch
# (jacrev vmapped the fused cell's double backward one element at a time) ----
@case
def jacrev_lstm_and_hessian_gru(d, dt):
    lstm, gru = rnn("LSTM", d, dt, batch_first=True), rnn("GRU", d, dt, batch_first=True)
    x = on(rnd(1, 3, 4), d, dt)
    return jacrev(lambda a: lstm(a)[0][0, -1])(x), hessian(lambda a: gru(a)[0].pow(2).sum())(x[0, :2])


@case
def per_sample_grads_lstm(d, dt):
    m = rnn("LSTM", d, dt, batch_first=True)
    params = {k: v.detach() for k, v in m.named_parameters()}
    xs = on(rnd(4, 3, 4), d, dt)
    loss = lambda p, a: functional_call(m, p, (a[None],))[0].pow(2).sum()
    if d == "cpu":  # CPU's unfused cell adds in place into an unbatched tensor: vmap raises there
        return [grad(loss)(params, x) for x in xs]
    psg = vmap(grad(loss), in_dims=(None, 0))(params, xs)
    return [{k: v[i] for k, v in psg.items()} for i in range(len(xs))]


# ---- fixed: forward AD through scaled_dot_product_attention (the fused op has no formula) ----
def sdpa(q, k, v, **kw):
    if q.device.type == "cpu":  # CPU's flash kernel has no forward formula either: its math path
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, **kw)
    return F.scaled_dot_product_attention(q, k, v, **kw)


@case
def fwd_ad_sdpa_causal(d, dt):
    q, k, v = (on(rnd(2, 2, 4, 8, seed=s), d, dt) for s in range(3))
    with fwAD.dual_level():
        return dual_outputs(sdpa(fwAD.make_dual(q, on(rnd(2, 2, 4, 8, seed=5), d, dt)), k, v, is_causal=True))


@case
def fwd_ad_sdpa_tangent_on_key_value_with_mask(d, dt):
    q, k, v = (on(rnd(2, 2, 4, 8, seed=s), d, dt) for s in range(3))
    mask = on(rnd(4, 4, seed=9), d, dt)
    with fwAD.dual_level():
        k, v = (fwAD.make_dual(t, on(rnd(2, 2, 4, 8, seed=6 + i), d, dt)) for i, t in enumerate((k, v)))
        return dual_outputs(sdpa(q, k, v, attn_mask=mask))


# ---- already working: a representative sample ----
@case
def jvp_transformer_encoder_layer(d, dt):
    # (under torch.func.jvp the choice was already the math path: a functorch transform is on)
    torch.manual_seed(1)
    m = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).to(d, dt)
    x, t = on(rnd(2, 5, 8), d, dt), on(rnd(2, 5, 8, seed=1), d, dt)
    if d == "cpu":
        with sdpa_kernel(SDPBackend.MATH):
            return jvp(m, (x,), (t,))
    return jvp(m, (x,), (t,))


@case
def vmap_ops(d, dt):
    x, w = on(rnd(4, 3, 5), d, dt), on(rnd(5, 6), d, dt)
    idx = torch.tensor([[2, 0], [1, 1], [0, 2], [2, 2]], device=d)
    f = lambda a, i: (F.softmax(a @ w, -1), F.layer_norm(a, (5,)), a.amax(1), a[i], a.gather(1, i[:, None].expand(2, 5)),
                      a.cumsum(0), torch.einsum("ij,jk->ik", a, w))
    return vmap(f)(x, idx)


@case
def vmap_in_out_dims_nested(d, dt):
    x, y = on(rnd(3, 4), d, dt), on(rnd(4, 5), d, dt)
    outer = vmap(vmap(torch.dot, in_dims=(None, 0)), in_dims=(0, None))(x, y.t().contiguous())
    return outer, vmap(torch.mul, in_dims=(1, 0), out_dims=1)(y, y.t().contiguous())


@case
def vmap_conv2d_cross_entropy(d, dt):
    x, w = on(rnd(3, 2, 4, 8, 8), d, dt), on(rnd(5, 4, 3, 3), d, dt)
    y = torch.tensor([[0, 1], [2, 3], [4, 0]], device=d)
    return vmap(lambda a, t: F.cross_entropy(F.conv2d(a, w, padding=1).mean((2, 3)), t))(x, y)


@case
def grad_family(d, dt):
    x, v = on(rnd(5), d, dt), on(rnd(5, seed=1), d, dt)
    f = lambda a: (a.sin() * a.exp()).sum() + (a ** 4).sum()
    out, pull = vjp(lambda a: a.sigmoid() * a.sum(), x)
    return (grad(f)(x), grad_and_value(f)(x), pull(v), jvp(lambda a: a.tanh() * a, (x,), (v,)),
            jacrev(lambda a: a.cumsum(0).sin())(x), jacfwd(lambda a: F.softmax(a, 0))(x), hessian(f)(x))


@case
def per_sample_grads_and_ensemble(d, dt):
    torch.manual_seed(1)
    ms = [nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).to(d, dt) for _ in range(3)]
    params = {k: v.detach() for k, v in ms[0].named_parameters()}
    x, y = on(rnd(6, 5), d, dt), torch.tensor([0, 1, 2, 0, 1, 2], device=d)
    loss = lambda p, a, t: F.cross_entropy(functional_call(ms[0], p, (a[None],)), t[None])
    psg = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    stacked, buffers = stack_module_state(ms)
    ens = vmap(lambda p, b: functional_call(ms[0], (p, b), (x,)))(stacked, buffers)
    return psg, ens


@case
def fwd_ad_conv_norm_layers(d, dt):
    torch.manual_seed(3)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.GELU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.LayerNorm(16)).to(d, dt)
    with fwAD.dual_level():
        return dual_outputs(m(fwAD.make_dual(on(rnd(2, 3, 6, 6), d, dt), on(rnd(2, 3, 6, 6, seed=1), d, dt))))


@case
def autograd_functional(d, dt):
    x, v = on(rnd(4), d, dt), on(rnd(4, seed=1), d, dt)
    f = lambda a: (a.tanh() ** 3).sum()
    g = lambda a: a.sin() * a.sum()
    AF = torch.autograd.functional
    return (AF.jacobian(g, x), AF.jacobian(g, x, vectorize=True, strategy="forward-mode"), AF.hessian(f, x),
            AF.hvp(f, x, v), AF.vhp(f, x, v))


@case
def gradient_penalty(d, dt):
    torch.manual_seed(5)
    m = nn.Sequential(nn.Conv2d(2, 3, 3), nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(3 * 4 * 4, 1)).to(d, dt)
    x = on(rnd(3, 2, 6, 6), d, dt).requires_grad_()
    g, = torch.autograd.grad(m(x).sum(), x, create_graph=True)
    gp = ((g.flatten(1).norm(2, dim=1) - 1) ** 2).mean()
    gp.backward()
    return gp, [p.grad for p in m.parameters()]


@case
def lstm_double_backward(d, dt):
    m = rnn("LSTM", d, dt, batch_first=True)
    x = on(rnd(2, 2, 4), d, dt).requires_grad_()
    g, = torch.autograd.grad(m(x)[0].sum(), x, create_graph=True)
    g.pow(2).sum().backward()
    return g, [p.grad for p in m.parameters()]


@case
def compiled_grad_and_vmap(d, dt):
    torch._dynamo.reset()
    backend = "tpu" if d == "tpu" else "eager"
    x, w = on(rnd(4, 3, 5), d, dt), on(rnd(5, 6), d, dt)
    f = torch.compile(lambda a: vmap(lambda r: (r @ w).softmax(-1))(a), backend=backend)
    g = torch.compile(lambda a: (a.sin() * a.exp()).sum(), backend=backend)
    return f(x), grad(g)(x[0, 0])


def flat(out):
    if out is None:  # a parameter the loss does not reach: no .grad, on CPU too
        return []
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in flat(out[k])]
    return [t for o in out for t in flat(o)]


def compare(fn):
    """Max error of tpu float32 against CPU float64, and whether it is within tolerance."""
    torch.backends.mkldnn.enabled = False  # CPU's mkldnn RNN kernel has no forward formula
    try:
        ref = [t.detach().double() for t in flat(fn("cpu", torch.float64))]
        c32 = [t.detach().double() for t in flat(fn("cpu", torch.float32))]
    finally:
        torch.backends.mkldnn.enabled = True
    out = [t.detach().cpu().double() for t in flat(fn("tpu", torch.float32))]
    assert len(out) == len(ref), (len(out), len(ref))
    worst, ok = 0.0, True
    for o, r, c in zip(out, ref, c32):
        assert o.shape == r.shape, (o.shape, r.shape)
        err, cpu_err = (o - r).abs().max().item(), (c - r).abs().max().item()
        tol = max(20 * cpu_err, 2e-5 * max(r.abs().max().item(), 1.0))
        worst, ok = max(worst, err), ok and err <= tol
    return worst, ok


def run_all():
    res = {}
    for name, fn in CASES.items():
        try:
            res[name] = list(compare(fn))
        except Exception as e:  # reported per case by the test
            res[name] = f"{type(e).__name__}: {str(e)[:300]}"
    return res
