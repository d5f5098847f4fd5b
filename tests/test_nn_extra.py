"""Native NN forwards and backwards (pooling, upsampling, grid sampling, padding, CTC and
margin losses, transposed convolutions, embedding_bag), each checked against PyTorch's
CPU kernels with nothing falling back to the CPU."""

import pytest
import torch
import torch.nn.functional as F

from conftest import dev, host, native

F32 = dict(rtol=1e-4, atol=1e-5)

def randn(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def check(fn, *args, grad=True, **tol):
    """fn on CPU vs on tpu (forward, and the gradients of float args), natively."""
    tol = tol or F32
    cpu = [a.clone().requires_grad_(grad) if isinstance(a, torch.Tensor) and a.is_floating_point()
           else a for a in args]
    tpu = [dev(a.detach()).requires_grad_(grad) if isinstance(a, torch.Tensor)
           and a.is_floating_point() else dev(a) for a in args]
    with native():
        want, got = fn(*cpu), fn(*tpu)
        if isinstance(want, tuple):
            want, got = want[0], got[0]
        torch.testing.assert_close(host(got), want, **tol)
        if grad:
            w = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
            (want * w).sum().backward()
            (got * dev(w)).sum().backward()
            for c, t in zip(cpu, tpu):
                if isinstance(c, torch.Tensor) and c.requires_grad:
                    torch.testing.assert_close(host(t.grad), c.grad, **tol)


# ---- pooling.cpp, distance.cpp

def test_adaptive_avg_pool_empty_batch():
    check(lambda x: F.adaptive_avg_pool1d(x, 5), torch.zeros(0, 8, 8), grad=False)
    check(lambda x: F.adaptive_avg_pool3d(x, (5, 7, 4)), torch.zeros(0, 8, 8, 8, 8), grad=False)


@pytest.mark.parametrize("out", [3, (5, 2)])
def test_adaptive_max_pool2d(out):
    x = randn(2, 3, 7, 9)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = 5.0  # a tie: CPU's index is the first
    check(lambda x: F.adaptive_max_pool2d(x, out), x)
    want = F.adaptive_max_pool2d(x, out, return_indices=True)[1]
    with native():
        got = F.adaptive_max_pool2d(dev(x), out, return_indices=True)[1]
    assert torch.equal(host(got), want)


def test_adaptive_max_pool1d_3d_nan():
    check(lambda x: F.adaptive_max_pool1d(x, 3), randn(3, 4, 4))
    check(lambda x: F.adaptive_max_pool3d(x, (2, 3, 2)), randn(2, 2, 5, 6, 4))
    x = randn(1, 2, 6, 6)
    x[0, 0, 0, 0] = x[0, 0, 0, 1] = float("nan")
    want = F.adaptive_max_pool2d(x, 2, return_indices=True)
    with native():
        got = F.adaptive_max_pool2d(dev(x), 2, return_indices=True)
    torch.testing.assert_close(host(got[0]), want[0], equal_nan=True)
    assert torch.equal(host(got[1]), want[1])


def test_max_pool3d_backward():
    check(lambda x: F.max_pool3d(x, 2, stride=1, padding=1), randn(2, 2, 4, 5, 3))


# Windows of up to 4 taps stack their taps; larger ones use one reduce_window: both
# forms must keep CPU's first maximum (ties, NaN, -inf and padding) in 2-d and 3-d.
@pytest.mark.parametrize("nd,args", [
    (2, dict(kernel_size=2, stride=2)),
    (2, dict(kernel_size=(1, 4), stride=(1, 3), padding=(0, 1), ceil_mode=True)),
    (2, dict(kernel_size=3, stride=2, padding=1)),
    (2, dict(kernel_size=(3, 2), stride=1, padding=1, dilation=(2, 1), ceil_mode=True)),
    (2, dict(kernel_size=5, stride=3, padding=2, dilation=2)),
    (3, dict(kernel_size=(1, 2, 2))),
    (3, dict(kernel_size=2, stride=1, padding=1)),
    (3, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
])
def test_max_pool_forms_keep_the_first_maximum(nd, args):
    pool = F.max_pool2d if nd == 2 else F.max_pool3d
    shape = (2, 3, 7, 8) if nd == 2 else (1, 2, 5, 6, 4)
    x = torch.randint(-3, 3, shape).float()  # many ties
    x.view(-1)[::7] = float("nan")
    x.view(-1)[3::11] = float("-inf")
    want = pool(x, return_indices=True, **args)
    with native():
        got = pool(dev(x), return_indices=True, **args)
    torch.testing.assert_close(host(got[0]), want[0], equal_nan=True)
    assert torch.equal(host(got[1]), want[1])
    wi = pool(x.nan_to_num(0, 0, 0).long(), return_indices=True, **args)
    with native():
        gi = pool(dev(x.nan_to_num(0, 0, 0).long()), return_indices=True, **args)
    assert torch.equal(host(gi[0]), wi[0]) and torch.equal(host(gi[1]), wi[1])
    check(lambda v: pool(v, **args), randn(*shape))


def test_pdist_few_rows():
    check(lambda x: F.pdist(x), randn(1, 5))
    check(lambda x: F.pdist(x, 3.0), randn(5, 4))


# ---- upsample.cpp

@pytest.mark.parametrize("kw", [
    dict(scale_factor=1.7, mode="bilinear", align_corners=True),
    dict(size=(3, 7), mode="bicubic", align_corners=False),
    dict(size=(7, 5), mode="nearest"),
    dict(size=(3, 7), mode="nearest-exact"),
    dict(size=(3, 7), mode="bilinear", antialias=True),
    dict(size=(9, 4), mode="bicubic", antialias=True, align_corners=True),
])
def test_interpolate_2d(kw):
    check(lambda x: F.interpolate(x, **kw), randn(2, 3, 6, 5))


@pytest.mark.parametrize("kw", [dict(mode="bilinear"), dict(mode="bicubic"),
                                dict(mode="bilinear", antialias=True), dict(mode="bicubic", antialias=True)])
def test_float64_interpolation_weights_in_double(kw):
    # The tap weights were made in float: float64 gradients (and antialiased outputs) were
    # off by ~1e-6. CPU makes them in double for float64.
    tol = dict(rtol=1e-12, atol=1e-12)
    for size in ((13, 5), (4, 17)):
        check(lambda x: F.interpolate(x, size=size, align_corners=False, **kw),
              randn(2, 3, 7, 9).double(), **tol)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_antialiased_uint8_images_as_cpu(mode):
    # The fractional weights were cast to uint8 (0): most pixels came out 0. CPU sums in
    # fixed point and rounds after each pass; float sums rounded per pass differ by <= 1.
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.int64).remainder(256).to(torch.uint8).reshape(2, 3, 8, 8)
    for size in ((5, 3), (3, 7)):
        want = F.interpolate(x, size=size, mode=mode, antialias=True)
        got = F.interpolate(x.to("tpu"), size=size, mode=mode, antialias=True).cpu()
        assert got.dtype == torch.uint8
        assert (got.int() - want.int()).abs().max().item() <= 1, (got, want)


@pytest.mark.parametrize("kw", [dict(scale_factor=0.6, mode="linear", align_corners=True),
                                dict(scale_factor=2, mode="nearest")])
def test_interpolate_1d(kw):
    check(lambda x: F.interpolate(x, **kw), randn(2, 3, 6))


def test_interpolate_3d():
    check(lambda x: F.interpolate(x, size=(3, 5, 4), mode="trilinear"), randn(1, 2, 4, 3, 5))
    check(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), randn(1, 2, 2, 3, 2))


# ---- grid_sample.cpp

@pytest.mark.parametrize("mode,pad,align", [
    ("bilinear", "border", True), ("bilinear", "reflection", False), ("nearest", "reflection", True),
    ("bicubic", "zeros", False), ("bicubic", "border", True), ("bicubic", "reflection", False),
])
def test_grid_sample_2d(mode, pad, align):
    x, grid = randn(2, 3, 5, 6), randn(2, 4, 3, 2, seed=1) * 0.8
    check(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=pad, align_corners=align), x, grid,
          rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode,pad", [("bilinear", "zeros"), ("bilinear", "reflection"), ("nearest", "border")])
def test_grid_sample_3d(mode, pad):
    x, grid = randn(2, 2, 4, 5, 3), randn(2, 3, 2, 4, 3, seed=1) * 0.8
    check(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=pad, align_corners=False), x, grid,
          rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("pad", ["border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_reads_a_nan_or_infinite_coordinate_as_cpu(mode, pad, align):
    """A NaN coordinate reads as coordinate 0, and a reflected inf is NaN, in CPU's and
    CUDA's kernels (they gave 0 here)."""
    nan, inf = float("nan"), float("inf")
    x = torch.arange(1.0, 31.0).reshape(1, 1, 5, 6)
    g = torch.tensor([[[[nan, 0.0], [0.0, nan], [inf, 0.0], [-inf, 0.0], [nan, nan], [0.1, 0.2]]]])
    want = F.grid_sample(x, g, mode=mode, padding_mode=pad, align_corners=align)
    got = F.grid_sample(x.to("tpu"), g.to("tpu"), mode=mode, padding_mode=pad, align_corners=align)
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)


# ---- padding.cpp

@pytest.mark.parametrize("mode,pad,shape", [
    ("reflect", (2, 3), (2, 3, 6)), ("replicate", (1, 2, 3, 0), (2, 3, 4, 5)),
    ("replicate", (-1, 2), (2, 3, 6)), ("reflect", (1, 1, 2, 0, 1, 1), (1, 2, 3, 4, 3)),
])
def test_pad_backward(mode, pad, shape):
    check(lambda x: F.pad(x, pad, mode=mode), randn(*shape))


# ---- loss_margin.cpp

@pytest.mark.parametrize("p,weight,red", [(1, False, "mean"), (2, True, "sum"), (1, True, "none")])
def test_multi_margin_loss(p, weight, red):
    x, y = randn(4, 5), torch.tensor([0, 3, 4, 1])
    w = randn(5, seed=2).abs() if weight else None
    def fn(x, y):
        wd = None if w is None else (w if x.device.type == "cpu" else dev(w))
        return F.multi_margin_loss(x, y, p=p, margin=0.7, weight=wd, reduction=red)
    check(fn, x, y)


@pytest.mark.parametrize("red", ["mean", "none"])
def test_multilabel_margin_loss(red):
    x, y = randn(3, 5), torch.tensor([[3, 0, -1, 1, 2], [1, 1, 4, 2, 0], [-1, 2, 3, 0, 0]])
    check(lambda x, y: F.multilabel_margin_loss(x, y, reduction=red), x, y)


# ---- loss_ctc.cpp

@pytest.mark.parametrize("targets_2d,red", [(True, "mean"), (False, "none")])
def test_ctc_loss(targets_2d, red):
    T, B, C = 12, 3, 5
    lp = randn(T, B, C).log_softmax(2)
    tl = torch.tensor([4, 0, 3])
    il = torch.tensor([12, 5, 9])
    tg = torch.tensor([[1, 2, 2, 3], [1, 1, 1, 1], [4, 1, 4, 0]])
    if not targets_2d:
        tg = torch.cat([tg[i, :tl[i]] for i in range(B)])
    check(lambda lp, tg, il, tl: F.ctc_loss(lp, tg, il, tl, reduction=red), lp, tg, il, tl)


def test_ctc_loss_zero_infinity():
    lp = randn(3, 2, 4).log_softmax(2)
    tg, il, tl = torch.tensor([[1, 2, 1, 2], [3, 3, 3, 3]]), torch.tensor([3, 3]), torch.tensor([4, 1])
    check(lambda lp, tg, il, tl: F.ctc_loss(lp, tg, il, tl, reduction="sum", zero_infinity=True), lp, tg, il, tl)


# ---- nn.cpp: transposed convolutions

@pytest.mark.parametrize("n,kw", [
    (1, dict(stride=2, padding=1, output_padding=1)),
    (2, dict(stride=(2, 1), padding=(0, 1), groups=2, dilation=(1, 2))),
    (3, dict(stride=2, output_padding=1)),
])
def test_conv_transpose_backward(n, kw):
    x = randn(2, 4, *([5] * n))
    w = randn(4, 3, *([3] * n), seed=1)  # (in, out / groups, k...)
    b = randn(3 * kw.get("groups", 1), seed=2)
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[n]
    check(lambda x, w, b: fn(x, w, b, **kw), x, w, b, rtol=1e-4, atol=1e-4)


# ---- embedding_bag.cpp

@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_keeps_a_non_finite_row_in_its_own_bag(mode):
    # A 0/1 matmul spread 0 * inf (an inf row of bag 0, a NaN padding row) into every bag.
    w = torch.arange(30.0).reshape(10, 3) / 10
    w[1] = float("inf")
    w[9] = float("nan")  # the padding row: skipped
    idx = torch.tensor([1, 2, 3, 4, 9, 5, 6])
    off = torch.tensor([0, 2, 5])
    want = F.embedding_bag(idx, w, off, mode=mode, padding_idx=9)
    got = F.embedding_bag(idx.to("tpu"), w.to("tpu"), off.to("tpu"), mode=mode, padding_idx=9).cpu()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert got[1:].isfinite().all()


def test_embedding_bag_max_keeps_cpus_scan_over_nan_and_zeros():
    # CPU keeps a bag's first row, then any strictly greater one: a NaN first wins, a later
    # NaN is passed over (it spread to the whole bag), and of 0.0 and -0.0 the first stays.
    nan, inf = float("nan"), float("inf")
    w = torch.tensor([[1., 2.], [nan, 5.], [3., nan], [inf, -inf], [0., -0.], [-0., 0.]])
    for idx, off in (([0, 1, 2], [0]), ([0, 1, 2, 3], [0, 2]), ([2, 0, 1], [0]), ([1, 2], [0, 1]),
                     ([4, 5], [0]), ([5, 4], [0]), ([3, 3, 1], [0])):
        args = (w, torch.tensor(idx), torch.tensor(off), False, 2)
        want = torch.ops.aten._embedding_bag(*args)
        got = torch.ops.aten._embedding_bag(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args])
        torch.testing.assert_close(got[0].cpu(), want[0], equal_nan=True, rtol=0, atol=0)
        assert torch.equal(got[0].cpu().signbit(), want[0].signbit()), (idx, got[0], want[0])
        assert torch.equal(got[3].cpu(), want[3]), (idx, got[3], want[3])


def test_embedding_bag_refuses_offsets_that_go_down():
    w, idx = torch.arange(12.0).reshape(4, 3), torch.tensor([0, 1, 2, 3])
    with pytest.raises(RuntimeError):
        F.embedding_bag(idx, w, torch.tensor([0, 3, 1]))
    with pytest.raises(RuntimeError, match="offsets must be non-decreasing"):
        F.embedding_bag(idx.to("tpu"), w.to("tpu"), torch.tensor([0, 3, 1], device="tpu")).cpu()
    assert F.embedding_bag(idx.to("tpu"), w.to("tpu"), torch.tensor([0, 1, 1], device="tpu")).shape == (3, 3)


@pytest.mark.parametrize("mode,psw,pad", [("mean", False, 2), ("max", False, None), ("sum", True, 1)])
def test_embedding_bag_backward(mode, psw, pad):
    w = randn(10, 3)
    idx, off = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3, 3, 6])
    s = randn(8, seed=3) if psw else None
    if psw:
        check(lambda w, s, i, o: F.embedding_bag(i, w, o, mode=mode, per_sample_weights=s, padding_idx=pad),
              w, s, idx, off)
    else:
        check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, padding_idx=pad), w, idx, off)


@pytest.mark.parametrize("loss", ["multi_margin_loss", "multilabel_margin_loss"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_margin_losses_of_one_sample_have_cpus_shape(loss, reduction):
    # PyTorch's Meta kernels give [1] where CPU gives a 0-d loss for a single sample.
    fn = getattr(torch.nn.functional, loss)
    cases = ([(torch.randn(()), torch.tensor(0)), (torch.randn(3), torch.tensor([1])),
              (torch.randn(2, 3), torch.tensor([1, 2]))] if loss == "multi_margin_loss" else
             [(torch.randn(()), torch.tensor(0)), (torch.randn(3), torch.tensor([1, -1, 0])),
              (torch.randn(2, 3), torch.tensor([[1, -1, 0], [2, 0, -1]]))])
    for x, y in cases:
        want = fn(x, y, reduction=reduction)
        got = fn(x.to("tpu"), y.to("tpu"), reduction=reduction)
        assert got.shape == want.shape, (tuple(x.shape), got.shape, want.shape)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)


def test_sync_batch_norm_ops_combine_uneven_parts_like_the_whole_batch():
    # torch.nn.SyncBatchNorm's ops, one process standing in for two ranks of 2 and 5
    # samples: the combined statistics, running statistics, normalization and gradients
    # equal BatchNorm's over the whole batch (float64 on the CPU).
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(n, 3, 4, generator=g, dtype=torch.float64) * 2 + 1 for n in (2, 5)]
    whole = torch.cat(parts)
    w = torch.rand(3, generator=g, dtype=torch.float64) + 0.5
    b = torch.randn(3, generator=g, dtype=torch.float64)
    eps, momentum = 1e-5, 0.1
    with native():
        stats = [torch.batch_norm_stats(p.float().to("tpu"), eps) for p in parts]
        means = torch.stack([m for m, _ in stats])
        invstds = torch.stack([s for _, s in stats])
        counts = torch.tensor([2 * 4, 5 * 4], dtype=torch.float32, device="tpu")
        rm, rv = torch.zeros(3, device="tpu"), torch.ones(3, device="tpu")
        mean, invstd = torch.batch_norm_gather_stats_with_counts(
            parts[0].float().to("tpu"), means, invstds, rm, rv, momentum, eps, counts)
    var_b, mean_b = torch.var_mean(whole, (0, 2), correction=0)
    torch.testing.assert_close(mean.cpu().double(), mean_b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(invstd.cpu().double(), 1 / torch.sqrt(var_b + eps), rtol=1e-5, atol=1e-6)
    # Updated in place, as CUDA's kernel does: the unbiased variance goes into running_var.
    torch.testing.assert_close(rm.cpu().double(), momentum * mean_b, rtol=1e-5, atol=1e-6)
    unbiased = torch.var(whole, (0, 2), correction=1)
    torch.testing.assert_close(rv.cpu().double(), (1 - momentum) + momentum * unbiased, rtol=1e-5, atol=1e-6)

    x = whole.clone().requires_grad_()
    y = F.batch_norm(x, None, None, w, b, training=True, eps=eps)
    dy = torch.randn(y.shape, generator=g, dtype=torch.float64)
    y.backward(dy)
    xt, dyt, wt = whole.float().to("tpu"), dy.float().to("tpu"), w.float().to("tpu")
    with native():
        out = torch.batch_norm_elemt(xt, wt, b.float().to("tpu"), mean, invstd, eps)
        sum_dy, sum_dy_xmu, gw, gb = torch.batch_norm_backward_reduce(dyt, xt, mean, invstd, wt, True, True, True)
        dx = torch.batch_norm_backward_elemt(dyt, xt, mean, invstd, wt, sum_dy, sum_dy_xmu,
                                             torch.tensor([8, 20], dtype=torch.int32, device="tpu"))
    torch.testing.assert_close(out.cpu().double(), y.detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dx.cpu().double(), x.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw.cpu().double(), (dy * (y.detach() - b.view(1, 3, 1)) / w.view(1, 3, 1)).sum((0, 2)),
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gb.cpu().double(), dy.sum((0, 2)), rtol=1e-5, atol=1e-5)
    # Half-precision inputs get float32 statistics, and outputs of their own dtype.
    with native():
        m16, s16 = torch.batch_norm_stats(xt.bfloat16(), eps)
        assert m16.dtype == s16.dtype == torch.float32
        assert torch.batch_norm_elemt(xt.bfloat16(), None, None, m16, s16, eps).dtype == torch.bfloat16
        none = torch.batch_norm_backward_reduce(dyt, xt, mean, invstd, None, False, False, False)
        assert all(t.numel() == 0 for t in none)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("final_norm", [False, True])
def test_transformer_encoder_inference_with_a_padding_mask_as_cpu(batch_first, final_norm):
    # Eval + no grad + src_key_padding_mask: PyTorch's fast path packs the batch into a
    # strided nested tensor, which tpu refused (NotImplementedError); the same values now
    # come from the dense batch, padded positions zeroed as the nested path leaves them.
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=batch_first)
    enc = torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(16) if final_norm else None).eval()
    x = torch.randn(2, 6, 16) if batch_first else torch.randn(6, 2, 16)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, -3:] = True
    with torch.inference_mode():
        want = enc(x, src_key_padding_mask=pad)
        enc.to("tpu")
        got = enc(x.to("tpu"), src_key_padding_mask=pad.to("tpu"))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="strided nested tensors are not supported on tpu"):
        torch._nested_tensor_from_mask(x.to("tpu"), pad.to("tpu"))


def _attention_cases():
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, -3:] = True
    all_pad = torch.zeros(2, 6, dtype=torch.bool)
    all_pad[0] = True  # a sequence of padding only: its rows attend to nothing
    causal = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)
    on = lambda m, d: None if m is None else m.to(d)  # noqa: E731
    return {
        "mha": lambda l, a, x, d: a(x, x, x),
        "mha_padding": lambda l, a, x, d: a(x, x, x, key_padding_mask=on(pad, d)),
        "mha_all_padding": lambda l, a, x, d: a(x, x, x, key_padding_mask=on(all_pad, d)),
        "mha_causal_per_head": lambda l, a, x, d: a(x, x, x, attn_mask=on(causal, d), average_attn_weights=False),
        "mha_both_no_weights": lambda l, a, x, d: a(x, x, x, attn_mask=on(causal, d), key_padding_mask=on(pad, d),
                                                      need_weights=False),  # (out, None)
        "layer": lambda l, a, x, d: l(x),
        "layer_padding": lambda l, a, x, d: l(x, src_key_padding_mask=on(pad, d)),
        "layer_causal": lambda l, a, x, d: l(x, src_mask=on(causal, d)),
    }


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("case", sorted(_attention_cases()))
def test_attention_inference_fast_paths_run_natively_as_cpu(case, norm_first):
    # Eval + no grad: nn.MultiheadAttention and nn.TransformerEncoderLayer call fused
    # native kernels that only CPU and CUDA implement; on tpu they ran on the CPU fallback.
    from conftest import no_fallbacks
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, norm_first=norm_first,
                                             activation="gelu" if norm_first else "relu").eval()
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 6, 16)
    fn = _attention_cases()[case]
    with torch.inference_mode():
        want = fn(layer, mha, x, "cpu")
        with no_fallbacks():
            got = fn(layer.to("tpu"), mha.to("tpu"), x.to("tpu"), "tpu")
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,),
                    strict=True):
        if w is None:  # no weights asked for: None, as CPU's kernel returns
            assert g is None
            continue
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_max_unpool_refuses_an_index_outside_its_plane():
    # A negative index wrapped (-1 wrote the last element); one past the plane raised an
    # IndexError from index_put. CPU raises RuntimeError (CUDA a device assert).
    x = torch.ones(1, 1, 2, 2)
    for bad in (-1, 99):
        idx = torch.tensor([[[[0, 1], [2, bad]]]])
        with pytest.raises(RuntimeError, match="Found an invalid max index"):
            F.max_unpool2d(x, idx, 2)
        with pytest.raises(RuntimeError, match="Found an invalid max index"):
            F.max_unpool2d(x.to("tpu"), idx.to("tpu"), 2).cpu()
    idx = torch.tensor([[[[0, 3], [9, 15]]]])
    assert torch.equal(F.max_unpool2d(x.to("tpu"), idx.to("tpu"), 2).cpu(), F.max_unpool2d(x, idx, 2))


def test_convolution_checks_its_arguments_as_cpu():
    # The rule sits on `convolution`, above at::_convolution's checks: wrong-length
    # parameters were taken as they came (or failed in XLA), empty kernels and spatial
    # dims gave results.
    z = torch.zeros
    conv = torch.ops.aten.convolution
    calls = [
        lambda d: F.conv2d(z(1, 3, 5, 5, device=d), z(4, 3, 3, 3, device=d), padding=(1, 1, 1)),
        lambda d: F.conv2d(z(1, 3, 5, 5, device=d), z(4, 3, 3, 3, device=d), stride=(1, 1, 1)),
        lambda d: F.conv2d(z(1, 3, 5, 5, device=d), z(4, 3, 3, 3, device=d), dilation=(1, 1, 1)),
        lambda d: F.conv2d(z(1, 3, 5, 5, device=d), z(4, 3, 0, 3, device=d)),
        lambda d: F.conv2d(z(1, 3, 5, 5, device=d), z(0, 3, 3, 3, device=d)),
        lambda d: F.conv2d(z(1, 3, 0, 5, device=d), z(4, 3, 3, 3, device=d), padding=2),
        lambda d: F.conv2d(z(1, 3, 5, 5, device=d), z(4, 3, 3, 3, device=d), stride=0),
        lambda d: F.conv2d(z(1, 3, 5, 5, device=d), z(4, 3, 3, 3, device=d), dilation=0),
        lambda d: conv(z(1, 3, 5, 5, device=d), z(4, 3, 3, 3, device=d), None, [1, 1], [-1, 0], [1, 1], False, [0, 0], 1),
        lambda d: conv(z(1, 3, 5, 5, device=d), z(3, 2, 3, 3, device=d), None, [2, 2], [0, 0], [1, 1], True, [-1, 0], 1),
        lambda d: F.conv_transpose2d(z(1, 3, 5, 5, device=d), z(3, 0, 3, 3, device=d)),
    ]
    for i, call in enumerate(calls):
        with pytest.raises(RuntimeError) as want:
            call("cpu")
        with pytest.raises(RuntimeError) as got:
            call("tpu").cpu()
        if i < 3 or 4 <= i <= 9:
            assert str(got.value) == str(want.value), i
    # What CPU accepts still runs: an empty batch or channel dim.
    for shapes in (((0, 3, 0, 5), (4, 3, 3, 3)), ((1, 0, 0, 5), (4, 0, 3, 3))):
        want = F.conv2d(z(shapes[0]), z(shapes[1]), padding=2)
        assert F.conv2d(z(shapes[0], device="tpu"), z(shapes[1], device="tpu"), padding=2).cpu().shape == want.shape


def test_unfold_backward_broadcasts_its_gradient():
    # istft under torch.compile builds its window envelope this way, a batch of 1
    # against the signal's batch.
    g = torch.randn(1, 17, 16)
    want = torch.ops.aten.unfold_backward(g, [2, 80], 1, 16, 4)
    got = torch.ops.aten.unfold_backward(g.to("tpu"), [2, 80], 1, 16, 4).cpu()
    torch.testing.assert_close(got, want)
    spec = torch.stft(torch.randn(2, 64), 16, 4, window=torch.hann_window(16), return_complex=True)
    fn = torch.compile(lambda s, w: torch.istft(s, 16, 4, window=w, length=64), backend="tpu")
    torch.testing.assert_close(fn(spec.to("tpu"), torch.hann_window(16, device="tpu")).cpu(),
                               torch.istft(spec, 16, 4, window=torch.hann_window(16), length=64), rtol=1e-4, atol=1e-5)
