"""The op signature (lowered_kernel.cpp's binary key) must tell apart every call whose
program differs: calls that differ in one compile-time argument, view geometry or
storage layout each get their own plan, and a repeated call reuses its plan."""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu


def _both(fn, *cpu_args):
    return fn(*cpu_args), fn(*[a.to("tpu") for a in cpu_args])


def _check(fn, *cpu_args):
    want, got = _both(fn, *cpu_args)
    torch.testing.assert_close(got.cpu(), want)


# Pairs of calls that differ only in a value the program bakes in.
CASES = [
    ("int dim", lambda x: x.sum(0), lambda x: x.sum(1)),
    ("int list of other length", lambda x: x.sum([0]), lambda x: x.sum([0, 1])),
    ("int list values", lambda x: x.permute(0, 1), lambda x: x.permute(1, 0)),
    ("bool", lambda x: x.cumsum(0).flip(0), lambda x: x.flip(1)),
    ("string", lambda x: F.gelu(x, approximate="none"), lambda x: F.gelu(x, approximate="tanh")),
    ("view offset", lambda x: x.reshape(-1)[1:5] + 1, lambda x: x.reshape(-1)[2:6] + 1),
    ("view strides", lambda x: x[:, ::2] + 1, lambda x: x[::2, :2] + 1),
    ("storage shape", lambda x: x[:2, :2] * 2, lambda x: x.reshape(-1)[:4].reshape(2, 2) * 2),
    ("double arg", lambda x: torch.nn.functional.elu(x, alpha=0.5), lambda x: torch.nn.functional.elu(x, alpha=2.0)),
]


@pytest.mark.parametrize("name,f,g", CASES, ids=[c[0] for c in CASES])
def test_signatures_differing_in_one_argument_get_their_own_program(name, f, g):
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7 - 1.5
    for fn in (f, g, f, g):  # interleaved: a stale plan would show on the repeats
        _check(fn, x)


def test_wrapped_number_and_tensor_operands_do_not_share_a_plan():
    x = torch.arange(6, dtype=torch.float32)
    _check(lambda a: a + 2, x)
    _check(lambda a: a + torch.tensor(3.0).to(a.device), x)  # a 0-dim tpu tensor
    _check(lambda a: a + 5, x)


def test_conj_and_neg_views_differ_from_the_plain_tensor():
    z = torch.complex(torch.arange(4.0), torch.arange(4.0) + 1)
    _check(lambda a: a * 2, z)
    _check(lambda a: a.conj() * 2, z)
    _check(lambda a: a.conj().imag * 2, z)  # a negative view
    _check(lambda a: a * 2, z)


def test_a_repeated_call_hits_its_plan():
    x = torch.randn(5, 3).to("tpu")
    y = x * 3 + 1  # plans made
    before = torch_tpu.metrics()
    for _ in range(10):
        y = x * 3 + 1
    after = torch_tpu.metrics()
    assert after["signature_misses"] == before["signature_misses"]
    assert after["signature_hits"] - before["signature_hits"] >= 20
    torch.testing.assert_close(y.cpu(), x.cpu() * 3 + 1)
