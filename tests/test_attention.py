"""Attention on tpu beyond the op tests: flex_attention eager and compiled, forward and
backward, against a float64 reference on the CPU (PyTorch's own device check refused tpu),
and scaled_dot_product_attention's shape errors at the call."""
import math

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch_tpu  # noqa: F401

B, H, HKV, L, D = 2, 4, 2, 16, 8


def reference(q, k, v, causal, bias, gqa):
    """softmax(q k^T / sqrt(D) + bias(i - j), causal) v in float64."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    kk, vv = (t.repeat_interleave(H // t.size(1), 1) if gqa else t for t in (k, v))
    s = q @ kk.transpose(-1, -2) / math.sqrt(D)
    i = torch.arange(L)
    s = s + (i[:, None] - i[None, :]) * bias
    if causal:
        s = s.masked_fill(i[:, None] < i[None, :], float("-inf"))
    out = s.softmax(-1) @ vv
    out.sum().backward()
    return out, q.grad, k.grad, v.grad


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
def test_flex_attention_matches_a_float64_reference(compiled, gqa):
    torch.manual_seed(0)
    q = torch.randn(B, H, L, D)
    k, v = (torch.randn(B, HKV if gqa else H, L, D) for _ in range(2))
    bias = 0.1
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, L, L, device="tpu", BLOCK_SIZE=8)
    fn = torch.compile(flex_attention, backend="tpu") if compiled else flex_attention
    qt, kt, vt = (t.to("tpu").requires_grad_() for t in (q, k, v))
    out = fn(qt, kt, vt, score_mod=lambda s, b, h, qi, ki: s + (qi - ki) * bias, block_mask=mask,
             enable_gqa=gqa)
    out.sum().backward()
    want = reference(q, k, v, True, bias, gqa)
    for got, w in zip((out, qt.grad, kt.grad, vt.grad), want):
        torch.testing.assert_close(got.detach().cpu().double(), w, rtol=1e-4, atol=1e-5)


def test_flex_attention_without_a_mask_and_its_lse_match_the_reference():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, H, L, D) for _ in range(3))
    out, lse = flex_attention(*(t.to("tpu") for t in (q, k, v)), return_lse=True)
    want = reference(q, k, v, False, 0.0, False)[0]
    torch.testing.assert_close(out.cpu().double(), want.detach(), rtol=1e-4, atol=1e-5)
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(D)
    torch.testing.assert_close(lse.cpu().double(), s.logsumexp(-1), rtol=1e-4, atol=1e-5)


def test_other_devices_keep_pytorchs_check():
    q = torch.randn(1, 1, 4, 8, device="meta")
    with pytest.raises(ValueError, match="FlexAttention is only supported on"):
        flex_attention(q, q, q)


@pytest.mark.parametrize("case", ["mask", "head_dim", "kv_length"])
def test_sdpa_shape_errors_are_raised_at_the_call(case):
    """The lowering only failed to compile at the next read, as an unrelated op's error
    (s46 attention probe); CPU raises at the call. (CPU itself does not check key/value
    lengths: its kernel corrupts memory, so that case has tpu's own message.)"""
    import torch.nn.functional as F
    q = torch.randn(2, 3, 5, 8)
    k, v, mask = q, q, None
    if case == "mask":
        mask = torch.ones(3, 5, dtype=torch.bool)
    elif case == "head_dim":
        k, v = torch.randn(2, 3, 7, 4), torch.randn(2, 3, 7, 8)
    else:
        k, v = torch.randn(2, 3, 7, 8), torch.randn(2, 3, 6, 8)
    if case != "kv_length":
        with pytest.raises(RuntimeError) as cpu:
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        want = str(cpu.value)
    else:
        want = "key and value must have the same sequence length, but got 7 and 6"
    t = lambda x: None if x is None else x.to("tpu")  # noqa: E731
    with pytest.raises(RuntimeError) as got:
        F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(mask))
    assert want in str(got.value)
    assert torch.ones(2, device="tpu").add(1).cpu().tolist() == [2.0, 2.0]


def test_sdpa_kernel_choices_are_honored():
    """sdpa_kernel([MATH]) runs the math path; flash/efficient/cuDNN (a CUDA script's
    choice) the fused kernel; nothing enabled that fits raises as CPU does."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    q = torch.randn(2, 2, 6, 8)
    want = F.scaled_dot_product_attention(q, q, q)
    x = q.to("tpu")
    fused = "_scaled_dot_product_fused_attention_overrideable"
    for backends, uses_fused in (([SDPBackend.MATH], False), ([SDPBackend.FLASH_ATTENTION], True),
                                 ([SDPBackend.EFFICIENT_ATTENTION], True), ([SDPBackend.OVERRIDEABLE], True)):
        with sdpa_kernel(backends), Ops() as ops:
            out = F.scaled_dot_product_attention(x, x, x)
        assert (fused in ops.seen) == uses_fused, (backends, ops.seen)
        torch.testing.assert_close(out.cpu(), want)
    # Dropout and grouped-query heads need the math path here; CUDA's flash kernel takes
    # them, so flash alone runs them (on math) while a mask beside them still raises.
    kv = x[:, :1].contiguous()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        assert F.scaled_dot_product_attention(x, x, x, dropout_p=0.5).shape == x.shape
        torch.testing.assert_close(F.scaled_dot_product_attention(x, kv, kv, enable_gqa=True).cpu(),
                                   F.scaled_dot_product_attention(q, q[:, :1], q[:, :1], enable_gqa=True))
        with pytest.raises(RuntimeError, match="No viable backend for scaled_dot_product_attention"):
            F.scaled_dot_product_attention(x, kv, kv, enable_gqa=True, attn_mask=torch.ones(6, 6, device="tpu"))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):  # no dropout in CUDA's cuDNN kernel either
        with pytest.raises(RuntimeError, match="No viable backend for scaled_dot_product_attention"):
            F.scaled_dot_product_attention(x, x, x, dropout_p=0.5)
    assert F.scaled_dot_product_attention(x, x, x, dropout_p=0.5).shape == x.shape


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_on_jagged_nested_tensors_matches_per_sequence_attention(causal):
    """Jagged NJTs (the layout torch_tpu recommends) raised on tpu: PyTorch's path converts
    them to strided nested tensors. Reference: each sequence's dense attention on the CPU."""
    import torch.nn.functional as F
    torch.manual_seed(0)
    q_lens, kv_lens = (3, 5, 2), (3, 5, 2) if causal else (4, 1, 6)
    qs = [torch.randn(n, 2, 8) for n in q_lens]
    ks = [torch.randn(n, 2, 8) for n in kv_lens]
    vs = [torch.randn(n, 2, 8) for n in kv_lens]

    def njt(parts):
        return torch.nested.nested_tensor([p.to("tpu") for p in parts], layout=torch.jagged,
                                          requires_grad=True)
    q, k, v = njt(qs), njt(ks), njt(vs)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=causal).transpose(1, 2)
    (out.values() * torch.arange(out.values().numel(), device="tpu").view_as(out.values()).sin()).sum().backward()
    for i in range(3):
        a, b, c = (t[i].clone().requires_grad_() for t in (qs, ks, vs))
        o = F.scaled_dot_product_attention(a.transpose(0, 1), b.transpose(0, 1), c.transpose(0, 1),
                                           is_causal=causal).transpose(0, 1)
        torch.testing.assert_close(out.unbind()[i].detach().cpu(), o.detach(), rtol=1e-4, atol=1e-5)
        start = sum(q_lens[:i]) * 16
        (o * torch.arange(start, start + o.numel()).view_as(o).sin()).sum().backward()
        for nt, ref in ((q, a), (k, b), (v, c)):
            torch.testing.assert_close(nt.grad.unbind()[i].cpu(), ref.grad, rtol=1e-4, atol=1e-5)


def test_jagged_sdpa_pads_key_and_value_alike_and_checks_its_inputs():
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    lens = (3, 6, 2)
    parts = [[torch.randn(n, 2, 4, generator=g) for n in lens] for _ in range(3)]

    def njt(ps, heads=2):
        return torch.nested.nested_tensor([p[:, :heads].to("tpu") for p in ps], layout=torch.jagged).transpose(1, 2)
    q, k = njt(parts[0]), njt(parts[1])
    # value without a cached max_seqlen pads to its token count, key to its longest
    # sequence: they were padded to different lengths (6 and 11) and refused.
    v = torch.nested.nested_tensor_from_jagged(torch.cat(parts[2]).to("tpu"), k.offsets()).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v)
    for i in range(3):
        want = F.scaled_dot_product_attention(*(p[i].transpose(0, 1) for p in parts))
        torch.testing.assert_close(out.unbind()[i].cpu(), want, rtol=1e-4, atol=1e-5)
    # A batch or head count of 1 was broadcast by the padded dense call; CPU refuses.
    one = njt([parts[1][0]])
    with pytest.raises(RuntimeError, match="batch size"):
        F.scaled_dot_product_attention(q, one, one)
    with pytest.raises(RuntimeError, match="heads"):
        F.scaled_dot_product_attention(q, njt(parts[1], 1), njt(parts[2], 1))
    with pytest.raises(ValueError, match="same dtype"):
        F.scaled_dot_product_attention(q, k.double(), v)


def test_jagged_layout_helpers_check_their_offsets():
    dense = torch.randn(2, 3, 2, device="tpu")
    values = torch.randn(10, 3, device="tpu")
    cases = [
        (lambda: torch.ops.aten._padded_dense_to_jagged_forward(dense, [torch.tensor([0, 4, 5], device="tpu")], 5),
         "longer than the max length"),
        (lambda: torch.ops.aten._padded_dense_to_jagged_forward(dense, [torch.tensor([0, 2, 5], device="tpu")], 7),
         "final offset should match total_L"),
        (lambda: torch.ops.aten._jagged_to_padded_dense_forward(values, [torch.tensor([0, 5, 12], device="tpu")], [5]),
         "past the 10 values"),
    ]
    for fn, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            fn().cpu()
    ok = torch.ops.aten._padded_dense_to_jagged_forward(dense, [torch.tensor([0, 2, 5], device="tpu")], 5).cpu()
    assert ok.shape == (5, 2)


def test_sdpa_under_vmap_and_per_sample_grads_as_cpu():
    """vmap over 4-D SDPA (per-sample gradients, ensembles, MultiheadAttention) raised:
    the fused op has no batching rule, so functorch transforms take the math path, also
    where only a fused backend is enabled (CUDA's fused ops batch)."""
    import torch.nn.functional as F
    from torch.func import grad, vmap
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 1, 2, 4, 8) for _ in range(3))
    loss = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum()
    t = lambda x: x.to("tpu")
    torch.testing.assert_close(vmap(F.scaled_dot_product_attention)(t(q), t(k), t(v)).cpu(),
                               vmap(F.scaled_dot_product_attention)(q, k, v))
    want = vmap(grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for backends in ([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], [SDPBackend.FLASH_ATTENTION]):
        with sdpa_kernel(backends):
            got = vmap(grad(loss, argnums=(0, 1, 2)))(t(q), t(k), t(v))
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-5)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    params = {n: p.detach() for n, p in mha.named_parameters()}
    x = torch.randn(3, 1, 4, 8)

    def sample_loss(p, xi):
        return torch.func.functional_call(mha, p, (xi, xi, xi), {"need_weights": False})[0].sum()

    want = vmap(grad(sample_loss), in_dims=(None, 0))(params, x)
    mha.to("tpu")
    got = vmap(grad(sample_loss), in_dims=(None, 0))({n: t(p) for n, p in params.items()}, t(x))
    for n in want:
        torch.testing.assert_close(got[n].cpu(), want[n], rtol=1e-4, atol=1e-5)
