"""tpu_dist collectives across processes (one process per device, as under torchrun).

Each launch spawns its ranks once (127.0.0.1, a free port, a short PG timeout) and runs
suites of checks in them, each suite under an eager mode (Strict, Debug, DeferAndFuse,
switched with torch_tpu.set_eager_mode); every check reports per rank as "MODE/check",
and each pytest test asserts one. Run as a script, this file is the rank process:
`test_distributed.py LAUNCH RANK WORLD PORT OUTDIR`.
"""
import datetime
import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import pytest

HERE = os.path.abspath(__file__)
PG_TIMEOUT_S = 10


# ----------------------------------------------------------------------------------------
# The harness (pytest side)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(suite, world, env=None, timeout=150, script=HERE):
    """Runs `suite` of `script` in `world` rank processes; returns {rank: {check: result}}
    (plus "__rc" and "__out", the exit code and output tail)."""
    # The free port is free when picked, not always when rank 0's store listens on it:
    # another test's processes (Gloo opens many connections) can take it in between.
    # Such a launch ran nothing: it runs again on another port.
    for _ in range(3):
        results = _launch_once(suite, world, env, timeout, script)
        if not any("EADDRINUSE" in res["__out"] and res["__rc"] != 0 for res in results.values()):
            break
    return results


def _launch_once(suite, world, env, timeout, script):
    port, outdir = _free_port(), tempfile.mkdtemp(prefix="tpu_dist_")
    e = dict(os.environ, **(env or {}))
    procs = [subprocess.Popen([sys.executable, script, suite, str(r), str(world), str(port), outdir],
                              env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    deadline, outs = time.time() + timeout, []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1, deadline - time.time()))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"suite {suite} hung past {timeout}s: " + p.communicate()[0][-3000:])
    results = {}
    for r in range(world):
        path = os.path.join(outdir, f"rank{r}.json")
        results[r] = json.load(open(path)) if os.path.exists(path) else {}
        results[r]["__rc"], results[r]["__out"] = procs[r].returncode, outs[r][-3000:]
        results[r]["__outdir"] = outdir
    return results


def assert_check(results, name, ranks=None):
    for r, res in results.items():
        if ranks is not None and r not in ranks:
            continue
        assert name in res, f"rank {r} did not run {name} (rc {res['__rc']}):\n{res['__out']}"
        assert res[name] == "ok", f"rank {r}, {name}:\n{res[name]}"


# ----------------------------------------------------------------------------------------
# The checks (rank side). Each takes (rank, world); tensors are tiny.

SUITES = {}


def check(*suites):
    def deco(fn):
        for s in suites:
            SUITES.setdefault(s, []).append(fn)
        return fn
    return deco


def _t(values, dtype=None):
    import torch
    return torch.tensor(values, dtype=dtype or torch.float32, device="tpu")


def _eq(a, b, tol=0.0):
    import torch
    assert a.device.type == "tpu", a.device
    a = a.cpu()
    b = torch.as_tensor(b, dtype=a.dtype)
    if a.is_complex():  # real and imaginary parts both compared
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    assert a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=tol, rtol=tol), (a, b)


ALL = ("collectives", "modes")


@check("collectives", "modes", "four")
def all_reduce_ops(rank, world):
    import torch.distributed as dist
    R = dist.ReduceOp
    rs = range(world)
    expect = {
        R.SUM: [0, world, sum(rs), sum(r * r for r in rs)],
        R.MAX: [0, 1, world - 1, (world - 1) ** 2],
        R.MIN: [0, 1, 0, 0],
        R.PRODUCT: [0, 1, 0, 0],
        R.AVG: [0, 1, sum(rs) / world, sum(r * r for r in rs) / world],
    }
    for op, want in expect.items():
        x = _t([0, 1, rank, rank * rank])
        dist.all_reduce(x, op=op)
        _eq(x, want, 1e-6)
    y = _t([rank + 1.0, 2.0])
    dist.all_reduce(y, op=R.PRODUCT)
    _eq(y, [float(functools.reduce(lambda a, b: a * b, [r + 1 for r in rs])), 2.0 ** world])


@check(*ALL)
def all_reduce_bitwise_ints(rank, world):
    import torch
    import torch.distributed as dist
    R = dist.ReduceOp
    vals = [[r + 1, 3 << r, 5 * r] for r in range(world)]
    for op, f in ((R.BAND, lambda a, b: a & b), (R.BOR, lambda a, b: a | b),
                  (R.BXOR, lambda a, b: a ^ b)):
        for dt in (torch.int32, torch.int64):
            x = _t(vals[rank], dt)
            dist.all_reduce(x, op=op)
            _eq(x, [functools.reduce(f, col) for col in zip(*vals)])
    x = _t([rank + 7, 1], torch.int64)
    dist.all_reduce(x, op=R.AVG)  # integers average with truncation
    _eq(x, [sum(r + 7 for r in range(world)) // world, 1])


@check("collectives", "four", "modes")
def all_reduce_dtypes(rank, world):
    import torch
    import torch.distributed as dist
    for dt in (torch.bfloat16, torch.float64, torch.int8):
        x = _t([1, 2], dt)
        dist.all_reduce(x)
        _eq(x, [world, 2 * world])
    b = _t([rank == 0, False], torch.bool)
    dist.all_reduce(b, op=dist.ReduceOp.MAX)
    _eq(b, [True, False])


@check("collectives", "modes", "four")
def all_reduce_large_in_chunks(rank, world):
    """Tensors of 8 MiB or more: where the plugin copies them to the host (the copying
    launch), chunk by chunk (4 MiB, the last partial), each chunk reduced while the next
    is copied; on host-memory buffers, in one call. The result must be whole and in place."""
    import torch
    import torch.distributed as dist
    n = (10 << 20) // 4 + 3
    ramp = torch.arange(n, dtype=torch.float64)
    scale = sum(r + 1 for r in range(world))
    x = torch.arange(n, device="tpu", dtype=torch.float32) * (rank + 1)
    dist.all_reduce(x)
    _eq(x, ramp * scale, 1e-6)
    x = torch.arange(n, device="tpu", dtype=torch.float32) * (rank + 1)
    w = dist.all_reduce(x, op=dist.ReduceOp.AVG, async_op=True)
    w.wait()
    _eq(x, ramp * scale / world, 1e-6)
    i = torch.full((n,), rank, device="tpu", dtype=torch.int32)
    dist.all_reduce(i, op=dist.ReduceOp.MAX)
    _eq(i, torch.full((n,), world - 1))
    # A view into a larger storage: its part is written, the rest left alone.
    big = torch.zeros(2 * n, device="tpu")
    v = big[n:]
    v.fill_(rank + 1.0)
    dist.all_reduce(v)
    assert big[:n].abs().sum().item() == 0
    _eq(v, torch.full((n,), float(scale)))


# Sizes that do not divide into chunks, with TPU_DIST_CHUNK_BYTES=4096 so that they cross
# many chunks cheaply: chunked where the plugin copies (the "copying" launch), in one call
# on host-memory buffers (the "chunks" launch). Every dtype the collectives take (Gloo's:
# not int16 or the unsigned types wider than 8 bits), values checked against float64 /
# exact integer references.
CHUNK_BYTES = 4096


def _chunk_dtypes():
    import torch
    return (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
            torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool)


def _ramp(n, rank, dtype):
    """Small integer values (exact in every dtype): i % 5 + rank, or i % 2 for bool."""
    import torch
    i = torch.arange(n, dtype=torch.int64)
    v = (i % 2 == 1) if dtype == torch.bool else i % 5 + rank
    if dtype.is_complex:
        return torch.complex(v.double(), (i % 3 - rank).double()).to(dtype)
    return v.to(dtype)


@check("chunks")
def chunked_all_reduce_every_dtype(rank, world):
    import torch
    import torch.distributed as dist
    for dt in _chunk_dtypes():
        item = torch.empty((), dtype=dt).element_size()
        n = 3 * CHUNK_BYTES // item + 7  # three whole chunks and a partial one
        op = dist.ReduceOp.MAX if dt == torch.bool else dist.ReduceOp.SUM
        x = _ramp(n, rank, dt).to("tpu")
        dist.all_reduce(x, op=op)
        ref = torch.stack([_ramp(n, r, dt).to(torch.complex128 if dt.is_complex else
                                              torch.float64) for r in range(world)])
        _eq(x, ref.amax(0) if dt == torch.bool else ref.sum(0))
    n = 5 * CHUNK_BYTES // 4 + 1
    x = _ramp(n, rank, torch.float32).to("tpu")
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    ref = torch.stack([_ramp(n, r, torch.float64) for r in range(world)]).mean(0)
    _eq(x, ref, 1e-6)


@check("chunks")
def chunked_reduce_scatter_tensor_every_dtype(rank, world):
    import torch
    import torch.distributed as dist
    for dt in _chunk_dtypes():
        item = torch.empty((), dtype=dt).element_size()
        m = 2 * CHUNK_BYTES // item + 3  # per rank: chunks of CHUNK_BYTES / world each
        op = dist.ReduceOp.MAX if dt == torch.bool else dist.ReduceOp.SUM
        out = torch.empty(m, dtype=dt, device="tpu")
        dist.reduce_scatter_tensor(out, _ramp(world * m, rank, dt).to("tpu"), op=op)
        ref = torch.stack([_ramp(world * m, r, dt).to(torch.complex128 if dt.is_complex else
                                                      torch.float64) for r in range(world)])
        ref = (ref.amax(0) if dt == torch.bool else ref.sum(0))[rank * m:(rank + 1) * m]
        _eq(out, ref)
    m = 3 * CHUNK_BYTES // 4 + 5
    full = torch.stack([_ramp(world * m, r, torch.float64) for r in range(world)])
    for op, ref in ((dist.ReduceOp.AVG, full.mean(0)), (dist.ReduceOp.MIN, full.amin(0))):
        out = torch.empty(m, device="tpu")
        w = dist.reduce_scatter_tensor(out, _ramp(world * m, rank, torch.float32).to("tpu"),
                                       op=op, async_op=True)
        w.wait()
        _eq(out, ref[rank * m:(rank + 1) * m], 1e-6)
    # An input that is a view into a larger storage, an output that is a view, and a
    # 2-D output: the rest of each storage is left alone.
    big = torch.zeros(world * m + 4, device="tpu")
    src = big[4:]
    src.copy_(_ramp(world * m, rank, torch.float32))
    outs = torch.full((2, m), -1.0, device="tpu")
    dist.reduce_scatter_tensor(outs[1], src)
    _eq(outs[0], torch.full((m,), -1.0))
    _eq(outs[1], full.sum(0)[rank * m:(rank + 1) * m])
    assert big[:4].abs().sum().item() == 0
    out2 = torch.empty(m, 1, device="tpu")
    dist.reduce_scatter_tensor(out2, _ramp(world * m, rank, torch.float32).to("tpu").view(-1, 1))
    _eq(out2, full.sum(0)[rank * m:(rank + 1) * m].view(-1, 1))


@check("chunks")
def chunked_collectives_after_pending_work(rank, world):
    """The chunked copy reads the input's buffer: pending (deferred) work writing it runs
    first, and later work sees the result."""
    import torch
    import torch.distributed as dist
    n = 4 * CHUNK_BYTES // 4 + 9
    x = torch.ones(n, device="tpu")
    x.mul_(rank + 1).add_(1.0)  # pending in DeferAndFuse
    dist.all_reduce(x)
    y = x * 2
    want = sum(r + 2.0 for r in range(world))
    _eq(y, torch.full((n,), 2 * want))


@check("collectives", "chunks")
def inputs_read_in_place_or_copied(rank, world):
    """Where the plugin reports host-memory buffers (the XLA CPU plugin does), Gloo reads
    all_gather/send inputs in place; TPU_DIST_HOST_ADDRESSES=0 copies them. Either way
    a collective sees its input as it was when issued, and an input that is a view of
    its output (FSDP's all_gather_into_tensor) is read before the output is written."""
    import torch
    import torch.distributed as dist
    import torch_tpu
    assert torch_tpu._C._dist_host_addresses(torch.tpu.current_device()) is True
    m = 5
    out = torch.zeros(world * m, device="tpu")
    mine = out[rank * m:(rank + 1) * m]
    mine.copy_(torch.arange(m, dtype=torch.float32) + 10 * rank)
    dist.all_gather_into_tensor(out, mine)
    _eq(out, torch.cat([torch.arange(m) + 10.0 * r for r in range(world)]))
    x = _t([rank + 1.0] * 3)
    outs = [torch.empty(3, device="tpu") for _ in range(world)]
    w = dist.all_gather(outs, x, async_op=True)
    x.add_(100.0)  # after issue: not what was sent
    w.wait()
    for r in range(world):
        _eq(outs[r], [r + 1.0] * 3)
    _eq(x, [rank + 101.0] * 3)
    # Point to point, in a ring: read in place on the sender.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    send = torch.arange(6, device="tpu", dtype=torch.float64).view(2, 3)[:, 1:] * (rank + 1)
    recv = torch.empty(2, 2, device="tpu", dtype=torch.float64)
    ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    _eq(recv, torch.tensor([[1.0, 2.0], [4.0, 5.0]]) * (prv + 1))


@check("collectives", "modes")
def all_reduce_in_place_or_staged(rank, world):
    """On host-memory buffers, all_reduce writes into the tensor's own buffer where nothing
    else holds it and the device is idle (no copy either way); otherwise it stages the
    values. Either way only the tensor (and its views) change: a clone sharing its buffer,
    the rest of a storage it is a part of, keep their values."""
    import os
    import torch
    import torch.distributed as dist
    import torch_tpu
    count = torch_tpu._C._dist_writes_in_place
    in_place = os.environ.get("TPU_DIST_HOST_ADDRESSES") != "0"
    want = sum(r + 1.0 for r in range(world))
    x = torch.full((2, 3), rank + 1.0, device="tpu")
    flat = x.view(6)
    assert flat[4].item() == rank + 1.0  # a part read: the storage's host copy is made
    torch.tpu.synchronize()
    before, version = count(), x._version
    dist.all_reduce(x)
    assert count() == before + in_place, (count(), before)
    # Written, in place or staged, as NCCL and Gloo write: autograd's version counter
    # stays as it was (c10d's collectives carry no alias annotation).
    assert x._version == version, (x._version, version)
    assert flat[4].item() == want  # an in-place write dropped that copy
    _eq(x, [[want] * 3] * 2)
    _eq(flat, [want] * 6)  # a view of the storage sees the result
    y = torch.empty_like(x)
    y.copy_(x)  # a whole-storage copy shares x's buffer (values never change): staged
    before = count()
    dist.all_reduce(x)
    assert count() == before, (count(), before)
    _eq(x, [[want * world] * 3] * 2)
    _eq(y, [[want] * 3] * 2)
    # Part of a storage: staged, the rest unchanged.
    big = torch.full((8,), 1.0, device="tpu")
    torch.tpu.synchronize()
    before = count()
    dist.all_reduce(big[2:6])
    assert count() == before, (count(), before)
    _eq(big, [1.0, 1.0] + [float(world)] * 4 + [1.0, 1.0])
    # AVG divides in place; integers too. (Zeros would be a storage not written yet.)
    z = torch.full((5,), rank + 0.5, device="tpu")
    k = torch.full((3,), rank + 1, dtype=torch.int64, device="tpu")
    torch.tpu.synchronize()
    before = count()
    dist.all_reduce(z, op=dist.ReduceOp.AVG)
    dist.all_reduce(k, op=dist.ReduceOp.MAX)
    assert count() == before + 2 * in_place, (count(), before)
    _eq(z, [sum(range(world)) / world + 0.5] * 5)
    _eq(k, [world] * 3)
    # Reduced values feed later programs as any other.
    _eq(z * 2 + k[:1], [2 * sum(range(world)) / world + 1 + world] * 5)


@check("chunks")
def ranks_in_place_and_staged_together(rank, world):
    """Rank 0 stages its tensor (a copy of several 4 KiB chunks' size) while the others
    reduce theirs in place: each makes the same transport calls, none hangs."""
    import os
    import torch
    import torch.distributed as dist
    import torch_tpu
    n = 3 * CHUNK_BYTES // 4 + 5
    x = torch.arange(n, device="tpu", dtype=torch.float32) + rank
    keep = None
    if rank == 0:  # a whole-storage copy shares x's buffer: staged
        keep = torch.empty_like(x)
        keep.copy_(x)
    torch.tpu.synchronize()
    before = torch_tpu._C._dist_writes_in_place()
    dist.all_reduce(x)
    in_place = rank != 0 and os.environ.get("TPU_DIST_HOST_ADDRESSES") != "0"
    assert torch_tpu._C._dist_writes_in_place() == before + in_place
    _eq(x, torch.arange(n, dtype=torch.float64) * world + sum(range(world)))
    if keep is not None:
        _eq(keep, torch.arange(n, dtype=torch.float64))


@check("collectives", "chunks")
def dtypes_gloo_lacks_are_refused(rank, world):
    import torch
    import torch.distributed as dist
    x = _t([1, 2], torch.int16)
    for name, fn in (("all_reduce", lambda: dist.all_reduce(x)),
                     ("all_gather_into_tensor",
                      lambda: dist.all_gather_into_tensor(_t([0] * 2 * world, torch.int16), x)),
                     ("broadcast", lambda: dist.broadcast(x, src=0))):
        try:
            fn()
        except TypeError as e:
            assert f"distributed.{name}()" in str(e) and "Short[2]" in str(e), str(e)
        else:
            raise AssertionError(f"{name} took int16")
    # Nothing was sent: the group and the tensor still work.
    y = x.to(torch.int32)
    dist.all_reduce(y)
    _eq(y, [world, 2 * world])


@check(*ALL)
def all_reduce_async_work(rank, world):
    import torch
    import torch.distributed as dist
    x = _t([rank, 1.0])
    w = dist.all_reduce(x, async_op=True)
    fut = w.get_future()
    assert w.wait() is True and w.is_completed() and w.is_success()
    assert fut.done()  # the future completes before wait() returns
    _eq(x, [sum(range(world)), world])
    (res,) = fut.wait()
    assert res.device.type == "tpu" and torch.equal(res.cpu(), x.cpu())
    # Several in flight at once complete in order.
    xs = [_t([float(rank + i)]) for i in range(4)]
    works = [dist.all_reduce(v, async_op=True) for v in xs]
    for i, (v, w) in enumerate(zip(xs, works)):
        w.wait()
        _eq(v, [sum(range(world)) + world * i])


@check(*ALL)
def broadcast_into_views(rank, world):
    import torch
    import torch.distributed as dist
    x = _t([rank] * 3)
    dist.broadcast(x, src=world - 1)
    _eq(x, [world - 1] * 3)
    # A column of a matrix: only that column changes, in place.
    m = torch.full((3, 4), float(rank), device="tpu")
    col = m[:, 1]
    dist.broadcast(col, src=0)
    want = torch.full((3, 4), float(rank))
    want[:, 1] = 0
    _eq(m, want)


@check(*ALL)
def collective_waited_inside_a_future_callback(rank, world):
    # DDP's PowerSGD hook issues and waits on collectives in a callback of another's
    # future: that callback runs on the thread that completed the first one.
    import torch.distributed as dist
    ranks = sum(range(1, world + 1))
    x, y, z = _t([rank + 1.0] * 3), _t([10.0 * (rank + 1)] * 2), _t([rank + 1.0])

    def waits(fut):
        return dist.all_reduce(y, async_op=True).get_future().wait()[0]

    def synchronous(fut):
        dist.all_reduce(z)
        return z

    _eq(dist.all_reduce(x, async_op=True).get_future().then(waits).wait(), [10.0 * ranks] * 2)
    _eq(x, [ranks] * 3)
    _eq(dist.all_reduce(x, async_op=True).get_future().then(synchronous).wait(), [ranks])
    _eq(x, [ranks * world] * 3)


@check(*ALL)
def collectives_under_inference_mode(rank, world):
    # Outputs made under torch.inference_mode() are inference tensors; the transport's
    # threads write them (and their host staging) outside that mode.
    import torch
    import torch.distributed as dist
    with torch.inference_mode():
        out = torch.empty(2 * world, device="tpu")
        dist.all_gather_into_tensor(out, _t([rank, rank + 0.5]))
        _eq(out, [v for r in range(world) for v in (r, r + 0.5)])
        pieces = [torch.empty(2, device="tpu") for _ in range(world)]
        dist.all_gather(pieces, _t([rank, 1.0]))
        for r, p in enumerate(pieces):
            _eq(p, [r, 1.0])
        rs = torch.empty(2, device="tpu")
        dist.reduce_scatter_tensor(rs, torch.arange(2.0 * world, device="tpu") + rank)
        _eq(rs, [world * (2 * rank + i) + sum(range(world)) for i in range(2)])
        a2a = torch.empty(world, device="tpu")
        dist.all_to_all_single(a2a, torch.arange(float(world), device="tpu") + 10 * rank)
        _eq(a2a, [10 * r + rank for r in range(world)])
        fresh = torch.empty(3, device="tpu")
        if rank == 0:
            fresh.fill_(7.0)
        dist.broadcast(fresh, src=0)
        _eq(fresh, [7.0] * 3)
        big = torch.zeros(6, device="tpu")
        view = big[2:5]
        view.fill_(rank + 1.0)
        dist.all_reduce(view)
        _eq(big, [0, 0] + [sum(range(1, world + 1))] * 3 + [0])
        if world == 2:
            got = torch.empty(2, device="tpu")
            if rank == 0:
                dist.send(_t([3.0, 4.0]), dst=1)
            else:
                dist.recv(got, src=0)
                _eq(got, [3.0, 4.0])


@check(*ALL)
def sync_batch_norm_matches_batch_norm_over_the_whole_batch(rank, world):
    # Each rank normalizes its part of the batch with statistics of the whole batch:
    # outputs, input gradients and running statistics equal BatchNorm2d's over all of it
    # (float64 on the CPU); weight and bias gradients summed over the ranks equal its.
    import torch
    import torch.distributed as dist
    g = torch.Generator().manual_seed(0)
    full = torch.randn(2 * world, 3, 4, 5, generator=g, dtype=torch.float64) * 3 + 1
    dy = torch.randn(full.shape, generator=g, dtype=torch.float64)
    w, b = torch.rand(3, generator=g, dtype=torch.float64) + 0.5, torch.randn(3, generator=g, dtype=torch.float64)
    ref = torch.nn.BatchNorm2d(3, momentum=0.3).double()
    sync = torch.nn.SyncBatchNorm(3, momentum=0.3).to("tpu")
    with torch.no_grad():
        for m in (ref, sync):
            m.weight.copy_(w)
            m.bias.copy_(b)
    xr = full.clone().requires_grad_()
    yr = ref(xr)
    yr.backward(dy)
    part = slice(2 * rank, 2 * rank + 2)
    x = full[part].float().to("tpu").requires_grad_()
    y = sync(x)
    y.backward(dy[part].float().to("tpu"))
    _eq(y, yr[part].detach(), 1e-4)
    _eq(x.grad, xr.grad[part], 1e-4)
    _eq(sync.running_mean, ref.running_mean, 1e-5)
    _eq(sync.running_var, ref.running_var, 1e-4)
    for p, want in ((sync.weight, ref.weight), (sync.bias, ref.bias)):
        grad = p.grad.clone()
        dist.all_reduce(grad)
        _eq(grad, want.grad, 1e-4)


@check(*ALL)
def reduce_to_root(rank, world):
    import torch.distributed as dist
    for dst in (0, world - 1):
        x = _t([rank, 2.0])
        dist.reduce(x, dst=dst)
        if rank == dst:
            _eq(x, [sum(range(world)), 2.0 * world])
    x = _t([rank + 1.0])
    dist.reduce(x, dst=0, op=dist.ReduceOp.AVG)
    if rank == 0:
        _eq(x, [sum(range(1, world + 1)) / world], 1e-6)


@check(*ALL)
def all_gather_forms(rank, world):
    import torch
    import torch.distributed as dist
    outs = [torch.empty(2, device="tpu") for _ in range(world)]
    dist.all_gather(outs, _t([rank, -rank]))
    for i, o in enumerate(outs):
        _eq(o, [i, -i])
    flat = torch.empty(2 * world, device="tpu")
    dist.all_gather_into_tensor(flat, _t([rank, 10 + rank]))
    _eq(flat, [v for i in range(world) for v in (i, 10 + i)])
    stacked = torch.empty(world, 2, device="tpu", dtype=torch.int64)
    dist.all_gather_into_tensor(stacked, _t([rank, 1], torch.int64))
    _eq(stacked, [[i, 1] for i in range(world)])
    # FSDP2's form: 2-D shards stacked along dimension 0, and back.
    full = torch.empty(2 * world, 3, device="tpu")
    dist.all_gather_into_tensor(full, torch.full((2, 3), float(rank), device="tpu"))
    _eq(full, [[float(i)] * 3 for i in range(world) for _ in range(2)])
    shard = torch.empty(2, 3, device="tpu")
    dist.reduce_scatter_tensor(shard, full)
    _eq(shard, [[float(world * rank)] * 3] * 2)
    # Ranks' pieces of different sizes and shapes (rank i sends i + 1 rows of 2), as on NCCL.
    pieces = [torch.empty(i + 1, 2, device="tpu") for i in range(world)]
    dist.all_gather(pieces, torch.full((rank + 1, 2), rank + 0.5, device="tpu"))
    for i, p in enumerate(pieces):
        _eq(p, [[i + 0.5] * 2] * (i + 1))


@check("collectives", "modes", "four")
def reduce_scatter_forms(rank, world):
    import torch
    import torch.distributed as dist
    out = torch.empty(2, device="tpu")
    dist.reduce_scatter(out, [_t([rank + i, 1]) for i in range(world)])
    _eq(out, [sum(range(world)) + world * rank, world])
    big = _t([float(rank * 100 + i) for i in range(2 * world)])
    out = torch.empty(2, device="tpu")
    dist.reduce_scatter_tensor(out, big)
    _eq(out, [sum(r * 100 for r in range(world)) + world * (2 * rank + j) for j in range(2)])
    out = torch.empty(2, device="tpu")
    dist.reduce_scatter_tensor(out, big, op=dist.ReduceOp.AVG)
    _eq(out, [sum(r * 100 for r in range(world)) / world + 2 * rank + j for j in range(2)], 1e-5)
    _eq(big, [float(rank * 100 + i) for i in range(2 * world)])  # read in place, unchanged
    # Ranks' pieces of different sizes (rank i gets i + 1 elements), as on Gloo and NCCL.
    mine = torch.empty(rank + 1, device="tpu")
    dist.reduce_scatter(mine, [_t([float(rank + 10 * i + j) for j in range(i + 1)]) for i in range(world)])
    _eq(mine, [sum(range(world)) + world * (10 * rank + j) for j in range(rank + 1)])
    # This rank's own piece must match its output: refused before anything is sent.
    try:
        dist.reduce_scatter(torch.empty(3, device="tpu"), [_t([1.0, 2.0]) for _ in range(world)])
    except ValueError as e:
        assert "reduce_scatter" in str(e) and "this rank's piece" in str(e), e
    else:
        raise AssertionError("a piece of the wrong size was accepted")


@check("collectives", "modes", "four")
def all_to_all_forms(rank, world):
    import torch
    import torch.distributed as dist
    outs = [torch.empty(1, device="tpu") for _ in range(world)]
    dist.all_to_all(outs, [_t([rank * 10 + i]) for i in range(world)])
    for i, o in enumerate(outs):
        _eq(o, [i * 10 + rank])
    out = torch.empty(world, device="tpu")
    dist.all_to_all_single(out, _t([rank * 10 + i for i in range(world)]))
    _eq(out, [i * 10 + rank for i in range(world)])
    # Uneven: rank r sends r + i + 1 values to rank i.
    send = [r_i for i in range(world) for r_i in [100 * rank + i] * (rank + i + 1)]
    recv_splits = [j + rank + 1 for j in range(world)]
    out = torch.empty(sum(recv_splits), device="tpu")
    dist.all_to_all_single(out, _t(send), output_split_sizes=recv_splits,
                           input_split_sizes=[rank + i + 1 for i in range(world)])
    _eq(out, [v for j in range(world) for v in [100 * j + rank] * (j + rank + 1)])


@check("collectives", "modes", "four")
def gather_scatter(rank, world):
    import torch
    import torch.distributed as dist
    for root in (0, world - 1):
        outs = [torch.empty(2, device="tpu") for _ in range(world)] if rank == root else None
        dist.gather(_t([rank, root]), outs, dst=root)
        if rank == root:
            for i, o in enumerate(outs):
                _eq(o, [i, root])
        out = torch.empty(2, device="tpu")
        ins = [_t([i, root]) for i in range(world)] if rank == root else None
        dist.scatter(out, ins, src=root)
        _eq(out, [rank, root])


@check("collectives", "modes", "four")
def send_recv(rank, world):
    import torch
    import torch.distributed as dist
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    buf = torch.empty(3, device="tpu")
    if rank % 2 == 0:
        dist.send(_t([rank] * 3), dst=nxt)
        dist.recv(buf, src=prv)
    else:
        dist.recv(buf, src=prv)
        dist.send(_t([rank] * 3), dst=nxt)
    _eq(buf, [prv] * 3)
    buf = torch.empty(2, device="tpu")
    reqs = [dist.isend(_t([rank, 1]), dst=nxt), dist.irecv(buf, src=prv)]
    for r in reqs:
        r.wait()
    _eq(buf, [prv, 1])
    ops = [dist.P2POp(dist.isend, _t([rank + 0.5]), nxt),
           dist.P2POp(dist.irecv, buf2 := torch.empty(1, device="tpu"), prv)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    _eq(buf2, [prv + 0.5])


@check(*ALL, "four")
def barrier_and_objects(rank, world):
    import torch.distributed as dist
    dist.barrier()
    objs = [{"rank": rank, "s": "x" * rank}] if rank == 0 else [None]
    dist.broadcast_object_list(objs, src=0)
    assert objs[0] == {"rank": 0, "s": ""}, objs
    got = [None] * world
    dist.all_gather_object(got, ("r", rank))
    assert got == [("r", i) for i in range(world)], got


@check(*ALL)
def coalesced_forms(rank, world):
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager
    a, b = _t([rank, 1.0]), _t([2.0 * rank])
    dist.all_reduce_coalesced([a, b])
    _eq(a, [sum(range(world)), world])
    _eq(b, [2 * sum(range(world))])
    outs = [torch.empty(world * 2, device="tpu") for _ in range(2)]
    rs = [torch.empty(1, device="tpu") for _ in range(2)]
    with _coalescing_manager(async_ops=True) as cm:
        for k in range(2):
            dist.all_gather_into_tensor(outs[k], _t([rank, k]))
    cm.wait()
    with _coalescing_manager(async_ops=True) as cm:
        for k in range(2):
            dist.reduce_scatter_tensor(rs[k], _t([float(k + i) for i in range(world)]))
    cm.wait()
    for k in range(2):
        _eq(outs[k], [v for i in range(world) for v in (i, k)])
        _eq(rs[k], [world * (k + rank)])


@check("collectives", "four", "modes")
def subgroups(rank, world):
    import torch.distributed as dist
    # Every rank creates every group, in the same order (c10d's rule).
    evens, odds = list(range(0, world, 2)), list(range(1, world, 2))
    g_even, g_odd = dist.new_group(evens), dist.new_group(odds)
    mine, members = (g_even, evens) if rank % 2 == 0 else (g_odd, odds)
    x = _t([rank, 1.0])
    dist.all_reduce(x, group=mine)
    _eq(x, [sum(members), len(members)])
    y = _t([rank])
    dist.broadcast(y, src=members[-1], group=mine)
    _eq(y, [members[-1]])
    rev = dist.new_group(list(reversed(range(world))))
    z = _t([rank])
    dist.all_reduce(z, group=rev, op=dist.ReduceOp.MAX)
    _eq(z, [world - 1])


@check("collectives", "four")
def coalescing_manager_with_a_device(rank, world):
    # c10d's _coalescing_manager(group, device): NCCL's way; tpu_dist raised "does not
    # implement startCoalescing". All-reduces inside run as one coalesced call; other
    # collectives run as issued and the manager's work waits for them.
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager
    a, b = _t([rank, 1.0]), _t([2.0 * rank])
    with _coalescing_manager(device=torch.device("tpu")):
        dist.all_reduce(a)
        dist.all_reduce(b)
    total = sum(range(world))
    _eq(a, [total, world])
    _eq(b, [2.0 * total])
    c = _t([rank + 1.0])
    with _coalescing_manager(device=torch.device("tpu"), async_ops=True) as cm:
        dist.broadcast(c, src=world - 1)
    cm.wait()
    _eq(c, [float(world)])


@check("collectives", "four", "modes")
def errors_name_the_collective(rank, world):
    import torch
    import torch.distributed as dist
    x = _t([rank, 1.0])

    def raises(exc, words, fn):
        try:
            fn()
        except exc as e:
            for w in words:
                assert w in str(e), (w, str(e))
            return
        raise AssertionError(f"no {exc.__name__} for {words}")

    premul = dist._make_nccl_premul_sum(2.0)
    raises(ValueError, ["all_reduce", "PREMUL_SUM"], lambda: dist.all_reduce(x, op=premul))
    raises(TypeError, ["all_reduce", "BAND", "Float"],
           lambda: dist.all_reduce(x, op=dist.ReduceOp.BAND))
    flags = torch.tensor([True, rank == 0], device="tpu")
    raises(TypeError, ["all_reduce", "AVG", "boolean"], lambda: dist.all_reduce(flags, op=dist.ReduceOp.AVG))
    _eq(flags, [True, rank == 0])  # refused before anything ran
    raises(ValueError, ["all_gather", "world size", f"{world + 1} output", f"{world} processes"],
           lambda: dist.all_gather([torch.empty(2, device="tpu")] * (world + 1), x))
    raises(ValueError, ["all_gather", "cpu", "tpu_dist"],
           lambda: dist.all_gather([torch.empty(2)] * world, x))
    raises(ValueError, ["all_gather_into_tensor", "world size"],
           lambda: dist.all_gather_into_tensor(torch.empty(3, device="tpu"), x))
    raises(ValueError, ["reduce_scatter_tensor"],
           lambda: dist.reduce_scatter_tensor(torch.empty(3, device="tpu"), x))
    raises(ValueError, ["all_to_all_single", "split sizes"],
           lambda: dist.all_to_all_single(torch.empty(2, device="tpu"), x,
                                          input_split_sizes=[5] * world))
    # Written tensors whose elements alias each other (an expand()ed view).
    wide = torch.full((1,), 2.0, device="tpu").expand(3)
    raises(ValueError, ["all_reduce", "overlap", "clone"], lambda: dist.all_reduce(wide))
    raises(ValueError, ["all_gather_into_tensor", "output", "overlap"],
           lambda: dist.all_gather_into_tensor(torch.empty(1, device="tpu").expand(2 * world), x))
    raises(ValueError, ["broadcast", "overlap"], lambda: dist.broadcast(wide, src=0))
    _eq(wide, [2.0] * 3)
    # Nothing was sent: the group and the tensors still work.
    dist.all_reduce(x)
    _eq(x, [sum(range(world)), world])


@check("collectives", "four", "modes")
def all_to_all_pieces_of_different_sizes(rank, world):
    """NCCL takes all_to_all pieces of different sizes (MoE token routing): rank r sends
    (r + 1) * (j + 1) values to rank j."""
    import torch
    import torch.distributed as dist
    ins = [torch.full(((rank + 1) * (j + 1),), float(10 * rank + j), device="tpu") for j in range(world)]
    outs = [torch.full(((i + 1) * (rank + 1),), -1.0, device="tpu") for i in range(world)]
    dist.all_to_all(outs, ins)
    for i, o in enumerate(outs):
        _eq(o, [10.0 * i + rank] * ((i + 1) * (rank + 1)))


@check("collectives", "four", "modes")
def gather_of_complex_values(rank, world):
    import torch
    import torch.distributed as dist
    x = torch.tensor([complex(rank, 1), complex(2, -rank)], device="tpu")
    outs = [torch.zeros(2, dtype=torch.complex64, device="tpu") for _ in range(world)] if rank == 0 else None
    dist.gather(x, outs, dst=0)
    if rank == 0:
        for r, o in enumerate(outs):
            assert torch.equal(o.cpu(), torch.tensor([complex(r, 1), complex(2, -r)])), (r, o)


@check("collectives", "modes")
def uneven_pending_work(rank, world):
    """Ranks record different work before a collective; none hangs."""
    import torch
    import torch.distributed as dist
    x = torch.ones(4, device="tpu")
    for _ in range(40 if rank == 0 else 1):
        x = x * 1.0 + 0.0
    y = (x * (rank + 1)).sum().reshape(1)
    import torch_tpu
    mode = torch_tpu.get_eager_mode()
    # While deferring, y is still a pending value: the collective materializes it. Strict
    # may still have it queued behind its program's compile; Debug has run it.
    if mode == torch_tpu.EagerMode.DEFER_AND_FUSE:
        assert not torch_tpu._C.is_materialized(y)
    elif mode == torch_tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING:
        assert torch_tpu._C.is_materialized(y)
    dist.all_reduce(y)
    z = y + 1  # recorded after the collective, reading its result
    _eq(z, [4.0 * sum(range(1, world + 1)) + 1])
    if rank == 1:
        dist.barrier()  # rank 1 waits in a barrier while rank 0 still records work
    else:
        w = torch.ones(2, device="tpu")
        for _ in range(20):
            w = w + 1
        dist.barrier()
        _eq(w, [21.0, 21.0])


@check("collectives", "four", "chips")
def device_ids_and_transport(rank, world):
    import torch
    import torch.distributed as dist
    from torch_tpu._internal.distributed import tpu_distributed as td
    # One process per device; TPU_VISIBLE_CHIPS (set from LOCAL_RANK by
    # prepare_tpu_environment) picks it when the process sees several.
    chips = int(os.environ.get("TPU_NUM_DEVICES", "1"))
    assert torch.tpu.device_count() == chips
    assert torch.tpu.current_device() == (rank if chips > 1 else 0)
    assert td.global_device_id() == rank
    assert td.all_global_device_ids() == list(range(world))
    assert td.transport() == "host"
    x = torch.ones(2, device="tpu")
    assert x.device.index == torch.tpu.current_device()
    dist.all_reduce(x)
    _eq(x, [world, world])


# Faults, in one group of 3 ranks (timeout 3 s): rank 2 exits right after a collective,
# rank 1 later stalls. Whatever happens, the others raise in time, never hang.

@check("faults")
def faults(rank, world):
    import torch
    import torch.distributed as dist
    timeout = _pg_timeout()
    # Every rank creates every group; a new group's timeout is its own (not the world's).
    # `patient` outlasts the skew a failed collective leaves between ranks (a rank may
    # learn of the dead peer only at its timeout); `pair` has the short timeout.
    patient = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=timeout + 30))
    pair = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=timeout))
    x = _t([rank, 1.0])
    dist.all_reduce(x)
    if rank == 2:
        os._exit(0)  # no teardown: the others must still finish
    _eq(x, [sum(range(world)), world])

    # A peer that died: the collective fails at once, naming itself.
    y = _t([1.0, 2.0])
    start = time.time()
    try:
        dist.all_reduce(y)
        raise AssertionError("all_reduce with a dead peer returned")
    except (RuntimeError, dist.DistError) as e:
        assert time.time() - start < timeout + 5, time.time() - start  # not the timeout
        assert "tpu_dist all_reduce failed" in str(e), str(e)
    _eq(y + 1, [2.0, 3.0])  # the tensor and the device still work
    dist.all_reduce(y, group=patient)  # a group without the dead rank still works
    _eq(y, [2.0, 4.0])

    # A peer alive but absent: the collective raises after the group's timeout.
    if rank == 1:
        time.sleep(timeout + 6)  # leaving sooner would end rank 0's wait early
        os._exit(0)
    start = time.time()
    try:
        dist.all_reduce(y, group=pair)
        raise AssertionError("all_reduce without its peer returned")
    except (RuntimeError, dist.DistError) as e:
        took = time.time() - start
        assert timeout - 0.5 <= took < timeout + 8, took
        assert "tpu_dist all_reduce failed" in str(e), str(e)
    _eq(y, [2.0, 4.0])  # unchanged and readable
    assert torch.ones(2, device="tpu").sum().item() == 2


@check("exit")
def exit_while_completing(rank, world):
    """The interpreter exits while a collective still completes on the transport's thread
    (a slow callback on its future): the exit waits for it instead of aborting the process
    (a thread that takes the GIL during finalization is torn down mid-C++ frame)."""
    import torch
    import torch.distributed as dist
    marker = os.path.join(os.environ["TPU_DIST_TEST_OUTDIR"], f"callback{rank}")

    def slow(fut):
        time.sleep(0.5)
        open(marker, "w").write(str(fut.value()[0].cpu().tolist()))

    x = torch.full((4,), float(rank + 1), device="tpu")
    dist.all_reduce(x, async_op=True).get_future().then(slow)
    del x
    sys.exit(0)  # no wait, no destroy_process_group


# ----------------------------------------------------------------------------------------
# The rank process


def _pg_timeout():
    return float(os.environ.get("TPU_DIST_TEST_PG_TIMEOUT", PG_TIMEOUT_S))


MODES = {"strict": "DEFER_NEVER", "debug": "DEFER_NEVER_AND_LAUNCH_BLOCKING",
         "fused": "DEFER_AND_FUSE", "env": None}  # env: as TPU_* variables set it
# What each launch runs: (mode, suite) in turn, in the same processes.
LAUNCHES = {
    "two": [("strict", "collectives"), ("debug", "modes"), ("fused", "modes")],
    "four": [("strict", "four")],
    "faults": [("strict", "faults")],
    "chips": [("env", "chips")],
    "exit": [("strict", "exit")],
    "chunks": [("strict", "chunks"), ("debug", "chunks"), ("fused", "chunks")],
    "copying": [("strict", "collectives"), ("strict", "chunks"), ("fused", "chunks")],
}


def rank_main(suites, launches, argv):
    """The rank process: runs the launch's suites, records each check's result."""
    launch_name, rank, world, port, outdir = argv[1], int(argv[2]), int(argv[3]), int(argv[4]), argv[5]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), TPU_DIST_TEST_OUTDIR=outdir)
    import torch  # noqa: F401  (loads torch_tpu)
    import torch.distributed as dist
    import torch_tpu
    from torch_tpu._internal.distributed.launchers.singlehost_wrapper import prepare_tpu_environment
    prepare_tpu_environment()  # TPU_VISIBLE_CHIPS = LOCAL_RANK
    backend = os.environ.get("TPU_DIST_TEST_BACKEND")  # None: the default
    if backend == "mesh":  # the default group made by init_device_mesh
        from torch.distributed.device_mesh import init_device_mesh
        init_device_mesh("tpu", (world,))
    else:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=_pg_timeout()))
    results = {"__backend": str(dist.get_backend())}
    path = os.path.join(outdir, f"rank{rank}.json")

    def save():
        with open(path, "w") as f:
            json.dump(results, f)

    for mode, suite in launches[launch_name]:
        if MODES[mode]:
            torch_tpu.set_eager_mode(getattr(torch_tpu.EagerMode, MODES[mode]))
        results[f"__mode/{suite}"] = torch_tpu.get_eager_mode().name
        for fn in suites[suite]:
            key = f"{mode}/{fn.__name__}"
            results[key] = "running"
            save()  # a check that ends the process still leaves its record
            try:
                fn(rank, world)
                results[key] = "ok"
            except Exception:
                results[key] = traceback.format_exc()[-3000:]
            save()
    torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_NEVER)
    dist.destroy_process_group()


if __name__ == "__main__":
    rank_main(SUITES, LAUNCHES, sys.argv)


# ----------------------------------------------------------------------------------------
# The tests


def _names(launch_name):
    return [f"{m}/{fn.__name__}" for m, suite in LAUNCHES[launch_name] for fn in SUITES[suite]]


@pytest.fixture(scope="module")
def two_ranks():
    return launch("two", 2)


@pytest.mark.parametrize("name", _names("two"))
def test_two_ranks(two_ranks, name):
    assert_check(two_ranks, name)


def test_default_backend_is_gloo_and_tpu_dist(two_ranks):
    for r in (0, 1):
        assert two_ranks[r]["__backend"] == "cpu:gloo,tpu:tpu_dist", two_ranks[r]


@pytest.mark.parametrize("name", _names("four"))
def test_four_ranks(four_ranks, name):
    assert_check(four_ranks, name)


@pytest.fixture(scope="module")
def four_ranks():
    """Four ranks with init_process_group("tpu_dist"): tpu tensors only."""
    return launch("four", 4, env={"TPU_DIST_TEST_BACKEND": "tpu_dist"})


def test_init_process_group_tpu_dist(four_ranks):
    for r in range(4):
        assert four_ranks[r]["__backend"] == "tpu_dist", four_ranks[r]


def test_visible_chips_pick_each_rank_its_device():
    """...with the default group made by init_device_mesh("tpu", ...), in DeferAndFuse
    mode as TPU_DEFER_AND_FUSE=1 sets it."""
    res = launch("chips", 2, env={"TPU_NUM_DEVICES": "2", "TPU_DIST_TEST_BACKEND": "mesh",
                                  "TPU_DEFER_AND_FUSE": "1"})
    assert_check(res, "env/device_ids_and_transport")
    for r in (0, 1):
        assert res[r]["__backend"] == "cpu:gloo,tpu:tpu_dist", res[r]
        assert res[r]["__mode/chips"] == "DEFER_AND_FUSE", res[r]


@pytest.fixture(scope="module")
def chunk_ranks():
    """Three ranks (blocks that split unevenly into chunks), 4 KiB chunks."""
    return launch("chunks", 3, env={"TPU_DIST_CHUNK_BYTES": str(CHUNK_BYTES)})


@pytest.mark.parametrize("name", _names("chunks"))
def test_chunked_collectives(chunk_ranks, name):
    assert_check(chunk_ranks, name)


@pytest.fixture(scope="module")
def copying_ranks():
    """Device memory never read in place (as on plugins whose buffers are not host memory):
    every collective, and the chunked paths through the plugin's raw copies."""
    return launch("copying", 3, env={"TPU_DIST_CHUNK_BYTES": str(CHUNK_BYTES),
                                     "TPU_DIST_HOST_ADDRESSES": "0"}, timeout=300)


@pytest.mark.parametrize("name", _names("copying"))
def test_copying_transport(copying_ranks, name):
    assert_check(copying_ranks, name)


def test_chunk_bytes_must_be_a_positive_number():
    res = launch("chunks", 1, env={"TPU_DIST_CHUNK_BYTES": "4k"}, timeout=60)
    assert res[0]["__rc"] != 0, res
    assert "TPU_DIST_CHUNK_BYTES must be a positive number of bytes, got '4k'" in res[0]["__out"]


def test_faults_never_hang():
    """Rank 2 exits after a collective, rank 1 stalls: ranks 0 and 1 raise in time."""
    res = launch("faults", 3, env={"TPU_DIST_TEST_PG_TIMEOUT": "3"}, timeout=90)
    assert [res[r]["__rc"] for r in range(3)] == [0, 0, 0], res
    assert_check(res, "strict/faults", ranks=[0])
    for r in (1, 2):  # they left mid-check, as planned
        assert res[r]["strict/faults"] == "running", res[r]


def test_exit_waits_for_collectives_still_completing():
    res = launch("exit", 2, timeout=90)
    assert [res[r]["__rc"] for r in (0, 1)] == [0, 0], res
    for r in (0, 1):
        assert res[r]["strict/exit_while_completing"] == "running", res[r]  # it exited
        with open(os.path.join(res[r]["__outdir"], f"callback{r}")) as f:
            assert f.read() == "[3.0, 3.0, 3.0, 3.0]", r  # the callback ran to its end
