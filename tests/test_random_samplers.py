"""Gamma, Dirichlet, Poisson and binomial sampling run natively (lowering/random_samplers.cpp):
drawn from the tpu generator, checked against the laws (moments and Kolmogorov-Smirnov
distances; tpu's stream is not CPU's, so values are not compared), with CPU's dtypes,
shapes, edge values and errors; the gamma's reparameterized gradient matches CPU's."""
import math

import numpy as np
import pytest
import torch

from conftest import assert_draws_follow_the_tpu_generator, no_fallbacks

try:
    from scipy import stats
except ImportError:  # compared with CPU's samples instead
    stats = None

N = 100_000
pytestmark = pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
F32_MIN, F64_MIN = torch.finfo(torch.float32).tiny, torch.finfo(torch.float64).tiny


def ks_distance(samples, cdf, floor=None, ceil=None):
    """sup |ECDF - F| for a continuous F, exact with ties: both limits at each distinct
    value. `floor` and `ceil` are clamp values holding the law's mass beyond them (F
    jumps there from 0, or to 1)."""
    x, counts = np.unique(samples, return_counts=True)
    right = np.cumsum(counts) / len(samples)
    left = right - counts / len(samples)
    f = cdf(x)
    f_left = f.copy()
    if floor is not None and x[0] == floor:
        f_left[0] = 0.0
    if ceil is not None and x[-1] == ceil:
        f[-1] = 1.0
    return max(np.abs(right - f).max(), np.abs(left - f_left).max())


def discrete_ks(samples, cdf):
    """sup over integers k of |ECDF(k) - F(k)| (a conservative KS distance for a
    discrete law)."""
    x, counts = np.unique(samples, return_counts=True)
    return np.abs(np.cumsum(counts) / len(samples) - cdf(x)).max()


def two_sample_ks(a, b):
    grid = np.union1d(a, b)
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return np.abs(fa - fb).max()


# With a fixed seed the draws are fixed; a limit at p ~ 1e-4 (one-sample: 2.2 / sqrt(n)).
def ks_limit(n, m=None):
    return 2.2 * math.sqrt(1 / n + (1 / m if m else 0))


def check_moments(x, mean, var, kurt_excess, n_se=5.0, what=""):
    """Sample mean and variance within n_se standard errors of the law's."""
    n = len(x)
    m, v = x.mean(), x.var()
    assert abs(m - mean) <= n_se * math.sqrt(var / n) + 1e-12, (what, m, mean)
    se_var = var * math.sqrt((2 + kurt_excess) / n)
    assert abs(v - var) <= n_se * se_var + 1e-12, (what, v, var)


GAMMA_ALPHAS = [1e-3, 0.1, 0.5, 1.0, 2.5, 10.0, 1e3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_standard_gamma_follows_the_law(dtype):
    torch.manual_seed(0)
    alpha = torch.tensor(GAMMA_ALPHAS, dtype=dtype).repeat_interleave(N).reshape(len(GAMMA_ALPHAS), N)
    with no_fallbacks():
        got = torch._standard_gamma(alpha.to("tpu")).cpu()
    assert got.dtype == dtype and got.shape == alpha.shape
    tiny = F32_MIN if dtype == torch.float32 else F64_MIN
    assert (got >= tiny).all() and torch.isfinite(got).all()
    ref = torch._standard_gamma(alpha[:, :20_000]) if stats is None else None
    for i, a in enumerate(GAMMA_ALPHAS):
        x = got[i].double().numpy()
        check_moments(x, a, a, 6 / a, what=a)
        if stats is not None:
            d = ks_distance(x, lambda v: stats.gamma.cdf(v, a), floor=tiny)
            assert d < ks_limit(N), (a, d)
        else:
            assert two_sample_ks(x, ref[i].double().numpy()) < ks_limit(N, 20_000), a


def test_gamma_boundary_alphas_match_cpu():
    # CPU's clamp: at least the smallest normal; 0, NaN and the alphas its loop cannot
    # sample (alpha <= -2/3) give it; an infinite alpha gives inf.
    for dtype, tiny in ((torch.float32, F32_MIN), (torch.float64, F64_MIN)):
        a = torch.tensor([0.0, -1.0, -0.8, -math.inf, math.nan, math.inf], dtype=dtype)
        with no_fallbacks():
            got = torch._standard_gamma(a.to("tpu")).cpu()
        assert torch.equal(got, torch._standard_gamma(a))
        assert got[:5].eq(tiny).all() and got[5] == math.inf
    # -2/3 < alpha < 0 samples as CPU's boost makes it (positive values).
    with no_fallbacks():
        g = torch._standard_gamma(torch.full((1000,), -0.5, device="tpu")).cpu()
    assert (g > 0).all() and torch.isfinite(g).all()


def test_gamma_distributions_sample_natively():
    torch.manual_seed(1)
    a = torch.full((N,), 3.0, device="tpu")
    with no_fallbacks():
        draws = {
            "gamma": torch.distributions.Gamma(a, 2.0).sample(),         # mean a / rate
            "chi2": torch.distributions.Chi2(a).sample(),                # mean df
            "beta": torch.distributions.Beta(a, a * 2).sample(),         # mean 1/3
            "student": torch.distributions.StudentT(a).sample(),         # mean 0, var 3
        }
    means = {k: v.cpu().double().mean().item() for k, v in draws.items()}
    assert abs(means["gamma"] - 1.5) < 0.02 and abs(means["chi2"] - 3) < 0.05
    assert abs(means["beta"] - 1 / 3) < 0.005 and abs(means["student"]) < 0.05
    assert abs(draws["student"].cpu().double().var().item() - 3) < 0.3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dirichlet_follows_the_law(dtype):
    torch.manual_seed(2)
    rows, finfo = 50_000, torch.finfo(dtype)
    for alpha in ([0.5, 1.0, 2.5], [10.0, 10.0, 10.0, 10.0], [0.1, 3.0]):
        a = torch.tensor(alpha, dtype=dtype)
        with no_fallbacks():
            x = torch._sample_dirichlet(a.expand(rows, len(alpha)).to("tpu")).cpu()
        assert x.dtype == dtype and x.shape == (rows, len(alpha))
        torch.testing.assert_close(x.double().sum(1), torch.ones(rows, dtype=torch.float64))
        total = sum(alpha)
        for i, ai in enumerate(alpha):
            mean, var = ai / total, ai * (total - ai) / (total ** 2 * (total + 1))
            xi = x[:, i].double().numpy()
            check_moments(xi, mean, var, 6.0 / min(ai, total - ai), what=(alpha, i))
            # (a float32 component near 1 is rounded to a coarse grid there: KS would see it)
            if stats is not None and (dtype == torch.float64 or ai <= total / 2):
                d = ks_distance(xi, lambda v: stats.beta.cdf(v, ai, total - ai), floor=finfo.tiny, ceil=1 - finfo.eps / 2)
                assert d < ks_limit(rows), (alpha, i, d)


def test_dirichlet_tiny_and_zero_alphas_follow_cpu():
    # CPU draws the gammas in double and clamps each at double's smallest normal before
    # normalizing: with alpha = 1e-3 all three clamp in about (F(dmin))^3 of the rows,
    # which then are 1/3 each; alpha = 0 rows are always 1/3 each.
    torch.manual_seed(3)
    rows = 40_000
    a = torch.full((rows, 3), 1e-3)
    with no_fallbacks():
        x = torch._sample_dirichlet(a.to("tpu")).cpu()
        z = torch._sample_dirichlet(torch.zeros(2, 3, device="tpu")).cpu()
    assert torch.equal(z, torch._sample_dirichlet(torch.zeros(2, 3)))
    assert (x >= F32_MIN).all() and (x <= 1 - 2 ** -24).all()
    torch.testing.assert_close(x.double().sum(1), torch.ones(rows, dtype=torch.float64), atol=1e-6, rtol=0)
    thirds = (x - 1 / 3).abs().lt(1e-6).all(1).double().mean().item()
    cpu = torch._sample_dirichlet(a)
    cpu_thirds = (cpu - 1 / 3).abs().lt(1e-6).all(1).double().mean().item()
    se = math.sqrt(cpu_thirds * (1 - cpu_thirds) / rows)
    assert abs(thirds - cpu_thirds) < 6 * se + 1e-3, (thirds, cpu_thirds)
    if stats is not None:
        want = stats.gamma.cdf(F64_MIN, 1e-3) ** 3
        assert abs(thirds - want) < 5 * math.sqrt(want * (1 - want) / rows), (thirds, want)
    # The largest component is at most the largest float below 1, as CPU's clamp.
    assert x.max(1).values.eq(1 - 2 ** -24).double().mean() > 0.5


POISSON_RATES = [0.0, 1e-3, 0.5, 4.0, 30.0, 1e4]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_poisson_follows_the_law(dtype):
    torch.manual_seed(4)
    rate = torch.tensor(POISSON_RATES, dtype=dtype).repeat_interleave(N).reshape(len(POISSON_RATES), N)
    with no_fallbacks():
        got = torch.poisson(rate.to("tpu")).cpu()
    assert got.dtype == dtype and got.shape == rate.shape
    assert torch.equal(got, got.round()) and (got >= 0).all()
    assert got[0].eq(0).all()
    for i, lam in enumerate(POISSON_RATES[1:], 1):
        x = got[i].double().numpy()
        check_moments(x, lam, lam, 1 / lam, what=lam)
        if stats is not None:
            assert discrete_ks(x, lambda k: stats.poisson.cdf(k, lam)) < ks_limit(N), lam


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_poisson_in_half_types(dtype):
    torch.manual_seed(5)
    rate = torch.tensor([0.5, 4.0, 30.0], dtype=dtype).repeat_interleave(20_000).reshape(3, -1)
    with no_fallbacks():
        got = torch.poisson(rate.to("tpu")).cpu()
    assert got.dtype == dtype and got.shape == rate.shape
    for i, lam in enumerate([0.5, 4.0, 30.0]):
        x = got[i].double()
        assert abs(x.mean().item() - lam) < 5 * math.sqrt(lam / x.numel()), lam


def test_poisson_rejects_negative_and_nan_rates_like_cpu():
    for bad in (-1.0, math.nan):
        r = torch.tensor([1.0, bad])
        with pytest.raises(RuntimeError, match="invalid Poisson rate, expected rate to be non-negative"):
            torch.poisson(r)
        with pytest.raises(RuntimeError, match="invalid Poisson rate, expected rate to be non-negative"):
            torch.poisson(r.to("tpu")).cpu()
    # The device stays usable; an infinite rate gives CPU's int64 overflow.
    inf = torch.tensor([math.inf, 0.0])
    assert torch.equal(torch.poisson(inf.to("tpu")).cpu(), torch.poisson(inf))


BINOMIAL_CASES = [  # (count, prob): inversion where count * min(p, 1-p) < 10, else BTRS
    (10.0, 0.3), (100.0, 0.5), (1e6, 0.3), (1e6, 1e-6), (50.0, 0.9), (1000.0, 0.99), (1e6, 0.999), (40.0, 0.05),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_binomial_follows_the_law(dtype):
    torch.manual_seed(6)
    count = torch.tensor([c for c, _ in BINOMIAL_CASES], dtype=dtype).repeat_interleave(N).reshape(-1, N)
    prob = torch.tensor([p for _, p in BINOMIAL_CASES], dtype=dtype).repeat_interleave(N).reshape(-1, N)
    with no_fallbacks():
        got = torch.binomial(count.to("tpu"), prob.to("tpu")).cpu()
    assert got.dtype == dtype and got.shape == count.shape
    assert torch.equal(got, got.round()) and (got >= 0).all() and (got <= count).all()
    for i, (n, p) in enumerate(BINOMIAL_CASES):
        x = got[i].double().numpy()
        var = n * p * (1 - p)
        check_moments(x, n * p, var, (1 - 6 * p * (1 - p)) / var, what=(n, p))
        if stats is not None:
            assert discrete_ks(x, lambda k: stats.binom.cdf(k, n, p)) < ks_limit(N), (n, p)


def test_binomial_edges_match_cpu():
    count = torch.tensor([0.0, -3.0, 5.0, 5.0, 5.0, 5.0, 5.0, math.nan, math.inf, math.inf, math.nan])
    prob = torch.tensor([0.5, 0.5, 0.0, 1.0, 1.5, -0.2, math.nan, 0.0, 1.0, 0.0, 1.0])
    for dtype in (torch.float32, torch.float64):
        c, p = count.to(dtype), prob.to(dtype)
        with no_fallbacks():
            got = torch.binomial(c.to("tpu"), p.to("tpu")).cpu()
        torch.testing.assert_close(got, torch.binomial(c, p), equal_nan=True, rtol=0, atol=0)
    # A count that is not an integer: at most the count, as CPU's.
    with no_fallbacks():
        x = torch.binomial(torch.full((N,), 7.5, device="tpu"), torch.full((N,), 0.5, device="tpu")).cpu()
    y = torch.binomial(torch.full((N,), 7.5), torch.full((N,), 0.5))
    assert x.max() <= 7 and abs(x.mean() - y.mean()) < 0.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_and_dtypes_as_cpu(dtype):
    a = torch.rand(3, 4, dtype=torch.float64) + 0.5
    cases = [
        lambda t: torch._standard_gamma(t),
        lambda t: torch._sample_dirichlet(t),
        lambda t: torch.poisson(t),
        lambda t: torch.binomial(t * 10, t / 2),
        lambda t: torch._standard_gamma(t.t()),                     # not contiguous
        lambda t: torch._standard_gamma(t[0, 0]),                   # 0-dim
        lambda t: torch._sample_dirichlet(t[0, 0]),
        lambda t: torch.poisson(t[:0]),                             # empty
        lambda t: torch.binomial(t[0] * 10, t / 2),                 # broadcast both ways
        lambda t: torch.binomial(t * 10, t[0] / 2),
        lambda t: torch._standard_gamma_grad(t[0], t),
        lambda t: torch._dirichlet_grad(t[0] / 2, t, t[:, :1] + 2),
    ]
    for f in cases:
        want = f(a.to(dtype))
        with no_fallbacks():
            got = f(a.to(dtype).to("tpu"))
        assert got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()


def test_refusals_as_cpu():
    # CPU's refusals: the dtypes its kernels lack, and mixed dtypes.
    a = torch.rand(3, 4, dtype=torch.float64) + 0.5
    refused = [
        (lambda t: torch._standard_gamma(t), torch.float16),
        (lambda t: torch._sample_dirichlet(t), torch.bfloat16),
        (lambda t: torch.binomial(t, t), torch.float16),
        (lambda t: torch._standard_gamma_grad(t, t), torch.bfloat16),
        (lambda t: torch._standard_gamma(t), torch.int64),
        (lambda t: torch.poisson(t), torch.int64),
        (lambda t: torch.binomial(t, t.double()), torch.float32),
        (lambda t: torch._standard_gamma_grad(t, t.double()), torch.float32),
        (lambda t: torch._dirichlet_grad(t, t, t), torch.float16),
        (lambda t: torch._dirichlet_grad(t, t, t.double()), torch.float32),
    ]
    for f, dtype in refused:
        with pytest.raises(Exception) as cpu:
            f(a.to(dtype))
        with pytest.raises(type(cpu.value)) as tpu:
            f(a.to(dtype).to("tpu"))
        assert str(tpu.value).split("\n")[0] == str(cpu.value).split("\n")[0]


def test_standard_gamma_grad_matches_cpu():
    # The three regimes: x < 0.8 (series), alpha > 8 (saddle point, by and off the
    # mean), and the rational fit; and the gradient of a Gamma rsample.
    alpha = torch.tensor([0.01, 0.3, 1.0, 2.5, 5.0, 8.5, 20.0, 200.0, 1e4])
    x = torch.tensor([1e-6, 1e-3, 0.1, 0.5, 0.79, 0.81, 1.0, 3.0, 10.0, 19.0, 20.0, 21.5, 190.0, 260.0, 1e4])
    a, v = alpha[:, None].expand(-1, len(x)), x[None, :].expand(len(alpha), -1)
    for dtype, tol in ((torch.float64, dict(rtol=1e-9, atol=1e-12)), (torch.float32, dict(rtol=2e-6, atol=1e-7))):
        want = torch._standard_gamma_grad(a.to(dtype), v.to(dtype))
        with no_fallbacks():
            got = torch._standard_gamma_grad(a.to(dtype).to("tpu"), v.to(dtype).to("tpu")).cpu()
        torch.testing.assert_close(got, want, equal_nan=True, **tol)
    torch.manual_seed(7)
    conc = torch.tensor([0.2, 1.0, 4.0, 30.0]).repeat(256).to("tpu").requires_grad_()
    with no_fallbacks():
        s = torch.distributions.Gamma(conc, 1.0).rsample()
        s.sum().backward()
    want = torch._standard_gamma_grad(conc.detach().cpu(), s.detach().cpu())
    torch.testing.assert_close(conc.grad.cpu(), want.view(-1), rtol=2e-6, atol=1e-7)


def test_dirichlet_grad_matches_cpu():
    # The four regimes: x near 0 or 1 (series), alpha and beta above 6 (saddle point, by
    # and off the mean), and the rational correction.
    import itertools
    xs = [1e-6, 1e-3, 0.02, 0.1, 0.3, 0.45, 0.5, 0.55, 0.7, 0.9, 0.98, 0.999]
    rows = list(itertools.product(xs, [0.01, 0.3, 1.0, 2.5, 7.0, 20.0, 300.0], [0.01, 0.5, 2.0, 6.5, 15.0, 400.0]))
    x, alpha, beta = (torch.tensor(c, dtype=torch.float64) for c in zip(*rows))
    total = alpha + beta
    want = torch._dirichlet_grad(x, alpha, total)
    with no_fallbacks():
        got = torch._dirichlet_grad(x.to("tpu"), alpha.to("tpu"), total.to("tpu")).cpu()
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, equal_nan=True)
    # float32: CPU's series and digamma differences run in float32 and cancel; the result
    # is as near the exact value (of the same float32 inputs) as CPU's.
    x32, a32, t32 = x.float(), alpha.float(), total.float()
    exact = torch._dirichlet_grad(x32.double(), a32.double(), t32.double())
    cpu = torch._dirichlet_grad(x32, a32, t32).double()
    with no_fallbacks():
        got = torch._dirichlet_grad(x32.to("tpu"), a32.to("tpu"), t32.to("tpu")).cpu()
    assert got.dtype == torch.float32
    err_cpu, err = ((v - exact).abs() / exact.abs() for v in (cpu, got.double()))
    assert (err <= 3 * err_cpu + 1e-4).all(), [rows[i] for i in torch.nonzero(err > 3 * err_cpu + 1e-4).flatten()]


def test_beta_and_dirichlet_rsample_gradients():
    torch.manual_seed(9)
    conc = torch.tensor([0.3, 1.0, 4.0, 20.0], dtype=torch.float64).to("tpu").requires_grad_()
    w = torch.arange(1.0, 5.0, dtype=torch.float64).to("tpu")
    with no_fallbacks():
        x = torch.distributions.Dirichlet(conc.expand(512, 4)).rsample()
        (x * w).sum().backward()
        beta_conc = torch.tensor([0.5, 3.0], dtype=torch.float64).to("tpu").requires_grad_()
        y = torch.distributions.Beta(beta_conc[0].expand(512), beta_conc[1].expand(512)).rsample()
        y.sum().backward()
    xc, cc = x.detach().cpu(), conc.detach().cpu().expand(512, 4)
    g = torch._dirichlet_grad(xc, cc, cc.sum(-1, True).expand_as(cc))
    want = (g * (w.cpu() - (xc * w.cpu()).sum(-1, True))).sum(0)
    torch.testing.assert_close(conc.grad.cpu(), want, rtol=1e-9, atol=1e-12)
    assert torch.isfinite(beta_conc.grad).all() and beta_conc.grad.cpu()[0] > 0


DRAWS = {
    "_standard_gamma": lambda g: torch._standard_gamma(torch.full((64,), 0.7, device="tpu"), generator=g),
    "_sample_dirichlet": lambda g: torch._sample_dirichlet(torch.full((16, 4), 2.0, device="tpu"), generator=g),
    "poisson": lambda g: torch.poisson(torch.tensor([3.0, 50.0], device="tpu").repeat(32), generator=g),
    "binomial": lambda g: torch.binomial(torch.tensor([10.0, 500.0], device="tpu").repeat(32),
                                         torch.full((64,), 0.4, device="tpu"), generator=g),
}


@pytest.mark.parametrize("op", sorted(DRAWS))
def test_samplers_follow_the_tpu_generator(op):
    draw_once = DRAWS[op]
    with no_fallbacks():
        assert_draws_follow_the_tpu_generator(draw_once)
    # Like the other lowered random ops (and CUDA's), a CPU generator is refused.
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        draw_once(torch.Generator().manual_seed(5))


def test_samplers_under_torch_compile():
    def sample(a, lam, n, p):
        return (torch._standard_gamma(a), torch._sample_dirichlet(a), torch.poisson(lam), torch.binomial(n, p))

    f = torch.compile(sample, backend="tpu")
    a = torch.full((4000, 3), 2.0, device="tpu")
    lam = torch.full((4000,), 20.0, device="tpu")
    n, p = torch.full((4000,), 30.0, device="tpu"), torch.full((4000,), 0.5, device="tpu")
    with no_fallbacks():
        torch.manual_seed(8)
        first = [t.cpu() for t in f(a, lam, n, p)]
        again = [t.cpu() for t in f(a, lam, n, p)]
        torch.manual_seed(8)
        seeded = [t.cpu() for t in f(a, lam, n, p)]
    for x, y, z in zip(first, again, seeded):
        assert torch.equal(x, z) and not torch.equal(x, y)
    g, d, k, b = first
    assert abs(g.mean().item() - 2) < 0.1 and abs(d.mean().item() - 1 / 3) < 0.01
    assert abs(k.mean().item() - 20) < 0.3 and abs(b.mean().item() - 15) < 0.3
    torch.testing.assert_close(d.sum(1), torch.ones(4000))
    # The backward reads the forward's sample (saved, not drawn again).
    conc = torch.tensor([0.5, 2.0, 9.0], dtype=torch.float64).repeat(100).to("tpu").requires_grad_()
    rsample = torch.compile(lambda c: torch.distributions.Gamma(c, 1.0).rsample(), backend="tpu")
    with no_fallbacks():
        s = rsample(conc)
        s.sum().backward()
    want = torch._standard_gamma_grad(conc.detach().cpu(), s.detach().cpu())
    torch.testing.assert_close(conc.grad.cpu(), want, rtol=1e-9, atol=1e-12)
