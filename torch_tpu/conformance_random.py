"""Goodness-of-fit checks of the conformance tool's random ops: a random op cannot match
CPU's values, so its tpu output is tested against the distribution PyTorch documents for
it, from a fixed seed and a sample large enough for the test to see a wrong law.

Each check draws on `tpu`, brings the draws to the host and returns
{"test": ..., "statistic": ..., "p": ..., "ok": p >= ALPHA, "law": text}. The tests are
written here (no SciPy): one-sample Kolmogorov-Smirnov for continuous laws, Pearson's
chi-square for discrete ones, exact value checks where an op's output is determined up to
its random mask (dropout keeps x / (1 - p) exactly).
"""
import math

import torch
import torch.nn.functional as F

ALPHA = 1e-3  # a fixed seed makes each verdict reproducible; 1e-3 leaves room for chance
N = 20000     # draws per check: a KS test then sees a CDF error of about 0.015
SEED = 1234


# ---------------------------------------------------------------- the tests

def kolmogorov_sf(lam: float) -> float:
    """P(K > lam) for Kolmogorov's distribution (the limit law of sqrt(n) * D_n)."""
    if lam < 0.2:
        return 1.0
    s = sum((-1) ** (k - 1) * math.exp(-2.0 * k * k * lam * lam) for k in range(1, 101))
    return min(max(2.0 * s, 0.0), 1.0)


def ks_test(x: torch.Tensor, cdf) -> tuple:
    """(D, p): one-sample Kolmogorov-Smirnov of the draws x against the CDF `cdf`
    (a function of a float64 tensor); p by Stephens' small-n correction of lambda."""
    x = torch.sort(x.detach().double().flatten().cpu()).values
    n = x.numel()
    f = cdf(x).clamp(0.0, 1.0)
    i = torch.arange(1, n + 1, dtype=torch.float64)
    d = max(float((i / n - f).max()), float((f - (i - 1) / n).max()))
    sn = math.sqrt(n)
    return d, kolmogorov_sf((sn + 0.12 + 0.11 / sn) * d)


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for a chi-square law with df degrees of freedom: 1 - the regularized lower
    incomplete gamma P(df/2, x/2), summed by its power series (enough terms for any x)."""
    if x <= 0:
        return 1.0
    a, h = df / 2.0, x / 2.0
    term = total = 1.0 / a
    k = 0
    while k < 100000:
        k += 1
        term *= h / (a + k)
        total += term
        if term < total * 1e-15:
            break
    log_p = a * math.log(h) - h - math.lgamma(a) + math.log(total)
    return max(0.0, 1.0 - math.exp(log_p))


def chi2_test(observed, expected) -> tuple:
    """(statistic, p) of Pearson's chi-square, df = categories - 1."""
    obs = [float(o) for o in observed]
    exp = [float(e) for e in expected]
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    return stat, chi2_sf(stat, len(obs) - 1)


def result(test, stat, p, law, **extra) -> dict:
    return {"test": test, "statistic": round(stat, 6), "p": p, "ok": p >= ALPHA, "law": law, **extra}


def fail(law, why) -> dict:
    return {"test": "values", "statistic": None, "p": 0.0, "ok": False, "law": law, "why": why}


# ---------------------------------------------------------------- CDFs

def uniform_cdf(a, b):
    return lambda x: (x - a) / (b - a)


def normal_cdf(mean=0.0, std=1.0):
    return lambda x: 0.5 * torch.erfc(-(x - mean) / (std * math.sqrt(2.0)))


def ks(x, cdf, law):
    d, p = ks_test(x, cdf)
    return result("KS", d, p, law, n=x.numel())


def binomial_fraction(hits: int, n: int, p: float, law: str) -> dict:
    stat, pv = chi2_test([hits, n - hits], [n * p, n * (1 - p)])
    return result("chi-square", stat, pv, law, n=n)


def discrete_uniform(v, low, high, law):
    v = v.cpu().long().flatten()
    if bool((v < low).any() or (v >= high).any()):
        return fail(law, f"values outside [{low}, {high})")
    counts = torch.bincount(v - low, minlength=high - low)
    stat, p = chi2_test(counts.tolist(), [v.numel() / (high - low)] * (high - low))
    return result("chi-square", stat, p, law, n=v.numel())


# ---------------------------------------------------------------- the ops' laws

def _uniform(dev):
    return ks(torch.empty(N, device=dev).uniform_(-2.0, 3.0), uniform_cdf(-2.0, 3.0), "U(-2, 3)")


def _rand_like(dev):
    return ks(torch.rand_like(torch.empty(N, device=dev)), uniform_cdf(0.0, 1.0), "U(0, 1)")


def _randn(dev):
    return ks(torch.randn(N, device=dev), normal_cdf(), "N(0, 1)")


def _randn_like(dev):
    return ks(torch.randn_like(torch.empty(N, device=dev)), normal_cdf(), "N(0, 1)")


def _normal_in_place(dev):
    return ks(torch.empty(N, device=dev).normal_(1.5, 0.5), normal_cdf(1.5, 0.5), "N(1.5, 0.5^2)")


def _normal(dev):
    # Per-element means and stds: standardized draws are N(0, 1).
    mean = torch.linspace(-3, 3, N)
    std = torch.linspace(0.5, 2.0, N)
    x = torch.normal(mean.to(dev), std.to(dev)).cpu()
    return ks((x - mean) / std, normal_cdf(), "N(mean_i, std_i^2), standardized")


def _normal_number_mean(dev):
    std = torch.linspace(0.5, 2.0, N)
    x = torch.normal(2.0, std.to(dev)).cpu()
    return ks((x - 2.0) / std, normal_cdf(), "N(2, std_i^2), standardized")


def _log_normal(dev):
    x = torch.empty(N, device=dev).log_normal_(1.0, 0.5).cpu()
    if bool((x <= 0).any()):
        return fail("logN(1, 0.5^2)", "non-positive draws")
    return ks(x.log(), normal_cdf(1.0, 0.5), "log of logN(1, 0.5^2) is N(1, 0.5^2)")


def _cauchy(dev):
    return ks(torch.empty(N, device=dev).cauchy_(1.0, 2.0),
              lambda x: 0.5 + torch.atan((x - 1.0) / 2.0) / math.pi, "Cauchy(1, 2)")


def _exponential(dev):
    return ks(torch.empty(N, device=dev).exponential_(1.5),
              lambda x: (1 - torch.exp(-1.5 * x)) * (x >= 0), "Exp(rate 1.5)")


def _geometric(dev):
    p, law = 0.3, "Geometric(0.3) on {1, 2, ...}"
    v = torch.empty(N, device=dev).geometric_(p).cpu()
    if bool((v < 1).any()) or not bool((v == v.round()).all()):
        return fail(law, "draws that are not positive integers")
    k = 12  # categories 1..11 and the tail >= 12
    obs = [int((v == i).sum()) for i in range(1, k)] + [int((v >= k).sum())]
    exp = [N * (1 - p) ** (i - 1) * p for i in range(1, k)] + [N * (1 - p) ** (k - 1)]
    stat, pv = chi2_test(obs, exp)
    return result("chi-square", stat, pv, law, n=N)


def _randint(dev):
    return discrete_uniform(torch.randint(3, 10, (N,), device=dev), 3, 10, "uniform on {3..9}")


def _randint_like(dev):
    return discrete_uniform(torch.randint_like(torch.empty(N, device=dev), 3, 10), 3, 10,
                            "uniform on {3..9}")


def _bernoulli(dev):
    levels = (0.1, 0.5, 0.9)
    p = torch.tensor(levels).repeat(N // len(levels))
    v = torch.bernoulli(p.to(dev)).cpu()
    if not bool(((v == 0) | (v == 1)).all()):
        return fail("Bernoulli(p_i)", "values other than 0 and 1")
    obs, exp = [], []
    for q in levels:
        m = p == q
        ones, n = int(v[m].sum()), int(m.sum())
        obs += [ones, n - ones]
        exp += [n * q, n * (1 - q)]
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    pv = chi2_sf(stat, len(levels))  # one degree of freedom per level
    return result("chi-square", stat, pv, "Bernoulli(p_i), p_i in 0.1/0.5/0.9", n=v.numel())


def _multinomial(dev):
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0])
    v = torch.multinomial(w.to(dev), N, replacement=True).cpu()
    law = "Categorical(weights 1:2:3:4:0)"
    if bool((v == 4).any()):
        return fail(law, "a zero-weight category was drawn")
    counts = torch.bincount(v, minlength=5)[:4]
    stat, p = chi2_test(counts.tolist(), [N * x / 10.0 for x in (1, 2, 3, 4)])
    return result("chi-square", stat, p, law, n=N)


def _dropout_like(out, scale_kept, p, law):
    """out: the dropout of ones, one value per mask decision: each is 0 or 1/(1-p)."""
    out = out.cpu().double().flatten()
    kept = (out - scale_kept).abs() < 1e-5 * scale_kept
    dropped = out == 0
    if not bool((kept | dropped).all()):
        return fail(law, "values other than 0 and 1/(1-p)")
    return binomial_fraction(int(dropped.sum()), out.numel(), p, law)


def _dropout(dev):
    out = F.dropout(torch.ones(N, device=dev), p=0.3, training=True)
    return _dropout_like(out, 1 / 0.7, 0.3, "dropout p=0.3: zero w.p. 0.3, else x/(1-p)")


def _dropout_nd(dims):
    def check(dev):
        c = N // 4
        x = torch.ones((4, c) + (2,) * dims, device=dev)
        out = (F.dropout2d if dims == 2 else F.dropout3d)(x, p=0.3, training=True).cpu()
        per_channel = out.flatten(2)
        if not bool((per_channel == per_channel[..., :1]).all()):
            return fail(f"dropout{dims}d", "a channel not dropped as a whole")
        return _dropout_like(per_channel[..., 0], 1 / 0.7, 0.3,
                             f"dropout{dims}d p=0.3 per channel: zero w.p. 0.3, else x/(1-p)")
    return check


def _alpha_values(out, p, law):
    """Alpha dropout of ones: two values, the dropped one a*alpha'+b (below the kept one)."""
    vals = torch.unique(out.cpu())
    if vals.numel() != 2:
        return fail(law, f"{vals.numel()} distinct values, expected 2")
    dropped = int((out.cpu() == vals[0]).sum())
    return binomial_fraction(dropped, out.numel(), p, law)


def _alpha_dropout(dev):
    out = F.alpha_dropout(torch.ones(N, device=dev), p=0.3, training=True)
    return _alpha_values(out, 0.3, "alpha dropout p=0.3: dropped w.p. 0.3")


def _feature_alpha_dropout(dev):
    x = torch.ones(4, N // 4, 3, device=dev)
    out = F.feature_alpha_dropout(x, p=0.3, training=True).cpu()
    if not bool((out == out[..., :1]).all()):
        return fail("feature alpha dropout", "a channel not dropped as a whole")
    return _alpha_values(out[..., 0], 0.3, "feature alpha dropout p=0.3 per channel")


def _rrelu(dev):
    # Training mode: a negative x becomes a * x with a ~ U(lower, upper).
    y = F.rrelu(-torch.ones(N, device=dev), lower=0.1, upper=0.3, training=True)
    return ks(-y, uniform_cdf(0.1, 0.3), "rrelu slope U(0.1, 0.3)")


# op_db name (and variant) -> check. Entries not here but seen drawing random numbers are
# reported "random, no distribution check" (shapes and dtypes compared only).
CHECKS = {
    "uniform": _uniform, "rand_like": _rand_like, "randn": _randn, "randn_like": _randn_like,
    "normal.in_place": _normal_in_place, "normal": _normal,
    "normal.number_mean": _normal_number_mean, "log_normal": _log_normal, "cauchy": _cauchy,
    "exponential": _exponential, "geometric": _geometric, "randint": _randint,
    "randint_like": _randint_like, "bernoulli": _bernoulli, "multinomial": _multinomial,
    "nn.functional.dropout": _dropout, "nn.functional.dropout2d": _dropout_nd(2),
    "nn.functional.dropout3d": _dropout_nd(3), "nn.functional.alpha_dropout": _alpha_dropout,
    "nn.functional.feature_alpha_dropout.with_train": _feature_alpha_dropout,
    "nn.functional.rrelu": _rrelu,
}


def check(key: str, device: str = "tpu") -> dict:
    """The goodness-of-fit verdict for op_db entry `key` on `device` (seeded), or None
    where no law is written down here."""
    fn = CHECKS.get(key)
    if fn is None:
        return None
    torch.manual_seed(SEED)
    return fn(device)
