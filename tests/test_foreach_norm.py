"""_foreach_norm (clip_grad_norm_'s per-parameter norms) runs as one program whose
norms are elements of one vector: values equal to the per-tensor norms, CPU's dtypes and
errors, and a list of hundreds of tensors compiles as a handful of reductions (the norms
share one storage instead of being a program output each)."""

import pytest
import torch

from conftest import dev, host, native

INF = float("inf")
SHAPES = [(8, 16), (16,), (8, 16), (3, 4, 5), (16,), (1,), ()]


def tensors(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype) for s in SHAPES]


@pytest.mark.parametrize("ord", [2, 2.0, 1, 0, 3, 0.5, -1, INF, -INF])
def test_values_match_each_tensors_own_norm(ord):
    xs = tensors()
    xs[1][3] = 0.0  # a zero for ord 0 and the negative orders
    with native():
        got = torch._foreach_norm([dev(x) for x in xs], ord)
        one_by_one = [torch.linalg.vector_norm(dev(x), ord) for x in xs]
    want = torch._foreach_norm(xs, ord)
    assert len(got) == len(xs)
    for g, o, w in zip(got, one_by_one, want):
        assert g.device.type == "tpu" and g.shape == () and g.dtype == w.dtype
        torch.testing.assert_close(host(g), host(o), rtol=1e-6, atol=0)  # summed in another order
        torch.testing.assert_close(host(g), w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16, torch.complex64])
def test_dtypes(dtype):
    xs = tensors(dtype)
    want = torch._foreach_norm(xs)
    with native():
        got = torch._foreach_norm([dev(x) for x in xs])
    tol = {torch.bfloat16: 1e-2, torch.float16: 1e-3}.get(dtype, 1e-6)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(host(g), w, rtol=tol, atol=tol)


def test_mixed_dtypes_and_dtype_argument():
    xs = tensors()
    xs[2] = xs[2].to(torch.float16)
    for kw, complex_at_4 in (({}, True), ({"dtype": torch.float64}, False)):
        if complex_at_4:  # (CPU refuses a dtype for a list of real and complex tensors)
            xs[4] = xs[4].to(torch.complex64)
        else:
            xs[4] = xs[4].real
        want = torch._foreach_norm(xs, **kw)
        with native():
            got = torch._foreach_norm([dev(x) for x in xs], **kw)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            torch.testing.assert_close(host(g), w, rtol=1e-3, atol=1e-3)


def test_norms_are_independent_tensors_of_one_storage():
    xs = [torch.full((4,), float(k)) for k in range(1, 6)]
    with native():
        got = torch._foreach_norm([dev(x) for x in xs])
        assert len({g.untyped_storage().data_ptr() for g in got}) == 1
        got[1].add_(100)  # writes its own element only
        vals = [host(g).item() for g in got]
    assert vals == pytest.approx([2.0, 104.0, 6.0, 8.0, 10.0])


BAD = [
    (lambda d: torch._foreach_norm([]), "at least one tensor"),
    (lambda d: torch._foreach_norm([torch.ones(3, dtype=torch.long, device=d)]), "Expected a floating point"),
    (lambda d: torch._foreach_norm([torch.ones(3, device=d)], dtype=torch.long), "dtype should be floating point"),
    (lambda d: torch._foreach_norm([torch.ones(3, dtype=torch.half, device=d)], dtype=torch.bfloat16), "narrowing"),
    (lambda d: torch._foreach_norm([torch.ones(3, dtype=torch.cfloat, device=d)], dtype=torch.double), "complex"),
    (lambda d: torch._foreach_norm([torch.ones(3, device=d)], dtype=torch.cdouble), "real"),
    (lambda d: torch._foreach_norm([torch.ones(3, device=d)], 1 + 1j), "integer or float"),
    (lambda d: torch._foreach_norm([torch.ones(0, device=d)], INF), "infinity norm on an empty"),
    (lambda d: torch._foreach_norm([torch.ones(2, device=d), torch.ones(0, 3, device=d)], -INF), "-inf norm"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_errors_match_cpu(case):
    fn, words = BAD[case]
    with pytest.raises(RuntimeError, match=words) as cpu:
        fn("cpu")
    with pytest.raises(RuntimeError) as tpu:
        fn("tpu")
    assert str(tpu.value) == str(cpu.value)


def test_empty_tensor_finite_orders_are_zero():
    for ord in (0, 1, 2, 3.5):
        with native():
            got = torch._foreach_norm([torch.ones(0, device="tpu"), torch.ones(2, 0, device="tpu")], ord)
        assert [host(g).item() for g in got] == [0.0, 0.0]


def test_gradients_match_cpu():
    xs = tensors()
    ws = [x.clone().requires_grad_() for x in xs]
    sum(n * (k + 1) for k, n in enumerate(torch._foreach_norm(ws))).backward()
    with native():
        ts = [dev(x).requires_grad_() for x in xs]
        sum(n * (k + 1) for k, n in enumerate(torch._foreach_norm(ts))).backward()
        grads = [host(t.grad) for t in ts]
    for g, w in zip(grads, ws):
        torch.testing.assert_close(g, w.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, INF])
def test_clip_grad_norm_over_many_parameters(norm_type):
    g = torch.Generator().manual_seed(1)
    shapes = [(32, 32), (32,), (32,), (7, 32)] * 50  # 200 parameters, 4 shapes
    grads = [torch.randn(s, generator=g) for s in shapes]
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p, gr in zip(params, grads):
        p.grad = gr.clone()
    want_total = torch.nn.utils.clip_grad_norm_(params, 1.0, norm_type)
    with native():
        tparams = [torch.nn.Parameter(torch.zeros(s, device="tpu")) for s in shapes]
        for p, gr in zip(tparams, grads):
            p.grad = dev(gr)
        total = torch.nn.utils.clip_grad_norm_(tparams, 1.0, norm_type)
        got = [host(p.grad) for p in tparams]
    torch.testing.assert_close(host(total), want_total, rtol=1e-5, atol=1e-6)
    for gt, p in zip(got, params):
        torch.testing.assert_close(gt, p.grad, rtol=1e-5, atol=1e-6)
