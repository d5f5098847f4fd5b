"""Compiled training of a model with sparse-gradient embeddings and dense parameters
(its backward returns a sparse COO gradient: the graph is not replayed, it runs as
recorded), and segment_reduce's checks of its segments when !unsafe (raised at the call,
as CPU and CUDA read them on the host)."""
import pytest
import torch
import torch.nn as nn

import torch_tpu
from torch_tpu import EagerMode

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING, EagerMode.DEFER_AND_FUSE]


class SparseAndDense(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(10, 4, sparse=True)
        self.emb = nn.Embedding(10, 4, sparse=True)
        self.lin = nn.Linear(3, 4)

    def forward(self, x, idx, offsets):
        a = self.bag(idx, offsets)
        e = self.emb(idx[:2])
        return ((a + self.lin(x)) * e).sum()


def train(device, compiled, steps=3):
    torch.manual_seed(0)
    model = SparseAndDense().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fn = torch.compile(model, backend="tpu") if compiled else model
    x = torch.randn(2, 3)
    idx, offsets = torch.tensor([1, 2, 3, 4, 1]), torch.tensor([0, 2])
    losses, grads = [], []
    for step in range(steps):
        opt.zero_grad()
        loss = fn((x + step).to(device), ((idx + step) % 10).to(device), offsets.to(device))
        loss.backward()
        losses.append(loss.detach().cpu())
        assert model.bag.weight.grad.is_sparse and model.emb.weight.grad.is_sparse
        grads.append([p.grad.to_dense().cpu() for p in model.parameters()])
        opt.step()
    return losses, grads, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("mode", [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE], ids=["strict", "fused"])
def test_compiled_training_with_sparse_grads_matches_cpu(mode):
    torch._dynamo.reset()
    want = train("cpu", compiled=False)
    with torch_tpu.set_eager_mode(mode):
        got = train("tpu", compiled=True)
    for w, g in zip(want, got):
        for a, b in zip(w, g):
            if isinstance(a, list):
                for p, q in zip(a, b):
                    torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-5)
            else:
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_a_compiled_graph_taking_a_sparse_tensor_runs():
    torch._dynamo.reset()
    i = torch.tensor([[0, 1, 2], [2, 0, 1]])
    sp = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0, 3.0]), (3, 3), check_invariants=True)
    x = torch.randn(3, 2)
    fn = torch.compile(lambda s, y: torch.sparse.mm(s, y * 2) + 1, backend="tpu")
    for _ in range(2):  # a second call would replay
        got = fn(sp.to("tpu"), x.to("tpu"))
    torch.testing.assert_close(got.cpu(), torch.sparse.mm(sp, x * 2) + 1)


# ---- segment_reduce(unsafe=False) ----

def cpu_error(fn):
    with pytest.raises(Exception) as e:
        fn("cpu")
    return type(e.value), str(e.value)


def segment_reduce_on(data, **segs):
    def call(device):
        kw = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in segs.items()}
        return torch.segment_reduce(data.to(device), "sum", **kw)
    return call


BAD = {
    "short": dict(lengths=torch.tensor([2, 2])),
    "long": dict(lengths=torch.tensor([1, 1, 1, 1, 1, 1])),
    "negative": dict(lengths=torch.tensor([7, -2])),
    "negative_int32": dict(lengths=torch.tensor([7, -2], dtype=torch.int32)),
    "empty": dict(lengths=torch.tensor([], dtype=torch.long)),
    "offsets_decreasing": dict(offsets=torch.tensor([0, 4, 2])),
}


@pytest.mark.parametrize("mode", MODES, ids=["strict", "debug", "fused"])
@pytest.mark.parametrize("case", list(BAD))
def test_bad_segments_raise_at_the_call_as_cpu(mode, case):
    call = segment_reduce_on(torch.ones(5), **BAD[case])
    etype, message = cpu_error(call)
    with torch_tpu.set_eager_mode(mode):
        with pytest.raises(etype) as e:
            call("tpu")  # at the call: nothing else reads a value
        assert str(e.value).splitlines()[0] == message.splitlines()[0]
        # The process stays usable.
        good = segment_reduce_on(torch.arange(5.0), lengths=torch.tensor([2, 0, 3]))
        torch.testing.assert_close(good("tpu").cpu(), good("cpu"))


@pytest.mark.parametrize("mode", MODES, ids=["strict", "debug", "fused"])
def test_rows_of_2d_lengths_are_each_checked(mode):
    data = torch.arange(10.0).reshape(2, 5)
    bad = segment_reduce_on(data, lengths=torch.tensor([[2, 3], [1, 3]]), axis=1)
    etype, message = cpu_error(bad)
    good = segment_reduce_on(data, lengths=torch.tensor([[2, 3], [1, 4]]), axis=1)
    with torch_tpu.set_eager_mode(mode):
        with pytest.raises(etype, match=r"Expected all rows of lengths along axis"):
            bad("tpu")
        torch.testing.assert_close(good("tpu").cpu(), good("cpu"))


@pytest.mark.parametrize("mode", MODES, ids=["strict", "debug", "fused"])
def test_unsafe_skips_the_checks(mode):
    # Lengths summing short of the data: CPU reads the first 4 elements; no check runs.
    call = segment_reduce_on(torch.arange(5.0), lengths=torch.tensor([2, 2]), unsafe=True)
    with torch_tpu.set_eager_mode(mode):
        torch.testing.assert_close(call("tpu").cpu(), call("cpu"))


def test_good_segments_with_grads_still_match_cpu():
    data = torch.randn(6, 3)
    out = {}
    for device in ("cpu", "tpu"):
        x = data.to(device).detach().requires_grad_()
        y = torch.segment_reduce(x, "mean", lengths=torch.tensor([1, 0, 5]).to(device), initial=0.5)
        y.sum().backward()
        out[device] = (y.detach().cpu(), x.grad.cpu())
    for a, b in zip(out["cpu"], out["tpu"]):
        torch.testing.assert_close(b, a)
