"""A process's first tpu op: no torch._dynamo import on its path (PyTorch's Python
meta references import it lazily), and the C++ meta functions used for output shapes
agree with CPU on shapes, strides and dtypes."""

import pytest
import torch

from conftest import native, run_python_json

FIRST_OP = (
    "import json, sys, time, torch\n"
    "t0 = time.perf_counter()\n"
    "x = torch.ones(4, device='tpu') + 1\n"
    "y = (x * 2).exp().sum(0)\n"
    "v = x.cpu().tolist()\n"
    "print(json.dumps({'v': v, 'y': y.item(), 'dynamo': 'torch._dynamo' in sys.modules,\n"
    "                  'sympy': 'sympy' in sys.modules, 's': time.perf_counter() - t0}))\n"
)


def first_op(**env):
    return run_python_json(FIRST_OP, env=env)


def test_first_op_imports_no_dynamo():
    out = first_op()
    assert out["v"] == [2.0, 2.0, 2.0, 2.0]
    assert out["y"] == pytest.approx(4 * 54.598150033, rel=1e-6)
    assert not out["dynamo"], "the first ops imported torch._dynamo"
    assert not out["sympy"], "the first ops imported sympy"


def test_python_meta_path_still_works():
    # TPU_CXX_META=0 turns the C++ meta table off: the Python references answer (and
    # import torch._dynamo), with the same values.
    out = first_op(TPU_CXX_META="0")
    assert out["v"] == [2.0, 2.0, 2.0, 2.0]
    assert out["dynamo"]


def _cases():
    a = torch.randn(6, 5, dtype=torch.float64)
    cl = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    i = torch.arange(30).reshape(6, 5)
    return {
        "add_transposed": lambda t: t["a"].t() + t["a"].t(),
        "mul_broadcast": lambda t: t["a"][:, :1] * t["a"][:1, :],
        "int_plus_float": lambda t: t["i"] + 1.5,
        "int_true_div": lambda t: t["i"] / 4,
        "compare": lambda t: t["a"] > 0,
        "channels_last_unary": lambda t: t["cl"].sigmoid(),
        "channels_last_binary": lambda t: t["cl"] * t["cl"],
        "sum_dim_dtype": lambda t: t["i"].sum(1),
        "mean_keepdim": lambda t: t["a"].mean(0, keepdim=True),
        "amax": lambda t: t["a"].amax(1),
        "softmax_strided": lambda t: t["a"].t().softmax(-1),
        "mm": lambda t: t["a"] @ t["a"].t(),
        "inplace_add": lambda t: t["a"].clone().add_(t["a"]),
        "pow_scalar": lambda t: t["a"].pow(2),
        "clamp": lambda t: t["a"].clamp(-0.5, 0.5),
        "where_cmp": lambda t: torch.maximum(t["a"], t["a"].t().t() * 0.5),
        "tril": lambda t: t["a"].tril(),
        "cumsum_int": lambda t: t["i"].cumsum(0),
        "gelu_channels_last": lambda t: torch.nn.functional.gelu(t["cl"]),
        "max_pool": lambda t: torch.nn.functional.max_pool2d(t["cl"], 2),
        "out_resize": lambda t: torch.add(t["a"], 1, out=t["a"].new_empty(0)),
    }, {"a": a, "cl": cl, "i": i}


CASES, INPUTS = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_cxx_meta_matches_cpu_layout(name):
    fn = CASES[name]
    expect = fn(INPUTS)
    with native():
        got = fn({k: v.to("tpu") for k, v in INPUTS.items()})
    assert got.shape == expect.shape
    assert got.dtype == expect.dtype
    assert got.stride() == expect.stride(), (got.stride(), expect.stride())
    torch.testing.assert_close(got.cpu(), expect, rtol=1e-5, atol=1e-6)
