"""Correctness at the edges: invalid values, overlapping writes and memory formats
behave as on CPU (issue 16, items 1-3). Each case runs the same call on CPU and tpu."""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu


def _outcome(fn, device):
    """(exception type, message) or (None, result on CPU) of fn(device), synchronized."""
    try:
        r = fn(device)
        r = tuple(t.cpu() for t in r) if isinstance(r, tuple) else r.cpu() if isinstance(r, torch.Tensor) else r
        torch_tpu.synchronize()
        return None, r
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e), str(e)


def _same_as_cpu(fn, match=None):
    cpu_err, cpu_val = _outcome(fn, "cpu")
    tpu_err, tpu_val = _outcome(fn, "tpu")
    assert tpu_err is cpu_err, f"cpu: {cpu_err} {cpu_val!s:.200}; tpu: {tpu_err} {tpu_val!s:.200}"
    if cpu_err is None:
        torch.testing.assert_close(tpu_val, cpu_val, equal_nan=True)
    elif match:
        assert match in tpu_val, tpu_val
    return cpu_err


# ---- item 1: invalid values raise like CPU ---------------------------------------

def _t(v, d, **k):
    return torch.tensor(v, device=d, **k)


def _x(d):
    return torch.linspace(-1.0, 1.0, 12, device=d).view(4, 3)


VALUES = {
    "cross_entropy": lambda d: F.cross_entropy(_x(d), _t([0, 3, 1, 7], d)),
    "cross_entropy_negative": lambda d: F.cross_entropy(_x(d), _t([0, -2, 1, 1], d)),
    "cross_entropy_none": lambda d: F.cross_entropy(_x(d), _t([0, 3, 1, 1], d), reduction="none"),
    "cross_entropy_smoothing": lambda d: F.cross_entropy(_x(d), _t([0, 3, 1, 1], d), label_smoothing=0.1),
    "nll_loss_1d": lambda d: F.nll_loss(_x(d)[0], _t(5, d)),
    "nll_loss2d": lambda d: F.nll_loss(_x(d).view(1, 3, 2, 2), _t([[[0, 1], [3, 2]]], d)),
    "multi_margin_loss": lambda d: F.multi_margin_loss(_x(d), _t([0, 3, 1, 2], d)),
    "multilabel_margin_loss": lambda d: F.multilabel_margin_loss(_x(d), _t([[0, 3, -1]] * 4, d)),
    "bce_input_above_1": lambda d: F.binary_cross_entropy(_t([0.5, 1.5], d), _t([0.0, 1.0], d)),
    "bce_input_nan": lambda d: F.binary_cross_entropy(_t([0.5, float("nan")], d), _t([0.0, 1.0], d)),
    "bce_target_above_1": lambda d: F.binary_cross_entropy(_t([0.5, 0.5], d), _t([0.0, 2.0], d)),
    "uniform_reversed": lambda d: torch.empty(3, device=d).uniform_(2, 1),
    "uniform_infinite": lambda d: torch.empty(3, device=d).uniform_(0, float("inf")),
    "bernoulli_float_p": lambda d: torch.empty(3, device=d).bernoulli_(1.5),
    "bernoulli_tensor_p": lambda d: torch.empty(3, device=d).bernoulli_(_t([0.5, 1.5, 0.0], d)),
    "bernoulli_probs": lambda d: torch.bernoulli(_t([0.5, -0.5, 0.0], d)),
    "normal_negative_std": lambda d: torch.normal(torch.zeros(3, device=d), _t([1.0, -1.0, 1.0], d)),
    "pow_int_negative": lambda d: _t([1, 2, 3], d) ** -1,
    "pow_int_negative_inplace": lambda d: _t([1, 2, 3], d).pow_(-2),
    "lerp_int": lambda d: torch.lerp(_t([1, 2], d), _t([3, 4], d), 0.5),
    "lerp_int_tensor_weight": lambda d: torch.lerp(_t([1, 2], d), _t([3, 4], d), _t([1, 0], d)),
    "floor_divide_int_zero": lambda d: _t([1, 2], d) // _t([0, 1], d),
    "remainder_int_zero": lambda d: _t([1, 2], d) % 0,
    "fmod_int_zero": lambda d: torch.fmod(_t([1, 2], d), _t([1, 0], d)),
    "div_trunc_int_zero": lambda d: torch.div(_t([1, 2], d), _t([0, 1], d), rounding_mode="trunc"),
    "softmax_int": lambda d: torch.softmax(_t([1, 2], d), 0),
    "log_softmax_int": lambda d: torch.log_softmax(_t([1, 2], d), 0),
    "gelu_int": lambda d: F.gelu(_t([1, 2], d)),
    "silu_int": lambda d: F.silu(_t([1, 2], d)),
    "relu_bool": lambda d: torch.relu(_t([True, False], d)),
    "smooth_l1_negative_beta": lambda d: F.smooth_l1_loss(_t([1.0], d), _t([2.0], d), beta=-1.0),
    "gather": lambda d: torch.gather(_x(d), 1, _t([[0, 3]], d)),
    "scatter_": lambda d: _x(d).scatter_(1, _t([[0, 3]], d), 1.0),
    "scatter_add_": lambda d: _x(d).scatter_add_(1, _t([[0, 3]], d), _x(d)),
    "index_add_": lambda d: _x(d).index_add_(1, _t([0, 3], d), _x(d)[:, :2]),
    "embedding_bag": lambda d: F.embedding_bag(_t([3], d), _x(d)[:3], _t([0], d)),
    "searchsorted_sorter": lambda d: torch.searchsorted(_t([1.0, 2.0, 3.0], d), _t([2.0], d), sorter=_t([0, 1, 5], d)),
    "one_hot": lambda d: F.one_hot(_t([0, 5], d), 3),
}

MODES = {"strict": torch_tpu.EagerMode.DEFER_NEVER, "debug": torch_tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING,
         "fused": torch_tpu.EagerMode.DEFER_AND_FUSE}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_invalid_value_raises_like_cpu(name):
    kept = torch.arange(3.0, device="tpu")
    _same_as_cpu(VALUES[name])
    assert kept.cpu().tolist() == [0.0, 1.0, 2.0]  # the process and tensors stay usable
    assert (kept * 2).cpu().tolist() == [0.0, 2.0, 4.0]


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", ["cross_entropy", "bce_input_above_1", "bernoulli_tensor_p", "pow_int_negative",
                                  "floor_divide_int_zero", "multi_margin_loss"])
def test_value_checks_in_every_mode(name, mode):
    with torch_tpu.set_eager_mode(MODES[mode]):
        err = _same_as_cpu(VALUES[name])
    assert err is not None


def test_loss_target_errors_name_the_op_and_ignore_index_still_works():
    x, t = _x("tpu"), _t([0, 3, 1, 7], "tpu")
    with pytest.raises(IndexError, match=r"nll_loss.*Target out of bounds.*0 to 2"):
        F.cross_entropy(x, t).cpu()
    for kw in ({"ignore_index": 7}, {"ignore_index": 3}):  # out of range but ignored: fine
        ok = torch.tensor([0, kw["ignore_index"], 1, 2])
        torch.testing.assert_close(F.cross_entropy(x, ok.to("tpu"), **kw).cpu(), F.cross_entropy(x.cpu(), ok, **kw))
    ok = torch.tensor([0, -100, 1, 2])
    torch.testing.assert_close(F.cross_entropy(x, ok.to("tpu"), reduction="none").cpu(),
                               F.cross_entropy(x.cpu(), ok, reduction="none"))
    with pytest.raises(RuntimeError, match="binary_cross_entropy: all elements of input"):
        F.binary_cross_entropy(_t([0.5, 1.5], "tpu"), _t([0.0, 1.0], "tpu")).item()


# ---- item 2: overlapping writes ------------------------------------------------------

def _ar(n, d):
    return torch.arange(float(n), device=d)


OVERLAP = {
    "shift_add_": lambda d: (lambda x: (x[1:].add_(x[:-1]), x)[1])(_ar(8, d)),
    "t_mul_": lambda d: (lambda x: (x.t().mul_(x), x)[1])(_ar(9, d).view(3, 3)),
    "expand_add_": lambda d: (lambda x: (x.expand(3, 4).add_(1), x)[1])(_ar(4, d)),
    "expand_relu_": lambda d: (lambda x: (x.expand(3, 4).relu_(), x)[1])(_ar(4, d)),
    "add_out": lambda d: (lambda a: (torch.add(a[:-1], a[1:], out=a[1:]), a)[1])(_ar(8, d)),
    "neg_out": lambda d: (lambda a: (torch.neg(a[:-1], out=a[1:]), a)[1])(_ar(8, d)),
    "cat_out": lambda d: (lambda a: (torch.cat([a[:2], a[2:4]], out=a[1:5]), a)[1])(_ar(8, d)),
    "copy_shift": lambda d: (lambda x: (x[1:].copy_(x[:-1]), x)[1])(_ar(8, d)),
    "copy_expand": lambda d: (lambda x: (x.expand(3, 4).copy_(torch.ones(3, 4, device=d)), x)[1])(_ar(4, d)),
    "clamp_tensor_": lambda d: (lambda a: (a[1:5].clamp_(a[:4]), a)[1])(_ar(6, d)),
    "gather_out": lambda d: (lambda a: (torch.gather(a[:4], 0, torch.tensor([0, 1], device=d), out=a[1:3]), a)[1])(_ar(6, d)),
    "scatter_": lambda d: (lambda a: (a[1:5].scatter_(0, torch.tensor([0, 1], device=d), a[:2]), a)[1])(_ar(6, d)),
    "foreach_add_": lambda d: (lambda a: (torch._foreach_add_([a[1:], a[:2]], [a[:-1], a[4:6]]), a)[1])(_ar(8, d)),
    "expand_uniform_": lambda d: _ar(4, d).expand(3, 4).uniform_(),
    "expand_index_add_": lambda d: _ar(4, d).expand(3, 4).index_add_(1, torch.tensor([0], device=d), torch.ones(3, 1, device=d)),
    # These refuse the same view too (found by test_fuzz_programs.py).
    "index_add_self": lambda d: (lambda t: t.index_add_(0, torch.tensor([0], device=d), t))(_ar(3, d).view(1, 3)),
    "index_copy_self": lambda d: (lambda t: t.index_copy_(0, torch.tensor([0], device=d), t))(_ar(3, d).view(1, 3)),
    "scatter_add_self": lambda d: (lambda t: t.scatter_add_(0, torch.zeros(1, 3, dtype=torch.long, device=d), t))(
        _ar(3, d).view(1, 3)),
    "put_self": lambda d: (lambda t: t.put_(torch.tensor([0, 1, 2], device=d), t))(_ar(3, d)),
    "index_put_self": lambda d: (lambda t: t.index_put_((torch.tensor([0, 1, 2], device=d),), t))(_ar(3, d)),
    "setitem_row": lambda d: (lambda t: t.__setitem__(torch.tensor([0], device=d), t[1]))(_ar(6, d).view(3, 2)),
    "index_put_indices": lambda d: (lambda t: t.index_put_((t[:1],), torch.tensor(5, device=d)))(
        torch.zeros(3, dtype=torch.long, device=d)),
    "gather_out_self": lambda d: (lambda t: torch.gather(t, 0, torch.zeros(1, 3, dtype=torch.long, device=d), out=t))(
        _ar(3, d).view(1, 3)),
    "index_select_out_self": lambda d: (lambda t: torch.index_select(t, 0, torch.tensor([0], device=d), out=t))(
        _ar(3, d).view(1, 3)),
    "take_out_self": lambda d: (lambda t: torch.take(t, torch.tensor([0, 1, 2], device=d), out=t))(_ar(3, d)),
}

ALLOWED = {  # CPU accepts these: same result
    "full_add_": lambda d: (lambda x: (x.add_(x), x)[1])(_ar(8, d)),
    "full_mul_out": lambda d: (lambda x: (torch.mul(x, x, out=x), x)[1])(_ar(8, d)),
    "expand_fill_": lambda d: (lambda x: (x.expand(3, 4).fill_(2), x)[1])(_ar(4, d)),
    "expand_zero_": lambda d: (lambda x: (x.expand(3, 4).zero_(), x)[1])(_ar(4, d)),
    "expand_masked_fill_": lambda d: (lambda x: (x.expand(3, 4).masked_fill_(
        torch.tensor([True, False, True, False], device=d), 5.), x)[1])(_ar(4, d)),
    "expand_index_put_": lambda d: (lambda x: (x.expand(3, 4).index_put_((torch.tensor([0], device=d),),
                                                                         torch.tensor(7.0, device=d)), x)[1])(_ar(4, d)),
    "expand_masked_fill_one": lambda d: (lambda x: (x.expand(3, 4).masked_fill_(
        torch.eye(3, 4, dtype=torch.bool, device=d)[1:2].expand(3, 4) & (torch.arange(3, device=d) == 1)[:, None], 5.),
        x)[1])(_ar(4, d)),
    "foreach_cross_pairs": lambda d: (lambda a, b: (torch._foreach_add_([b[:4], a[2:6]], [a[:4], b[4:]]), a, b)[1:])(
        _ar(8, d), _ar(8, d)),
    "disjoint_add_": lambda d: (lambda x: (x[4:].add_(x[:4]), x)[1])(_ar(8, d)),
}


@pytest.mark.parametrize("name", sorted(OVERLAP))
def test_overlapping_write_raises_like_cpu(name):
    assert _same_as_cpu(OVERLAP[name], "unsupported operation") is RuntimeError
    x = torch.arange(4.0, device="tpu")  # the process stays usable
    assert (x + 1).cpu().tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_allowed_overlap_matches_cpu(name):
    assert _same_as_cpu(ALLOWED[name]) is None


def test_aliased_out_of_a_contraction_computes_the_product():
    # CPU accepts mm(a, a, out=a) and returns zeros (it clears `out` before reading its
    # inputs) and sums into an expanded out= twice: artifacts of its aliasing, not
    # semantics. tpu computes the product and the sum from the inputs' values.
    a = torch.arange(4.0, device="tpu").view(2, 2)
    torch.mm(a, a, out=a)
    assert a.cpu().tolist() == [[2.0, 3.0], [6.0, 11.0]]
    s = torch.zeros(1, device="tpu").expand(2)
    torch.sum(torch.ones(2, 2, device="tpu"), 0, out=s)
    assert s.cpu().tolist() == [2.0, 2.0]


# ---- item 3: memory formats and layouts --------------------------------------------

def _cl(d):
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last).to(d)


def _tr(d):
    g = torch.Generator().manual_seed(1)
    return torch.randn(3, 4, generator=g).t().to(d)


def _w(d):
    g = torch.Generator().manual_seed(2)
    return torch.randn(6, 3, 3, 3, generator=g).to(memory_format=torch.channels_last).to(d)


def _conv_grads(d):
    x, w = _cl(d).requires_grad_(), _w(d).requires_grad_()
    F.conv2d(x, w, padding=1).sum().backward()
    return x.grad, w.grad


LAYOUTS = {
    "to_device": lambda d: _cl("cpu").to(d),
    "to_device_transposed": lambda d: _tr("cpu").to(d),
    "to_dtype": lambda d: _cl(d).to(torch.float16),
    "to_cpu": lambda d: _cl(d).cpu(),
    "clone": lambda d: _cl(d).clone(),
    "clone_transposed": lambda d: _tr(d).clone(),
    "clone_channels_last": lambda d: _cl(d).contiguous().clone(memory_format=torch.channels_last),
    "relu": lambda d: _cl(d).relu(),
    "sigmoid": lambda d: _cl(d).sigmoid(),
    "gelu": lambda d: F.gelu(_cl(d)),
    "add": lambda d: _cl(d) + _cl(d),
    "add_scalar": lambda d: _cl(d) + 1,
    "mul_broadcast": lambda d: _cl(d) * torch.arange(5.0, device=d),
    "where": lambda d: torch.where(_cl(d) > 0, _cl(d), 0.0),
    "clamp": lambda d: _cl(d).clamp(0),
    "transposed_add": lambda d: _tr(d) + 1,
    "transposed_mul": lambda d: _tr(d) * _tr(d),
    "conv2d": lambda d: F.conv2d(_cl(d), _w(d), padding=1),
    "conv2d_input_cl_only": lambda d: F.conv2d(_cl(d), _w(d).contiguous(), padding=1),
    "conv2d_grad_input": lambda d: _conv_grads(d)[0],
    "conv2d_grad_weight": lambda d: _conv_grads(d)[1],
    "batch_norm": lambda d: F.batch_norm(_cl(d), torch.zeros(3, device=d), torch.ones(3, device=d), training=True),
    "max_pool2d": lambda d: F.max_pool2d(_cl(d), 2),
    "avg_pool2d": lambda d: F.avg_pool2d(_cl(d), 2),
    "adaptive_avg_pool2d": lambda d: F.adaptive_avg_pool2d(_cl(d), 1),
    "interpolate": lambda d: F.interpolate(_cl(d), scale_factor=2),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layout_matches_cpu(name):
    cpu, tpu = LAYOUTS[name]("cpu"), LAYOUTS[name]("tpu")
    assert tpu.stride() == cpu.stride(), f"{name}: tpu {tpu.stride()} cpu {cpu.stride()}"
    torch.testing.assert_close(tpu.cpu(), cpu, atol=1e-4, rtol=1e-4)


def test_empty_like_and_to_copy_keep_the_layout():
    x = _cl("tpu")
    assert torch.empty_like(x).stride() == x.stride()
    assert torch.empty_like(x, memory_format=torch.contiguous_format).is_contiguous()
    y = x[:, :, ::2]  # not dense: the suggested format, as CPU
    assert y.to(torch.float64).stride() == y.cpu().to(torch.float64).stride()
    assert x.to(torch.float64).is_contiguous(memory_format=torch.channels_last)
    # asked-for contiguity, and ops CPU returns contiguous from channels_last inputs
    for f in (lambda t: t.contiguous(), lambda t: t.clone(memory_format=torch.contiguous_format),
              lambda t: t.softmax(1), lambda t: t.sum(1, keepdim=True), lambda t: F.layer_norm(t, (5,))):
        assert f(x).stride() == f(x.cpu()).stride()


def test_signed_zeros_and_out_of_range_casts():
    a, b = torch.tensor([-0.0, 0.0]), torch.tensor([0.0, -0.0])
    for f in (torch.maximum, torch.minimum, torch.fmax, torch.fmin):  # the first operand on ties, as CPU
        assert f(a.to("tpu"), b.to("tpu")).cpu().tolist() == f(a, b).tolist()
        assert torch.equal(torch.signbit(f(a.to("tpu"), b.to("tpu")).cpu()), torch.signbit(f(a, b)))
    # A max/min reduction over +-0 returns the first of the equal zeros; CPU's vectorized
    # kernel's choice depends on its lane order (unspecified, IEEE allows either).
    assert torch.signbit(a.to("tpu").max().cpu()).item() is True
    assert torch.signbit(b.to("tpu").max().cpu()).item() is False
    # Float -> int8/int32 of values outside the target's range: CPU's result is C++
    # undefined behaviour (x86 truncates through int32: 300 -> 44, 1e10 -> 0); tpu keeps
    # XLA's saturating conversion, as CUDA's converting instructions do. NaN -> 0.
    v = torch.tensor([300.0, -300.0, 127.9, -128.9, 1e10, float("nan"), float("inf")])
    assert v.to("tpu").to(torch.int8).cpu().tolist() == [127, -128, 127, -128, 127, 0, 127]
    assert v.to("tpu").to(torch.int32).cpu().tolist()[4:] == [2**31 - 1, 0, 2**31 - 1]
    ok = torch.tensor([100.7, -100.7, 0.5])  # in range: truncation toward zero, as CPU
    assert v.new_tensor(ok).to("tpu").to(torch.int8).cpu().tolist() == ok.to(torch.int8).tolist()


# ---- index tensors on the CPU: accepted by advanced indexing, as CUDA does --------

def _cpu_index_cases():
    i = torch.tensor([3, 0, 2, 3])
    m = torch.tensor([True, False, True, False])
    return {
        "getitem": lambda x: x[i],
        "getitem_2d": lambda x: x.view(2, 6)[torch.tensor([1, 0]), torch.tensor([5, 2])],
        "bool_mask": lambda x: x.view(4, 3)[m],
        "index_put": lambda x: x.index_put((i,), torch.full((4,), 7.0, device=x.device),
                                           accumulate=True),
        "setitem": lambda x: x.view(4, 3).index_put_((m,), torch.tensor(-1.0, device=x.device)),
    }


@pytest.mark.parametrize("name", list(_cpu_index_cases()))
def test_cpu_index_tensors_index_tpu_tensors(name):
    fn = _cpu_index_cases()[name]
    x = torch.arange(12.0)
    want = fn(x.clone())
    got = fn(x.to("tpu"))
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), want)


def test_cpu_index_tensor_gradient_reaches_the_tpu_leaf():
    i = torch.tensor([3, 0, 3])
    leaf = torch.arange(6.0, device="tpu").requires_grad_()
    leaf[i].pow(2).sum().backward()
    torch.testing.assert_close(leaf.grad.cpu(), torch.tensor([0.0, 0, 0, 12, 0, 0]))


def test_other_ops_still_refuse_cpu_index_tensors():
    x = torch.arange(6.0, device="tpu")
    with pytest.raises(RuntimeError, match="index_select: expected all tensors on the same device"):
        torch.index_select(x, 0, torch.tensor([1, 2]))
    assert x.sum().item() == 15.0  # still usable


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_hypot_of_nan_is_nan_unless_the_other_is_infinite(dtype):
    # Its scaling takes max and min of |a| and |b|; a dropped NaN gave hypot(1, NaN) = sqrt 2.
    n, i = float("nan"), float("inf")
    a = torch.tensor([n, 1.0, n, i, -i, n, 0.0, 3.0, -0.0, 1e-30], dtype=dtype)
    b = torch.tensor([1.0, n, n, n, n, i, n, 4.0, 0.0, 1e-30], dtype=dtype)
    for x, y in ((a, b), (a.repeat(600), b.repeat(600))):
        torch.testing.assert_close(torch.hypot(x.to("tpu"), y.to("tpu")).cpu(), torch.hypot(x, y), equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8], ids=str)
def test_integer_pow_wraps_as_cpu_and_takes_negative_exponents_of_minus_one(dtype):
    # XLA's integer power squares only a few times (1113 ** 1113 came out wrong) and gives
    # 0 for (-1) ** -n; CPU squares over every exponent bit, wrapping, and gives +-1 there.
    signed = dtype != torch.uint8
    top = {torch.int8: 127, torch.uint8: 255}.get(dtype, 20000)
    g = torch.Generator().manual_seed(0)
    b = torch.randint(-30 if signed else 0, 30, (3000,), generator=g).to(dtype)
    e = torch.randint(-5 if signed else 0, top, (3000,), generator=g).to(dtype)
    if signed:
        b[:6] = torch.tensor([-1, -1, 1, 0, -1, 2], dtype=dtype)
        e[:6] = torch.tensor([-1, -2, -3, -4, -127, -1], dtype=dtype)
    if dtype in (torch.int32, torch.int64):
        b[6:10] = torch.tensor([-1113, 1113, -1113, 1113], dtype=dtype)
        e[6:10] = torch.tensor([1113, 1113, 10701, 10701], dtype=dtype)
    bt, et = b.to("tpu"), e.to("tpu")
    assert torch.equal((bt ** et).cpu(), b ** e)
    assert torch.equal((3 ** et).cpu(), 3 ** e)  # pow.Scalar
    assert torch.equal((bt ** 100).cpu(), b ** 100)  # pow.Tensor_Scalar


ARGUMENT_ERRORS = {
    "complex_of_two_dtypes": (lambda d: torch.complex(torch.ones(2, device=d),
                                                      torch.ones(2, dtype=torch.float64, device=d)),
                              "f64"),
    "conv3d_negative_padding": (lambda d: F.conv3d(torch.ones(1, 1, 4, 4, 4, device=d),
                                                   torch.ones(1, 1, 2, 2, 2, device=d), padding=-1),
                                "negative padding"),
    "conv_transpose2d_negative_padding": (lambda d: F.conv_transpose2d(torch.ones(1, 1, 4, 4, device=d),
                                                                       torch.ones(1, 1, 2, 2, device=d),
                                                                       padding=-1), "negative padding"),
    "as_strided_scatter_outside": (lambda d: torch.as_strided_scatter(
        torch.ones(16, device=d), torch.ones(2, 2, device=d), (2, 2), (200, 200)), "reaches element 400"),
    "as_strided_scatter_offset_outside": (lambda d: torch.as_strided_scatter(
        torch.ones(16, device=d), torch.ones(2, 2, device=d), (2, 2), (4, 1), 11), "offset 11"),
    "complex_into_an_out_of_another_precision": (lambda d: torch.complex(
        torch.ones(2, dtype=torch.float64, device=d), torch.ones(2, dtype=torch.float64, device=d),
        out=torch.empty(2, dtype=torch.complex64, device=d)), "complex"),
    "aminmax_into_an_out_of_another_dtype": (lambda d: torch.aminmax(
        torch.ones(2, device=d), out=(torch.empty(0, dtype=torch.float64, device=d), torch.empty(0, device=d))),
        "aminmax"),
    "aminmax_into_outs_of_its_dtype": (lambda d: torch.aminmax(
        torch.tensor([1.0, 3.0], device=d), out=(torch.empty(0, device=d), torch.empty(0, device=d))), None),
    "as_strided_scatter_last_element": (lambda d: torch.as_strided_scatter(
        torch.ones(16, device=d), 2 * torch.ones(2, 2, device=d), (2, 2), (4, 1), 10), None),
}


@pytest.mark.parametrize("case", sorted(ARGUMENT_ERRORS))
def test_invalid_arguments_raise_as_cpu_and_leave_the_inputs_usable(case):
    # These computed something on tpu (a promoted complex, a cropping convolution, a write
    # outside self) where CPU raises.
    fn, match = ARGUMENT_ERRORS[case]
    _same_as_cpu(fn, match)
    x = torch.arange(4.0, device="tpu")
    assert (x + 1).cpu().tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("dim", [0, 1, -1, 5, -7])
def test_cat_skips_legacy_empty_inputs_as_cpu_does(dim):
    # CPU skips 1-D empty inputs; with every input skipped it checks no dim (found by fuzzing)
    e = lambda d, dt=torch.float32: torch.zeros(0, dtype=dt, device=d)  # noqa: E731
    m = lambda d: torch.arange(6.0, device=d).reshape(2, 3)  # noqa: E731
    _same_as_cpu(lambda d: torch.cat([e(d), e(d)], dim))
    _same_as_cpu(lambda d: torch.cat([e(d, torch.int64), e(d)], dim))  # promoted dtype
    _same_as_cpu(lambda d: torch.cat([e(d), m(d), e(d)], dim))  # dim checked on m alone


@pytest.mark.parametrize("src_device", ["tpu", "cpu"])
@pytest.mark.parametrize("dst_shape,src_shape", [((4, 6), (3, 2, 2)), ((6,), (1, 6)), ((2, 3), (3, 2)),
                                                 ((0, 3), (2, 3)), ((4, 6), (4, 1))])
def test_copy_checks_that_the_source_broadcasts_at_once(dst_shape, src_shape, src_device):
    # A copy_ of the wrong shape was queued and failed only at the next read, taking the
    # destination's values with it (found by tests/test_fuzz_programs.py).
    def fn(d):
        dst = torch.arange(float(torch.Size(dst_shape).numel()), device=d).reshape(dst_shape)
        try:
            dst.copy_(torch.ones(src_shape, device=src_device if d == "tpu" else "cpu"))
        except RuntimeError as e:
            return str(e), dst * 1  # the destination stays as it was, and usable
        return "ok", dst * 1
    want_msg, want = fn("cpu")
    got_msg, got = fn("tpu")
    assert got_msg == want_msg
    torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("self_shape,src_shape", [((4, 6), (1,)), ((4, 6), (1, 4)), ((3, 2, 2), (1, 4)),
                                                  ((4,), ()), ((), (1,)), ((4, 6), (1, 1, 6)),
                                                  ((4, 6), (1, 6)), ((), ())])
def test_index_add_checks_the_source_slices_as_cpu(self_shape, src_shape):
    # CPU checks them in its kernel, not in the meta function: a mismatched source was
    # read with self's slice shape, or failed to compile (found by test_fuzz_programs.py)
    _same_as_cpu(lambda d: torch.zeros(self_shape, device=d).index_add_(
        0, torch.tensor([0], device=d), torch.ones(src_shape, device=d)))


@pytest.mark.parametrize("name", ["mul_scalar", "mul_tensor", "mul_zero_dim", "mul_bool", "addcmul_", "addcdiv_",
                                  "mul_float_ok", "addcmul_bf16_ok"])
def test_in_place_ops_refuse_a_result_dtype_self_cannot_hold(name):
    # PyTorch's meta kernels of mul_, addcmul_ and addcdiv_ do not check this, CPU does:
    # int.mul_(2.5) was silently truncated on tpu (found by test_fuzz_programs.py)
    cases = {
        "mul_scalar": lambda d: torch.tensor([1, 2, 3], dtype=torch.int32, device=d).mul_(2.5),
        "mul_tensor": lambda d: torch.tensor([1, 2, 3], device=d).mul_(torch.full((3,), 2.5, device=d)),
        "mul_zero_dim": lambda d: torch.tensor([1, 2, 3], device=d).mul_(torch.tensor(2.5, device=d)),
        "mul_bool": lambda d: torch.tensor([True, False], device=d).mul_(2),
        "addcmul_": lambda d: torch.tensor([1, 2], device=d).addcmul_(torch.ones(2, device=d),
                                                                      torch.ones(2, device=d), value=0.5),
        "addcdiv_": lambda d: torch.tensor([1, 2], device=d).addcdiv_(torch.ones(2, device=d), torch.ones(2, device=d)),
        "mul_float_ok": lambda d: torch.tensor([1.0, 2.0], device=d).mul_(torch.tensor(2, device=d)),
        "addcmul_bf16_ok": lambda d: torch.ones(2, dtype=torch.bfloat16, device=d).addcmul_(
            torch.ones(2, device=d), torch.full((2,), 3.0, device=d)),
    }
    err = _same_as_cpu(cases[name], match="can't be cast to the desired output type")
    assert (err is None) == name.endswith("_ok")


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float64), (torch.float16, torch.float32),
                                    (torch.int64, torch.float32), (torch.float32, torch.float8_e4m3fn)])
def test_ops_that_take_one_dtype_refuse_a_mix_as_cpu(dtypes):
    """CPU's and CUDA's kernels refuse these mixes (tpu cast the second operand); the losses
    that promote give CPU's dtype (huber_loss the input's, mse_loss the promoted one)."""
    a, b = dtypes
    i = lambda d: torch.tensor([0, 1], device=d)  # noqa: E731
    x = lambda d, t=a: torch.full((4,), 0.5, device=d).to(t)  # noqa: E731
    y = lambda d, t=b: torch.full((4,), 0.25, device=d).to(t)  # noqa: E731
    errs = {"index_add": lambda d: x(d).index_add(0, i(d), y(d)[:2]),
            "index_copy": lambda d: x(d).index_copy(0, i(d), y(d)[:2]),
            "put": lambda d: x(d).put(i(d), y(d)[:2])}
    if a in (torch.float32, torch.float64) and b != torch.float8_e4m3fn:  # CPU has no f16 cdist
        errs |= {"bce": lambda d: F.binary_cross_entropy(x(d), y(d)),
                 "cdist": lambda d: torch.cdist(x(d).view(1, 2, 2), y(d).view(1, 2, 2))}
    for name, fn in errs.items():
        assert _same_as_cpu(fn) is RuntimeError, name
    for fn in [lambda d: F.huber_loss(x(d), y(d)), lambda d: F.mse_loss(x(d), y(d)),
               lambda d: F.smooth_l1_loss(x(d), y(d), reduction="none")]:
        if torch.float8_e4m3fn in dtypes:
            assert _same_as_cpu(fn, match="Promotion for Float8") is RuntimeError
            continue
        cpu_err, cpu_val = _outcome(fn, "cpu")
        tpu_err, tpu_val = _outcome(fn, "tpu")
        assert tpu_err is cpu_err, (cpu_val, tpu_val)
        if cpu_err is None:
            assert tpu_val.dtype == cpu_val.dtype
            torch.testing.assert_close(tpu_val, cpu_val)
        else:
            assert tpu_val == cpu_val


def test_a_resized_out_takes_the_inputs_layout_as_cpu():
    # TensorIterator restrides a resized out to its inputs' order: a view of the out's
    # storage reads the values in that order (found by test_fuzz_programs.py)
    def fn(d):
        out = torch.arange(24.0, device=d).reshape(4, 6)
        seen = out.t()  # the storage's first 12 values, as the program leaves them
        src = torch.arange(12.0, device=d).reshape(3, 2, 2).transpose(0, 2)
        with pytest.warns(UserWarning):
            torch.add(src, 1.0, out=out)
        return out, seen, torch.tensor(out.stride())
    _same_as_cpu(fn)


def test_index_put_takes_values_of_self_dtype_only_as_cpu():
    # CPU's and CUDA's kernels write values without a cast (found by test_fuzz_programs.py)
    idx = lambda d: torch.tensor([0, 1], device=d)  # noqa: E731

    def put(value_dtype, accumulate=False):
        return lambda d: torch.zeros(4, device=d).index_put_(
            (idx(d),), torch.tensor(2, dtype=value_dtype, device=d), accumulate=accumulate)
    for dt in (torch.int64, torch.float64, torch.bool):
        for acc in (False, True):
            assert _same_as_cpu(put(dt, acc), match="Index put requires the source and destination dtypes match") \
                is RuntimeError
    assert _same_as_cpu(put(torch.float32)) is None
    # One value on the CPU through one boolean mask: CPU and CUDA fill with masked_fill_ (a cast)
    _same_as_cpu(lambda d: (lambda x: (x.__setitem__(x >= 0, torch.tensor(2)), x)[1])(torch.zeros(4, device=d)))
    # ... but not a value on the device (CUDA's kernel then checks the dtype, as here)
    x = torch.zeros(4, device="tpu")
    with pytest.raises(RuntimeError, match="got Float for the destination and Long for the source"):
        x[x >= 0] = torch.tensor(2, device="tpu")
    assert x.cpu().tolist() == [0.0] * 4


def test_copy_between_two_views_of_the_same_elements_does_nothing_as_cpu():
    # CPU's copy_ returns before its overlap checks (found by test_fuzz_programs.py)
    def fn(d):
        x = torch.arange(4.0, device=d)
        x.expand(3, 4).copy_(x.expand(3, 4))
        return x
    assert _same_as_cpu(fn) is None


def test_resize_to_the_same_sizes_keeps_the_view_as_cpu():
    # CPU's resize_ returns at once when the sizes do not change: a strided view stays one
    # and a fill through it writes its own elements (found by test_fuzz_programs.py)
    def fn(d):
        x = torch.zeros(3, 2, 2, device=d)
        v = x.diagonal(offset=-1, dim1=-2, dim2=-1)
        v.resize_((3, 1)).fill_(2.0)
        w = x[:, 0, :].t()
        w.resize_(w.shape, memory_format=torch.contiguous_format)  # a memory format restrides
        return x, torch.tensor(v.stride()), torch.tensor(w.stride())
    assert _same_as_cpu(fn) is None


def test_scalar_values_are_checked_at_every_call_as_cpu():
    # CPU checks these Scalars at each call; the plan of the same signature made for an
    # accepted value must not skip them (found by test_fuzz_semantics.py)
    x = torch.arange(4.0, device="tpu")
    cases = [  # (accepted, refused, message)
        (lambda d, v: torch.arange(3, device=d) ** v, (2, -2), "Integers to negative integer powers"),
        (lambda d, v: torch.arange(0, device=d) ** v, (2, -2), "Integers to negative integer powers"),
        (lambda d, v: torch.arange(3, device=d).pow_(v), (2, -2), "Integers to negative integer powers"),
        (lambda d, v: F.softshrink(torch.arange(4.0, device=d), v), (0.5, -0.5), "lambda must be in range [0, 3.40282e+38]"),
        (lambda d, v: F.softshrink(torch.arange(4.0, device=d).bfloat16(), v), (0.5, 1e39), "for input dtype BFloat16"),
        (lambda d, v: F.celu(torch.arange(4.0, device=d) - 2, v), (1.0, 0.0), "alpha cannot be 0 for CELU"),
    ]
    for fn, (ok, bad), message in cases:
        assert _same_as_cpu(lambda d: fn(d, ok)) is None
        before = torch_tpu.metrics()["signature_hits"]
        with pytest.raises(RuntimeError, match=message.replace("[", r"\[").replace("+", r"\+")):
            fn("tpu", bad)  # at the call, not at a later read
        assert _same_as_cpu(lambda d: fn(d, bad), match=message) is RuntimeError
        assert torch_tpu.metrics()["signature_hits"] >= before
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_bucketize_and_searchsorted_edges_as_cpu():
    # bucketize ran PyTorch's reference, which returns the input's dtype for empty
    # boundaries (found by test_fuzz_semantics.py); it now lowers as searchsorted does
    from conftest import no_fallbacks
    with no_fallbacks():
        for dt in (torch.int32, torch.float32, torch.bfloat16):
            for bd in ([], [1, 2, 2, 3], [float("nan"), 1.0] if dt.is_floating_point else [0, 5]):
                for right in (False, True):
                    for out_int32 in (False, True):
                        assert _same_as_cpu(lambda d: torch.bucketize(
                            torch.tensor([[1, 3], [2, 0]], dtype=dt, device=d), torch.tensor(bd, dtype=dt, device=d),
                            right=right, out_int32=out_int32)) is None
                assert _same_as_cpu(lambda d: torch.bucketize(2, torch.tensor(bd, dtype=dt, device=d))) is None
    assert _same_as_cpu(lambda d: torch.bucketize(torch.ones(2, device=d), torch.ones(2, 2, device=d)),
                        match="boundaries tensor must be 1 dimension") is RuntimeError


def test_cummax_dim_of_scalars_and_empty_tensors_as_cpu():
    # A 0-dim tensor takes dim -1 or 0 only; an empty one any dim (CPU checks none then)
    for f in ("cummax", "cummin"):
        assert _same_as_cpu(lambda d: getattr(torch.tensor(1.0, device=d), f)(1)[0],
                            match="Expected reduction dim -1 or 0 for scalar but got 1") is IndexError
        assert _same_as_cpu(lambda d: getattr(torch.tensor(1.0, device=d), f)(-1)) is None
        assert _same_as_cpu(lambda d: getattr(torch.empty(0, device=d), f)(3)) is None


def test_norm_orders_without_identity_refuse_empty_dims_at_every_call_as_cpu():
    # Negative and infinite orders cannot reduce an empty dim; the order is a Scalar, so
    # a plan made for order 2 must not let -1 through (found by test_fuzz_semantics.py)
    x = lambda d: torch.empty(0, 3, device=d)  # noqa: E731
    for fn in (lambda d, p: x(d).norm(p, dim=0), lambda d, p: torch.linalg.vector_norm(x(d), p, dim=0),
               lambda d, p: torch.ops.aten.norm.ScalarOpt_dim(x(d), p, [0])):
        for p in (2.0, -1.0, float("inf"), 1.0, -2.5):
            err = _same_as_cpu(lambda d: fn(d, p), match="norm on the dimension 0because this dimension is empty")
            assert (err is RuntimeError) == (p < 0 or p == float("inf"))
    assert _same_as_cpu(lambda d: torch.linalg.vector_norm(x(d), -1.0), match="norm on an empty tensor") is RuntimeError
    assert _same_as_cpu(lambda d: torch.linalg.vector_norm(x(d), -1.0, dim=1)) is None


def test_index_writes_into_an_empty_dim_refuse_any_index_as_cpu():
    # No index fits a dim of size 0: the call fails whatever the values (the empty result's
    # device check used to be skipped, so these returned quietly)
    i = lambda d: torch.tensor([0], device=d)  # noqa: E731
    cases = {
        "index_put_": lambda d: torch.empty(0, dtype=torch.long, device=d).index_put_(
            (torch.tensor(0, device=d),), torch.tensor(1, device=d), accumulate=True),
        "scatter_": lambda d: torch.empty(0, device=d).scatter_(0, i(d), torch.ones(1, device=d)),
        "scatter_add": lambda d: torch.empty(0, 2, device=d).scatter_add(0, i(d).view(1, 1), torch.ones(1, 1, device=d)),
        "index_add_": lambda d: torch.empty(0, device=d).index_add_(0, i(d), torch.ones(1, device=d)),
        "index_fill_": lambda d: torch.empty(2, 0, device=d).index_fill_(1, i(d), 1.0),
        "index_copy_": lambda d: torch.empty(2, 0, device=d).index_copy_(1, i(d), torch.ones(2, 1, device=d)),
        "gather": lambda d: torch.empty(0, device=d).gather(0, i(d)),
        "index": lambda d: torch.empty(0, device=d)[i(d)],
        "index_select": lambda d: torch.empty(0, device=d).index_select(0, i(d)),
        "embedding": lambda d: F.embedding(i(d), torch.empty(0, 3, device=d)),
        "take": lambda d: torch.empty(0, device=d).take(i(d)),
    }
    for name, fn in cases.items():
        assert _same_as_cpu(fn) in (IndexError, RuntimeError), name
    # Empty indices into an empty dim are fine
    assert _same_as_cpu(lambda d: torch.empty(0, device=d).index_add_(0, i(d)[:0], torch.ones(0, device=d))) is None


def test_index_reduce_counts_indices_against_source_slices_as_cpu():
    def fn(d):
        return torch.zeros(1, 0, dtype=torch.long, device=d).index_reduce(
            0, torch.empty(0, dtype=torch.long, device=d), torch.zeros(1, 0, dtype=torch.long, device=d), "amin")
    assert _same_as_cpu(fn, match="Number of indices (0) should be equal to source.size(dim): (1)") is RuntimeError


def test_softmax_checks_its_dim_before_its_dtype_as_cpu():
    for f in ("softmax", "log_softmax"):
        assert _same_as_cpu(lambda d: getattr(torch.tensor(1, device=d), f)(1)) is IndexError
        assert _same_as_cpu(lambda d: getattr(torch.ones(2, dtype=torch.long, device=d), f)(0)) is NotImplementedError
        assert _same_as_cpu(lambda d: getattr(torch.ones(0, dtype=torch.long, device=d), f)(0)) is None


def test_norm_of_one_element_is_its_absolute_value_as_cpu():
    # CPU's norm over a single element returns |x| for every order but 0, NaN included
    # (the general (|x|^p)^(1/p) is NaN there, and 2.0000000004 for p=0.5)
    x = lambda d: torch.tensor([[2.0, -3.0, 0.0, float("nan")]], device=d)  # noqa: E731
    for p in (float("nan"), 0.5, 3.0, 0.0, -1.0, -0.5, 7.3, 2.0, float("inf")):
        assert _same_as_cpu(lambda d: (x(d).norm(p=p, dim=0), torch.linalg.vector_norm(x(d).t(), p, dim=1),
                                       torch.tensor(-2.0, device=d).norm(p))) is None
    # Nothing to reduce: zeros for every order CPU accepts
    assert _same_as_cpu(lambda d: torch.empty(0, 2, device=d).norm(float("nan"), dim=0)) is None


def test_index_values_of_an_empty_result_are_checked_as_cpu():
    # Indices into a dim that has elements, while the result has none (a zero-size other
    # dim): the program has nothing to compute, so CPU's kernel checks them (a counted fallback)
    from conftest import all_fallbacks
    for bad in (True, False):
        i = lambda d: torch.tensor([5 if bad else 1], device=d)  # noqa: E731
        cases = [
            lambda d: torch.zeros(2, 0, device=d).index_add_(0, i(d), torch.ones(1, 0, device=d)),
            lambda d: torch.zeros(2, 0, dtype=torch.long, device=d).index_reduce_(
                0, i(d), torch.ones(1, 0, dtype=torch.long, device=d), "amin"),
            lambda d: torch.zeros(2, 0, device=d).index_fill_(0, i(d), 1.0),
        ]
        for n, fn in enumerate(cases):
            before = sum(all_fallbacks().values())
            err = _same_as_cpu(fn)  # CPU's index_add_ and index_fill_ check nothing here
            assert err is (IndexError if bad and n == 1 else None)
            assert sum(all_fallbacks().values()) > before


def test_gcd_and_lcm_run_natively_as_cpu():
    # They ran on the CPU fallback before; CPU's own arithmetic (|min| stays min in gcd,
    # lcm's product wraps at 32 bits for narrow integers) is matched value for value
    from conftest import no_fallbacks
    with no_fallbacks():
        for dt in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
            info = torch.iinfo(dt)
            pool = [v for v in (-12, -3, -1, 0, 1, 2, 8, 18, 35) if info.min <= v <= info.max]
            pool += [info.max, info.max - 1] + ([info.min] if dt in (torch.int8, torch.int16) else [])
            x = torch.tensor(pool, dtype=dt)
            for f in (torch.gcd, torch.lcm):
                assert _same_as_cpu(lambda d: f(x.repeat_interleave(len(pool)).to(d), x.repeat(len(pool)).to(d))) is None
    assert _same_as_cpu(lambda d: torch.gcd(torch.ones(2, device=d), torch.ones(2, device=d))) is NotImplementedError


def test_isin_with_nan_among_the_test_elements_as_cpu():
    # The decomposition searched sorted test elements, which a NaN (sorted last) sent
    # astray: inf was reported absent (found by test_fuzz_semantics.py)
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([-0.0, -0.5, -1.0, -0.0, -inf, 0.0, -0.0, -inf, 0.0, 0.0, -inf, inf,
                      -0.0, 2.0, nan, -2.5, 0.5, -1.0, -inf, 1.5, -inf, -0.5, 3.0, 3.0])  # the fuzzer's case
    for test in (x, torch.tensor([nan, inf, 1.5]), torch.full((30,), nan), torch.cat([x, torch.arange(40.0)])):
        for invert in (False, True):
            assert _same_as_cpu(lambda d: torch.isin(x.to(d), test.to(d), invert=invert)) is None
        assert _same_as_cpu(lambda d: torch.isin(inf, test.to(d))) is None


def test_index_select_of_a_scalar_takes_one_index_as_cpu():
    # Other counts made a program XLA refused to compile (found by test_fuzz_gradients.py)
    for idx in ([0], [0, 0, 0], []):
        err = _same_as_cpu(lambda d: torch.tensor(2.0, device=d).index_select(0, torch.tensor(idx, dtype=torch.long, device=d)),
                           match="Index to scalar can have only 1 value")
        assert err is (None if len(idx) == 1 else RuntimeError)


def test_foreach_in_place_over_lists_sharing_memory_runs_in_order_as_cpu():
    # The same tensor twice (or views of one) in a written list: CPU's per-tensor path runs
    # the elements in order, each reading the earlier writes; one program read them all
    # first, and the last write won (a + 1 for [a, a] += 1)
    cases = [
        lambda d: (lambda a, b: (torch._foreach_add_([a, a, b], 1.0), a, b)[1:])(
            torch.ones(3, device=d), torch.ones(4, device=d)),
        lambda d: (lambda a: (torch._foreach_mul_([a, a[:2]], [2.0, 3.0]), a)[1:])(torch.ones(3, device=d)),
        lambda d: (lambda a: (torch._foreach_addcmul_([a, a], [a, a], [a, a], 1.0), a)[1:])(torch.arange(4.0, device=d)),
        lambda d: (lambda x, y: (torch._foreach_copy_([y, y], [x, x * 2]), y)[1:])(
            torch.arange(4.0, device=d), torch.zeros(4, device=d)),
        lambda d: (lambda x: (torch._foreach_lerp_([x, x], [x * 0 + 10, x * 0 + 20], 0.5), x)[1:])(torch.arange(4.0, device=d)),
        lambda d: (lambda a, b: (torch._foreach_add_([a, b], [b, a]), a, b)[1:])(
            torch.arange(4.0, device=d), torch.arange(4.0, device=d) + 1),
        lambda d: (lambda a: (torch._foreach_div_([a[0], a[1], a], 2.0), a)[1:])(torch.arange(6.0, device=d).view(2, 3)),
        lambda d: (lambda a: (torch._foreach_clamp_min_([a, a], [1.0, 2.0]), a)[1:])(torch.arange(4.0, device=d)),
    ]
    for mode in (torch_tpu.EagerMode.DEFER_NEVER, torch_tpu.EagerMode.DEFER_AND_FUSE):
        with torch_tpu.set_eager_mode(mode):
            for fn in cases:
                assert _same_as_cpu(fn) is None
            # A partial overlap between an element's own input and output is still refused
            assert _same_as_cpu(lambda d: (lambda x: torch._foreach_copy_([x[1:], x[:3]], [x[:3], x[1:]]))(
                torch.arange(4.0, device=d))) is RuntimeError


def test_foreach_in_place_result_types_and_exponents_as_cpu():
    # CPU's per-tensor path makes each element's checks: a result type that cannot cast to
    # the written tensor's, an integer tensor to a negative integer power
    T = lambda d, *v: torch.tensor(list(v), device=d)  # noqa: E731

    def inplace(op, lst, *rest):
        return lambda d: (lambda l: (op(l, *[r(d) if callable(r) else r for r in rest]), tuple(l))[1])(lst(d))
    refused = [
        inplace(torch._foreach_mul_, lambda d: [T(d, 1, 2)], lambda d: [T(d, 1.5, 2.5)]),
        inplace(torch._foreach_div_, lambda d: [T(d, 1, 2)], lambda d: [T(d, 2, 2)]),
        inplace(torch._foreach_add_, lambda d: [T(d, True, False)], 1),
        inplace(torch._foreach_pow_, lambda d: [T(d, 1, 2), T(d, 3, 4)], [2, -1]),
        lambda d: tuple(torch._foreach_pow([T(d, 3, 4), T(d, 1, 2)], -1)),
    ]
    for fn in refused:
        assert _same_as_cpu(fn) is RuntimeError
    accepted = [
        inplace(torch._foreach_mul_, lambda d: [T(d, 1.5, 2.0)], lambda d: [T(d, 2, 3)]),
        inplace(torch._foreach_copy_, lambda d: [T(d, 0, 0)], lambda d: [T(d, 1.7, 2.2)]),
        inplace(torch._foreach_zero_, lambda d: [T(d, 1, 2)]),
        lambda d: tuple(torch._foreach_pow([T(d, 1.0, 2.0)], -1)),
    ]
    for fn in accepted:
        assert _same_as_cpu(fn) is None


def test_nn_argument_checks_cpu_makes_in_its_kernels():
    # Checks PyTorch's meta functions skip (found by probing nn ops against CPU)
    w = torch.randn(4, 3)
    bag = lambda off: lambda d: F.embedding_bag(torch.tensor([0, 2, 0, 3], device=d), w.to(d),  # noqa: E731
                                                torch.tensor(off, device=d), mode="sum")
    assert _same_as_cpu(bag([1, 2]), match="offsets[0] has to be 0") is RuntimeError
    assert _same_as_cpu(bag([0, 2, 9]), match="offsets[-1] can not be greater than input's length 4") is RuntimeError
    assert _same_as_cpu(bag([0, 4])) is None and _same_as_cpu(bag([0, 2, 2])) is None
    x1, x2 = torch.randn(4, 5).log_softmax(1), torch.randn(2, 5, 3)
    for dt, ok1d, ok2d in ((torch.int32, False, False), (torch.uint8, True, False), (torch.int64, True, True)):
        err = _same_as_cpu(lambda d: F.nll_loss(x1.to(d), torch.tensor([0, 1, 2, 3], dtype=dt, device=d)))
        assert err is (None if ok1d else RuntimeError)
        err = _same_as_cpu(lambda d: F.cross_entropy(x2.to(d), torch.tensor([[0, 1, 2], [1, 2, 3]], dtype=dt, device=d)))
        assert err is (None if ok2d else RuntimeError)
    xi, wi = torch.randn(1, 2, 3, 3), torch.randn(2, 3, 3, 3)
    ct = lambda stride, dilation, op: lambda d: F.conv_transpose2d(  # noqa: E731
        xi.to(d), wi.to(d), stride=stride, dilation=dilation, output_padding=op)
    assert _same_as_cpu(ct((2, 1), 1, (1, 1)), match="output padding must be smaller than either stride or dilation") \
        is RuntimeError
    assert _same_as_cpu(ct((2, 2), 1, (1, 1))) is None and _same_as_cpu(ct(1, 3, 2)) is None


def test_matrix_products_refuse_mixed_dtypes_and_ignore_a_zero_alpha_as_cpu():
    # Checks CPU's kernels make (the meta functions do not), and BLAS's alpha == 0, which
    # leaves the product out (NaN in it included), as beta == 0 leaves self out (CPU's
    # baddbmm skips it only where its sizes take BLAS: not compared)
    f, dd, v = torch.randn(2, 2), torch.randn(2, 2).double(), torch.randn(2)
    calls = [lambda d: torch.mm(f.to(d), dd.to(d)), lambda d: torch.bmm(f[None].to(d), dd[None].to(d)),
             lambda d: torch.addmm(dd.to(d), f.to(d), f.to(d)), lambda d: torch.addmm(f.to(d), dd.to(d), f.to(d)),
             lambda d: torch.baddbmm(f[None].to(d), f[None].to(d), dd[None].to(d)),
             lambda d: torch.addbmm(f.to(d), f[None].to(d), dd[None].to(d)),
             lambda d: torch.mv(f.to(d), v.double().to(d)), lambda d: torch.addmv(v.to(d), f.to(d), v.double().to(d)),
             lambda d: torch.dot(v.to(d), v.double().to(d)), lambda d: torch.matmul(f.to(d), dd.to(d)),
             lambda d: torch.mm(f.bfloat16().to(d), f.to(d))]
    for fn in calls:
        assert _same_as_cpu(fn) is RuntimeError
    assert _same_as_cpu(lambda d: torch.addr(f.to(d), v.to(d), v.double().to(d))) is None  # addr promotes
    nan = torch.full((2, 2), float("nan"))
    for fn in (lambda d: torch.addmm(f.to(d), nan.to(d), f.to(d), alpha=0),
               lambda d: torch.addmm(nan.to(d), f.to(d), f.to(d), beta=0),
               lambda d: torch.addbmm(f.to(d), nan[None].to(d), f[None].to(d), alpha=0),
               lambda d: torch.addmv(v.to(d), nan.to(d), v.to(d), alpha=0)):
        assert _same_as_cpu(fn) is None


def test_masked_scatter_needs_a_source_element_per_mask_one_as_cpu():
    x = torch.randn(3, 4)
    assert _same_as_cpu(lambda d: x.to(d).masked_scatter(x.to(d) > -10, torch.arange(5.0, device=d)),
                        match="Number of elements of source < number of ones in mask") is RuntimeError
    assert _same_as_cpu(lambda d: x.to(d).masked_scatter(x.to(d) > 10, torch.empty(0, device=d))) is None
    assert _same_as_cpu(lambda d: x.to(d).masked_scatter(x.to(d) > 0, torch.arange(12.0, device=d))) is None


def test_pow_by_a_scalar_half_is_a_square_root_as_cpu():
    # CPU's and CUDA's kernels take sqrt for a Scalar exponent of 0.5 and 1 / sqrt for
    # -0.5: at -0 and -inf these differ from IEEE pow (found by test_fuzz_semantics.py)
    x = torch.tensor([-0.0, -0.5, 0.0, -float("inf"), float("inf"), 4.0, 2.0])
    for e in (0.5, -0.5, 2.0, 1.5):
        c, t = torch.pow(x, e), torch.pow(x.to("tpu"), e).cpu()
        assert torch.equal(c.isnan(), t.isnan()), e
        finite = ~c.isnan()
        torch.testing.assert_close(t[finite], c[finite], rtol=1e-6, atol=0)
        assert torch.equal(t[finite].signbit(), c[finite].signbit()), e


def test_a_reduction_given_a_dtype_writes_only_an_out_of_it_as_cpu():
    # CPU's kernels check these; PyTorch's meta functions do not (found by an out= probe)
    a = torch.randn(3, 4)

    def out(shape, dtype, d):
        return torch.empty(shape, dtype=dtype, device=d)
    refused = [
        lambda d: torch.mean(a.to(d), 1, out=out(3, torch.long, d)),  # its division is floating
        lambda d: torch.mean(a.to(d), 1, out=out(3, torch.bool, d)),
        lambda d: torch.mean(a.double().to(d), (0, 1), out=out((), torch.int32, d)),
        lambda d: torch.mean(a.to(d), 1, dtype=torch.double, out=out(3, torch.float, d)),
        lambda d: torch.mean(a.to(d), dtype=torch.double, out=out((), torch.float, d)),
        lambda d: torch.nansum(a.to(d), 1, dtype=torch.double, out=out(3, torch.float, d)),
    ]
    for fn in refused:
        assert _same_as_cpu(fn) is RuntimeError
    taken = [
        lambda d: torch.mean(a.to(d), 1, out=out(3, torch.double, d)),
        lambda d: torch.mean(a.bfloat16().to(d), 1, out=out(3, torch.float, d)),
        lambda d: torch.mean(a.to(d), 1, dtype=torch.double, out=out(3, torch.double, d)),
        lambda d: torch.nansum(a.to(d), 1, dtype=torch.double, out=out(3, torch.double, d)),
        lambda d: torch.sum(a.to(d), 1, out=out(3, torch.long, d)),
    ]
    for fn in taken:
        assert _same_as_cpu(fn) is None


def test_random_integers_must_fit_their_dtype_as_cpu():
    # CPU's kernels refuse ends an integral dtype cannot hold (these drew wrapped values)
    refused = {
        lambda d: torch.randint(0, 300, (3,), dtype=torch.uint8, device=d): "to - 1 is out of bounds for unsigned char",
        lambda d: torch.randint(-1, 5, (3,), dtype=torch.uint8, device=d): "from is out of bounds for unsigned char",
        lambda d: torch.randint(-129, 5, (3,), dtype=torch.int8, device=d): "from is out of bounds for signed char",
        lambda d: torch.randint(0, 3, (3,), dtype=torch.bool, device=d): "to - 1 is out of bounds for bool",
        lambda d: torch.empty(3, dtype=torch.int32, device=d).random_(-2**31 - 1, 0): "from is out of bounds for int",
        lambda d: torch.empty(3, dtype=torch.uint8, device=d).random_(300, None): "from is out of bounds",
        lambda d: torch.randperm(2050, dtype=torch.half, device=d): "n cannot be greater than 2049 for Half type.",
        lambda d: torch.randperm(257, dtype=torch.uint8, device=d): "without overflow",
        lambda d: torch.randperm(2**24 + 2, dtype=torch.float, device=d): "n cannot be greater than 2^24+1",
    }
    for fn, message in refused.items():
        assert _same_as_cpu(fn, match=message) is RuntimeError
    assert _same_as_cpu(lambda d: torch.randperm(3, dtype=torch.bool, device=d)) is NotImplementedError
    for fn in (lambda d: torch.randint(0, 256, (3,), dtype=torch.uint8, device=d),
               lambda d: torch.randint(-32768, 32768, (3,), dtype=torch.int16, device=d),
               lambda d: torch.randint(0, 2, (3,), dtype=torch.bool, device=d),
               lambda d: torch.randperm(256, dtype=torch.uint8, device=d),
               lambda d: torch.randperm(2049, dtype=torch.half, device=d)):
        for d in ("cpu", "tpu"):
            r = fn(d).cpu()
            assert r.dtype == fn("cpu").dtype and r.shape == fn("cpu").shape
    x = torch.randint(0, 256, (2000,), dtype=torch.uint8, device="tpu").cpu()
    assert x.min() == 0 and x.max() == 255  # the whole range is drawn


def test_pickle_round_trips_tpu_tensors_views_and_modules():
    # pickle saves a storage through PyTorch's legacy writer, which copies a device storage
    # to the host over a tensor made on its data pointer: that tensor's storage is not ours
    # (it failed an internal assert)
    import io
    import pickle
    a = torch.randn(3, 4)
    t = a.to("tpu")
    for obj, want in ((t, a), (t[1:, ::2], a[1:, ::2]), (t.t(), a.t())):
        got = pickle.loads(pickle.dumps(obj))
        assert got.device.type == "tpu" and got.shape == want.shape
        torch.testing.assert_close(got.cpu(), want)
        torch.testing.assert_close((got * 2).cpu(), want * 2)  # usable
    p = torch.nn.Parameter(t.clone())
    q = pickle.loads(pickle.dumps(p))
    assert isinstance(q, torch.nn.Parameter) and q.requires_grad and q.device.type == "tpu"
    m = torch.nn.Linear(4, 2).to("tpu")
    m2 = pickle.loads(pickle.dumps(m))
    torch.testing.assert_close(m2(t).cpu(), m(t).cpu())
    buf = io.BytesIO()
    torch.save(t, buf, _use_new_zipfile_serialization=False)
    buf.seek(0)
    torch.testing.assert_close(torch.load(buf).cpu(), a)
    torch.testing.assert_close(t.cpu(), a)  # the original is intact


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64], ids=str)
def test_wide_unsigned_tensors_support_what_cpu_does(dtype):
    # uint16 had no tpu dtype (any tensor of it raised); min/max of uint32/64 failed to compile
    x = torch.tensor([5, 3, 2**15 + 7, 9, 0, 65535], dtype=dtype)
    y = torch.tensor([65535, 0, 9, 2**15 + 7, 3, 5], dtype=dtype)
    calls = [lambda d: x.to(d), lambda d: x.to(d) == y.to(d), lambda d: x.to(d).sum(),
             lambda d: x.to(d).float(), lambda d: x.to(d).view(2, 3).t().contiguous(),
             lambda d: torch.cat([x.to(d), x.to(d)]), lambda d: x.to(d) * 2, lambda d: x.to(d) & y.to(d),
             lambda d: x.to(d)[torch.tensor([0, 5], device=d)], lambda d: torch.full((3,), 7, dtype=dtype, device=d),
             lambda d: torch.where(torch.tensor([True, False] * 3, device=d), x.to(d), y.to(d)),
             lambda d: x.to(d).sort().values, lambda d: x.to(d).to(torch.int64)]
    for fn in calls:
        want, got = fn("cpu"), fn("tpu").cpu()
        assert got.dtype == want.dtype and torch.equal(got, want)
    t = x.to("tpu")  # beyond CPU's kernels (which raise): values as the integers say
    assert t.min().item() == 0 and t.max().item() == 65535 and t.amin().item() == 0


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64],
                         ids=str)
def test_floating_to_uint8_takes_the_int64_low_byte(src):
    # c10 defines float -> uint8 through int64 on every platform (-1.0 -> 255, 300.0 -> 44);
    # a direct conversion saturated (0 and 255). Values beyond int64 (inf) stay platform-defined.
    v = torch.tensor([-1.0, -3.7, 255.0, 256.0, 300.0, -300.0, -129.0, 0.5, 1e4]).to(src)
    real = v.real if v.is_complex() else v
    want = (real.double().trunc().long() & 255).to(torch.uint8)  # the rule, computed exactly
    assert want[:6].tolist() == [255, 253, 255, 0, 44, 212]
    for name, fn in [("to", lambda d: v.to(d).to(torch.uint8)),
                     ("copy_", lambda d: torch.zeros(9, dtype=torch.uint8, device=d).copy_(v.to(d))),
                     ("strided copy_", lambda d: torch.zeros(18, dtype=torch.uint8, device=d)[::2].copy_(v.to(d)))]:
        got = fn("tpu").cpu()
        assert torch.equal(got, want), (name, got)
    with torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
        assert torch.equal((v.to("tpu") * 1).to(torch.uint8).cpu(), want)


@pytest.mark.parametrize("call", [lambda x: x.argmax(), lambda x: x.argmin(0), lambda x: x.view(1, 3).argmax(1, keepdim=True),
                                  lambda x: torch.argmax(x, 0, out=torch.empty(0, dtype=torch.long, device=x.device))],
                         ids=["argmax", "argmin_dim", "argmax_keepdim", "argmax_out"])
def test_argmax_argmin_of_bool_raise_like_cpu(call):
    # CPU's kernels refuse bool (so do CUDA's); tpu computed an index
    err = _same_as_cpu(lambda d: call(torch.tensor([False, True, True], device=d)), match="does not support bool input")
    assert err is RuntimeError
    x = torch.tensor([False, True, True], device="tpu")
    with pytest.raises(RuntimeError):
        call(x)
    assert x.int().argmax().item() == 1  # the tensor stays usable


_INTEGRAL_REFUSED = {  # op: the dtypes of its first tensor CPU's kernel refuses (each computed on tpu before)
    "topk": (lambda x: x.flatten().topk(2), [torch.bool]),
    "kthvalue": (lambda x: x.flatten().kthvalue(1), [torch.bool]),
    "median": (lambda x: x.median(), [torch.bool]),
    "median_dim": (lambda x: x.flatten().median(0), [torch.bool]),
    "abs": (lambda x: x.abs(), [torch.bool]),
    "floor": (lambda x: x.floor(), [torch.bool]),
    "round": (lambda x: x.round(), [torch.bool]),
    "round_decimals": (lambda x: x.round(decimals=1), [torch.bool, torch.int8, torch.int64]),
    "frac": (lambda x: x.frac(), [torch.bool, torch.uint8, torch.int32]),
    "remainder": (lambda x: x % x, [torch.bool]),
    "fmod": (lambda x: torch.fmod(x, x), [torch.bool]),
    "leaky_relu": (lambda x: F.leaky_relu(x), [torch.bool, torch.int16, torch.int64]),
    "hypot": (lambda x: torch.hypot(x, x), [torch.bool, torch.int32]),
    "logaddexp": (lambda x: torch.logaddexp(x, x), [torch.int64]),
    "bucketize": (lambda x: torch.bucketize(x.flatten(), x.flatten().sort().values), [torch.bool]),
    "trace": (lambda x: x.view(2, 2).trace(), [torch.bool]),
    "mse_loss": (lambda x: F.mse_loss(x, x), [torch.bool, torch.int32]),
    "avg_pool": (lambda x: F.avg_pool1d(x, 2), [torch.bool, torch.int32]),
    "nearest": (lambda x: F.interpolate(x, scale_factor=2), [torch.bool, torch.int64]),
    "reflect": (lambda x: F.pad(x, (1, 1), mode="reflect"), [torch.bool]),
    "rsub": (lambda x: 1 - x, [torch.bool]),
    "threshold": (lambda x: F.threshold(x, 0, 0), [torch.bool]),
    "mm": (lambda x: x.view(2, 2) @ x.view(2, 2), [torch.bool]),
    "max_pool2d": (lambda x: F.max_pool2d(x.view(1, 1, 2, 2), 2), [torch.bool]),
}


@pytest.mark.parametrize("name,dtype", [(n, d) for n, (_, ds) in _INTEGRAL_REFUSED.items() for d in ds],
                         ids=lambda v: str(v).replace("torch.", ""))
def test_bool_and_integer_inputs_cpu_refuses_raise_alike(name, dtype):
    fn = _INTEGRAL_REFUSED[name][0]
    make = lambda d: torch.tensor([1, 0, 1, 1], dtype=dtype, device=d).view(1, 1, 4)  # noqa: E731
    assert _same_as_cpu(lambda d: fn(make(d))) in (NotImplementedError, RuntimeError)


@pytest.mark.parametrize("call", [lambda x: F.avg_pool1d(x, 2), lambda x: F.interpolate(x.to(torch.uint8), scale_factor=2),
                                  lambda x: x.round(), lambda x: x % x.clamp(min=1), lambda x: F.pad(x, (1, 1), mode="reflect")],
                         ids=["avg_pool_int64", "nearest_uint8", "round_int", "remainder_int", "reflect_int"])
def test_integer_inputs_cpu_takes_still_compute(call):
    _same_as_cpu(lambda d: call(torch.tensor([3, 0, 5, 2], device=d).view(1, 1, 4)))
    assert _outcome(lambda d: call(torch.tensor([3, 0, 5, 2], device=d).view(1, 1, 4)), "tpu")[0] is None


def test_strided_nested_tensor_ops_name_the_op_and_the_jagged_layout():
    import warnings
    parts = [torch.randn(2, 3), torch.randn(4, 3)]
    # Refused where it is made (one that required grad ended the process: autograd asked
    # its sizes in a noexcept function).
    for grad in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PyTorch's prototype warning for the strided layout
            with pytest.raises(NotImplementedError,
                               match=r"_nested_tensor_from_tensor_list.*torch.strided.*layout=torch.jagged"):
                torch.nested.as_nested_tensor([parts[0].to("tpu").requires_grad_(grad), parts[1].to("tpu")])
    nt = torch.nested.nested_tensor(parts)  # one made on the CPU, moved: its ops refuse
    with pytest.raises(NotImplementedError, match=r"torch.strided.*layout=torch.jagged"):
        nt.to("tpu")
    jagged = torch.nested.nested_tensor([p.to("tpu") for p in parts], layout=torch.jagged)
    assert torch.equal((jagged + jagged).unbind()[1].cpu(), parts[1] * 2)


INDEX_DTYPE_CASES = {
    "index_select": lambda a, i: a.index_select(0, i),
    "index_add_": lambda a, i: a.clone().index_add_(0, i, torch.ones(2, 3, device=a.device)),
    "index_copy_": lambda a, i: a.clone().index_copy_(0, i, torch.ones(2, 3, device=a.device)),
    "index_fill_": lambda a, i: a.clone().index_fill_(0, i, 1.0),
    "index_reduce_": lambda a, i: a.clone().index_reduce_(0, i, torch.ones(2, 3, device=a.device), "prod"),
}


@pytest.mark.parametrize("op", sorted(INDEX_DTYPE_CASES))
@pytest.mark.parametrize("index_dtype", [torch.float32, torch.int32])
def test_index_ops_refuse_the_index_dtypes_cpu_refuses(op, index_dtype):
    # A float index was read as integers (silently), an int32 one where CPU takes int64 only.
    fn = INDEX_DTYPE_CASES[op]
    a, i = torch.randn(4, 3), torch.tensor([0, 2]).to(index_dtype)
    try:
        want = fn(a, i)
    except Exception as e:
        with pytest.raises(type(e)) as got:
            fn(a.to("tpu"), i.to("tpu")).cpu()
        assert str(got.value).split("\n")[0] == str(e).split("\n")[0]
    else:
        assert torch.equal(fn(a.to("tpu"), i.to("tpu")).cpu(), want)
    assert (a.to("tpu") * 2).sum().item() == pytest.approx((a * 2).sum().item(), rel=1e-5, abs=1e-5)  # a sum near 0: summation order


def test_multinomial_without_replacement_refuses_more_samples_than_categories_at_the_call():
    p = torch.tensor([0.2, 0.3, 0.5])
    with pytest.raises(RuntimeError, match=r"cannot sample n_sample > prob_dist.size\(-1\) samples without"):
        p.to("tpu").multinomial(5, replacement=False)
    assert p.to("tpu").multinomial(3).sort().values.cpu().tolist() == [0, 1, 2]


def test_resize_to_a_negative_size_raises_cpus_error_and_queues_nothing():
    v = torch.randn(5)
    t = v.to("tpu")
    with pytest.raises(RuntimeError, match="numel: integer multiplication overflow"):
        t.resize_(-1)
    torch.tpu.synchronize()  # nothing left behind to fail later
    assert torch.equal(t.cpu(), v)
    assert (torch.ones(3, device="tpu") * 2).sum().item() == 6.0


# ---- a failed device-side check taints what its op computed -------------------------

@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_failed_index_check_leaves_no_readable_garbage(mode):
    # Strict and DeferAndFuse raise an out-of-range index at the next sync, as CUDA's
    # device asserts do; the op's new results (read with clamped indices) then raise at
    # every use instead of reading as values, and a failed in-place write leaves its
    # tensor as it was. Debug raises at the call and writes nothing.
    x = torch.arange(12.0, device="tpu").view(4, 3)
    bad = torch.tensor([0, 9], device="tpu")
    ones = torch.ones(2, 3, device="tpu")
    with torch_tpu.set_eager_mode(MODES[mode]):
        y = x.clone()
        if mode == "debug":
            with pytest.raises(IndexError, match="out of (range|bounds)"):
                x.index_select(0, bad)
            with pytest.raises(RuntimeError, match="out of (range|bounds)"):  # as CPU's type
                y.index_add_(0, bad, ones)
            assert torch.equal(y.cpu(), x.cpu())  # the failed index_add_ wrote nothing
        else:
            z = x.index_select(0, bad)
            y.index_add_(0, bad, ones)
            kept = x.index_select(0, bad)
            kept.copy_(torch.full((2, 3), 5.0, device="tpu"))  # overwritten whole before the sync
            with pytest.raises((IndexError, RuntimeError), match="out of (range|bounds)"):
                torch_tpu.synchronize()
            torch_tpu.synchronize()  # raised once
            for use in (lambda t: t.cpu(), lambda t: (t + 1).cpu(), lambda t: t.sum().item()):
                with pytest.raises(RuntimeError, match=r"device-side check failed \(.*out of (range|bounds)"):
                    use(z)
            assert torch.equal(y.cpu(), x.cpu())  # the failed in-place write left y as it was
            assert torch.equal(kept.cpu(), torch.full((2, 3), 5.0))
        # Everything else stays usable.
        assert torch.equal(x.cpu(), torch.arange(12.0).view(4, 3))
        assert x.index_select(0, torch.tensor([3, 0], device="tpu")).sum().item() == 33.0


def test_a_failed_index_check_taints_a_compiled_graphs_results():
    cf = torch.compile(lambda x, i: x.index_select(0, i) * 2, backend="tpu")
    x = torch.arange(12.0, device="tpu").view(4, 3)
    good = torch.tensor([0, 1], device="tpu")
    assert cf(x, good).sum().item() == 30.0
    with torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_NEVER):  # (Debug raises at the call)
        r = cf(x, torch.tensor([0, 9], device="tpu"))
        with pytest.raises(IndexError, match="index_select.*out of bounds"):
            r.cpu()
        with pytest.raises(RuntimeError, match=r"device-side check failed \(aten::index_select"):
            r.cpu()
    assert cf(x, good).sum().item() == 30.0 and x.sum().item() == 66.0


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("spatial", [False, True])
def test_a_batch_of_only_ignored_targets_has_zero_gradients_as_cpu(reduction, spatial):
    # ignore_index inside the class range (a pad id) and a padding-only batch: the mean's
    # total weight is 0. CPU's loss is NaN but its gradient 0; tpu's was NaN in the
    # ignored class's column, and one optimizer step made every weight NaN.
    shape, tshape = ((2, 3, 2, 2), (2, 2, 2)) if spatial else ((4, 3), (4,))
    x = torch.randn(shape)
    t = torch.zeros(tshape, dtype=torch.long)
    w = torch.tensor([0.5, 2.0, 1.0])
    for kw in ({}, {"weight": w}):
        grads = []
        for d in ("cpu", "tpu"):
            xd = x.detach().to(d).requires_grad_()
            kwd = {k: v.to(d) for k, v in kw.items()}
            loss = F.cross_entropy(xd, t.to(d), ignore_index=0, reduction=reduction, **kwd)
            loss.sum().backward()
            grads.append(xd.grad.cpu())
        assert not grads[1].isnan().any()
        torch.testing.assert_close(grads[1], grads[0])


def test_out_into_an_empty_tensor_and_is_set_to_as_cpu():
    # out= into an empty 2-D tensor (or an empty slice) recursed without end in Strict
    # and Debug (a segfault); is_set_to ran on the CPU fallback, comparing two host copies.
    for mode in MODES.values():
        with torch_tpu.set_eager_mode(mode):
            o = torch.empty(2, 0, device="tpu")
            assert torch.add(torch.zeros(2, 0, device="tpu"), 1, out=o) is o and o.shape == (2, 0)
            x = torch.arange(8.0, device="tpu").view(2, 4)
            v = x[:, 4:]
            torch.sub(v, v, out=v)
            torch.neg(torch.zeros(3, 0, 2, device="tpu"), out=torch.empty(3, 0, 2, device="tpu"))
            assert torch.equal(x.cpu(), torch.arange(8.0).view(2, 4))
    x = torch.arange(6.0, device="tpu")
    y = torch.empty(0, device="tpu").set_(x.untyped_storage(), 0, (6,), (1,))
    assert x.is_set_to(y) and y.is_set_to(x)
    assert not x.is_set_to(x[1:]) and not x.is_set_to(x.clone()) and not x.view(2, 3).is_set_to(x)


def test_a_copy_to_cpu_of_a_non_dense_view_keeps_its_dimension_order_as_cpu():
    for make in (lambda d: torch.arange(12.0, device=d).as_strided((3, 2), (2, 4)),
                 lambda d: torch.randn(2, 3, 4, 5, device=d)[:, :, ::2].permute(0, 2, 3, 1),
                 lambda d: torch.randn(2, 3, 4, 5, device=d).to(memory_format=torch.channels_last)[:, :, 1:]):
        want = make("cpu").to(torch.float64).stride()  # CPU's _to_copy of the same view
        assert make("tpu").to("cpu").stride() == want
        assert make("tpu").to("cpu", torch.float64).stride() == want


SCALAR_FITS = {
    "int8_fill": lambda d: torch.zeros(2, dtype=torch.int8, device=d).fill_(1000),
    "uint8_fill": lambda d: torch.zeros(2, dtype=torch.uint8, device=d).fill_(1e10),
    "half_fill": lambda d: torch.zeros(2, dtype=torch.float16, device=d).fill_(1e5),
    "f32_fill": lambda d: torch.zeros(3, device=d).fill_(1e40),
    "half_one_element_fill": lambda d: torch.zeros(1, dtype=torch.float16, device=d).fill_(1e5),
    "full_int8": lambda d: torch.full((2,), 1000, dtype=torch.int8, device=d),
    "full_like_int32": lambda d: torch.full_like(torch.zeros(2, dtype=torch.int32, device=d), 1e10),
    "where_int8": lambda d: torch.where(torch.tensor([True, False], device=d), torch.ones(2, dtype=torch.int8, device=d), 1000),
    "where_half": lambda d: torch.where(torch.tensor([True, False], device=d), torch.ones(2, dtype=torch.float16, device=d), 7e4),
    "where_bf16": lambda d: torch.where(torch.tensor([True, False], device=d), torch.ones(2, dtype=torch.bfloat16, device=d), 1e300),
    "masked_fill_int8": lambda d: torch.zeros(2, dtype=torch.int8, device=d).masked_fill(torch.tensor([True, False], device=d), 1000),
    "index_fill_int8": lambda d: torch.zeros(2, dtype=torch.int8, device=d).index_fill(0, torch.tensor([0], device=d), 1000),
    "scatter_int8": lambda d: torch.zeros(2, dtype=torch.int8, device=d).scatter(0, torch.tensor([0], device=d), 1000),
    "clamp_int8": lambda d: torch.ones(2, dtype=torch.int8, device=d).clamp(max=1000),
    "clamp_f32_big": lambda d: torch.ones(2, device=d).clamp(max=1e40),
    "complex_fill": lambda d: torch.zeros(2, device=d).fill_(1 + 2j),
    "complex_full_like": lambda d: torch.full_like(torch.zeros(2, dtype=torch.int32, device=d), 1 + 2j),
    "add_int8_wraps": lambda d: torch.ones(2, dtype=torch.int8, device=d) + 1000,
    "half_plus_big": lambda d: torch.ones(2, dtype=torch.float16, device=d) + 7e4,
}


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("name", sorted(SCALAR_FITS))
def test_a_number_written_into_a_narrower_dtype_raises_or_converts_as_cpu(name, mode):
    # CPU's fill-like kernels convert the number checked ("value cannot be converted to
    # type int8_t without overflow"); arithmetic wraps or overflows to inf. DeferAndFuse
    # wrapped silently where Strict raised, and Strict raised where CPU gives inf.
    with torch_tpu.set_eager_mode(MODES[mode]):
        _same_as_cpu(SCALAR_FITS[name], match="without overflow")


@pytest.mark.parametrize("name", ["bool_minus_int", "true_minus_uint8", "int_minus_true", "bool_minus_bool", "rsub_bool"])
def test_subtraction_with_bool_raises_as_cpu(name):
    cases = {
        "bool_minus_int": lambda d: torch.tensor([True], device=d) - torch.tensor([1], device=d),
        "true_minus_uint8": lambda d: True - torch.tensor([1, 2], dtype=torch.uint8, device=d),
        "int_minus_true": lambda d: torch.tensor([1, 2], device=d) - True,
        "bool_minus_bool": lambda d: torch.tensor([True], device=d) - torch.tensor([False], device=d),
        "rsub_bool": lambda d: torch.rsub(torch.tensor([True], device=d), 1),
    }
    (torch.tensor([1, 2], device="tpu") - 1).cpu()  # a plan for int - int exists first
    for mode in ("strict", "fused"):
        with torch_tpu.set_eager_mode(MODES[mode]):
            assert _same_as_cpu(cases[name], match="Subtraction") is RuntimeError


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_pow_by_half_at_negative_zero_and_infinity_as_cpu(dtype):
    # CPU takes sqrt for a Scalar exponent of +-0.5 except in its float16 kernel, which
    # computes pow: -inf ** 0.5 is inf there (NaN through sqrt), -0 ** 0.5 is +0.
    x = torch.tensor([float("-inf"), -0.0, 0.0, 4.0, float("inf")], dtype=dtype)
    for e in (0.5, -0.5):
        want, got = x ** e, (x.to("tpu") ** e).cpu()
        assert torch.equal(got.isnan(), want.isnan()), (e, got, want)
        keep = ~want.isnan()
        assert torch.equal(got[keep], want[keep]) and torch.equal(got[keep].signbit(), want[keep].signbit()), (e, got, want)


@pytest.mark.parametrize("name", ["add_float_into_int", "mul_int_by_float_into_int", "div_into_long",
                                  "add_into_wider", "lt_into_float"])
def test_out_of_a_dtype_the_result_cannot_cast_to_raises_cpus_error(name):
    cases = {
        "add_float_into_int": lambda d: torch.add(torch.arange(4.0, device=d), 0.5,
                                                  out=torch.zeros(4, dtype=torch.int32, device=d)),
        "mul_int_by_float_into_int": lambda d: torch.mul(torch.arange(4, device=d), 1.5,
                                                         out=torch.zeros(4, dtype=torch.int64, device=d)),
        "div_into_long": lambda d: torch.div(torch.arange(4, device=d), 2, out=torch.zeros(4, dtype=torch.int64, device=d)),
        "add_into_wider": lambda d: torch.add(torch.arange(4.0, device=d), 1, out=torch.zeros(4, dtype=torch.float64, device=d)),
        "lt_into_float": lambda d: torch.lt(torch.arange(4.0, device=d), 2, out=torch.zeros(4, device=d)),
    }
    _same_as_cpu(cases[name], match="can't be cast to the desired output type")


MASKS = {"short_rows": (4, 4), "short_dim": (3,), "one_col": (4, 1), "one_row": (1, 5), "one": (1,),
         "too_many_dims": (4, 5, 6)}
MASK_USES = {
    "get": lambda x, m: x[m],
    "get_after_none": lambda x, m: torch.ops.aten.index(x, [None, m.reshape(-1)[:4]]),
    "set_scalar": lambda x, m: x.__setitem__(m, 2.0),
    "set_values": lambda x, m: x.index_put_((m,), torch.ones(int(m.sum()), device=x.device)),
    "accumulate": lambda x, m: x.index_put_((m,), torch.ones((), device=x.device), accumulate=True),
}


@pytest.mark.parametrize("use", sorted(MASK_USES))
@pytest.mark.parametrize("mask", sorted(MASKS))
def test_a_mask_whose_shape_differs_from_the_indexed_dims_raises_as_cpu(mask, use):
    """A smaller mask's coordinates would read or write the wrong elements, and a size-1
    mask would broadcast: CPU raises IndexError naming both shapes, and the tensor stays."""
    def run(d):
        x = torch.arange(20.0, device=d).view(4, 5)
        m = torch.zeros(MASKS[mask], dtype=torch.bool, device=d)
        m.view(-1)[0] = True
        try:
            MASK_USES[use](x, m)
            return None, x.cpu()
        except Exception as e:  # noqa: BLE001 - the type and message are compared
            return type(e), str(e), x.cpu()
    cpu, tpu = run("cpu"), run("tpu")
    assert cpu[0] is IndexError and tpu[0] is IndexError and tpu[1] == cpu[1], (cpu, tpu)
    assert torch.equal(tpu[-1], cpu[-1])


BOOL_PRODUCTS = {
    "x_times_mask": lambda a, m: a * m,
    "mask_times_x": lambda a, m: m * a,
    "x_times_float_mask": lambda a, m: a * m.float(),
    "mul_": lambda a, m: a.clone().mul_(m),
    "half": lambda a, m: a.half() * m,
    "amax_grad": lambda a, m: _amax_grad(a),
    "dropout_backward": lambda a, m: torch.ops.aten.native_dropout_backward(a, m, 2.0),
}


def _amax_grad(a):
    x = torch.stack([a[3], a[1], a[3]]).detach().requires_grad_()  # [2, nan, 2]
    x.amax().backward()
    return x.grad


@pytest.mark.parametrize("name", sorted(BOOL_PRODUCTS))
def test_inf_and_nan_times_a_false_mask_stay_nan_as_cpu(name):
    """inf * 0 and NaN * 0 are NaN: XLA rewrites `y * convert(mask)` to a select that gave 0,
    hiding NaN gradients (amax's, dropout's) that CPU and CUDA show."""
    def run(d):
        a = torch.tensor([float("inf"), float("nan"), -float("inf"), 2.0], device=d)
        m = torch.tensor([False, False, False, True], device=d)
        return BOOL_PRODUCTS[name](a, m).cpu()
    torch.testing.assert_close(run("tpu"), run("cpu"), equal_nan=True)


INTEGER_CASES = {
    # std/var take floating and complex only (an integer var returned an integer)
    "var_int": lambda d: torch.tensor([1, 2, 4], device=d).var(),
    "var_dim_uint8": lambda d: torch.tensor([1, 2, 4], dtype=torch.uint8, device=d).var(0),
    "std_int": lambda d: torch.tensor([1, 2, 4], device=d).std(),
    "var_bool": lambda d: torch.tensor([True, False], device=d).var(),
    # a bool promoted by the other operand is computed as CPU does, not refused
    "bool_remainder_int": lambda d: torch.tensor([True, False, True], device=d) % 5,
    "bool_remainder_float": lambda d: torch.tensor([True, False, True], device=d) % 2.5,
    "bool_fmod_tensor": lambda d: torch.fmod(torch.tensor([True, False], device=d), torch.tensor([2, 3], device=d)),
    "bool_addcmul": lambda d: torch.addcmul(torch.tensor([True, False], device=d), torch.tensor([2, 3], device=d),
                                            torch.tensor([2, 3], device=d)),
    "bool_remainder_bool": lambda d: torch.tensor([True], device=d) % torch.tensor([True], device=d),
    "bool_div_trunc": lambda d: torch.div(torch.tensor([True, True], device=d), torch.tensor([True, True], device=d),
                                          rounding_mode="trunc"),
    "int_histogram": lambda d: torch.histogram(torch.tensor([1, 2, 3], device=d), 3),
    # sizes past what a storage can hold
    "bincount_huge": lambda d: torch.bincount(torch.tensor([2**62], device=d)),
    "bincount_max": lambda d: torch.bincount(torch.tensor([2**63 - 1], device=d)),
    "bincount_minlength_huge": lambda d: torch.bincount(torch.tensor([1], device=d), minlength=2**62),
    "repeat_interleave_huge": lambda d: torch.repeat_interleave(torch.tensor([2**62], device=d)),
}


@pytest.mark.parametrize("name", sorted(INTEGER_CASES))
def test_integer_and_bool_inputs_raise_or_compute_as_cpu(name):
    err = _same_as_cpu(INTEGER_CASES[name])
    assert (torch.ones(3, device="tpu") + 1).sum().item() == 6.0  # nothing left pending or failed
    del err


def test_foreach_in_place_ops_bump_versions_as_cpu():
    # A tensor saved for the backward and then written by a foreach op (an optimizer step
    # between forward and backward) made the backward read the new values (s46 alias probe).
    def run(d):
        xs = [torch.arange(3.0, device=d), torch.arange(2.0, device=d)]
        torch._foreach_add_(xs, 1)
        torch._foreach_mul_(xs, [2.0, 3.0])
        torch._foreach_zero_(xs)
        a = torch.arange(3.0, device=d).requires_grad_()
        b = a * 1
        c = b * b
        torch._foreach_add_([b], 1.0)
        p = torch.nn.Parameter(torch.arange(3.0, device=d))
        opt = torch.optim.SGD([p], lr=0.1, foreach=True)
        p.grad = torch.ones(3, device=d)
        loss = (p * p).sum()
        opt.step()
        for t in (c.sum(), loss):
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                t.backward()
        return [x._version for x in xs]
    assert run("tpu") == run("cpu") == [3, 3]


def test_a_write_through_a_bool_view_keeps_the_other_bytes():
    # The bool view's write read the whole storage as bools (every other byte became 0 or 1).
    def fn(d):
        x = torch.tensor([5, 6, 7, 8], dtype=torch.uint8, device=d)
        x.view(torch.bool)[1] = False
        f = torch.tensor([1.5, -2.0], device=d)
        f.view(torch.bool)[0] = True
        y = torch.tensor([0, 2, 4, 0], dtype=torch.uint8, device=d)
        y.view(torch.bool)[3:].fill_(True)
        z = torch.tensor([3, 9, 0, 4], dtype=torch.uint8, device=d)
        z.view(torch.bool)[::2].copy_(torch.tensor([False, True], device=d))
        return x, f, y, z
    _same_as_cpu(fn)


def test_set_grows_a_short_storage_and_set_without_a_source_gives_a_fresh_one():
    # set_(storage, offset, size, stride) past the storage's end had ATen's CPU resize copy
    # our storage record as bytes (the source was zeroed, reads failed); set_() ran on the
    # CPU fallback and kept the old storage, which a later write then changed under a view.
    y = torch.arange(6.0, device="tpu")
    x = torch.empty(0, device="tpu")
    x.set_(y.untyped_storage(), 4, (4,), (1,))
    assert y.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert x[:2].cpu().tolist() == [4.0, 5.0] and x.untyped_storage().nbytes() == 32
    x.fill_(1.0)
    assert y.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 1.0, 1.0]  # the same storage, grown
    x = torch.arange(6.0, device="tpu")
    v = x[1:3]
    x.set_()
    assert x.untyped_storage().nbytes() == 0 and x.shape == (0,) and x.device.type == "tpu"
    x.resize_(2)
    x.fill_(5)
    assert v.cpu().tolist() == [1.0, 2.0] and x.cpu().tolist() == [5.0, 5.0]


INVALID_CALLS = {  # found by the s46 invalid-input fuzzer: each raised late, raw, or not at all
    "linear_bias": lambda d: F.linear(torch.ones(2, 3, device=d), torch.ones(4, 3, device=d), torch.ones(5, device=d)),
    "addmm_self": lambda d: torch.addmm(torch.ones(5, 2, device=d), torch.ones(4, 2, device=d),
                                        torch.ones(2, 1, device=d)),
    "conv_bias": lambda d: F.conv2d(torch.ones(1, 2, 5, 5, device=d), torch.ones(3, 2, 3, 3, device=d),
                                    torch.ones(4, device=d)),
    "conv_groups": lambda d: F.conv2d(torch.ones(1, 4, 5, 5, device=d), torch.ones(3, 2, 3, 3, device=d), groups=2),
    "conv_transpose_channels": lambda d: F.conv_transpose2d(torch.ones(1, 4, 4, 4, device=d),
                                                            torch.ones(5, 2, 3, 3, device=d)),
    "conv_transpose_bias": lambda d: F.conv_transpose2d(torch.ones(1, 4, 5, 5, device=d),
                                                        torch.ones(4, 2, 3, 3, device=d), torch.ones(3, device=d)),
    "conv_dtypes": lambda d: F.conv2d(torch.ones(1, 4, 5, 5, device=d), torch.ones(6, 4, 3, 3, device=d).double()),
    "bitwise_not_float": lambda d: torch.bitwise_not(torch.ones(3, device=d)),
    "index_select_2d": lambda d: torch.ones(3, device=d).index_select(0, torch.tensor([[0, 1]], device=d)),
    "heaviside_dtypes": lambda d: torch.heaviside(torch.ones(3, device=d), torch.ones(3, dtype=torch.int64, device=d)),
    "sort_out_indices": lambda d: torch.sort(torch.ones(3, device=d), out=(torch.empty(3, device=d),
                                                                           torch.empty(3, device=d))),
    "softmax_out_dtype": lambda d: torch.softmax(torch.ones(3, device=d), 0,
                                                 out=torch.empty(3, dtype=torch.float64, device=d)),
    "reflect_pad_width": lambda d: F.pad(torch.ones(1, 1, 3, 3, device=d), (3, 0, 0, 0), mode="reflect"),
    "reflect_pad_height": lambda d: F.pad(torch.ones(1, 1, 3, 3, device=d), (0, 0, 4, 0), mode="reflect"),
    "cat_out_overlap": lambda d: (lambda a: torch.cat([a, a], out=a))(torch.ones(2, 3, device=d)),
    "cat_out_dtype": lambda d: torch.cat([torch.ones(2, device=d)], out=torch.zeros(2, dtype=torch.int64, device=d)),
    "stack_out_dtype": lambda d: torch.stack([torch.ones(2, device=d)], out=torch.zeros(1, 2, dtype=torch.int64,
                                                                                       device=d)),
    "triu_indices_negative": lambda d: torch.triu_indices(-1, 3, device=d),
}


@pytest.mark.parametrize("name", sorted(INVALID_CALLS))
def test_invalid_calls_raise_cpus_error_at_the_call(name):
    fn = INVALID_CALLS[name]
    with pytest.raises(Exception) as cpu:
        fn("cpu")
    with pytest.raises(Exception) as tpu:
        fn("tpu")  # at the call: no read of the result
    assert type(tpu.value) is type(cpu.value), (tpu.value, cpu.value)
    want = str(cpu.value).split("\n")[0].replace("bitwise_not_cpu", "bitwise_not")
    assert str(tpu.value).split("\n")[0] == want
    assert torch.ones(2, device="tpu").add(1).cpu().tolist() == [2.0, 2.0]
