"""Op forms the model-compatibility run (python -m torch_tpu.compat) found wrong or falling
back to the CPU, each reduced to the op and input form the model used.

Every test runs with no CPU fallback allowed.
"""
import pytest
import torch

import torch_tpu
from conftest import check, dev, no_fallbacks


@pytest.fixture(autouse=True)
def native():
    with no_fallbacks():
        yield


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def put(x, idx, v, acc=False):
    return torch.ops.aten.index_put(x, list(idx), v, acc)


MASK = torch.tensor([[1, 0, 1, 0, 0], [0, 0, 0, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 1]], dtype=torch.bool)


# ---- index_put with a boolean mask and one value row per selected element ----
# (udop, qwen2_5_omni/qwen3_omni thinkers, xmod: x[mask] = rows, and x[mask]'s backward)

@pytest.mark.parametrize("acc", [False, True])
def test_index_put_mask_rows(acc):
    check(lambda x, m, v: put(x, (m,), v, acc), randn(4, 5, 3), MASK, randn(7, 3, seed=1))


def test_index_put_mask_rows_broadcast_inner():
    check(lambda x, m, v: put(x, (m,), v), randn(4, 5, 3), MASK, randn(7, 1, seed=1))


def test_index_put_mask_on_inner_dim():
    # position_ids[..., i, attention_mask[i]] = llm_positions (qwen2_5_omni's rope index)
    pos = torch.zeros(3, 2, 6, dtype=torch.long)
    mask = torch.tensor([0, 1, 1, 1, 0, 1], dtype=torch.bool)
    check(lambda p, m, v: put(p[:, 1], (None, m), v), pos, mask, torch.arange(12).view(3, 4))
    check(lambda x, m, v: put(x, (None, None, m), v), randn(4, 5, 3), torch.tensor([True, False, True]),
          randn(4, 5, 2, seed=2))


def test_index_put_mask_uint8_and_setitem():
    def f(x, m, v):
        x = x.clone()
        x[m] = v  # new_hidden_states[lang_mask] = adapted (xmod)
        return x
    check(f, randn(4, 5, 3), MASK, randn(7, 3, seed=3))
    check(lambda x, m, v: put(x, (m,), v), randn(4, 5), MASK.to(torch.uint8), randn(7, seed=3))


def test_index_put_mask_selects_nothing():
    check(lambda x, m, v: put(x, (m,), v), randn(4, 5, 3), torch.zeros(4, 5, dtype=torch.bool), randn(0, 3))


def test_mask_index_backward():
    # x[mask]'s backward is index_put(zeros, [mask], grad, accumulate=True) (udop)
    x, w = randn(4, 5, 3), randn(7, 3, seed=4)
    xt = dev(x).requires_grad_()
    (xt[dev(MASK)] * dev(w)).sum().backward()
    xc = x.clone().requires_grad_()
    (xc[MASK] * w).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=0, atol=0)


def test_index_put_mask_count_mismatch_raises():
    x = dev(randn(4, 5, 3))
    with pytest.raises(RuntimeError, match="shape mismatch: value tensor of shape \\[6, 3\\]"):
        put(x, (dev(MASK),), dev(randn(6, 3))).cpu()
        torch_tpu.synchronize()


# ---- index_put with a boolean mask beside integer index tensors ----
# x[mask, idx] = v: the mask stands for its true coordinates, broadcast with idx; idx's
# length fixes the count (the mask selects that many elements, or one, which broadcasts).

ROWS = torch.tensor([True, False, True, False])
COLS = torch.tensor([0, 2])


@pytest.mark.parametrize("acc", [False, True])
def test_index_put_mask_with_index_tensor(acc):
    check(lambda x, m, i, v: put(x, (m, i), v, acc), randn(4, 3), ROWS, COLS, randn(2, seed=1))
    check(lambda x, m, i, v: put(x, (m, i), v, acc), randn(4, 3, 5), ROWS, COLS, randn(2, 5, seed=1))


def test_index_put_mask_with_index_tensor_inner_and_setitem():
    def f(x, m, i):
        x = x.clone()
        x[:, m, i] = 7.0
        return x
    check(f, randn(2, 4, 3), ROWS, COLS)
    check(lambda x, m, i, v: put(x, (m, None, i), v), randn(4, 5, 3), ROWS, COLS, randn(2, 5, seed=2))


def test_index_put_mask_with_index_tensor_one_true_broadcasts():
    one = torch.tensor([False, False, True, False])
    check(lambda x, m, i, v: put(x, (m, i), v), randn(4, 3), one, COLS, randn(2, seed=3))


def test_index_put_mask_with_index_tensor_count_mismatch_raises():
    three = torch.tensor([True, True, True, False])
    with pytest.raises(IndexError, match="shape mismatch: indexing tensors could not be broadcast"):
        put(randn(4, 3), (three, COLS), randn(2))
    with pytest.raises(IndexError, match="shape mismatch: indexing tensors could not be broadcast"):
        put(dev(randn(4, 3)), (dev(three), dev(COLS)), dev(randn(2))).cpu()
        torch_tpu.synchronize()


# ---- conditioning the run found: tpu must stay at float64's answer ----

def test_group_norm_one_element_groups_is_exact():
    # grounding-dino's input_proj_vision: GroupNorm(32, 32) over a 1x1 map. Each group
    # holds one value, so x - mean is exactly 0 and the output is the bias; CPU's float32
    # kernel leaves ~6e-6 of rounding there, which flips the query top-k's ties
    # downstream (CPU 1.13 from float64 at the model output, tpu 6e-7).
    x = randn(2, 32, 1, 1) * 3
    w, bias = randn(32, seed=1), randn(32, seed=2)
    want = torch.nn.functional.group_norm(x.double(), 32, w.double(), bias.double(), 1e-5)
    got = torch.nn.functional.group_norm(dev(x), 32, dev(w), dev(bias), 1e-5).cpu()
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)


def test_masked_scatter_uint8_mask_raises_as_cpu():
    # Found beside the index_put work by the conformance tool's error inputs.
    x, src, m = randn(4, 5), randn(20, seed=1), MASK.to(torch.uint8)
    with pytest.raises(RuntimeError, match="masked_scatter_ only supports boolean masks"):
        x.masked_scatter(m, src)
    with pytest.raises(RuntimeError, match="masked_scatter_ only supports boolean masks, but got mask with dtype Byte"):
        dev(x).masked_scatter(dev(m), dev(src)).cpu()


def test_masked_fill_with_a_cpu_scalar_tensor_value():
    # LightGlue: `mask.masked_fill(m == 0, torch.tensor(False))`; CUDA takes a 0-dim CPU
    # value, and so must tpu, natively (PyTorch's meta reference refused it beside a meta tensor).
    x = torch.tensor([True, False, True, True])
    m = torch.tensor([1, 0, 0, 2])
    f = torch.randn(4, 3)
    with no_fallbacks():
        got = x.to("tpu").masked_fill(m.to("tpu") == 0, torch.tensor(False)).cpu()
        got_f = f.to("tpu").masked_fill(m.to("tpu")[:, None] == 0, torch.tensor(-2.5)).cpu()
        got_i = f.to("tpu").clone().masked_fill_(m.to("tpu")[:, None] > 0, torch.tensor(7)).cpu()
    assert torch.equal(got, x.masked_fill(m == 0, torch.tensor(False)))
    assert torch.equal(got_f, f.masked_fill(m[:, None] == 0, torch.tensor(-2.5)))
    assert torch.equal(got_i, f.clone().masked_fill_(m[:, None] > 0, torch.tensor(7)))
    with pytest.raises(RuntimeError, match="0-dim|0-dimensional"):
        f.to("tpu").masked_fill(m.to("tpu")[:, None] == 0, torch.tensor([1.0, 2.0]))
