"""Sparse COO tensors on tpu, compared with CPU: construction, coalesce, conversions,
arithmetic with a sparse operand, nn.Embedding(sparse=True) gradients and the optimizers
that take sparse gradients (SparseAdam, SGD, Adagrad); unsupported layouts and ops raise
errors that name them. Each test runs in Strict (DEFER_NEVER) and DeferAndFuse modes."""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from conftest import no_fallbacks

EagerMode = torch_tpu.EagerMode


@pytest.fixture(params=[EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE], ids=["strict", "fused"], autouse=True)
def mode(request):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse invariant checks")
        with torch_tpu.set_eager_mode(request.param):
            yield request.param


def close(got, want, **kw):
    """got (tpu) equals want (CPU): layout, and for sparse the coalesced flag, indices
    and values after coalescing."""
    assert got.device.type == "tpu"
    assert got.layout == want.layout
    got = got.cpu()
    assert got.device.type == "cpu"
    if want.is_sparse:
        assert got.is_coalesced() == want.is_coalesced()
        assert got.sparse_dim() == want.sparse_dim() and got.dense_dim() == want.dense_dim()
        got, want = got.coalesce(), want.coalesce()
        torch.testing.assert_close(got._indices(), want._indices())
        torch.testing.assert_close(got._values(), want._values(), **kw)
    else:
        torch.testing.assert_close(got, want, **kw)


def coo(dev, dense_dims=False, dtype=torch.float32):
    """An uncoalesced 3x4 COO tensor (duplicate entries, unsorted), optionally with a
    dense dim of 2."""
    i = torch.tensor([[2, 0, 1, 2, 0], [3, 1, 0, 3, 2]])
    v = torch.arange(1.0, 6.0, dtype=dtype)
    size = (3, 4)
    if dense_dims:
        v = torch.stack([v, -2 * v], 1)
        size = (3, 4, 2)
    return torch.sparse_coo_tensor(i, v, size).to(dev)


# ---- construction and metadata ----

def test_construct_and_metadata():
    with no_fallbacks():
        for dd in (False, True):
            c, t = coo("cpu", dd), coo("tpu", dd)
            assert t.device.type == "tpu" and t.is_sparse and t.layout == torch.sparse_coo
            assert t._nnz() == c._nnz() == 5
            assert (t.sparse_dim(), t.dense_dim()) == (c.sparse_dim(), c.dense_dim())
            assert not t.is_coalesced()
            assert t._indices().device.type == "tpu" and t._values().device.type == "tpu"
            torch.testing.assert_close(t._indices().cpu(), c._indices())
            torch.testing.assert_close(t._values().cpu(), c._values())
            close(t, c)


def test_factory_on_device():
    i = torch.tensor([[0, 2, 1]])
    v = torch.tensor([1.0, 2.0, 3.0])
    with no_fallbacks():
        t = torch.sparse_coo_tensor(i.to("tpu"), v.to("tpu"), (4,))
        close(t, torch.sparse_coo_tensor(i, v, (4,)))
        t = torch.sparse_coo_tensor(i, v, device="tpu")  # size inferred
        assert t.shape == (3,) and t.device.type == "tpu"
        e = torch.sparse_coo_tensor(size=(2, 3), device="tpu")
        assert e._nnz() == 0 and e.to_dense().cpu().eq(0).all()
        z = torch.zeros(2, 3, device="tpu", layout=torch.sparse_coo)
        assert z.is_sparse and z._nnz() == 0


def test_coalesce_indices_values():
    with no_fallbacks():
        for dd in (False, True):
            c, t = coo("cpu", dd), coo("tpu", dd)
            tc, cc = t.coalesce(), c.coalesce()
            assert tc.is_coalesced() and tc._nnz() == cc._nnz() == 4
            torch.testing.assert_close(tc.indices().cpu(), cc.indices())
            torch.testing.assert_close(tc.values().cpu(), cc.values())
            assert tc.coalesce() is tc
    with pytest.raises(RuntimeError, match="coalesced"):
        coo("tpu").indices()


def test_to_dense_and_to_sparse():
    with no_fallbacks():
        for dd in (False, True):
            close(coo("tpu", dd).to_dense(), coo("cpu", dd).to_dense())
        x = torch.tensor([[0.0, 1.5, 0.0], [-2.0, 0.0, 3.0]])
        close(x.to("tpu").to_sparse(), x.to_sparse())
        close(x.to("tpu").to_sparse(1), x.to_sparse(1))
        close(x.to("tpu").to_sparse(layout=torch.sparse_coo), x.to_sparse(layout=torch.sparse_coo))
        close(x.to("tpu").to_sparse().to_dense(), x)
        s = x.to("tpu").to_sparse()
        assert s.to_sparse() is s


def test_to_sparse_refuses_what_cpu_refuses():
    x = torch.randn(2, 3)
    for f in (lambda t: t.to_sparse(0), lambda t: t.to_sparse(3), lambda t: t.to_sparse(dense_dim=2)):
        with pytest.raises(RuntimeError) as want:
            f(x)
        with pytest.raises(RuntimeError) as got:
            f(x.to("tpu"))
        assert str(got.value) == str(want.value)
    close(torch.tensor(3.0, device="tpu").to_sparse(0), torch.tensor(3.0).to_sparse(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_rounding_division_of_duplicate_entries(dtype):
    # floor(3/2) + floor(3/2) is not floor(6/2): CPU coalesces before a rounding division.
    def s(dev):
        return torch.sparse_coo_tensor(torch.tensor([[0, 0, 1]]), torch.tensor([3, 3, -3], dtype=dtype), (2,)).to(dev)
    for mode in ("floor", "trunc"):
        with no_fallbacks():
            close(s("tpu").div(2, rounding_mode=mode), s("cpu").div(2, rounding_mode=mode))
            got, want = s("tpu"), s("cpu")
            got.div_(2, rounding_mode=mode), want.div_(2, rounding_mode=mode)
            close(got, want)


def test_device_copies_and_clone():
    c = coo("cpu", True)
    with no_fallbacks():
        t = c.to("tpu")
        close(t, c)
        back = t.to("cpu")
        assert back.is_sparse and back.device.type == "cpu"
        close(t.clone(), c.clone())
        close(t.coalesce().clone(), c.coalesce())
        dst = torch.sparse_coo_tensor(size=(3, 4, 2), device="tpu")
        dst.copy_(c)
        close(dst, c)
        close(t.detach(), c)
        z = t.clone().zero_()
        assert z._nnz() == 0 and z.shape == c.shape


def test_print():
    t, c = coo("tpu"), coo("cpu")
    s = str(t)
    assert "device='tpu:0'" in s and "layout=torch.sparse_coo" in s and "nnz=5" in s
    assert str(c).split("size=")[1] == s.split("size=")[1].replace(", device='tpu:0'", "")
    assert "tensor(indices=" in repr(t.coalesce())


def test_transpose_unsqueeze_unary():
    with no_fallbacks():
        c, t = coo("cpu"), coo("tpu")
        close(t.t(), c.t())
        close(t.coalesce().t().to_dense(), c.t().to_dense())
        close(t.unsqueeze(0), c.unsqueeze(0))
        for f in (torch.neg, torch.abs, torch.sqrt, torch.sin, torch.tanh, torch.sign, torch.floor):
            close(f(t), f(c))
        u = t.clone()
        u.neg_()
        close(u, -c)


def test_reductions_and_shape_ops():
    with no_fallbacks():
        c, t = coo("cpu"), coo("tpu")
        close(t.sum(), c.sum())
        close(t.sum(1), c.sum(1))
        close(torch.sparse.sum(t), torch.sparse.sum(c))
        close(torch.sparse.sum(t, 0), torch.sparse.sum(c, 0))
        close(t.pow(2), c.pow(2))
        close(t.norm(), c.norm())
        close(torch.norm(t, 1, dim=(0, 1)), torch.norm(c, 1, dim=(0, 1)))
        close(t.permute(1, 0), c.permute(1, 0))
        close(torch.cat([t, t], 1), torch.cat([c, c], 1))
        close(t.narrow_copy(1, 1, 2), c.narrow_copy(1, 1, 2))
        close((-t).relu(), (-c).relu())
        close(t.any(), c.any())
        close(torch.mv(t, torch.arange(4.0, device="tpu")), torch.mv(c, torch.arange(4.0)))
        close(t.double(), c.double())
        close(t.half().to_dense(), c.half().to_dense())


# ---- arithmetic with a sparse operand ----

def test_add_dense_sparse():
    d = torch.arange(12.0).reshape(3, 4)
    with no_fallbacks():
        c, t = coo("cpu"), coo("tpu")
        close(d.to("tpu") + t, d + c)
        close(torch.add(d.to("tpu"), t, alpha=-0.5), torch.add(d, c, alpha=-0.5))
        close(d.to("tpu") - t, d - c)
        x = d.to("tpu")
        x.add_(t, alpha=2)
        close(x, d.clone().add_(c, alpha=2))
        # into a view (a parameter's row range)
        big = torch.zeros(5, 4)
        tb = big.to("tpu")
        tb[1:4].add_(t)
        big[1:4].add_(c)
        close(tb, big)
        dd = torch.ones(3, 4, 2)
        close(dd.to("tpu") + coo("tpu", True), dd + coo("cpu", True))
        # integer dense + float sparse promotes
        close(torch.ones(3, 4, dtype=torch.long).to("tpu") + t, torch.ones(3, 4, dtype=torch.long) + c)
    with pytest.raises(RuntimeError, match=r"add\(sparse, dense\) is not supported"):
        coo("tpu") + d.to("tpu")
    with pytest.raises(RuntimeError, match="same size"):
        torch.ones(2, 2, device="tpu") + coo("tpu")


def test_add_sparse_sparse_and_accumulate():
    with no_fallbacks():
        c, t = coo("cpu"), coo("tpu")
        c2 = torch.sparse_coo_tensor(torch.tensor([[1, 0], [1, 1]]), torch.tensor([10.0, 20.0]), (3, 4))
        t2 = c2.to("tpu")
        close(t + t2, c + c2)
        close(t.coalesce() + t.coalesce(), c.coalesce() + c.coalesce(), check_dtype=True)
        close(t - t2, c - c2)
        u, v = t.clone(), c.clone()
        u.add_(t2, alpha=3)
        v.add_(c2, alpha=3)
        close(u, v)
        close(t + torch.sparse_coo_tensor(size=(3, 4), device="tpu"), c + torch.sparse_coo_tensor(size=(3, 4)))


def test_mul_div_sparse_mask():
    d = torch.arange(1.0, 13.0).reshape(3, 4)
    with no_fallbacks():
        for dd in (False, True):
            c, t = coo("cpu", dd), coo("tpu", dd)
            close(t * 2.5, c * 2.5)
            close(3 * t, 3 * c)
            close(t / 4, c / 4)
            close(t.coalesce() * t.coalesce(), c.coalesce() * c.coalesce())
            u, v = t.clone(), c.clone()
            u.mul_(0.5)
            v.mul_(0.5)
            close(u, v)
            u.div_(2)
            v.div_(2)
            close(u, v)
        c, t = coo("cpu"), coo("tpu")
        close(t * d.to("tpu"), c * d)
        close(d.to("tpu").sparse_mask(t.coalesce()), d.sparse_mask(c.coalesce()))
        close(d.to("tpu").sparse_mask(t), d.sparse_mask(c))
        other = torch.sparse_coo_tensor(torch.tensor([[2, 1, 0], [3, 0, 0]]), torch.tensor([5.0, 6.0, 7.0]), (3, 4))
        close(other.to("tpu").sparse_mask(t.coalesce()), other.sparse_mask(c.coalesce()))
        dd = torch.randn(3, 4, 2)
        close(dd.to("tpu").sparse_mask(coo("tpu", True).coalesce()), dd.sparse_mask(coo("cpu", True).coalesce()))


def test_sparse_mm():
    torch.manual_seed(0)
    m = torch.randn(4, 5)
    with no_fallbacks():
        c, t = coo("cpu"), coo("tpu")
        close(torch.sparse.mm(t, m.to("tpu")), torch.sparse.mm(c, m))
        close(t @ m.to("tpu"), c @ m)
        close(torch.mm(t, m.to("tpu")), torch.mm(c, m))
        b = torch.randn(3, 5)
        close(torch.addmm(b.to("tpu"), t, m.to("tpu"), beta=0.5, alpha=2.0),
              torch.addmm(b, c, m, beta=0.5, alpha=2.0))
        # gradient flows to the dense operand
        mt = m.to("tpu").requires_grad_()
        mc = m.clone().requires_grad_()
        torch.sparse.mm(t, mt).pow(2).sum().backward()
        torch.sparse.mm(c, mc).pow(2).sum().backward()
        close(mt.grad, mc.grad)


# ---- embeddings and optimizers ----

def test_embedding_sparse_grad():
    idx = torch.tensor([[1, 2, 2], [7, 1, 0]])
    with no_fallbacks():
        for padding_idx in (None, 2):
            grads = {}
            for dev in ("cpu", "tpu"):
                torch.manual_seed(0)
                emb = nn.Embedding(10, 4, sparse=True, padding_idx=padding_idx).to(dev)
                emb(idx.to(dev)).pow(2).sum().backward()
                emb(idx[:1].to(dev)).sum().backward()  # accumulates a second sparse grad
                assert emb.weight.grad.is_sparse
                grads[dev] = emb.weight.grad
            close(grads["tpu"], grads["cpu"])
        w = torch.randn(10, 3)
        wt = w.to("tpu").requires_grad_()
        wc = w.clone().requires_grad_()
        F.embedding(idx.to("tpu"), wt, sparse=True).sum().backward()
        F.embedding(idx, wc, sparse=True).sum().backward()
        close(wt.grad, wc.grad)


@pytest.mark.parametrize("kw", [dict(mode="sum"), dict(mode="mean", padding_idx=4), dict(mode="sum", psw=True)])
def test_embedding_bag_sparse_grad(kw):
    kw = dict(kw)
    psw = kw.pop("psw", False)
    grads = {}
    with no_fallbacks():
        for dev in ("cpu", "tpu"):
            torch.manual_seed(0)
            eb = nn.EmbeddingBag(10, 3, sparse=True, **kw).to(dev)
            args = (torch.tensor([1, 2, 4, 5, 4], device=dev), torch.tensor([0, 2], device=dev))
            w = torch.arange(1.0, 6.0, device=dev) if psw else None
            eb(*args, per_sample_weights=w).pow(2).sum().backward()
            grads[dev] = eb.weight.grad
    assert grads["tpu"].is_sparse
    close(grads["tpu"], grads["cpu"])


def _train(dev, make_opt, steps=3, padding_idx=None):
    torch.manual_seed(0)
    emb = nn.Embedding(12, 5, sparse=True, padding_idx=padding_idx).to(dev)
    opt = make_opt(emb.parameters())
    batches = [torch.tensor([[1, 2, 2, 5]]), torch.tensor([[0, 11, 5, 5]]), torch.tensor([[3, 2, 9, 1]])]
    for b in batches[:steps]:
        opt.zero_grad()
        emb(b.to(dev)).pow(2).sum().backward()
        opt.step()
    return emb.weight.detach(), opt


@pytest.mark.parametrize("name,make_opt", [
    ("sparse_adam", lambda p: torch.optim.SparseAdam(p, lr=0.1)),
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.1)),
    ("sgd_foreach", lambda p: torch.optim.SGD(p, lr=0.1, foreach=True)),
    ("sgd_momentum", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    ("adagrad", lambda p: torch.optim.Adagrad(p, lr=0.1)),
    ("adagrad_decay", lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)),
])
def test_optimizer_sparse_grads(name, make_opt):
    want, opt_c = _train("cpu", make_opt)
    with no_fallbacks():
        got, opt_t = _train("tpu", make_opt)
    close(got, want, rtol=1e-5, atol=1e-6)
    for sc, st in zip(opt_c.state.values(), opt_t.state.values()):
        for k, v in sc.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                close(st[k], v, rtol=1e-5, atol=1e-6)


def test_embedding_padding_idx_sparse_adam():
    want, _ = _train("cpu", lambda p: torch.optim.SparseAdam(p, lr=0.05), padding_idx=2)
    with no_fallbacks():
        got, _ = _train("tpu", lambda p: torch.optim.SparseAdam(p, lr=0.05), padding_idx=2)
    close(got, want, rtol=1e-5, atol=1e-6)


# ---- clear errors ----

def test_compressed_layouts_refused():
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]], device="tpu")
    for conv, name in ((lambda: x.to_sparse_csr(), "SparseCsr"), (lambda: x.to_sparse_csc(), "SparseCsc"),
                       (lambda: x.to_sparse_bsr((1, 1)), "SparseBsr"), (lambda: x.to_sparse_bsc((1, 1)), "SparseBsc"),
                       (lambda: x.to_sparse(layout=torch.sparse_csr), "SparseCsr")):
        with pytest.raises(NotImplementedError, match=f"{name} layout is not supported on tpu"):
            conv()
    with pytest.raises(NotImplementedError, match="layout is not supported on tpu"):
        torch.sparse_csr_tensor(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.tensor([1.0, 2.0]),
                                (2, 2), device="tpu")
    with pytest.raises(NotImplementedError, match="layout is not supported on tpu"):
        torch.sparse_csr_tensor(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.tensor([1.0, 2.0]),
                                (2, 2)).to("tpu")
    with pytest.raises(NotImplementedError, match="layout is not supported on tpu"):
        coo("tpu").to_sparse_csr()


def test_unsupported_coo_op_named():
    t = coo("tpu")
    with pytest.raises(NotImplementedError, match=r"aten::index_select is not supported for sparse COO tensors on "
                                                  r"tpu.*to_dense\(\)"):
        t.index_select(0, torch.tensor([0], device="tpu"))
    with pytest.raises(RuntimeError, match=r"sparse @ sparse is not supported on tpu"):
        torch.mm(t, t.t())
    with pytest.raises(RuntimeError, match="divides by a scalar only"):
        t / torch.ones(3, 4, device="tpu")


def test_grads_of_a_sparse_leaf():
    m = torch.randn(4, 2)
    for f in (lambda s, m: s.to_dense().pow(2).sum(),
              lambda s, m: torch.sparse.mm(s, m).pow(2).sum(),
              lambda s, m: torch.sparse.addmm(torch.ones(3, 2, device=m.device), s, m).sum()):
        grads = {}
        with no_fallbacks():
            for dev in ("cpu", "tpu"):
                s = coo("cpu").coalesce().to(dev).requires_grad_()
                f(s, m.to(dev)).backward()
                grads[dev] = s.grad
        close(grads["tpu"], grads["cpu"])
