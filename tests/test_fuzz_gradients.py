"""Property-based fuzzing (hypothesis) of gradients where their definitions are choices:
ties (max, sort, median, maximum: which element gets the gradient, or how it is split),
kinks and boundaries (abs, relu, clamp, hardtanh, threshold, softplus at 0 and at their
bounds), zeros (prod, cumprod, norm, sqrt, pow, atan2), infinities (log, reciprocal) and
duplicate indices (gather, index_add, embedding). Inputs come from a small pool of such
values, so ties and boundaries are frequent. The loss and every input's gradient match
CPU's in Strict and DeferAndFuse (float32). Deterministic (derandomized) in CI;
TPU_FUZZ_EXAMPLES=N runs N random cases per op and mode instead (a campaign)."""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402
from fuzzing import MODES, check_outcomes_alike, fuzz_settings  # noqa: E402

SETTINGS = fuzz_settings(6)
POOL = [-3.0, -1.0, -0.5, 0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 3.0, 6.0]


def _d(x, d):
    return d % x.dim() if x.dim() else 0


def _idx(x, d, n, seed):
    """Indices (with duplicates) into dim d of x, n of them."""
    size = x.shape[_d(x, d)] if x.dim() else 1
    return torch.randint(size, (n,), generator=torch.Generator().manual_seed(seed)).to(x.device)


# name -> fn(x, y, d, i): x, y float tensors needing grad (y: the same shape), d a dim,
# i a seed for indices. Returns a tensor (or a tuple whose tensors all enter the loss).
OPS = {
    # Ties
    "amax": lambda x, y, d, i: x.amax(d),
    "amin_all": lambda x, y, d, i: x.amin(),
    "max_dim": lambda x, y, d, i: x.max(d).values,
    "max_all": lambda x, y, d, i: x.max(),
    "min_dim": lambda x, y, d, i: x.min(d).values,
    "median_all": lambda x, y, d, i: x.median(),
    "median_dim": lambda x, y, d, i: x.median(d).values,
    "nanmedian_dim": lambda x, y, d, i: x.nanmedian(d).values,
    "kthvalue": lambda x, y, d, i: x.kthvalue(1, d).values,
    "sort": lambda x, y, d, i: x.sort(d, stable=True).values,
    # (ties broken first: which tied element CPU's topk picks is its selection algorithm's)
    "topk": lambda x, y, d, i: (x + torch.arange(x.numel(), device=x.device).reshape(x.shape) * 1e-3).topk(1, d).values,
    "cummax": lambda x, y, d, i: x.cummax(d).values,
    "cummin": lambda x, y, d, i: x.cummin(d).values,
    "maximum": lambda x, y, d, i: torch.maximum(x, y),
    "minimum": lambda x, y, d, i: torch.minimum(x, y),
    "fmax": lambda x, y, d, i: torch.fmax(x, y),
    "logsumexp": lambda x, y, d, i: x.logsumexp(d),
    "norm_inf": lambda x, y, d, i: x.norm(float("inf"), dim=d),
    "max_pool1d": lambda x, y, d, i: F.max_pool1d(x.reshape(1, 1, -1), 2, 1),
    # Kinks and bounds
    "abs": lambda x, y, d, i: x.abs(),
    "relu": lambda x, y, d, i: x.relu(),
    "leaky_relu": lambda x, y, d, i: F.leaky_relu(x, 0.1),
    "clamp": lambda x, y, d, i: x.clamp(-0.5, 1.0),
    "clamp_tensor": lambda x, y, d, i: x.clamp(min=y),
    "hardtanh": lambda x, y, d, i: F.hardtanh(x, -1.0, 1.0),
    "relu6": lambda x, y, d, i: F.relu6(x),
    "hardsigmoid": lambda x, y, d, i: F.hardsigmoid(x),
    "hardswish": lambda x, y, d, i: F.hardswish(x),
    "threshold": lambda x, y, d, i: F.threshold(x, 0.5, -2.0),
    "hardshrink": lambda x, y, d, i: F.hardshrink(x, 0.5),
    "softshrink": lambda x, y, d, i: F.softshrink(x, 0.5),
    "softplus": lambda x, y, d, i: F.softplus(x, beta=1.0, threshold=1.0),
    "elu": lambda x, y, d, i: F.elu(x),
    "celu": lambda x, y, d, i: F.celu(x, 0.5),
    "gelu_tanh": lambda x, y, d, i: F.gelu(x, approximate="tanh"),
    "sign": lambda x, y, d, i: x.sign() * x,
    "round": lambda x, y, d, i: x.round() + x.frac(),
    "smooth_l1": lambda x, y, d, i: F.smooth_l1_loss(x, y, beta=1.0, reduction="none"),
    "huber": lambda x, y, d, i: F.huber_loss(x, y, delta=0.5, reduction="none"),
    "l1": lambda x, y, d, i: F.l1_loss(x, y),
    "where": lambda x, y, d, i: torch.where(x > 0, x, y),
    # Zeros and infinities
    "prod_dim": lambda x, y, d, i: x.prod(d),
    "prod_all": lambda x, y, d, i: x.prod(),
    "cumprod": lambda x, y, d, i: x.cumprod(d),
    "norm2": lambda x, y, d, i: x.norm(dim=d),
    "norm1": lambda x, y, d, i: x.norm(1, dim=d),
    "vector_norm_3": lambda x, y, d, i: torch.linalg.vector_norm(x, 3, dim=d),
    "normalize": lambda x, y, d, i: F.normalize(x, dim=d),
    "dist": lambda x, y, d, i: torch.dist(x, y),
    "sqrt": lambda x, y, d, i: x.abs().sqrt(),
    "pow2": lambda x, y, d, i: x.pow(2),
    "pow_half": lambda x, y, d, i: x.abs().pow(0.5),
    "pow_tensor": lambda x, y, d, i: x.abs().pow(y),
    "atan2": lambda x, y, d, i: torch.atan2(x, y),
    "hypot": lambda x, y, d, i: torch.hypot(x, y),
    "log": lambda x, y, d, i: x.abs().log(),
    "xlogy": lambda x, y, d, i: torch.xlogy(x, y.abs()),
    "reciprocal": lambda x, y, d, i: x.reciprocal(),
    "div": lambda x, y, d, i: x / y,
    "std": lambda x, y, d, i: x.std(d),
    "var_mean": lambda x, y, d, i: torch.var_mean(x, d),
    "logaddexp": lambda x, y, d, i: torch.logaddexp(x, y),
    "log_softmax": lambda x, y, d, i: x.log_softmax(d),
    "binary_cross_entropy": lambda x, y, d, i: F.binary_cross_entropy(x.sigmoid(), (y > 0).float()),
    "kl_div": lambda x, y, d, i: F.kl_div(x.log_softmax(-1), y.abs(), reduction="batchmean"),
    # Duplicate indices
    "gather": lambda x, y, d, i: x.gather(_d(x, d), _idx(x, d, 5, i).reshape(
        [5 if k == _d(x, d) else x.shape[k] for k in range(x.dim())]) if x.dim() else _idx(x, d, 1, i)[0]),
    "index_select": lambda x, y, d, i: x.index_select(_d(x, d), _idx(x, d, 5, i)),
    "index_add": lambda x, y, d, i: x.index_add(0, _idx(x, 0, x.shape[0] if x.dim() else 1, i), y),
    "take": lambda x, y, d, i: x.take(torch.randint(max(1, x.numel()), (6,),
                                                    generator=torch.Generator().manual_seed(i)).to(x.device)),
    "embedding": lambda x, y, d, i: F.embedding(_idx(x, 0, 6, i), x.reshape(x.shape[0], -1) if x.dim() else
                                                x.reshape(1, 1)),
    "index_put_acc": lambda x, y, d, i: x.index_put((_idx(x, 0, x.shape[0] if x.dim() else 1, i),), y,
                                                    accumulate=True) if x.dim() else x,
    "cross_entropy": lambda x, y, d, i: F.cross_entropy(
        x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1),
        _idx(x, -1, (x.numel() // x.shape[-1]) if x.dim() else 1, i), label_smoothing=0.1),
}


@st.composite
def cases(draw):
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.sampled_from([1, 2, 3, 4])) for _ in range(rank))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    pool = torch.tensor(POOL)
    x = pool[torch.randint(len(POOL), shape, generator=g)]
    y = pool[torch.randint(len(POOL), shape, generator=g)]
    return x, y, draw(st.integers(-3, 3)), draw(st.integers(0, 2**16))


def _run(fn, x, y, d, i, device):
    xs = [t.detach().clone().to(device).requires_grad_() for t in (x, y)]
    try:
        out = fn(xs[0], xs[1], d, i)
    except Exception as e:  # noqa: BLE001
        return e
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
    if not outs:
        return None
    loss = sum((o * torch.arange(1, o.numel() + 1, device=device).reshape(o.shape).float().div(7)).sum()
               for o in outs)
    loss.backward()
    return [loss.detach().cpu()] + [t.grad.cpu() if t.grad is not None else None for t in xs]


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(OPS))
def test_fuzz_gradient_semantics_match_cpu(name, mode):
    assert len(OPS) >= 70

    @SETTINGS
    @given(cases())
    def check(case):
        x, y, d, i = case
        want = _run(OPS[name], x, y, d, i, "cpu")
        with torch_tpu.set_eager_mode(MODES[mode]):
            got = _run(OPS[name], x, y, d, i, "tpu")
        what = f"{name}[{mode}] x={x.tolist()} y={y.tolist()} d={d} i={i}"
        if check_outcomes_alike(want, got, what) or want is None:
            return
        for n, (g, w) in enumerate(zip(got, want)):
            assert (g is None) == (w is None), f"{what}: gradient {n} defined on one side only"
            if w is None:
                continue
            finite = torch.isfinite(w)
            scale = float(w[finite].abs().max()) if finite.any() else 1.0
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * max(1.0, scale), equal_nan=True,
                                       msg=f"{what}: {'loss' if n == 0 else 'grad ' + 'xy'[n - 1]}")
            assert torch.equal(g.isinf(), w.isinf()), f"{what}: infinities differ"

    check()
