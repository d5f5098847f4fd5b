"""jax_op: JAX and Pallas functions as PyTorch ops on tpu tensors, their StableHLO
spliced into our programs (Strict, Debug, DeferAndFuse, compiled)."""
import math
import os
import sys
import warnings
from typing import Optional

import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode
from conftest import ROOT, no_fallbacks, run_python

jax = pytest.importorskip("jax")  # pinned in the Makefile's setup: present in CI
import jax.numpy as jnp  # noqa: E402

from torch_tpu.pallas import custom_jax_kernel, jax_op  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "examples"))

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING, EagerMode.DEFER_AND_FUSE]
TRACES = {"mlp": 0}


@jax_op("jaxop_test::mlp")
def mlp(x: jax.Array, w: jax.Array, b: Optional[jax.Array] = None, scale: float = 2.0) -> jax.Array:
    TRACES["mlp"] += 1  # runs once per export, never per call
    y = jnp.tanh(x @ w) * scale
    return y if b is None else y + b


def mlp_ref(x, w, b=None, scale=2.0):
    y = torch.tanh(x @ w) * scale
    return y if b is None else y + b


@pytest.fixture(params=MODES, ids=lambda m: m.name)
def mode(request):
    with torch_tpu.set_eager_mode(request.param):
        yield request.param


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def leaves(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    cpu = [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]
    return cpu, [c.float().to("tpu").requires_grad_() for c in cpu]


def test_import_torch_tpu_does_not_import_jax():
    r = run_python(
        "import sys, torch, torch_tpu, torch_tpu.pallas\n"
        "assert 'jax' not in sys.modules, 'import torch_tpu imported jax'\n"
        "import torch_tpu._internal.pallas as p\n"
        "assert p.jax_op is torch_tpu.pallas.jax_op\n"
        "assert 'jax' not in sys.modules\n"
        "try:\n"
        "    torch_tpu.pallas.jax_op('sub::noarray', lambda x: x * 2)\n"
        "except TypeError as e:\n"
        "    print(e)\n"
        "assert 'jax' in sys.modules  # the first jax_op imported it\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "jax_op sub::noarray: no parameter is annotated jax.Array" in r.stdout
    r = run_python(
        "import sys, torch, torch_tpu\n"
        "from torch_tpu.pallas import jax_op\n"
        "assert 'jax' not in sys.modules\n"
        "import jax\n"
        "@jax_op('sub::twice')\n"
        "def twice(x: jax.Array) -> jax.Array: return x * 2\n"
        "print(twice(torch.arange(3.0, device='tpu')).tolist())\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[0.0, 2.0, 4.0]"


def test_forward_backward_in_each_mode(mode):
    (x, w, b), (xt, wt, bt) = leaves((4, 8), (8, 3), (3,))
    for p in (x, w, b):
        p.requires_grad_()
    with no_fallbacks():
        y = mlp(xt, wt, bt, scale=3.0)
        (y * y).sum().backward()
        out, gx, gw, gb = y.cpu(), xt.grad.cpu(), wt.grad.cpu(), bt.grad.cpu()
    ref = mlp_ref(x, w, b, 3.0)
    (ref * ref).sum().backward()
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    for got, want in ((gx, x.grad), (gw, w.grad), (gb, b.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_torch_ops_namespace_and_optional_tensor(mode):
    (x, w), (xt, wt) = leaves((2, 5), (5, 4), seed=1)
    y = torch.ops.jaxop_test.mlp(xt.detach(), wt.detach())  # b=None, scale default
    torch.testing.assert_close(y.cpu().double(), mlp_ref(x, w), rtol=1e-5, atol=1e-5)
    wt_t = wt.detach().t().contiguous().t()  # a transposed view: read through its strides
    assert not wt_t.is_contiguous()
    y = mlp(xt.detach(), wt_t)
    torch.testing.assert_close(y.cpu().double(), mlp_ref(x, w), rtol=1e-5, atol=1e-5)


def test_deferred_call_joins_the_fused_graph():
    (x, w), (xt, wt) = leaves((4, 8), (8, 3), seed=2)
    with torch_tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE):
        torch_tpu.synchronize()
        before = torch_tpu.metrics()
        y = (mlp(xt.detach() * 2, wt.detach()) + 1).relu()
        out = y.cpu()
        after = torch_tpu.metrics()
    assert after["fused_graphs"] - before["fused_graphs"] == 1  # mul, the JAX op, add, relu
    assert after["deferred_ops"] - before["deferred_ops"] >= 4
    torch.testing.assert_close(out.double(), (mlp_ref(x * 2, w) + 1).relu(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("eager", [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE], ids=lambda m: m.name)
def test_compiled_forward_backward(eager):
    (x, w, b), (xt, wt, bt) = leaves((4, 8), (8, 3), (3,), seed=3)
    for p in (x, w, b):
        p.requires_grad_()

    def f(x, w, b):
        return (mlp(x.sin(), w, b, scale=0.5) * 2).sum()

    compiled = torch.compile(f, backend="tpu", fullgraph=True)  # the op is in the graph
    from torch_tpu._internal.compile import counters
    graphs = counters["compiled_graphs"]
    with torch_tpu.set_eager_mode(eager), no_fallbacks():
        loss = compiled(xt, wt, bt)
        loss.backward()
        got = [loss.item(), xt.grad.cpu(), wt.grad.cpu(), bt.grad.cpu()]
    assert counters["compiled_graphs"] - graphs == 2  # forward and backward
    ref = (mlp_ref(x.sin(), w, b, 0.5) * 2).sum()
    ref.backward()
    assert abs(got[0] - ref.item()) < 1e-4
    for g, want in zip(got[1:], (x.grad, w.grad, b.grad)):
        torch.testing.assert_close(g.double(), want, rtol=1e-4, atol=1e-5)


def test_static_arguments_key_the_export_cache():
    @jax_op("jaxop_test::statics")
    def statics(x: jax.Array, k: int, axes: tuple[int, ...], mode: str, neg: bool = False) -> jax.Array:
        TRACES["statics"] = TRACES.get("statics", 0) + 1
        y = jnp.sum(x, axis=axes) * k if mode == "sum" else jnp.max(x, axis=axes) * k
        return -y if neg else y

    x = torch.arange(24.0).reshape(2, 3, 4)
    xt = x.to("tpu")
    assert statics(xt, 2, [0, 2], "sum").cpu().tolist() == (x.sum((0, 2)) * 2).tolist()
    assert statics(xt, 2, (0, 2), "sum").cpu().tolist() == (x.sum((0, 2)) * 2).tolist()
    assert TRACES["statics"] == 1  # a list and a tuple of the same values: one export
    assert statics(xt, 3, [1], "max", neg=True).cpu().tolist() == (-x.amax(1) * 3).tolist()
    assert statics(xt, 3, [1], "max", True).cpu().tolist() == (-x.amax(1) * 3).tolist()
    assert TRACES["statics"] == 2
    assert statics(xt[:1], 3, [1], "max").shape == (1, 4)  # a new shape: a new export
    assert TRACES["statics"] == 3


def test_export_once_per_signature_not_per_call():
    TRACES["mlp"] = 0
    xt, wt = torch.randn(3, 6, device="tpu"), torch.randn(6, 2, device="tpu")
    for _ in range(3):
        mlp(xt, wt, scale=1.5)
    mlp(xt, wt, scale=1.5).cpu()
    assert TRACES["mlp"] == 1
    mlp(xt.to(torch.bfloat16), wt.to(torch.bfloat16), scale=1.5).cpu()
    assert TRACES["mlp"] == 2


def test_several_outputs_and_dtypes(mode):
    @jax_op("jaxop_test::stats")
    def stats(x: jax.Array, idx: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        return x.mean(-1), jnp.argmax(x, -1).astype(jnp.int32), x[idx] > 0

    x = torch.randn(5, 7)
    idx = torch.tensor([4, 0, 2])
    xt = x.to("tpu").requires_grad_()
    m, a, pos = stats(xt, idx.to("tpu"))
    (m * torch.arange(5.0, device="tpu")).sum().backward()  # integer outputs: no gradient
    torch.testing.assert_close(xt.grad.cpu(), torch.arange(5.0)[:, None].expand(5, 7) / 7)
    assert (m.dtype, a.dtype, pos.dtype) == (torch.float32, torch.int32, torch.bool)
    torch.testing.assert_close(m.cpu(), x.mean(-1))
    assert a.cpu().tolist() == x.argmax(-1).tolist()
    assert pos.cpu().tolist() == (x[idx] > 0).tolist()


@jax_op("jaxop_test::arange_like")
def arange_like(x: jax.Array) -> jax.Array:
    return jnp.arange(x.shape[0], dtype=jnp.float32) + jnp.zeros_like(x)


def test_a_function_of_its_inputs_shapes_only(mode):
    # jax.export drops arguments whose values are never read: no tensor is left to
    # dispatch on, and the call runs on the current device.
    with no_fallbacks():
        out = arange_like(torch.ones(4, device="tpu"))
        assert out.device.type == "tpu"
        assert torch.equal(out.cpu(), torch.arange(4.0))
        assert torch.equal((out * 2).cpu(), torch.arange(4.0) * 2)


def test_64_bit_inputs_keep_their_width():
    @jax_op("jaxop_test::wide")
    def wide(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        return x * 3, y / 3

    a, b = wide(torch.tensor([2**40 + 1], device="tpu"), torch.tensor([1.0], dtype=torch.float64, device="tpu"))
    assert a.dtype == torch.int64 and a.item() == 3 * (2**40 + 1)
    assert b.dtype == torch.float64 and b.item() == 1.0 / 3


def test_user_registered_backward_is_a_jax_op(mode):
    @jax_op("jaxop_test::cube")
    def cube(x: jax.Array) -> jax.Array:
        return x ** 3

    @jax_op("jaxop_test::cube_backward")
    def cube_backward(x: jax.Array, g: jax.Array) -> jax.Array:
        return 30.0 * x * x * g  # deliberately 10x the true gradient: proves it is used

    cube.register_autograd(lambda ctx, g: cube_backward(ctx.saved_tensors[0], g),
                           setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))
    x = torch.tensor([1.0, -2.0, 0.5], device="tpu", requires_grad=True)
    cube(x).sum().backward()
    assert x.grad.cpu().tolist() == [30.0, 120.0, 7.5]


def test_pallas_kernel_forward_backward(mode):
    import pallas_gpt
    g = torch.Generator().manual_seed(4)
    x = torch.randn(16, 24, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(24, generator=g, dtype=torch.float64, requires_grad=True)
    xt = x.detach().float().to("tpu").requires_grad_()
    bt = b.detach().float().to("tpu").requires_grad_()
    with no_fallbacks():
        y = pallas_gpt.add_gelu(xt, bt)
        (y * y).sum().backward()
        got = y.cpu(), xt.grad.cpu(), bt.grad.cpu()
    ref = torch.nn.functional.gelu(x + b)
    (ref * ref).sum().backward()
    for g_, want in zip(got, (ref.detach(), x.grad, b.grad)):
        torch.testing.assert_close(g_.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("eager,compiled", [(EagerMode.DEFER_NEVER, False), (EagerMode.DEFER_AND_FUSE, False),
                                            (EagerMode.DEFER_NEVER, True)],
                         ids=["strict", "fused", "compiled"])
def test_pallas_gpt_losses_match_plain_model(eager, compiled):
    import pallas_gpt
    with torch_tpu.set_eager_mode(eager), no_fallbacks():
        plain = pallas_gpt.train(False, steps=3, compiled=compiled)
        fused = pallas_gpt.train(True, steps=3, compiled=compiled)
    assert all(abs(a - b) < 1e-4 for a, b in zip(plain, fused)), (plain, fused)
    assert plain[-1] < plain[0]  # it trains


def _scale(x: jax.Array, s: float) -> jax.Array:
    return x * s


def test_donated_argument_is_consumed(mode):
    @jax_op("jaxop_test::scale_inplace", donate_argnums=(0,))
    def scale(x: jax.Array, s: float) -> jax.Array:
        return x * s

    x = torch.arange(4.0, device="tpu")
    keep = torch.arange(4.0, device="tpu")
    y = scale(x, 2.5)
    assert y.cpu().tolist() == [0.0, 2.5, 5.0, 7.5]
    with pytest.raises(RuntimeError, match=r"donated to jaxop_test::scale_inplace"):
        x.cpu()
    with pytest.raises(RuntimeError, match=r"donated to jaxop_test::scale_inplace"):
        (x + 1).cpu()
    with pytest.raises(RuntimeError, match=r"donated to jaxop_test::scale_inplace"):
        x.mul_(2)
    assert keep.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]  # another tensor is untouched
    big = torch.ones(1 << 20, device="tpu") * 3
    torch_tpu.synchronize()
    before = torch.tpu.memory_allocated()
    out = scale(big, 2.0)
    torch_tpu.synchronize()
    # The output's 4 MiB took the place of the donated input's, though `big` still exists.
    assert torch.tpu.memory_allocated() == before
    assert out[:2].cpu().tolist() == [6.0, 6.0]
    with pytest.raises(ValueError, match="donate_argnums 1 is not a tensor parameter"):
        jax_op("jaxop_test::bad_donation", _scale, donate_argnums=1)


def test_shape_mismatch_names_the_op_and_shapes():
    with pytest.raises(RuntimeError, match=r"jax_op jaxop_test::mlp: the JAX function fails for "
                                           r"\(x: float32\[3, 4\], w: float32\[5, 2\], b=None, scale=2.0\)"):
        mlp(torch.ones(3, 4, device="tpu"), torch.ones(5, 2, device="tpu"))


def test_dtype_mismatch_names_the_op():
    @jax_op("jaxop_test::needs_float")
    def needs_float(x: jax.Array) -> jax.Array:
        return jax.lax.erf(x)

    with pytest.raises(RuntimeError, match=r"jaxop_test::needs_float.*x: int32\[4\]"):
        needs_float(torch.ones(4, dtype=torch.int32, device="tpu"))
    with pytest.raises(RuntimeError, match=r"jaxop_test::needs_float: argument 'x' is on cpu"):
        needs_float(torch.ones(4))
    with pytest.raises(RuntimeError, match=r"jaxop_test::needs_float.*Expected a value of type 'Tensor'"):
        needs_float(3.0)


def test_spliced_module_checks_operand_types():
    # The importer refuses a module whose @main does not take what the caller says.
    text = ('"builtin.module"() ({\n'
            '  "func.func"() <{function_type = (tensor<2xf32>) -> tensor<2xf32>, sym_name = "main"}> ({\n'
            '  ^bb0(%arg0: tensor<2xf32>):\n'
            '    "func.return"(%arg0) : (tensor<2xf32>) -> ()\n'
            '  }) : () -> ()\n'
            '}) : () -> ()\n')
    with pytest.raises(ValueError, match=r"jaxop_test::ident: .*@main has type \(tensor<2xf32>\) -> "
                                         r"tensor<2xf32>, expected \(tensor<3xf32>\)"):
        torch_tpu._C._import_stablehlo(text, "jaxop_test::ident", [("f32", [3])], [("f32", [3])])
    with pytest.raises(ValueError, match=r"jaxop_test::ident: .*top-level op other than func.func"):
        torch_tpu._C._import_stablehlo(text.replace('"func.func"() <{', '"sdy.mesh"() <{', 1),
                                       "jaxop_test::ident", [("f32", [2])], [("f32", [2])])
    mid = torch_tpu._C._import_stablehlo(text, "jaxop_test::ident", [("f32", [2])], [("f32", [2])])
    (y,) = torch.ops.torch_tpu.call_stablehlo([torch.tensor([1.0, 2.0], device="tpu")], mid)
    assert y.cpu().tolist() == [1.0, 2.0]
    # A call with the wrong operands is an op's argument error: RuntimeError, as for every op.
    with pytest.raises(RuntimeError, match=r"jaxop_test::ident: tensor argument 0 is tensor<3xf32> but "
                                           r"the exported function takes tensor<2xf32>"):
        torch.ops.torch_tpu.call_stablehlo([torch.ones(3, device="tpu")], mid)


def test_parameter_kinds_from_annotations():
    @jax_op("jaxop_test::union")
    def union(x: jax.Array, y: jax.Array | None = None, k=2) -> jax.Array:  # k: int from its default
        return x * k if y is None else x * k + y

    x = torch.ones(2, device="tpu")
    assert union(x, None, 3).cpu().tolist() == [3.0, 3.0]
    assert union(x, x).cpu().tolist() == [3.0, 3.0]
    def nostatic(x: jax.Array, k):
        return x

    with pytest.raises(TypeError, match=r"jax_op jaxop_test::nostatic: static parameter 'k' needs a type"):
        jax_op("jaxop_test::nostatic", nostatic)
    with pytest.raises(ValueError, match="namespace::op"):
        jax_op("no_namespace")


def test_custom_jax_kernel_is_a_deprecated_alias():
    with pytest.warns(DeprecationWarning, match="use torch_tpu.pallas.jax_op"):
        @custom_jax_kernel("jaxop_test::old_name")
        def old(x: jax.Array) -> jax.Array:
            return x + 1
    assert old(torch.zeros(2, device="tpu")).cpu().tolist() == [1.0, 1.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # jax_op itself does not warn

        @jax_op("jaxop_test::new_name")
        def new(x: jax.Array) -> jax.Array:
            return x - 1
    assert new(torch.zeros(1, device="tpu")).cpu().tolist() == [-1.0]


def test_complex_gradients_match_torch(mode):
    # JAX's vjp convention for complex values is the conjugate of PyTorch's.
    @jax_op("jaxop_test::cmul")
    def cmul(x: jax.Array) -> jax.Array:
        return x * (1 + 2j)

    @jax_op("jaxop_test::abs2")
    def abs2(x: jax.Array) -> jax.Array:
        return (x * x.conj()).real

    x = torch.tensor([1 + 1j, 2 - 0.5j], dtype=torch.complex64)
    r = torch.tensor([0.5, -1.5])
    cases = [(cmul, x, lambda y: y.real.sum()), (abs2, x, lambda y: y.sum()),
             (cmul, r, lambda y: y.imag.sum())]  # a real input with a complex output
    for op, v, loss in cases:
        want = v.clone().requires_grad_()
        loss(want * (1 + 2j) if op is cmul else (want * want.conj()).real).backward()
        got = v.to("tpu").requires_grad_()
        loss(op(got)).backward()
        torch.testing.assert_close(got.grad.cpu(), want.grad)


def test_float_statics_of_either_sign_are_exported_apart():
    @jax_op("jaxop_test::div")
    def div(x: jax.Array, s: float) -> jax.Array:
        return x / s

    for s in (0.0, -0.0):  # -0.0 does not reuse what was exported for 0.0
        x = torch.ones(1, device="tpu", requires_grad=True)
        y = div(x, s)
        y.backward()  # nor does its backward: d(x / s)/dx = 1 / s
        assert y.item() == x.grad.item() == math.copysign(math.inf, s)
    assert div(x, float("nan")).isnan().item() and div(x, float("nan")).isnan().item()


def test_sequence_statics_arrive_as_tuples(mode):
    @jax_op("jaxop_test::addaxis")
    def addaxis(x: jax.Array, shape: tuple[int, ...], perm: list[int]) -> jax.Array:
        assert type(shape) is tuple and type(perm) is tuple, (shape, perm)
        return jnp.transpose(x.reshape(shape), perm).reshape(shape + (1,))

    x = torch.arange(6.0, device="tpu", requires_grad=True)
    y = addaxis(x, [2, 3], [1, 0])
    (y * torch.arange(6.0, device="tpu").reshape(2, 3, 1)).sum().backward()  # the backward too
    assert y.shape == (2, 3, 1)
    assert x.grad.cpu().tolist() == torch.arange(6.0).reshape(3, 2).t().reshape(-1).tolist()


def test_compiled_call_with_every_tensor_none():
    @jax_op("jaxop_test::maybe")
    def maybe(a: Optional[jax.Array] = None, n: int = 3) -> jax.Array:
        return jnp.ones((n,)) if a is None else a + 1

    f = torch.compile(lambda n: maybe(None, n) * 2, backend="tpu", fullgraph=True)
    y = f(4)
    assert y.device.type == "tpu" and y.cpu().tolist() == [2.0] * 4


def test_variadic_tuple_output_takes_its_count_from_the_export(mode):
    @jax_op("jaxop_test::powers")
    def powers(x: jax.Array, n: int) -> tuple[jax.Array, ...]:
        return tuple(x ** (k + 1) for k in range(n))

    x = torch.tensor([1.0, 2.0], device="tpu", requires_grad=True)
    for n in (1, 3):
        outs = powers(x, n)
        assert [o.cpu().tolist() for o in outs] == [[1.0, 2.0 ** (k + 1)] for k in range(n)]
    outs[0].sum().backward(retain_graph=True)  # the backward of a variadic op, outputs unused
    (outs[1] + outs[2]).sum().backward()
    assert x.grad.cpu().tolist() == [1.0 + 2 + 3, 1.0 + 4 + 12]


def test_compiled_dynamic_sizes_are_specialized_or_refused():
    from torch_tpu.dynamism import mark_dynamic

    @jax_op("jaxop_test::twice")
    def twice(x: jax.Array) -> jax.Array:
        return x * 2

    f = torch.compile(lambda x: twice(x) + 1, backend="tpu", dynamic=True, fullgraph=True)
    for n in (4, 6):  # exported per shape: a guard on the size, a compile per size
        x = torch.arange(float(n), device="tpu")
        assert f(x).cpu().tolist() == (torch.arange(float(n)) * 2 + 1).tolist()
    torch._dynamo.reset()
    g = torch.compile(lambda x: twice(x).sum(0), backend=torch_tpu.TpuBackend(dynamism=True), fullgraph=True)
    x = torch.ones(5, 3, device="tpu")
    mark_dynamic(x, 0, 2, 16)  # a bounded size must stay dynamic: refused, naming the op
    with pytest.raises(Exception, match=r"jax_op jaxop_test::twice: argument 'x' has the dynamic size"):
        g(x)


def test_lapack_custom_calls_are_refused_at_export():
    @jax_op("jaxop_test::inv")
    def inv(a: jax.Array) -> jax.Array:
        return jnp.linalg.inv(a)

    a = torch.eye(3, device="tpu") * 2
    if torch_tpu._C.platform().lower() not in ("cpu", "host"):
        pytest.skip("LAPACK custom calls are what JAX emits for the cpu platform")
    with pytest.raises(NotImplementedError, match=r"jax_op jaxop_test::inv: the JAX function \(a: float32\[3, 3\]\) "
                                                  r"uses lu, triangular_solve .*lapack_sgetrf_ffi.*not available "
                                                  r"through PJRT plugins"):
        inv(a)


def test_sequence_statics_take_defaults():
    @jax_op("jaxop_test::tiled")
    def tiled(x: jax.Array, block: tuple[int, ...] = (2, 2), w: list[float] = None) -> jax.Array:
        y = x.reshape(block + (-1,)).sum(-1)
        return y if w is None else y * jnp.array(w)

    x = torch.ones(8, device="tpu")
    assert tiled(x).cpu().tolist() == [[2.0, 2.0], [2.0, 2.0]]
    assert tiled(x, (4,), [1.0, 2.0, 3.0, 4.0]).cpu().tolist() == [2.0, 4.0, 6.0, 8.0]
    assert torch.ops.jaxop_test.tiled(x, w=[0.5, 1.0]).cpu().tolist() == [[1.0, 2.0], [1.0, 2.0]]


@jax_op("jaxop_test::narrow_steps")
def narrow_steps(a: jax.Array, narrow: str, chain: bool) -> jax.Array:
    t = jnp.bfloat16 if narrow == "bf16" else jnp.float16
    for _ in range(4 if chain else 0):
        a = jnp.sin((a.astype(t) * 3 + 1).astype(jnp.float32))
    return (a.astype(t) * 3).astype(jnp.float32)


def test_narrow_float_steps_stay_rounded(mode):
    # XLA:CPU folded the convert pair around a bf16 step (excess precision): the result of
    # (a.astype(bf16) * 3).astype(f32) was not a bf16 value. torch's CPU ops round each step.
    x = torch.randn(256, generator=torch.Generator().manual_seed(0))
    for narrow, t, chain in (("bf16", torch.bfloat16, False), ("bf16", torch.bfloat16, True),
                             ("f16", torch.float16, False)):
        want = x
        for _ in range(4 if chain else 0):
            want = torch.sin((want.to(t) * 3 + 1).float())
        want = (want.to(t) * 3).float()
        got = narrow_steps(x.to("tpu"), narrow, chain).cpu()
        torch.testing.assert_close(got, want, rtol=0, atol=0)
