"""Collectives of one tpu_dist group run in issue order, as NCCL's (one stream per
communicator): a collective issued before an earlier async one on the same tensor has
finished sees its result. The host-staged transport read its inputs at issue and wrote
results back later, so `a = all_reduce(x, async_op=True); all_reduce(x)` gave 1 + 2 = 3
where NCCL gives 6 (found by session 58's tensor-parallel probe). Ranks are threads of
one process on two devices of the XLA CPU client, each with its own Gloo group, through
the host-staged transport ("host") that multi-process groups on this plugin use."""
import pytest

from conftest import run_python_json

PROGRAM = r"""
import datetime, json, threading, torch, torch.distributed as dist, torch_tpu
from torch_tpu import _C
store = dist.HashStore(); world = 2; res = {}; lock = threading.Lock()
def rank(r):
    torch.tpu.set_device(r); dev = f"tpu:{r}"
    host = dist.ProcessGroupGloo(dist.PrefixStore("g/", store), r, world, datetime.timedelta(seconds=30))
    b = _C._dist_create_backend(host, "host")
    assert _C._dist_transport(b) == "host"
    opts = dist.AllreduceOptions
    out = {}
    def ones(n):
        return (torch.ones(n) * (r + 1)).to(dev)
    x = ones(3); w1 = b.allreduce([x], opts()); w2 = b.allreduce([x], opts()); w1.wait(); w2.wait()
    out["two_async"] = x.cpu().tolist()
    x = ones(3); w1 = b.allreduce([x], opts()); b.allreduce([x], opts()).wait(); w1.wait()
    out["async_then_waited"] = x.cpu().tolist()
    x = ones(3); ws = [b.allreduce([x], opts()) for _ in range(3)]
    for w in ws: w.wait()
    out["three_async"] = x.cpu().tolist()
    y = ones(2); w1 = b.allreduce([y], opts()); o = torch.zeros(4).to(dev)
    w2 = b._allgather_base(o, y); w1.wait(); w2.wait()
    out["allgather_of_it"] = o.cpu().tolist()
    z = ones(2); w1 = b.allreduce([z], opts()); bo = dist.BroadcastOptions(); bo.rootRank = 0
    w2 = b.broadcast([z], bo); w1.wait(); w2.wait()
    out["broadcast_of_it"] = z.cpu().tolist()
    # independent tensors still run side by side, with their own values
    p, q = ones(4), ones(4) * 10
    w1 = b.allreduce([p], opts()); w2 = b.allreduce([q], opts()); w1.wait(); w2.wait()
    out["independent"] = [p.cpu().tolist(), q.cpu().tolist()]
    with lock:
        res[r] = out
ts = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
[t.start() for t in ts]; [t.join(120) for t in ts]
print(json.dumps(res))
"""

WANT = {
    "two_async": [6.0] * 3,          # (1 + 2), then 3 + 3
    "async_then_waited": [6.0] * 3,
    "three_async": [12.0] * 3,
    "allgather_of_it": [3.0] * 4,    # gathers the reduced values
    "broadcast_of_it": [3.0] * 2,    # rank 0's reduced value
    "independent": [[3.0] * 4, [30.0] * 4],
}


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_collectives_on_one_tensor_run_in_issue_order(mode):
    env = {"TPU_NUM_DEVICES": "2", "TPU_DEFER_AND_FUSE": "1" if mode == "fused" else "0",
           "TPU_LAUNCH_BLOCKING": "1" if mode == "debug" else "0"}
    res = run_python_json(PROGRAM, env=env, timeout=240)
    assert sorted(res) == ["0", "1"], res
    for r in ("0", "1"):
        assert res[r] == WANT, (r, res[r])


def test_collectives_through_staging_copies_run_in_issue_order():
    # Without reading device memory in place (TPU_DIST_HOST_ADDRESSES=0), results are
    # written back from staging copies when each collective completes.
    res = run_python_json(PROGRAM, env={"TPU_NUM_DEVICES": "2", "TPU_DIST_HOST_ADDRESSES": "0"}, timeout=240)
    for r in ("0", "1"):
        assert res[r] == WANT, (r, res[r])


DROP_PROGRAM = r"""
import datetime, json, threading, time, torch, torch.distributed as dist, torch_tpu
from torch_tpu import _C
store = dist.HashStore(); world = 2; res = {}
def rank(r):
    torch.tpu.set_device(r)
    host = dist.ProcessGroupGloo(dist.PrefixStore("g/", store), r, world, datetime.timedelta(seconds=30))
    b = _C._dist_create_backend(host, "host")
    x = (torch.ones(3) * (r + 1)).to(f"tpu:{r}")
    if r == 1:
        time.sleep(1.0)  # rank 0's collective is still in flight when it drops everything
    w = b.allreduce([x], dist.AllreduceOptions())
    if r == 1:
        w.wait(); res[r] = x.cpu().tolist()
    del w, x, b  # rank 0: its Work now holds the last reference to x's Python object
    res.setdefault(r, "dropped")
ts = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
[t.start() for t in ts]; [t.join(60) for t in ts]
print(json.dumps({str(k): v for k, v in res.items()}))
"""


def test_dropping_a_backend_with_a_collective_in_flight_does_not_hang():
    # Python dropping a backend waits (holding the GIL) for its in-flight Works; the
    # transport thread finishing one freed a tensor whose Python object needs the GIL,
    # so both waited forever (session 58's CI: this file's debug case hung at teardown).
    res = run_python_json(DROP_PROGRAM, env={"TPU_NUM_DEVICES": "2"}, timeout=60)
    assert res == {"0": "dropped", "1": [3.0, 3.0, 3.0]}, res
