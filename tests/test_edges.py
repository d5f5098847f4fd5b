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
        if isinstance(r, torch.Tensor):
            r = r.cpu()
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
    "expand_uniform_": lambda d: _ar(4, d).expand(3, 4).uniform_(),
    "expand_index_add_": lambda d: _ar(4, d).expand(3, 4).index_add_(1, torch.tensor([0], device=d), torch.ones(3, 1, device=d)),
}

ALLOWED = {  # CPU accepts these: same result
    "full_add_": lambda d: (lambda x: (x.add_(x), x)[1])(_ar(8, d)),
    "full_mul_out": lambda d: (lambda x: (torch.mul(x, x, out=x), x)[1])(_ar(8, d)),
    "expand_fill_": lambda d: (lambda x: (x.expand(3, 4).fill_(2), x)[1])(_ar(4, d)),
    "expand_zero_": lambda d: (lambda x: (x.expand(3, 4).zero_(), x)[1])(_ar(4, d)),
    "expand_masked_fill_": lambda d: (lambda x: (x.expand(3, 4).masked_fill_(
        torch.tensor([True, False, True, False], device=d), 5.), x)[1])(_ar(4, d)),
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
