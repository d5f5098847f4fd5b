"""Issue 18, the fused step's distance from its contraction floor: what the fused GPT
step spends besides its contractions, removed where it was ours.

"""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401
from conftest import no_fallbacks

# Attention's forward forms exp(s - m) once (read by the row sum and by the dot) and
# divides the (L, E) product by the row sum, instead of forming the (L, S) probabilities
# in a second pass: values stay within CPU's own error of the float64 definition.
def _attention(q, k, v, g, **kw):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, **kw)
    return [o.detach(), *torch.autograd.grad(o, (q, k, v), g)]


@pytest.mark.parametrize("shape,causal", [((2, 3, 256, 64), True), ((1, 2, 100, 32), True),
                                          ((2, 2, 64, 16), False)])
def test_attention_against_float64(shape, causal):
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(shape, generator=gen, dtype=torch.float64) * 2 for _ in range(4))
    want = _attention(q, k, v, g, is_causal=causal)
    cpu = _attention(*(t.float() for t in (q, k, v, g)), is_causal=causal)
    with no_fallbacks():
        got = [t.cpu().double() for t in _attention(*(t.float().to("tpu") for t in (q, k, v, g)), is_causal=causal)]
    for name, a, c, w in zip(("out", "dq", "dk", "dv"), got, cpu, want):
        err, cpu_err = (a - w).abs().max().item(), (c.double() - w).abs().max().item()
        assert err <= 2 * cpu_err + 1e-6, (name, err, cpu_err)


def test_attention_rows_with_every_key_masked_are_zero():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=gen) for _ in range(3))
    mask = torch.ones(8, 8, dtype=torch.bool)
    mask[3] = False  # query 3 sees no key
    with no_fallbacks():
        got = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), attn_mask=mask.to("tpu")).cpu()
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask[:, :].clone())
    assert torch.equal(got[:, :, 3], torch.zeros(1, 2, 4))  # 0, not 0/0
    keep = torch.arange(8) != 3
    torch.testing.assert_close(got[:, :, keep].double(), want[:, :, keep], atol=1e-6, rtol=1e-5)
