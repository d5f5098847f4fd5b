"""The random ops' number arguments (randint's bounds, uniform_'s range, bernoulli_'s p,
dropout's p, ...) are runtime operands of their programs: a call with new values reuses
the compiled program (a replay buffer sampled with randint(0, len(buffer)) compiled one
program per step before, and in DeferAndFuse its whole step), draws inside the new
bounds, and CPU's argument checks still run at every call."""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import EagerMode

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING]
N = 4096


def compiles():
    m = torch_tpu.metrics()
    return m["op_compiles"] + m["graph_compiles"], m["signature_misses"]


def fresh(dtype=torch.float32):
    return torch.empty(N, dtype=dtype, device="tpu")


# (name, draw(value) -> tpu tensor, three values, check(cpu result as float64, value))
CASES = [
    ("randint_high", lambda v: torch.randint(0, v, (N,), device="tpu"), [10, 11, 1000],
     lambda r, v: r.min() >= 0 and r.max() < v and r.max() >= v * 0.9),
    ("randint_low_high", lambda v: torch.randint(v, v + 7, (N,), device="tpu"), [-3, 5, 100],
     lambda r, v: r.min() == v and r.max() == v + 6),
    ("random_from_to", lambda v: fresh(torch.int32).random_(-v, v), [2, 9, 300],
     lambda r, v: r.min() >= -v and r.max() < v),
    ("random_to", lambda v: fresh(torch.int16).random_(v), [3, 50, 7000],
     lambda r, v: r.min() >= 0 and r.max() < v),
    ("random_from_default_top", lambda v: fresh(torch.int8).random_(v, None), [-128, 0, 120],
     lambda r, v: r.min() >= v and r.max() <= 127),
    ("uniform_", lambda v: fresh().uniform_(v, v + 0.5), [-2.0, 0.25, 10.0],
     lambda r, v: r.min() >= v and r.max() < v + 0.5 and abs(r.mean() - (v + 0.25)) < 0.02),
    ("uniform_bf16", lambda v: fresh(torch.bfloat16).uniform_(-v, v), [1.0, 3.0, 8.0],
     lambda r, v: r.min() >= -v and r.max() <= v and r.std() > v / 2),
    ("normal_", lambda v: fresh().normal_(v, 2 * v), [1.0, 3.0, 0.5],
     lambda r, v: abs(r.mean() - v) < 0.2 * v and abs(r.std() - 2 * v) < 0.2 * v),
    ("normal_tensor_mean_float_std", lambda v: torch.normal(torch.zeros(N, device="tpu"), v), [0.5, 2.0, 4.0],
     lambda r, v: abs(r.std() - v) < 0.1 * v),
    ("normal_float_mean_tensor_std", lambda v: torch.normal(v, torch.ones(N, device="tpu")), [-1.0, 2.0, 5.0],
     lambda r, v: abs(r.mean() - v) < 0.1),
    ("log_normal_", lambda v: fresh().log_normal_(v, 0.25), [0.0, 1.0, -1.0],
     lambda r, v: r.min() > 0 and abs(r.log().mean() - v) < 0.05),
    ("exponential_", lambda v: fresh().exponential_(v), [0.5, 2.0, 10.0],
     lambda r, v: r.min() >= 0 and abs(r.mean() - 1 / v) < 0.1 / v),
    ("cauchy_", lambda v: fresh().cauchy_(v, 0.5), [0.0, 3.0, -7.0],
     lambda r, v: abs(r.median() - v) < 0.1),
    ("geometric_", lambda v: fresh().geometric_(v), [0.2, 0.5, 0.9],
     lambda r, v: r.min() >= 1 and abs(r.mean() - 1 / v) < 0.1 / v),
    ("bernoulli_", lambda v: fresh().bernoulli_(v), [0.1, 0.5, 0.85],
     lambda r, v: set(r.unique().tolist()) <= {0.0, 1.0} and abs(r.mean() - v) < 0.04),
    ("bernoulli_p", lambda v: torch.bernoulli(torch.empty(N, device="tpu"), v), [0.3, 0.6, 0.0],
     lambda r, v: abs(r.mean() - v) < 0.04),
]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("name,draw,values,check", CASES, ids=[c[0] for c in CASES])
def test_new_values_reuse_the_program_and_draw_within_them(mode, name, draw, values, check):
    with torch_tpu.set_eager_mode(mode):
        first = draw(values[0]).cpu()  # compiles
        assert check(first.double(), values[0]), (values[0], first)
        draw(values[0]).cpu()
        before = compiles()
        for v in values[1:]:
            r = draw(v).cpu()
            assert check(r.double(), v), (v, r)
        assert compiles() == before, f"{name}: a new value compiled a program"


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_dropout_rate_is_a_runtime_operand_forward_and_backward(mode):
    x = torch.rand(64, 64) + 0.5
    with torch_tpu.set_eager_mode(mode):
        def step(p):
            xt = x.to("tpu").requires_grad_()
            y = F.dropout(xt, p, training=True)
            y.sum().backward()
            return y.detach().cpu(), xt.grad.cpu()

        step(0.1)
        step(0.1)
        before = compiles()
        for p in (0.25, 0.5, 0.9):
            y, g = step(p)
            kept = y != 0
            assert abs(kept.double().mean() - (1 - p)) < 0.04
            torch.testing.assert_close(y[kept], x[kept] / (1 - p))
            torch.testing.assert_close(g, kept.float() / (1 - p))
        assert compiles() == before


def test_a_growing_replay_buffer_compiles_its_defer_and_fuse_step_once():
    # The RL loop that found this: each step appends to a buffer and samples a batch of
    # indices below its current size; the fused step is the same program every time.
    torch.manual_seed(0)
    buffer = torch.randn(600, 8, device="tpu")
    w = torch.randn(8, 1, device="tpu", requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.01)
    counts = []
    with torch_tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE):
        for size in range(100, 110):
            idx = torch.randint(0, size, (32,), device="tpu")
            loss = (buffer[idx] @ w).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            assert int(idx.max()) < size
            counts.append(compiles()[0])
    assert counts[-1] == counts[3], counts


def test_the_word_width_follows_the_range_on_one_program_shape():
    # A range from 2^28 on draws 64-bit words (32-bit ones mod a range near 2^32 favour
    # low values); the value class is part of the program's key, so both stay right.
    for hi in (1000, 3 * 2**30, 1000, 2**40, 2**62):
        r = torch.randint(0, hi, (N,), device="tpu").cpu()
        assert r.min() >= 0 and r.max() < hi
        # Uniform over [0, hi): a third of the draws below hi / 3, within sampling noise.
        assert abs((r < hi // 3).double().mean() - 1 / 3) < 0.04, hi
    full = torch.empty(N, dtype=torch.int64, device="tpu").random_(-2**63, None).cpu()
    assert (full < 0).double().mean().item() == pytest.approx(0.5, abs=0.04)
    assert full.double().abs().max() > 2**62


def test_draws_follow_the_seed_whatever_the_values_before():
    torch.manual_seed(7)
    a = torch.randint(0, 97, (N,), device="tpu").cpu()
    torch.randint(0, 5, (N,), device="tpu")  # the shared program, another value
    torch.manual_seed(7)
    b = torch.randint(0, 97, (N,), device="tpu").cpu()
    assert torch.equal(a, b)
    torch.manual_seed(7)
    c = torch.randint(0, 96, (N,), device="tpu").cpu()
    assert not torch.equal(a, c)


def cpu_error(fn):
    with pytest.raises(Exception) as e:
        fn("cpu")
    return type(e.value), str(e.value)


ERRORS = [
    ("uniform_from_gt_to", lambda d: torch.ones(3, device=d).uniform_(2, 1.5)),
    ("uniform_to_inf", lambda d: torch.ones(3, device=d).uniform_(0, math.inf)),
    ("uniform_from_nan", lambda d: torch.ones(3, device=d).uniform_(math.nan, 1)),
    ("uniform_range_past_float", lambda d: torch.ones(3, device=d).uniform_(-3e38, 3e38)),
    ("uniform_half_out_of_bounds", lambda d: torch.ones(3, device=d, dtype=torch.half).uniform_(0, 70000.0)),
    ("uniform_half_range", lambda d: torch.ones(3, device=d, dtype=torch.half).uniform_(-65000.0, 65000.0)),
    ("uniform_bf16_range", lambda d: torch.ones(3, device=d, dtype=torch.bfloat16).uniform_(-3e38, 3e38)),
    ("uniform_double_inf", lambda d: torch.ones(3, device=d, dtype=torch.double).uniform_(-math.inf, 0)),
    ("random_from_eq_to", lambda d: torch.ones(3, device=d).random_(5, 5)),
    ("random_from_gt_to_int8_out_of_bounds", lambda d: torch.ones(3, device=d, dtype=torch.int8).random_(1000, 3)),
    ("random_to_zero", lambda d: torch.ones(3, device=d, dtype=torch.int32).random_(0)),
    ("random_to_negative", lambda d: torch.ones(3, device=d).random_(-5)),
    ("random_from_out_of_int8", lambda d: torch.ones(3, device=d, dtype=torch.int8).random_(-1000, 5)),
    ("random_to_out_of_uint8", lambda d: torch.ones(3, device=d, dtype=torch.uint8).random_(0, 300)),
    ("random_to_out_of_half", lambda d: torch.ones(3, device=d, dtype=torch.half).random_(0, 2**40)),
    ("randint_empty", lambda d: torch.randint(5, 5, (3,), device=d)),
    ("bernoulli_above_one", lambda d: torch.ones(3, device=d).bernoulli_(1.5)),
    ("bernoulli_nan", lambda d: torch.ones(3, device=d).bernoulli_(math.nan)),
    ("bernoulli_p_negative", lambda d: torch.bernoulli(torch.ones(3, device=d), -0.1)),
    ("native_dropout_above_one", lambda d: torch.native_dropout(torch.ones(3, device=d), 1.5, True)),
    ("native_dropout_negative", lambda d: torch.native_dropout(torch.ones(3, device=d), -0.5, True)),
]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("name,fn", ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_values_raise_as_cpu_at_every_call(mode, name, fn):
    want_type, want = cpu_error(fn)
    with torch_tpu.set_eager_mode(mode):
        for _ in range(2):  # the second call meets a planned program (or none)
            with pytest.raises(want_type) as e:
                fn("tpu")
            assert str(e.value).splitlines()[0] == want.splitlines()[0]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_refused_value_after_good_ones_leaves_the_tensor_as_it_was(mode):
    with torch_tpu.set_eager_mode(mode):
        t = torch.zeros(8, device="tpu")
        t.uniform_(0, 1)
        t.bernoulli_(0.5)
        t.random_(0, 10)
        before = t.cpu().clone()
        with pytest.raises(RuntimeError, match="expects to return a"):
            t.uniform_(1, 0)
        with pytest.raises(RuntimeError, match="expects p to be in"):
            t.bernoulli_(2.0)
        with pytest.raises(RuntimeError, match="less than 'to'"):
            t.random_(10, 0)
        assert torch.equal(t.cpu(), before)
        assert t.uniform_(3, 4).cpu().min() >= 3  # usable after


def test_not_training_dropout_ignores_p():
    x = torch.randn(10)
    for p in (0.0, 0.5, 1.5):
        y, mask = torch.native_dropout(x.to("tpu"), p, False)
        assert torch.equal(y.cpu(), x) and bool(mask.cpu().all())
