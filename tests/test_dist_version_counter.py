"""tpu_dist's collectives and autograd's version counter, as on NCCL.

c10d's in-place collectives (all_reduce, broadcast, recv, ...) carry no alias annotation in
their schema, so no ADInplaceOrView kernel bumps the version of the tensors they write:
NCCL writes the result with raw device writes, and `y = torch.tanh(w); dist.all_reduce(y);
y.sum().backward()` runs (with the reduced y). tpu_dist writes results without a bump on
every path: into the tensor's own host memory (in place), by a write-back of staged host
values, chunk by chunk, and through the device transport. The one bump NCCL makes is its
own copy of all_gather's flat result into an output list of equal pieces: each piece once.

Gloo, run on CPU tensors in the same processes, is the reference where it writes in place
as NCCL does; it bumps where it copies its results (all_gather_into_tensor, reduce_scatter,
all_to_all's list, gather, the coalesced form, AVG's division), and there the expected
bump is NCCL's. Run as a script, this file is a rank process (see test_distributed.py).
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import launch, assert_check, rank_main  # noqa: E402

HERE = os.path.abspath(__file__)
SUITES = {"versions": [], "autograd": []}
BOTH = [("strict", "versions"), ("strict", "autograd"), ("fused", "versions"), ("fused", "autograd")]
LAUNCHES = {
    "in_place": BOTH + [("debug", "versions"), ("debug", "autograd")],
    "staged": BOTH,
    "device": BOTH,
}
# Chunks of 64 bytes on the staged launch: a tensor of 3 chunks or more takes the
# chunked paths (all_reduce, reduce_scatter_tensor), smaller ones the one-copy path.
CHUNK_BYTES = 64


def check(*suites):
    def deco(fn):
        for s in suites:
            SUITES[s].append(fn)
        return fn
    return deco


# ----------------------------------------------------------------------------------------
# The collectives: each takes (rank, world, device) and returns the tensors the
# collective writes on this rank, and the call that writes them.


def _full(shape, value, device, dtype=None):
    import torch
    return torch.full(shape, float(value), device=device, dtype=dtype or torch.float32)


def _all_reduce(rank, world, d):
    import torch.distributed as dist
    x = _full((2, 3), rank + 1, d)
    return [x], lambda: dist.all_reduce(x)


def _all_reduce_avg_async(rank, world, d):
    import torch.distributed as dist
    x = _full((5,), rank + 0.5, d)
    return [x], lambda: dist.all_reduce(x, op=dist.ReduceOp.AVG, async_op=True).wait()


def _all_reduce_into_a_slice(rank, world, d):
    """Part of a storage (staged): the base shares the view's version counter."""
    import torch.distributed as dist
    base = _full((8,), rank + 1, d)
    view = base[2:6]
    return [base, view], lambda: dist.all_reduce(view)


def _all_reduce_of_a_shared_buffer(rank, world, d):
    """A whole-storage copy shares x's buffer: staged, written back whole."""
    import torch
    import torch.distributed as dist
    x = _full((4,), rank + 1, d)
    keep = torch.empty_like(x)
    keep.copy_(x)
    return [x, keep], lambda: dist.all_reduce(x)


def _all_reduce_of_chunks(rank, world, d):
    """Over 3 chunks: chunked where host addresses are off."""
    import torch
    import torch.distributed as dist
    x = torch.arange(3 * CHUNK_BYTES // 4 + 5, device=d, dtype=torch.float32) + rank
    return [x], lambda: dist.all_reduce(x)


def _all_reduce_int_max(rank, world, d):
    import torch
    import torch.distributed as dist
    k = _full((3,), rank + 1, d, torch.int64)
    return [k], lambda: dist.all_reduce(k, op=dist.ReduceOp.MAX)


def _broadcast(rank, world, d):
    import torch.distributed as dist
    x = _full((3,), 7 if rank == 0 else -1, d)
    return [x], lambda: dist.broadcast(x, src=0)


def _reduce(rank, world, d):
    import torch.distributed as dist
    x = _full((3,), rank + 1, d)
    return [x], lambda: dist.reduce(x, dst=0)


def _all_gather(rank, world, d):
    import torch
    import torch.distributed as dist
    outs = [torch.empty(2, device=d) for _ in range(world)]
    return outs, lambda: dist.all_gather(outs, _full((2,), rank, d))


def _all_gather_uneven(rank, world, d):
    """Pieces of different sizes (NCCL broadcasts each into its piece: no copy)."""
    import torch
    import torch.distributed as dist
    outs = [torch.empty(i + 1, device=d) for i in range(world)]
    return outs, lambda: dist.all_gather(outs, _full((rank + 1,), rank, d))


def _all_gather_into_tensor(rank, world, d):
    import torch
    import torch.distributed as dist
    out = torch.empty(world, 2, device=d)
    return [out], lambda: dist.all_gather_into_tensor(out, _full((1, 2), rank, d))


def _reduce_scatter(rank, world, d):
    import torch
    import torch.distributed as dist
    out = torch.empty(2, device=d)
    return [out], lambda: dist.reduce_scatter(out, [_full((2,), rank + i, d) for i in range(world)])


def _reduce_scatter_tensor(rank, world, d):
    import torch
    import torch.distributed as dist
    out = torch.empty(2, device=d)
    return [out], lambda: dist.reduce_scatter_tensor(out, torch.arange(2.0 * world, device=d) + rank)


def _reduce_scatter_tensor_of_chunks(rank, world, d):
    import torch
    import torch.distributed as dist
    m = 3 * CHUNK_BYTES // 4 + 1
    out = torch.empty(m, device=d)
    src = torch.arange(float(world * m), device=d) + rank
    return [out], lambda: dist.reduce_scatter_tensor(out, src)


def _all_to_all_single(rank, world, d):
    import torch
    import torch.distributed as dist
    out = torch.empty(world, device=d)
    return [out], lambda: dist.all_to_all_single(out, torch.arange(float(world), device=d) + 10 * rank)


def _all_to_all(rank, world, d):
    import torch
    import torch.distributed as dist
    outs = [torch.empty(1, device=d) for _ in range(world)]
    return outs, lambda: dist.all_to_all(outs, [_full((1,), 10 * rank + i, d) for i in range(world)])


def _gather(rank, world, d):
    import torch
    import torch.distributed as dist
    outs = [torch.empty(2, device=d) for _ in range(world)] if rank == 0 else []
    return outs, lambda: dist.gather(_full((2,), rank, d), outs if rank == 0 else None, dst=0)


def _scatter(rank, world, d):
    import torch
    import torch.distributed as dist
    out = torch.empty(2, device=d)
    ins = [_full((2,), i, d) for i in range(world)] if rank == 0 else None
    return [out], lambda: dist.scatter(out, ins, src=0)


def _all_reduce_coalesced(rank, world, d):
    import torch.distributed as dist
    a, b = _full((2,), rank, d), _full((1,), 2 * rank, d)
    return [a, b], lambda: dist.all_reduce_coalesced([a, b])


def _send_recv(rank, world, d):
    import torch
    import torch.distributed as dist
    buf = torch.empty(3, device=d)
    if rank == 0:
        return [], lambda: dist.send(_full((3,), 5, d), dst=1)
    return [buf], lambda: dist.recv(buf, src=0)


def _recv_from_any_source(rank, world, d):
    import torch
    import torch.distributed as dist
    buf = torch.empty(2, device=d)
    if rank == 0:
        return [], lambda: dist.send(_full((2,), 6, d), dst=1)
    return [buf], lambda: dist.recv(buf)


def _batch_isend_irecv(rank, world, d):
    import torch
    import torch.distributed as dist
    buf = torch.empty(2, device=d)
    nxt, prv = (rank + 1) % world, (rank - 1) % world

    def call():
        ops = [dist.P2POp(dist.isend, _full((2,), rank + 0.5, d), nxt),
               dist.P2POp(dist.irecv, buf, prv)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
    return [buf], call


# name: (collective, NCCL's bump of each written tensor, Gloo writes in place as NCCL,
# ranks it needs at least)
COLLECTIVES = {
    "all_reduce": (_all_reduce, 0, True, 1),
    "all_reduce_avg_async": (_all_reduce_avg_async, 0, False, 1),  # Gloo divides with div_
    "all_reduce_into_a_slice": (_all_reduce_into_a_slice, 0, True, 1),
    "all_reduce_of_a_shared_buffer": (_all_reduce_of_a_shared_buffer, 0, True, 1),
    "all_reduce_of_chunks": (_all_reduce_of_chunks, 0, True, 1),
    "all_reduce_int_max": (_all_reduce_int_max, 0, True, 1),
    "broadcast": (_broadcast, 0, True, 1),
    "reduce": (_reduce, 0, True, 1),
    "all_gather": (_all_gather, 1, True, 1),
    "all_gather_uneven": (_all_gather_uneven, 0, False, 2),  # Gloo refuses
    "all_gather_into_tensor": (_all_gather_into_tensor, 0, False, 1),
    "reduce_scatter": (_reduce_scatter, 0, False, 1),
    "reduce_scatter_tensor": (_reduce_scatter_tensor, 0, False, 1),
    "reduce_scatter_tensor_of_chunks": (_reduce_scatter_tensor_of_chunks, 0, False, 1),
    "all_to_all_single": (_all_to_all_single, 0, True, 1),
    "all_to_all": (_all_to_all, 0, False, 1),
    "gather": (_gather, 0, False, 1),
    "scatter": (_scatter, 0, True, 1),
    "all_reduce_coalesced": (_all_reduce_coalesced, 0, False, 1),
    "send_recv": (_send_recv, 0, True, 2),
    "recv_from_any_source": (_recv_from_any_source, 0, True, 2),
    "batch_isend_irecv": (_batch_isend_irecv, 0, True, 2),
}


def _run(collective, rank, world, device):
    """The version change of each tensor the collective wrote, and their values."""
    import torch
    written, call = collective(rank, world, device)
    if device == "tpu":
        torch.tpu.synchronize()  # idle: the in-place path where the tensor allows it
    before = [t._version for t in written]
    call()
    return [t._version - v for t, v in zip(written, before)], [t.cpu() for t in written]


@check("versions")
def collectives_leave_versions_as_nccl(rank, world):
    import warnings
    import torch
    import torch_tpu
    in_place = torch_tpu._C._dist_writes_in_place()
    problems = []
    for name, (collective, bump, gloo_as_nccl, ranks) in COLLECTIVES.items():
        if world < ranks:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # all_reduce_coalesced is deprecated
            got, values = _run(collective, rank, world, "tpu")
            gloo, want = (None, None) if name == "all_gather_uneven" else \
                _run(collective, rank, world, "cpu")
        if got != [bump] * len(got):
            problems.append(f"{name}: version changes {got}, NCCL's {[bump] * len(got)}")
        if gloo_as_nccl and gloo is not None and got != gloo:
            problems.append(f"{name}: version changes {got}, Gloo's {gloo}")
        if name == "reduce" and rank != 0:
            want = None  # Gloo leaves partial sums there (NCCL leaves it as it was)
        if want is not None and not all(torch.equal(a, b) for a, b in zip(values, want)):
            problems.append(f"{name}: values {values}, Gloo's {want}")
    assert not problems, "\n".join(problems)
    # Those that could write in place did (where host addresses are on), so that path
    # was checked too.
    if os.environ.get("TPU_DIST_HOST_ADDRESSES") != "0" and \
            os.environ.get("TPU_DIST_TRANSPORT") != "device":
        assert torch_tpu._C._dist_writes_in_place() > in_place


@check("versions")
def collectives_under_inference_mode_and_no_grad(rank, world):
    """Inference tensors have no version counter; a normal tensor written under
    inference_mode or no_grad keeps its version too."""
    import torch
    import torch.distributed as dist
    x = _full((3,), rank + 1, "tpu")
    with torch.inference_mode():
        inf = _full((3,), rank + 1, "tpu")
        dist.all_reduce(inf)
        dist.all_reduce(x)
        outs = [torch.empty(2, device="tpu") for _ in range(world)]
        dist.all_gather(outs, _full((2,), rank, "tpu"))
    with torch.no_grad():
        dist.all_reduce(x)
    assert x._version == 0, x._version
    assert [o.is_inference() for o in outs] == [True] * world
    want = sum(range(1, world + 1))
    assert inf.cpu().tolist() == [want] * 3 and x.cpu().tolist() == [want * world] * 3


# ----------------------------------------------------------------------------------------
# Autograd through tensors a collective wrote: tpu's gradients are CPU/Gloo's.


def _through_collective(rank, world, d, fn, collective, sync):
    """w -> fn(w) = y; the collective writes y (or a part); the gradient of sum(y)."""
    import torch
    import torch.distributed as dist
    g = torch.Generator().manual_seed(3 + rank)
    w = (torch.randn(6, generator=g) * 0.7).to(d).requires_grad_(True)
    y = fn(w)
    if sync and d == "tpu":
        torch.tpu.synchronize()
    v = y._version
    if collective == "all_reduce":
        dist.all_reduce(y)
    elif collective == "all_reduce_async":
        dist.all_reduce(y, async_op=True).wait()
    elif collective == "all_reduce_slice":
        dist.all_reduce(y[1:4])
    elif collective == "broadcast":
        dist.broadcast(y, src=0)
    elif collective == "all_to_all_single":
        dist.all_to_all_single(y, torch.arange(6.0, device=d) * (rank + 1))
    elif collective == "send_recv":
        if rank == 0:
            dist.send(torch.linspace(-1, 1, 6, device=d), dst=1)
        elif rank == 1:
            dist.recv(y, src=0)
    assert y._version == v, (collective, d, v, y._version)
    (y * torch.arange(1.0, 7.0, device=d)).sum().backward()
    return w.grad.cpu(), y.detach().cpu()


@check("autograd")
def backward_through_written_results_matches_gloo(rank, world):
    import torch
    fns = {"tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid, "exp": torch.exp}
    collectives = ["all_reduce", "all_reduce_async", "all_reduce_slice", "broadcast",
                   "all_to_all_single"] + (["send_recv"] if world >= 2 else [])
    problems = []
    for fname, fn in fns.items():
        for collective in collectives:
            for sync in (False, True):
                try:
                    got = _through_collective(rank, world, "tpu", fn, collective, sync)
                except Exception as e:  # noqa: BLE001 (reported per case)
                    problems.append(f"{fname}/{collective}/sync={sync}: {type(e).__name__}: {e}")
                    continue
                want = _through_collective(rank, world, "cpu", fn, collective, sync)
                for what, a, b in zip(("grad", "y"), got, want):
                    if not torch.allclose(a, b, atol=1e-5, rtol=1e-5):
                        problems.append(f"{fname}/{collective}/sync={sync}: {what} {a}, Gloo's {b}")
    assert not problems, "\n".join(problems)


@check("autograd")
def tanh_then_all_reduce_then_backward(rank, world):
    """The report's case, exactly."""
    import torch
    import torch.distributed as dist
    grads = {}
    for d in ("cpu", "tpu"):
        w = torch.tensor([1.0, 2.0, 3.0], device=d, requires_grad=True)
        y = torch.tanh(w)
        dist.all_reduce(y)
        assert y._version == 0, (d, y._version)
        y.sum().backward()
        grads[d] = w.grad.cpu()
    assert torch.allclose(grads["tpu"], grads["cpu"], atol=1e-6), grads


if __name__ == "__main__":
    rank_main(SUITES, LAUNCHES, sys.argv)


# ----------------------------------------------------------------------------------------
# The tests


def _names(launch_name):
    return [f"{m}/{fn.__name__}" for m, suite in LAUNCHES[launch_name] for fn in SUITES[suite]]


@pytest.fixture(scope="module")
def in_place_ranks():
    """Host addresses on (the XLA CPU plugin's buffers are host memory): results written
    into the tensors' own memory where nothing else holds it, else staged."""
    return launch("in_place", 2, script=HERE)


@pytest.mark.parametrize("name", _names("in_place"))
def test_in_place_transport(in_place_ranks, name):
    assert_check(in_place_ranks, name)


@pytest.fixture(scope="module")
def staged_ranks():
    """Device memory never read or written in place: every result staged and written
    back, large ones chunk by chunk."""
    return launch("staged", 2, script=HERE, env={"TPU_DIST_HOST_ADDRESSES": "0",
                                                  "TPU_DIST_CHUNK_BYTES": str(CHUNK_BYTES)})


@pytest.mark.parametrize("name", _names("staged"))
def test_staged_transport(staged_ranks, name):
    assert_check(staged_ranks, name)


@pytest.fixture(scope="module")
def device_rank():
    """The device transport (a one-process group: XLA CPU clients do not span processes)."""
    return launch("device", 1, script=HERE, env={"TPU_DIST_TRANSPORT": "device"})


@pytest.mark.parametrize("name", _names("device"))
def test_device_transport(device_rank, name):
    assert_check(device_rank, name)
