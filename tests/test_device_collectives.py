"""tpu_dist's device transport (csrc/distributed/device_collectives.*): collectives as
StableHLO programs with one replica per rank.

Its programs' values over 2, 3 and 4 devices are checked by the C++ test
tests/cpp/collective_tests.cpp (ctest `collective_tests`: one client with 4 CPU devices).
Here the c10d side. The XLA CPU plugin's client reaches only its own process's devices,
so ranks that are processes cannot use it (two asking for it get an error that says
why), but ranks that are threads of one process, each on its own device of a 4-device
client, run real collectives through it (Strict, DeferAndFuse, Debug), and a group of
one process runs every c10d API on it (DDP, object collectives, host-staged fallbacks).
Run as a script, this file is such a process: `test_device_collectives.py single MODE
OUT`, `... threads WORLD MODE OUT` or `... pair RANK PORT OUT`.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.abspath(__file__)


# ----------------------------------------------------------------------------------------
# Rank side


def _single(mode, out):
    """Every collective of a one-process group on the device transport; writes
    {check: "ok" | error}."""
    import datetime
    import torch
    import torch.distributed as dist
    import torch_tpu
    from torch_tpu import _C
    from torch_tpu._internal.distributed import tpu_distributed as td

    torch_tpu.set_eager_mode(_MODES(torch_tpu)[mode])
    dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=20))
    backend = dist.group.WORLD._get_backend(torch.device("tpu"))
    results = {}

    def check(name):
        def wrap(fn):
            try:
                fn()
                results[name] = "ok"
            except Exception as e:  # reported per check
                results[name] = f"{type(e).__name__}: {e}"
            return fn
        return wrap

    def programs():
        return _C._dist_device_programs(backend)

    dtypes = [torch.float32, torch.bfloat16, torch.int32, torch.int64]
    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
           "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}

    @check("transport_is_device")
    def _():
        assert td.transport() == "device", td.transport()

    for dt in dtypes:
        for name, op in ops.items():
            @check(f"all_reduce_{name}_{dt}".replace("torch.", ""))
            def _(dt=dt, op=op):
                src = (torch.arange(12) - 5).reshape(3, 4).to(dt)
                t = src.to("tpu")
                y = t * 1  # pending work before the collective (DeferAndFuse: a graph)
                dist.all_reduce(y, op=op)
                assert y.dtype == dt and torch.equal(y.cpu(), src), (y.cpu(), src)

    for dt in [torch.int32, torch.int64, torch.bool]:
        for name, op in {"band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
                         "bxor": dist.ReduceOp.BXOR}.items():
            @check(f"all_reduce_{name}_{dt}".replace("torch.", ""))
            def _(dt=dt, op=op):
                src = (torch.arange(6) % 3).to(dt)
                t = src.to("tpu")
                dist.all_reduce(t, op=op)
                assert torch.equal(t.cpu(), src)

    @check("all_reduce_into_a_view_leaves_the_rest")
    def _():
        base = torch.arange(10, dtype=torch.float32).to("tpu")
        view = base[2:6]
        dist.all_reduce(view)
        assert torch.equal(base.cpu(), torch.arange(10, dtype=torch.float32))
        t = torch.arange(6, dtype=torch.float32).reshape(2, 3).to("tpu").t()  # not contiguous
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        assert torch.equal(t.cpu(), torch.arange(6, dtype=torch.float32).reshape(2, 3).t())

    @check("programs_are_cached_per_collective_shape_dtype")
    def _():
        t = torch.ones(7, device="tpu")
        dist.all_reduce(t)
        n = programs()
        dist.all_reduce(t)
        dist.all_reduce(torch.ones(7, device="tpu") * 3)
        assert programs() == n, (programs(), n)
        dist.all_reduce(torch.ones(8, device="tpu"))
        assert programs() == n + 1
        dist.all_reduce(torch.ones(7, device="tpu"), op=dist.ReduceOp.MAX)
        assert programs() == n + 2

    @check("async_work_wait_and_future")
    def _():
        t = torch.full((4,), 2.0, device="tpu")
        work = dist.all_reduce(t, async_op=True)
        assert work.wait()
        assert work.is_completed() and work.is_success()
        fut = dist.all_reduce(t, async_op=True).get_future()
        (value,) = fut.wait()
        assert value is t or torch.equal(value.cpu(), t.cpu())
        assert torch.equal(t.cpu(), torch.full((4,), 2.0))

    @check("broadcast_reduce")
    def _():
        t = torch.tensor([1.5, -2.0, 3.0], device="tpu")
        dist.broadcast(t, src=0)
        assert torch.equal(t.cpu(), torch.tensor([1.5, -2.0, 3.0]))
        dist.reduce(t, dst=0, op=dist.ReduceOp.PRODUCT)
        assert torch.equal(t.cpu(), torch.tensor([1.5, -2.0, 3.0]))

    @check("all_gather_forms")
    def _():
        src = torch.arange(6, dtype=torch.int64).reshape(2, 3)
        out = [torch.zeros(2, 3, dtype=torch.int64, device="tpu")]
        dist.all_gather(out, src.to("tpu"))
        assert torch.equal(out[0].cpu(), src)
        big = torch.zeros(2, 3, dtype=torch.int64, device="tpu")
        dist.all_gather_into_tensor(big, src.to("tpu"))
        assert torch.equal(big.cpu(), src)
        obj = [None]
        dist.all_gather_object(obj, {"rank": 0})
        assert obj == [{"rank": 0}]

    @check("reduce_scatter_forms")
    def _():
        src = torch.arange(8, dtype=torch.float32)
        out = torch.zeros(8, device="tpu")
        dist.reduce_scatter_tensor(out, src.to("tpu"), op=dist.ReduceOp.AVG)
        assert torch.equal(out.cpu(), src)
        out = torch.zeros(8, device="tpu")
        dist.reduce_scatter(out, [src.to("tpu")])
        assert torch.equal(out.cpu(), src)

    @check("all_to_all_forms")
    def _():
        src = torch.arange(6, dtype=torch.int32)
        out = torch.zeros(6, dtype=torch.int32, device="tpu")
        dist.all_to_all_single(out, src.to("tpu"))
        assert torch.equal(out.cpu(), src)
        outs = [torch.zeros(6, dtype=torch.int32, device="tpu")]
        dist.all_to_all(outs, [src.to("tpu")])
        assert torch.equal(outs[0].cpu(), src)

    @check("host_staged_for_gather_scatter_barrier")
    def _():
        src = torch.tensor([4.0, 5.0], device="tpu")
        out = [torch.zeros(2, device="tpu")]
        dist.gather(src, out, dst=0)
        assert torch.equal(out[0].cpu(), torch.tensor([4.0, 5.0]))
        got = torch.zeros(2, device="tpu")
        dist.scatter(got, [src], src=0)
        assert torch.equal(got.cpu(), torch.tensor([4.0, 5.0]))
        dist.barrier()

    @check("premul_sum_is_refused")
    def _():
        t = torch.ones(2, device="tpu")
        try:
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
        except (ValueError, RuntimeError) as e:
            assert "PREMUL_SUM" in str(e), e
        else:
            raise AssertionError("PREMUL_SUM ran")

    @check("training_step_ddp")
    def _():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2).to("tpu")
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        x = torch.randn(8, 4).to("tpu")
        ddp(x).pow(2).sum().backward()
        ref = torch.nn.Linear(4, 2)
        ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
        ref(x.cpu()).pow(2).sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(p.grad.cpu(), q.grad, atol=1e-5), (p.grad.cpu(), q.grad)

    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(results, f)


def _threads(world, mode, out):
    """Ranks as threads of one process, rank r on tpu:r of one client with 4 devices
    (TPU_NUM_DEVICES=4): every rank's device is a distinct device of the client, so the
    device transport runs real world-size collectives here. Writes {check: [error per
    rank or None]}; values against CPU references (float64, cast)."""
    import datetime
    import threading
    import torch
    import torch.distributed as dist
    import torch_tpu
    from torch_tpu import _C

    from torch._C import _distributed_c10d as C10d

    torch_tpu.set_eager_mode(_MODES(torch_tpu)[mode])
    store = dist.HashStore()
    results, lock = {}, threading.Lock()
    R = dist.ReduceOp

    def rank(r):
        torch.tpu.set_device(r)
        dev = f"tpu:{r}"
        host = dist.ProcessGroupGloo(dist.PrefixStore("g/", store), r, world,
                                     datetime.timedelta(seconds=60))
        b = _C._dist_create_backend(host, "device")

        def inp(k, dtype=torch.float32, n=8, of=r):
            """Rank `of`'s input of check k: halves in [-2, 2] (every reduction exact)."""
            g = torch.Generator().manual_seed(1000 * k + of)
            v = torch.randint(-4, 5, (n,), generator=g, dtype=torch.float64)
            return (v / 2 if dtype.is_floating_point else v).to(dtype)

        def every(k, dtype=torch.float32, n=8):
            return torch.stack([inp(k, dtype, n, q).double() for q in range(world)])

        def check(name, fn):
            try:
                fn()
                err = None
            except Exception as e:  # reported per rank
                err = f"rank {r}: {type(e).__name__}: {e}"
            with lock:
                results.setdefault(name, []).append(err)

        def eq(got, want):
            assert got.dtype == want.dtype and torch.equal(got.cpu(), want), (got.cpu(), want)

        def transport():
            assert _C._dist_transport(b) == "device"

        check("transport", transport)
        reduce_ref = {R.SUM: lambda x: x.sum(0), R.AVG: lambda x: x.mean(0),
                      R.PRODUCT: lambda x: x.prod(0), R.MIN: lambda x: x.amin(0),
                      R.MAX: lambda x: x.amax(0)}
        for i, (op, ref) in enumerate(reduce_ref.items()):
            for j, dt in enumerate([torch.float32, torch.bfloat16, torch.int32, torch.int64]):
                k = 10 * i + j

                def all_reduce(op=op, ref=ref, dt=dt, k=k):
                    t = inp(k, dt).to(dev)
                    o = dist.AllreduceOptions()
                    o.reduceOp = op
                    b.allreduce([t], o).wait()
                    want = ref(every(k, dt))
                    if not dt.is_floating_point:
                        want = want.trunc()
                    eq(t, want.to(dt))
                check(f"all_reduce_{op}_{dt}".replace("torch.", "").replace("RedOpType.", ""),
                      all_reduce)
        bit = {R.BAND: lambda a, c: a & c, R.BOR: lambda a, c: a | c, R.BXOR: lambda a, c: a ^ c}
        for i, (op, fn) in enumerate(bit.items()):
            for j, dt in enumerate([torch.int32, torch.int64, torch.bool]):
                k = 100 + 10 * i + j

                def bitwise(op=op, fn=fn, dt=dt, k=k):
                    t = (inp(k, torch.int64) + 4).to(dt).to(dev)
                    o = dist.AllreduceOptions()
                    o.reduceOp = op
                    b.allreduce([t], o).wait()
                    want = (inp(k, torch.int64, of=0) + 4).to(dt)
                    for q in range(1, world):
                        want = fn(want, (inp(k, torch.int64, of=q) + 4).to(dt))
                    eq(t, want)
                check(f"all_reduce_{op}_{dt}".replace("torch.", "").replace("RedOpType.", ""),
                      bitwise)

        def broadcast():
            t = inp(200).to(dev)
            o = dist.BroadcastOptions()
            o.rootRank = world - 1
            b.broadcast([t], o).wait()
            eq(t, inp(200, of=world - 1))
        check("broadcast", broadcast)

        def reduce():
            t = inp(201).to(dev)
            o = dist.ReduceOptions()
            o.rootRank, o.reduceOp = 0, R.SUM
            b.reduce([t], o).wait()
            eq(t, every(201).sum(0).float() if r == 0 else inp(201))
        check("reduce", reduce)

        def all_gather():
            x = inp(202, torch.int64, 6).view(2, 3)
            outs = [torch.zeros(2, 3, dtype=torch.int64, device=dev) for _ in range(world)]
            b.allgather([outs], [x.to(dev)], C10d.AllgatherOptions()).wait()
            for q in range(world):
                eq(outs[q], inp(202, torch.int64, 6, q).view(2, 3))
            big = torch.zeros(world * 2, 3, dtype=torch.int64, device=dev)
            b._allgather_base(big, x.to(dev)).wait()
            eq(big, every(202, torch.int64, 6).long().view(world * 2, 3))
        check("all_gather", all_gather)

        def reduce_scatter():
            x = inp(203, n=4 * world)
            out = torch.zeros(4, device=dev)
            o = dist.ReduceScatterOptions()
            o.reduceOp = R.SUM
            b._reduce_scatter_base(out, x.to(dev), o).wait()
            eq(out, every(203, n=4 * world).sum(0).float()[4 * r:4 * r + 4])
            o.reduceOp = R.AVG
            out = torch.zeros(4, device=dev)
            b.reduce_scatter([out], [list(x.to(dev).chunk(world))], o).wait()
            eq(out, every(203, n=4 * world).mean(0).float()[4 * r:4 * r + 4])
        check("reduce_scatter", reduce_scatter)

        def all_to_all():
            x = inp(204, torch.int32, 2 * world)
            out = torch.zeros(2 * world, dtype=torch.int32, device=dev)
            b.alltoall_base(out, x.to(dev), [], [], dist.AllToAllOptions()).wait()
            want = torch.cat([inp(204, torch.int32, 2 * world, q)[2 * r:2 * r + 2]
                              for q in range(world)])
            eq(out, want)
            outs = [torch.zeros(2, dtype=torch.int32, device=dev) for _ in range(world)]
            b.alltoall(outs, list(x.to(dev).chunk(world)), dist.AllToAllOptions()).wait()
            eq(torch.cat([o.cpu() for o in outs]), want)
        check("all_to_all", all_to_all)

        def uneven_all_to_all_runs_host_staged():
            # rank q sends q + 1 elements to everyone
            x = torch.full((world * (r + 1),), float(r), device=dev)
            out = torch.zeros(sum(q + 1 for q in range(world)), device=dev)
            b.alltoall_base(out, x, [q + 1 for q in range(world)], [r + 1] * world,
                            dist.AllToAllOptions()).wait()
            eq(out, torch.cat([torch.full((q + 1,), float(q)) for q in range(world)]))
        check("uneven_all_to_all", uneven_all_to_all_runs_host_staged)

        def coalesced_and_future():
            ts = [inp(205).to(dev), inp(206, torch.int64).to(dev)]
            o = dist.AllreduceCoalescedOptions()
            o.reduceOp = R.MAX
            fut = b.allreduce_coalesced(ts, o).get_future()
            fut.wait()
            eq(ts[0], every(205).amax(0).float())
            eq(ts[1], every(206, torch.int64).amax(0).long())
        check("coalesced_and_future", coalesced_and_future)

        def pending_work_and_views():
            base = torch.zeros(10, device=dev)
            y = inp(207).to(dev) * 2  # pending in DeferAndFuse
            base[1:9] = y
            view = base[1:9]
            b.allreduce([view], dist.AllreduceOptions()).wait()
            want = torch.zeros(10)
            want[1:9] = (every(207) * 2).sum(0).float()
            eq(base, want)
        check("pending_work_and_views", pending_work_and_views)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    with open(out, "w") as f:
        json.dump(results, f)


def _MODES(torch_tpu):
    return {"strict": torch_tpu.EagerMode.DEFER_NEVER,
            "debug": torch_tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING,
            "defer": torch_tpu.EagerMode.DEFER_AND_FUSE}


def _pair(rank, port, out):
    """One of two processes asking for the device transport; writes the error it got."""
    import datetime
    import torch  # noqa: F401
    import torch.distributed as dist
    import torch_tpu  # noqa: F401
    result = "no error"
    try:
        dist.init_process_group("tpu_dist", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=2, timeout=datetime.timedelta(seconds=20))
        import torch as t
        dist.all_reduce(t.ones(1, device="tpu"))
    except Exception as e:
        result = f"{type(e).__name__}: {e}"
    with open(out, "w") as f:
        json.dump({"error": result}, f)


# ----------------------------------------------------------------------------------------
# pytest side


def _env():
    return dict(os.environ, TPU_DIST_TRANSPORT="device", HF_HUB_OFFLINE="1")


@pytest.fixture(scope="module", params=["strict"])
def single(request):
    out = os.path.join(tempfile.mkdtemp(prefix="tpu_devcoll_"), "r.json")
    p = subprocess.run([sys.executable, HERE, "single", request.param, out], env=_env(),
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0 and os.path.exists(out), p.stdout[-3000:] + p.stderr[-3000:]
    return json.load(open(out))


def test_every_check_of_a_one_process_group_passes(single):
    failed = {k: v for k, v in single.items() if v != "ok"}
    assert not failed, failed
    # The checks above all ran (a check list that silently shrank would pass).
    assert len(single) >= 35, sorted(single)


@pytest.mark.parametrize("world,mode", [(4, "strict"), (2, "defer"), (2, "debug")])
def test_ranks_as_threads_on_devices_of_one_client(world, mode):
    """Real collectives of `world` ranks through the c10d backend: the ranks are threads
    of one process whose client has 4 devices, rank r on tpu:r."""
    out = os.path.join(tempfile.mkdtemp(prefix="tpu_devcoll_"), "r.json")
    p = subprocess.run([sys.executable, HERE, "threads", str(world), mode, out],
                       env=dict(_env(), TPU_NUM_DEVICES="4"), capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0 and os.path.exists(out), p.stdout[-3000:] + p.stderr[-3000:]
    res = json.load(open(out))
    failed = {k: v for k, v in res.items() if any(v) or len(v) != world}
    assert not failed, failed
    assert len(res) >= 30, sorted(res)


def test_two_processes_on_cpu_clients_are_refused_with_the_reason():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = tempfile.mkdtemp(prefix="tpu_devcoll_")
    procs = [subprocess.Popen([sys.executable, HERE, "pair", str(r), str(port),
                               os.path.join(d, f"{r}.json")], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for r in range(2):
        path = os.path.join(d, f"{r}.json")
        assert os.path.exists(path), outs[r][-3000:]
        err = json.load(open(path))["error"]
        assert "device-collective transport cannot run this group of 2 processes" in err, err
        assert "ranks 0 and 1 both use device 0" in err, err
        assert "TPU_DIST_TRANSPORT=host" in err, err


if __name__ == "__main__":
    if sys.argv[1] == "single":
        _single(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "threads":
        _threads(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        _pair(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
