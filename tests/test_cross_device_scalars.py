"""A cpu tensor that an op writes, sent to the tpu backend by a tpu operand or a tpu
Generator among its arguments (the dispatcher takes the highest backend key). A 0-dim cpu
tensor used to pass the 0-dim-cpu-scalar rule as if only read, and then failed where its
storage was read as a tpu one ("this storage is not one the tpu backend made",
NotImplementedError); DataLoader(generator=torch.Generator("tpu")) hit it drawing its base
seed. Now CUDA's RuntimeErrors come before anything is written. fill_ of a cpu tensor from a
tpu value works, as from a cuda one (ATen's fill_ reads value.item())."""
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import no_fallbacks

SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu!"
CPU_GENERATOR = "Expected a 'cpu' device type for generator but found 'tpu'"


def tpu_generator():
    return torch.Generator(device="tpu").manual_seed(0)


@pytest.mark.parametrize("draw", [
    lambda g: torch.empty((), dtype=torch.int64).random_(generator=g),
    lambda g: torch.empty((), dtype=torch.int64).random_(0, 10, generator=g),
    lambda g: torch.empty(()).uniform_(generator=g),
    lambda g: torch.empty(()).normal_(generator=g),
    lambda g: torch.empty(()).bernoulli_(0.5, generator=g),
    lambda g: torch.empty(()).exponential_(generator=g),
    lambda g: torch.rand((), generator=g),
    lambda g: torch.randn((), generator=g),
    lambda g: torch.randint(0, 10, (), generator=g),
    lambda g: torch.empty(4).uniform_(generator=g),  # 1-dim: the same message
    lambda g: torch.randperm(6, generator=g),
], ids=["random_", "random_from_to", "uniform_", "normal_", "bernoulli_", "exponential_", "rand", "randn",
        "randint", "uniform_1d", "randperm"])
def test_cpu_random_op_refuses_a_tpu_generator_like_cuda(draw):
    with pytest.raises(RuntimeError, match=CPU_GENERATOR):
        draw(tpu_generator())


def test_cpu_random_op_leaves_the_tensor_unchanged():
    t = torch.tensor(5, dtype=torch.int64)
    with pytest.raises(RuntimeError, match=CPU_GENERATOR):
        t.random_(generator=tpu_generator())
    assert t.item() == 5
    u = torch.full((), 1.5)
    with pytest.raises(RuntimeError, match=CPU_GENERATOR):
        u.uniform_(generator=tpu_generator())
    assert u.item() == 1.5


def test_dataloader_with_a_tpu_generator_raises_cudas_error():
    # pytorch/pytorch#98792: the same call on CUDA
    with pytest.raises(RuntimeError, match=CPU_GENERATOR):
        next(iter(DataLoader([1, 2, 3], generator=tpu_generator())))
    # still usable, and a cpu generator works
    assert next(iter(DataLoader([1, 2, 3], generator=torch.Generator().manual_seed(0)))).tolist() == [1]


@pytest.mark.parametrize("write", [
    lambda c, a, m: c.add_(a),
    lambda c, a, m: c.mul_(a),
    lambda c, a, m: c.addcmul_(a, a),
    lambda c, a, m: c.lerp_(a, 0.5),
    lambda c, a, m: c.masked_fill_(m, 3.0),
    lambda c, a, m: c.masked_fill_(m, a),
    lambda c, a, m: c.clamp_(min=a),  # no lowering for a cpu self: the CPU fallback's path
    lambda c, a, m: c.copysign_(a),
    lambda c, a, m: torch._foreach_add_([c], [a]),
], ids=["add_", "mul_", "addcmul_", "lerp_", "masked_fill_bool", "masked_fill_value", "clamp_", "copysign_",
        "foreach_add_"])
@pytest.mark.parametrize("shape", [(), (3,)], ids=["0d", "1d"])
def test_cpu_tensor_written_with_tpu_operands_raises_like_cuda(write, shape):
    a = torch.tensor(2.0, device="tpu")
    m = torch.tensor(True, device="tpu")
    c = torch.full(shape, 1.0)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        write(c, a, m)
    assert torch.equal(c, torch.full(shape, 1.0))  # untouched
    assert (a + 1).item() == 3.0  # the process stays usable


def test_cpu_scalar_tensors_still_mix_into_tpu_ops():
    t = torch.tensor([1.0, 2.0, 3.0], device="tpu")
    c = torch.tensor(2.0)
    with no_fallbacks():
        t.add_(c)
        t.mul_(c)
        torch.testing.assert_close(t.cpu(), torch.tensor([6.0, 8.0, 10.0]))
        w = torch.where(t > 7, t, torch.tensor(0.0))
        torch.testing.assert_close(w.cpu(), torch.tensor([0.0, 8.0, 10.0]))
        t.lerp_(torch.zeros(3, device="tpu"), torch.tensor(0.5))
        torch.testing.assert_close(t.cpu(), torch.tensor([3.0, 4.0, 5.0]))
        t.masked_fill_(t > 3.5, torch.tensor(-1.0))
        torch.testing.assert_close(t.cpu(), torch.tensor([3.0, -1.0, -1.0]))
        s = torch.tensor(1.0, device="tpu")
        s.add_(torch.tensor(4.0))
        assert s.item() == 5.0
    assert c.item() == 2.0
    # a cpu 0-dim out with tpu inputs keeps out='s own error
    with pytest.raises(RuntimeError, match="Expected out tensor to have device tpu:0, but got cpu instead"):
        torch.add(s, s, out=torch.empty(()))


@pytest.mark.parametrize("shape", [(), (3,), (2, 2)], ids=["0d", "1d", "2d"])
def test_cpu_fill_from_a_tpu_value_reads_it_like_cuda(shape):
    for dtype, value in [(torch.float32, 2.5), (torch.int64, 7), (torch.bool, True)]:
        c = torch.zeros(shape, dtype=dtype)
        assert c.fill_(torch.tensor(value, device="tpu")) is c
        assert c.device.type == "cpu" and torch.equal(c, torch.full(shape, value, dtype=dtype))
    # cast to self's dtype, as fill_ with a Python number
    c = torch.zeros(shape, dtype=torch.int32)
    c.fill_(torch.tensor(3.75, device="tpu"))
    assert torch.equal(c, torch.full(shape, 3, dtype=torch.int32))


def test_cpu_fill_from_a_tpu_value_refuses_what_cuda_refuses():
    c = torch.zeros(3)
    with pytest.raises(RuntimeError, match="fill_ only supports 0-dimension value tensor but got tensor with 1 dim"):
        c.fill_(torch.ones(1, device="tpu"))
    assert torch.equal(c, torch.zeros(3))
    # a leaf that requires grad refuses the in-place write, as on CPU
    leaf = torch.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        leaf.fill_(torch.tensor(1.0, device="tpu"))


def test_cpu_fill_from_a_tpu_value_under_autograd():
    x = torch.ones(3, requires_grad=True)
    y = x * 2
    y.fill_(torch.tensor(4.0, device="tpu"))
    assert torch.equal(y.detach(), torch.full((3,), 4.0))
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros(3))  # fill_ cuts the gradient, as on CPU


def test_tpu_fill_from_a_cpu_value_still_native():
    t = torch.zeros(3, device="tpu")
    with no_fallbacks():
        t.fill_(torch.tensor(1.5))
        t.fill_(torch.tensor(2.5, device="tpu"))
    assert t.cpu().tolist() == [2.5, 2.5, 2.5]


def test_fill_from_a_value_on_another_tpu_device():
    from conftest import run_python
    r = run_python("""
import torch
a = torch.zeros(3, device="tpu:0")
assert a.fill_(torch.tensor(4.0, device="tpu:1")) is a
assert a.device == torch.device("tpu:0") and a.cpu().tolist() == [4.0, 4.0, 4.0]
print("ok")
""", env={"TPU_NUM_DEVICES": "2"}, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
