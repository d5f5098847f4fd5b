"""torch.compile of attention on jagged nested tensors, and nn.TransformerEncoder's
padding-mask check, on tpu. Run in Strict and with TPU_DEFER_AND_FUSE=1."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from conftest import all_fallbacks

TOL = dict(rtol=1e-5, atol=1e-5)


class Block(nn.Module):
    """q/k/v projections, attention over (B, H, j, D) jagged tensors, output projection."""

    def __init__(self, causal=False):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(16, 16) for _ in range(4))
        self.causal = causal

    def forward(self, x):
        q, k, v = (p(x).unflatten(-1, (2, 8)).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o(y.transpose(1, 2).flatten(-2)) + x


def jagged(parts, device):
    return torch.nested.nested_tensor([p.to(device) for p in parts], layout=torch.jagged, requires_grad=True)


def run_and_backward(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # backend="tpu": the nested graph runs eagerly, warned
        out = model(x)
    out.values().pow(2).sum().backward()
    return out


def assert_same_step(got, x_got, model_got, want, x_want, model_want):
    torch.testing.assert_close(got.values().cpu(), want.values().cpu(), **TOL)
    torch.testing.assert_close(x_got.grad.values().cpu(), x_want.grad.values().cpu(), **TOL)
    for (name, p), w in zip(model_got.named_parameters(), model_want.parameters()):
        torch.testing.assert_close(p.grad.cpu(), w.grad.cpu(), **TOL, msg=lambda m: f"{name}: {m}")


# Two batches with other sizes and lengths: the longest length is symbolic in the graph
# (PyTorch marks it dynamic); fixing it to one batch's value raised Dynamo's
# ConstraintViolationError on tpu with every backend, where CPU compiles.
LENGTHS = [(3, 6, 2), (5, 2, 4, 7)]


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "tpu"])
def test_compiled_attention_on_jagged_tensors_matches_cpu(backend):
    torch.manual_seed(0)
    model = Block()
    torch._dynamo.reset()
    on_tpu = copy.deepcopy(model).to("tpu")
    compiled = torch.compile(on_tpu, backend=backend)
    before = torch_tpu.metrics()["compiled_eager_graphs"]
    for lengths in LENGTHS:
        parts = [torch.randn(n, 16) for n in lengths]
        reference = copy.deepcopy(model)
        x_cpu, x_tpu = jagged(parts, "cpu"), jagged(parts, "tpu")
        want = run_and_backward(reference, x_cpu)
        got = run_and_backward(compiled, x_tpu)
        assert_same_step(got, x_tpu, on_tpu, want, x_cpu, reference)
        on_tpu.zero_grad(set_to_none=True)
    if backend == "tpu":  # the documented fallback: the graph runs eagerly, counted
        assert torch_tpu.metrics()["compiled_eager_graphs"] > before


@pytest.mark.parametrize("backend", ["aot_eager", "tpu"])
def test_compiled_causal_attention_on_jagged_tensors_matches_eager(backend):
    """CPU refuses causal jagged attention: the reference is tpu's eager run (itself
    checked against per-sequence attention in test_attention.py)."""
    torch.manual_seed(0)
    model = Block(causal=True).to("tpu")
    torch._dynamo.reset()
    on_tpu = copy.deepcopy(model)
    compiled = torch.compile(on_tpu, backend=backend)
    for lengths in LENGTHS:
        parts = [torch.randn(n, 16) for n in lengths]
        x_eager, x_compiled = jagged(parts, "tpu"), jagged(parts, "tpu")
        want = run_and_backward(model, x_eager)
        got = run_and_backward(compiled, x_compiled)
        assert_same_step(got, x_compiled, on_tpu, want, x_eager, model)
        model.zero_grad(set_to_none=True)
        on_tpu.zero_grad(set_to_none=True)


# ---- torch._nested_tensor_from_mask_left_aligned (TransformerEncoder's mask_check) ----

MASKS = {
    "left aligned": [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]],
    "a gap": [[1, 0, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]],
    "right aligned": [[0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]],
    "all tokens": [[1] * 4] * 3,
    "all padding": [[0] * 4] * 3,
}


def d2h_bytes():
    return torch_tpu.metrics()["d2h_bytes"]


@pytest.mark.parametrize("name", MASKS)
def test_mask_check_reads_the_mask_on_the_device_not_the_input(name):
    """It answers as CPU does; the input stays on the device (the CPU fallback copied all
    of it to the host), only the answer is read back, and nothing falls back."""
    x = torch.randn(3, 4, 4096)
    mask = torch.tensor(MASKS[name], dtype=torch.bool)
    want = torch._nested_tensor_from_mask_left_aligned(x, mask)
    x_t, mask_t = x.to("tpu"), mask.to("tpu")
    torch.tpu.synchronize()
    fallbacks, read = all_fallbacks(), d2h_bytes()
    got = torch._nested_tensor_from_mask_left_aligned(x_t, mask_t)
    assert got is want
    assert all_fallbacks() == fallbacks
    assert d2h_bytes() - read < mask.numel() * 8 < x.nbytes


@pytest.mark.parametrize("x, mask", [
    (torch.randn(2, 4, 3), torch.ones(2, 4)),
    (torch.randn(2, 4, 3), torch.ones(2, 4, 1, dtype=torch.bool)),
    (torch.randn(4, 3), torch.ones(2, 4, dtype=torch.bool)),
    (torch.randn(2, 4, 3), torch.ones(3, 4, dtype=torch.bool)),
    (torch.randn(2, 0, 3), torch.ones(2, 0, dtype=torch.bool)),
], ids=["float mask", "3-d mask", "2-d input", "sizes differ", "no positions"])
def test_mask_check_refuses_what_cpu_refuses(x, mask):
    with pytest.raises(Exception) as cpu:
        torch._nested_tensor_from_mask_left_aligned(x, mask)
    with pytest.raises(cpu.type) as tpu:
        torch._nested_tensor_from_mask_left_aligned(x.to("tpu"), mask.to("tpu"))
    assert str(tpu.value).splitlines()[0] == str(cpu.value).splitlines()[0]


def test_mask_check_of_no_sequences_is_true_as_on_cpu():
    x, mask = torch.randn(0, 4, 3), torch.ones(0, 4, dtype=torch.bool)
    assert torch._nested_tensor_from_mask_left_aligned(x, mask) is True
    assert torch._nested_tensor_from_mask_left_aligned(x.to("tpu"), mask.to("tpu")) is True


@pytest.mark.parametrize("padding", ["right", "left"])
def test_encoder_fast_path_with_mask_check_runs_without_fallbacks(padding):
    """Right padding takes the (dense on tpu) nested fast path, left padding fails the check
    and takes the layer path; both as on CPU, and the check falls back no more."""
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2,
                                enable_nested_tensor=True, mask_check=True).eval()
    x = torch.randn(3, 6, 16)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    for row, n in enumerate((6, 4, 2)):
        if padding == "right":
            pad[row, n:] = True
        else:
            pad[row, :6 - n] = True
    enc_t = copy.deepcopy(enc).to("tpu")
    with torch.no_grad():
        want = enc(x, src_key_padding_mask=pad)
        fallbacks = all_fallbacks()
        got = enc_t(x.to("tpu"), src_key_padding_mask=pad.to("tpu")).cpu()
    assert all_fallbacks() == fallbacks
    keep = ~pad  # CPU's output at padded positions differs by path; tokens' rows must agree
    torch.testing.assert_close(got[keep], want[keep], **TOL)
    if padding == "right":
        torch.testing.assert_close(got[pad], want[pad], **TOL)
