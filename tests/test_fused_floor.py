"""Issue 18, the fused step's distance from its contraction floor: what the fused GPT
step spends besides its contractions, removed where it was ours.

Fresh memory per execution: on the XLA CPU plugin every execution allocates its outputs
and a temporary buffer of the program's size from malloc. With glibc's defaults those
came from fresh mappings each time (mmap'd blocks, per-thread arenas whose empty heaps
are unmapped), so every step page-faulted and zero-filled its working set again: ~30,000
faults per fused GPT step, ~13 % of its CPU time. csrc/runtime/host_heap.cpp sets the
heap at load so executions reuse the pages earlier ones touched (TPU_HOST_HEAP=0: off).
"""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401
from conftest import no_fallbacks, run_python_json

# A fused step of 8 MiB activations: 4 matmuls, their outputs kept, a value read back.
FAULTS_PER_STEP = r"""
import json, resource, torch, torch_tpu
from torch_tpu import EagerMode
torch_tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE)
g = torch.Generator().manual_seed(0)
x = torch.randn(2048, 1024, generator=g).to("tpu")
w = [torch.randn(1024, 1024, generator=g).div_(32).to("tpu") for _ in range(4)]
def step():
    h, outs = x, []
    for m in w:
        h = torch.tanh(h @ m) + h
        outs.append(h * 2)
    return outs, h.sum().item()
for _ in range(12):  # the heap grows to what two steps in flight hold
    keep = step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    keep = step()
per_step = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 10
# The 8 MiB buffers one step writes (its outputs and intermediates), in 4 KiB pages.
print(json.dumps({"faults": per_step, "pages": 2048 * 1024 * 4 * 8 / 4096}))
"""


def test_fused_steps_reuse_host_memory():
    got = run_python_json(FAULTS_PER_STEP)
    # Reused memory faults a small fraction of the pages a step writes (0 measured).
    assert got["faults"] < 0.05 * got["pages"], got


def test_without_the_heap_settings_each_step_faults_its_memory_again():
    """The measure above can fail: with the settings off (as before) the same step
    page-faults most of what it writes, every step."""
    got = run_python_json(FAULTS_PER_STEP, env={"TPU_HOST_HEAP": "0"})
    assert got["faults"] > 0.15 * got["pages"], got  # 3,900 of 16,384 measured


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
