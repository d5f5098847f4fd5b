"""Per-device random generators: torch.manual_seed makes tpu randomness reproducible."""
import pytest
import torch
import torch.nn.functional as F

from conftest import no_fallbacks


def draw():
    return [
        torch.rand(64, device="tpu").cpu(),
        torch.randn(64, device="tpu").cpu(),
        torch.empty(64, device="tpu").normal_(2.0, 3.0).cpu(),
        torch.empty(64, device="tpu").uniform_(-1, 1).cpu(),
        torch.empty(64, device="tpu").bernoulli_(0.3).cpu(),
        F.dropout(torch.ones(64, device="tpu"), 0.5, training=True).cpu(),
    ]


def test_manual_seed_reproduces_every_random_op():
    torch.manual_seed(123)
    with no_fallbacks():
        a = draw()
    torch.manual_seed(123)
    b = draw()
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    torch.manual_seed(124)
    c = draw()
    assert not torch.equal(a[0], c[0])


def test_successive_draws_differ():
    torch.manual_seed(0)
    assert not torch.equal(torch.rand(16, device="tpu").cpu(), torch.rand(16, device="tpu").cpu())


def test_distributions_have_the_right_moments():
    torch.manual_seed(1)
    u = torch.rand(200_000, device="tpu")
    n = torch.randn(200_000, device="tpu")
    assert 0.0 <= u.min().item() and u.max().item() < 1.0
    assert abs(u.mean().item() - 0.5) < 0.01
    assert abs(n.mean().item()) < 0.01 and abs(n.std().item() - 1.0) < 0.01
    b = torch.empty(200_000, device="tpu").bernoulli_(0.25)
    assert abs(b.mean().item() - 0.25) < 0.01


def test_dropout_scales_kept_values():
    torch.manual_seed(2)
    y = F.dropout(torch.ones(10_000, device="tpu"), 0.2, training=True).cpu()
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.8))
    assert abs((y == 0).float().mean().item() - 0.2) < 0.02


def test_explicit_generator_and_state_round_trip():
    g = torch.Generator(device="tpu")
    g.manual_seed(7)
    a = torch.rand(8, device="tpu", generator=g).cpu()
    g.manual_seed(7)
    b = torch.rand(8, device="tpu", generator=g).cpu()
    assert torch.equal(a, b)
    state = torch.tpu.get_rng_state()
    x = torch.rand(8, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(x, torch.rand(8, device="tpu").cpu())


def test_multinomial_frequencies_follow_the_probabilities():
    torch.manual_seed(3)
    p = torch.tensor([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 0.0, 2.0]])
    with no_fallbacks():
        s = torch.multinomial(p.to("tpu"), 20_000, replacement=True).cpu()
        race = torch.stack([torch.multinomial(p[0].to("tpu"), 3) for _ in range(1000)]).cpu()
    assert s.dtype == torch.int64 and s.shape == (2, 20_000)
    freq = torch.stack([torch.bincount(r, minlength=4) for r in s]).float() / 20_000
    torch.testing.assert_close(freq, p / p.sum(1, keepdim=True), atol=0.015, rtol=0)
    # Without replacement: distinct categories, zero-probability ones never drawn, the
    # first draw distributed like p.
    assert all(len(set(r.tolist())) == 3 for r in race) and not (race == 1).any()
    first = torch.bincount(race[:, 0], minlength=4).float() / 1000
    torch.testing.assert_close(first, p[0], atol=0.04, rtol=0)


def test_multinomial_with_replacement_over_many_categories():
    # Every sample was compared with every category (rows x samples x categories of
    # memory: 6,000 x 6,000 took 2.5 s and 700 MB); a binary search draws the same.
    torch.manual_seed(5)
    for n in (1, 2, 3, 7, 1000, 6000):
        p = torch.rand(2, n)
        p[:, ::3] = 0
        if n < 3:
            p[:, -1] = 1
        with no_fallbacks():
            s = torch.multinomial(p.to("tpu"), 6000, replacement=True).cpu()
        assert s.min() >= 0 and s.max() < n
        assert (p.gather(1, s) > 0).all()  # never a zero-probability category
        if n == 7:
            freq = torch.stack([torch.bincount(r, minlength=n) for r in s]).float() / 6000
            torch.testing.assert_close(freq, p / p.sum(1, keepdim=True), atol=0.03, rtol=0)


def test_multinomial_rejects_bad_probabilities_like_cpu():
    import pytest
    for probs, k, repl in (([1.0, -1.0], 1, True), ([0.0, 0.0], 1, True), ([1.0, float('nan')], 1, False)):
        with pytest.raises(RuntimeError):
            torch.multinomial(torch.tensor(probs), k, repl)
        with pytest.raises(RuntimeError, match="multinomial"):
            torch.multinomial(torch.tensor(probs, device="tpu"), k, repl).cpu()
    # The device and its tensors stay usable. Like CPU, categories of probability 0 are
    # drawn last once the others are exhausted.
    assert torch.multinomial(torch.tensor([0.0, 1.0], device="tpu"), 1).item() == 1
    assert torch.multinomial(torch.tensor([1.0, 0.0], device="tpu"), 2).tolist() == [0, 1]


@pytest.mark.parametrize("k, replacement", [(1, True), (1, False), (2, False)])
def test_multinomial_raises_at_the_call_where_cuda_checks_on_the_host(k, replacement):
    # Without replacement or for one sample, PyTorch's sampler checks the probabilities
    # with .item() before it returns: the call raises, not a later unrelated read.
    for probs in ([-0.1, 0.2, 0.5], [0.0, 0.0, 0.0], [1.0, float("inf"), 1.0]):
        with pytest.raises(RuntimeError):
            torch.multinomial(torch.tensor(probs), k, replacement)
        with pytest.raises(RuntimeError, match="multinomial"):
            torch.multinomial(torch.tensor(probs, device="tpu"), k, replacement)  # no read
        assert (torch.arange(3.0, device="tpu") + 1).tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("op", ["exponential_", "geometric_", "log_normal_", "cauchy_"])
def test_lowered_random_ops_take_a_tpu_generator(op):
    arg = 0.3 if op == "geometric_" else 1.0
    g = torch.Generator(device="tpu")
    with no_fallbacks():
        g.manual_seed(3)
        a = getattr(torch.empty(64, device="tpu"), op)(arg, generator=g).cpu()
        b = getattr(torch.empty(64, device="tpu"), op)(arg, generator=g).cpu()
        g.manual_seed(3)
        c = getattr(torch.empty(64, device="tpu"), op)(arg, generator=g).cpu()
    assert torch.equal(a, c) and not torch.equal(a, b)
    assert torch.isfinite(a).all()


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_dropout_recomputes_the_same_mask(reentrant):
    # torch.utils.checkpoint saves the device's random state before the forward and
    # restores it for the recompute (it asks the device module whether it started).
    from torch.utils.checkpoint import checkpoint
    w = torch.randn(8, 8).to("tpu").requires_grad_()

    def block(x):
        return F.dropout(torch.tanh(x @ w), 0.5, training=True) * 3

    def grads(ckpt):
        torch.manual_seed(7)
        w.grad = None
        x = torch.randn(4, 8).to("tpu").requires_grad_()
        y = checkpoint(block, x, use_reentrant=reentrant) if ckpt else block(x)
        (y * y).sum().backward()
        return x.grad.cpu(), w.grad.cpu()

    plain, ckpt = grads(False), grads(True)
    # (a fused graph may round differently with the recompute in it: another mask would
    # differ by whole values)
    torch.testing.assert_close(ckpt, plain, rtol=1e-5, atol=1e-5)
    assert torch.tpu._initialized


def test_integer_draws_near_two_to_the_32_are_uniform():
    # 32-bit words mod a range of 3 * 2**30 gave P(x < range / 3) = 0.5; from 2**28 on
    # the words are 64-bit, as CPU's and CUDA's.
    torch.manual_seed(0)
    for r in (3 * 2**30, 5 * 2**29, 3 * 2**28):
        x = torch.randint(0, r, (200_000,), device="tpu").cpu().double()
        assert abs((x < r / 3).double().mean().item() - 1 / 3) < 0.01, r
        x = torch.empty(200_000, dtype=torch.int64, device="tpu").random_(7, 7 + r).cpu().double()
        assert x.min() >= 7 and x.max() < 7 + r
        assert abs((x < 7 + r / 3).double().mean().item() - 1 / 3) < 0.01, r


def test_random_bounds_and_bernoulli_probabilities_as_cpu():
    def same_error(fn, *args):
        with pytest.raises(Exception) as want:
            fn("cpu", *args)
        with pytest.raises(Exception) as got:
            fn("tpu", *args)
        assert type(got.value) is type(want.value)
        return str(got.value), str(want.value)

    rnd = lambda dev, dt, *a: torch.empty(4, dtype=dt, device=dev).random_(*a)  # noqa: E731
    for dt, a in ((torch.float16, (0, 70000)), (torch.float16, (-70000, 0)), (torch.float16, (70000,)),
                  (torch.uint8, (0, 300)), (torch.int8, (-200, 0))):
        got, want = same_error(rnd, dt, *a)
        assert got == want  # (the dtype's name used to trail junk)
    same_error(rnd, torch.complex64)           # NotImplementedError
    same_error(rnd, torch.complex64, 0, 5)     # RuntimeError
    assert rnd("tpu", torch.bfloat16, 0, 70000).dtype == torch.bfloat16  # CPU only warns
    same_error(lambda dev: torch.bernoulli(torch.tensor([0, 1], device=dev)))
    same_error(lambda dev: torch.empty(3, device=dev).bernoulli_(torch.tensor([True, False, True], device=dev)))
    got, want = same_error(lambda dev: torch.empty(3, device=dev).bernoulli_(torch.rand(4, device=dev)))
    assert got == want
    same_error(lambda dev: torch.empty(3, device=dev).bernoulli_(torch.rand(2, 3, device=dev)))
    # A cpu p is copied over, as CUDA's kernel does.
    p = torch.tensor([0.0, 1.0, 1.0, 0.0])
    assert torch.equal(torch.empty(4, device="tpu").bernoulli_(p).cpu(), p)


def test_seeds_past_64_bits_are_refused():
    for s in (2**64, -2**63 - 1):
        with pytest.raises(ValueError):
            torch.manual_seed(s)
        with pytest.raises(ValueError):
            torch.tpu.manual_seed(s)
        with pytest.raises(ValueError):
            torch.tpu.manual_seed_all(s)
    torch.tpu.manual_seed(2**64 - 1)
    a = torch.rand(4, device="tpu").cpu()
    torch.tpu.manual_seed(-1)  # the same 64 bits
    assert torch.equal(torch.rand(4, device="tpu").cpu(), a)
