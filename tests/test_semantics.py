"""PyTorch semantics on tpu exactly as on CPU: storage sharing, views, in-place,
copies across devices and dtypes, scalars and promotion, out=, autograd."""
import pytest
import torch

from conftest import no_fallbacks


def same(t, ref, **kw):
    torch.testing.assert_close(t.cpu(), ref, **kw)


def test_write_through_a_slice_changes_the_base():
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    with no_fallbacks():
        y = t[1:3]
        y.add_(1)
    x[1:3].add_(1)
    same(t, x)


def test_views_share_storage_both_ways():
    x = torch.arange(24.0).reshape(2, 3, 4)
    t = x.to("tpu")
    with no_fallbacks():
        v = t.view(6, 4)
        v[2].mul_(10)          # select + in-place through a view
        p = t.permute(2, 0, 1)
        p[0].fill_(-1)         # write through a permuted view
        s = t[:, ::2, 1::2]    # steps
        s.sub_(0.5)
    xv = x.view(6, 4)
    xv[2].mul_(10)
    x.permute(2, 0, 1)[0].fill_(-1)
    x[:, ::2, 1::2].sub_(0.5)
    same(t, x)
    same(v, xv)


def test_transpose_expand_as_strided_read_correctly():
    x = torch.randn(5, 7)
    t = x.to("tpu")
    with no_fallbacks():
        same(t.t() * 1, x.t() * 1)
        same(t[:, :1].expand(5, 4) + 0, x[:, :1].expand(5, 4) + 0)
        same(torch.as_strided(t, (3, 3), (8, 2), 1) + 0, torch.as_strided(x, (3, 3), (8, 2), 1) + 0)
        same(t.reshape(35)[3:30:4] * 2, x.reshape(35)[3:30:4] * 2)


def test_views_of_views_in_place():
    x = torch.arange(64.0).reshape(8, 8)
    t = x.to("tpu")
    with no_fallbacks():
        t[2:6][:, 1:7:2].t()[1].add_(100)
    x[2:6][:, 1:7:2].t()[1].add_(100)
    same(t, x)


def test_copy_across_devices_and_dtypes():
    x = torch.randn(4, 6)
    t = torch.empty(4, 6, dtype=torch.bfloat16, device="tpu")
    t.copy_(x)                                   # cpu f32 -> tpu bf16
    same(t, x.to(torch.bfloat16))
    u = torch.zeros(6, 4, device="tpu", dtype=torch.float64)
    u.copy_(t.t())                               # tpu bf16 transposed -> tpu f64
    same(u, x.to(torch.bfloat16).t().double())
    c = torch.empty(6, 4, dtype=torch.int32)
    c.copy_(u * 10)                              # tpu -> cpu int
    assert torch.equal(c, (x.to(torch.bfloat16).t().double() * 10).int())
    col = torch.zeros(4, 3, device="tpu")
    col[:, 1].copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))  # cpu -> strided tpu view
    same(col, torch.tensor([[0, 1, 0], [0, 2, 0], [0, 3, 0], [0, 4, 0.0]]))
    b = torch.zeros(3, 4, device="tpu")
    b.copy_(torch.arange(4.0))                   # broadcasting copy
    same(b, torch.arange(4.0).expand(3, 4))


def test_zero_dim_and_empty_tensors():
    with no_fallbacks():
        s = torch.tensor(3.5).to("tpu")
        assert (s * 2).item() == 7.0
        assert (s * 2).dim() == 0
        e = torch.empty(0, 4, device="tpu")
        assert (e + 1).shape == (0, 4)
        assert e.sum(0).cpu().tolist() == [0.0] * 4
        assert torch.ones(3, 0, device="tpu").sum().item() == 0.0


def test_type_promotion_with_python_scalars_and_zero_dim():
    i = torch.arange(5, device="tpu")
    f = torch.ones(5, device="tpu", dtype=torch.bfloat16)
    with no_fallbacks():
        assert (i * 2).dtype == torch.int64
        assert (i * 2.5).dtype == torch.float32
        assert (f + 1.5).dtype == torch.bfloat16
        assert (f + torch.tensor(2.0, dtype=torch.float64, device="tpu")).dtype == torch.bfloat16
        assert (i + torch.tensor(2.5).to("tpu")).dtype == torch.float32
        assert (i > 2).dtype == torch.bool
        same(i * 2.5, torch.arange(5) * 2.5)
        same(i / 2, torch.arange(5) / 2)


def test_cpu_scalar_tensor_mixes_in_but_big_cpu_tensor_errors():
    t = torch.ones(3, device="tpu")
    with no_fallbacks():
        same(t * torch.tensor(4.0), torch.full((3,), 4.0))
    with pytest.raises(RuntimeError, match="same device"):
        t + torch.ones(3)
    same(t, torch.ones(3))


def test_out_variants_write_and_resize():
    a = torch.randn(3, 4).to("tpu")
    b = torch.randn(3, 4).to("tpu")
    out = torch.empty(0, device="tpu")
    with no_fallbacks():
        r = torch.add(a, b, out=out)
    assert r is out and out.shape == (3, 4)
    same(out, a.cpu() + b.cpu())
    big = torch.zeros(4, 4, device="tpu")
    torch.mul(a, 2, out=big[1:])
    same(big[1:], a.cpu() * 2)
    same(big[0], torch.zeros(4))


def test_out_of_a_wider_dtype_gets_the_common_dtype_result_cast():
    # CPU computes a pointwise op in its inputs' common dtype and casts into `out`:
    # mul(f32, f32, out=f64) is the f32 product widened, not the f64 product.
    torch.manual_seed(0)
    a, b = torch.randn(64), torch.randn(64)
    i = torch.arange(-3, 5)
    cases = {
        "mul": lambda d, o: torch.mul(a.to(d), b.to(d), out=o),
        "add alpha": lambda d, o: torch.add(a.to(d), b.to(d), alpha=3, out=o),
        "div": lambda d, o: torch.div(a.to(d), b.to(d), out=o),
        "mul scalar": lambda d, o: torch.mul(a.to(d), 2.1, out=o),
        "sin of int": lambda d, o: torch.sin(i.to(d), out=o),
        "eq": lambda d, o: torch.eq(a.to(d), b.to(d), out=o),
    }
    for name, f in cases.items():
        n = 8 if "int" in name else 64
        want = torch.empty(n, dtype=torch.float64)
        f("cpu", want)
        got = torch.empty(n, dtype=torch.float64, device="tpu")
        with no_fallbacks():
            r = f("tpu", got)
        assert r is got, name
        if name == "sin of int":  # CPU's f32 sin varies with the instruction set
            torch.testing.assert_close(got.cpu(), torch.sin(i.to("tpu")).cpu().double(), rtol=0, atol=0)
            torch.testing.assert_close(got.cpu(), want)
        else:  # IEEE f32 arithmetic, widened
            torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, msg=name)
    assert not torch.equal(torch.mul(a.double(), b.double()), torch.mul(a, b).double())  # the test can tell
    with pytest.raises(RuntimeError, match="cast"):
        torch.add(a.to("tpu"), 1, out=torch.empty(64, dtype=torch.int64, device="tpu"))


def test_shape_mismatch_error_names_shapes_and_keeps_tensors():
    a = torch.ones(3, 4, device="tpu")
    b = torch.ones(5, device="tpu")
    # CPU's own message (the sizes that clash), as CPU raises it.
    with pytest.raises(RuntimeError) as cpu_err:
        a.cpu() + b.cpu()
    with pytest.raises(RuntimeError, match=r"size of tensor a \(4\) must match the size of tensor b \(5\)") as err:
        a + b
    assert str(err.value) == str(cpu_err.value)
    assert a.sum().item() == 12.0


def test_autograd_through_views_and_in_place():
    x = torch.randn(4, 5, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    def f(z):
        y = z * 2
        y[:, 1:3].mul_(3)
        return (y.t()[::2] ** 2).sum()
    f(x).backward()
    with no_fallbacks():
        f(xt).backward()
    same(xt.grad, x.grad)


def test_detach_and_clone_semantics():
    t = torch.arange(4.0, device="tpu")
    d = t.detach()
    d.add_(1)                 # detach shares storage
    c = t.clone()
    c.add_(1)                 # clone does not
    same(t, torch.arange(4.0) + 1)
    same(c, torch.arange(4.0) + 2)


def test_int64_wraps_like_cpu():
    big = torch.tensor([2**62, -(2**62)], dtype=torch.int64)
    same((big.to("tpu") * 4), big * 4)


def test_dtype_views_reinterpret_the_storage_bytes():
    x = torch.tensor([1.0, -2.0, 3.5, 0.25])
    t = x.to("tpu")
    with no_fallbacks():
        same(t.view(torch.int32) + 0, x.view(torch.int32))          # same width
        same(t.view(torch.uint8) + 0, x.view(torch.uint8))          # narrower
        same(t.view(torch.float64) * 1, x.view(torch.float64))      # wider
        t.view(torch.int32)[1] = 0                                  # write through a view
        t.view(torch.uint8)[0] = 7
    y = x.clone()
    y.view(torch.int32)[1] = 0
    y.view(torch.uint8)[0] = 7
    same(t, y)
    b = torch.tensor([True, False, True]).to("tpu")
    same(b.view(torch.uint8) + 0, torch.tensor([1, 0, 1], dtype=torch.uint8))


def test_save_load_and_deepcopy():
    import copy
    import io
    m = torch.nn.Linear(3, 2).to("tpu")
    mask = torch.tensor([True, False, True], device="tpu")
    m2 = copy.deepcopy(m)
    assert m2.weight.device.type == "tpu"
    same(m2.weight, m.weight.cpu())
    buf = io.BytesIO()
    torch.save({"sd": m.state_dict(), "mask": mask, "half": m.weight.half()}, buf)
    buf.seek(0)
    back = torch.load(buf)
    assert back["sd"]["weight"].device.type == "tpu"
    same(back["sd"]["weight"], m.weight.cpu())
    same(back["mask"], mask.cpu())
    same(back["half"], m.weight.cpu().half())
    buf.seek(0)
    assert torch.load(buf, map_location="cpu")["sd"]["bias"].device.type == "cpu"


def test_item_of_any_one_element_tensor():
    assert torch.tensor([3.5], device="tpu").item() == 3.5
    assert torch.tensor([[7]], device="tpu").item() == 7
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        torch.ones(2, device="tpu").item()


def test_copying_lazy_conjugate_and_negative_views_to_tpu():
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    assert torch.equal(z.conj().to("tpu").cpu(), z.conj().resolve_conj())
    n = torch._neg_view(torch.tensor([1.0, -2.0]))
    assert torch.equal(n.to("tpu").cpu(), torch.tensor([-1.0, 2.0]))
