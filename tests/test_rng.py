"""Per-device random generators: torch.manual_seed makes tpu randomness reproducible."""
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
