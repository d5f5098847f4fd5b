"""Group splitting on tpu_dist, with the default group bound to a device as CUDA scripts
bind theirs: `init_process_group("tpu_dist", device_id=torch.device("tpu", local_rank))`.
Then `dist.split_group` makes new groups (ncclCommSplit on CUDA), `new_group` asks the
ranks outside a group to split too, and `init_device_mesh` builds its dimensions' groups
with split_group. Each check runs collectives on the new groups against the values they
must give; the 2-D mesh runs DTensor ops and FSDP2 + TP against a CPU reference. Run as
a script, this file is a rank process (see test_distributed.py)."""
import copy
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import _eq, _t, assert_check, launch, rank_main  # noqa: E402

HERE = os.path.abspath(__file__)
SUITES = {"two": [], "four": [], "mixed": []}
LAUNCHES = {"two": [("strict", "two"), ("debug", "two"), ("fused", "two")],
            "four": [("strict", "four"), ("fused", "four")],
            "mixed": [("strict", "mixed")]}


def check(*suites):
    def deco(fn):
        for s in suites:
            SUITES[s].append(fn)
        return fn
    return deco


def _ranks(group):
    import torch.distributed as dist
    return dist.get_process_group_ranks(group)


def _collectives_on(group, rank):
    """Every collective on `group` (this rank is a member), checked against its values."""
    import torch
    import torch.distributed as dist
    members = _ranks(group)
    n, me = len(members), dist.get_group_rank(group, rank)
    x = _t([rank, 1.0])
    dist.all_reduce(x, group=group)
    _eq(x, [sum(members), n])
    x = _t([rank])
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=group)
    _eq(x, [max(members)])
    y = _t([rank, rank])
    dist.broadcast(y, group_src=n - 1, group=group)
    _eq(y, [members[-1]] * 2)
    y = _t([rank + 1.0])
    dist.reduce(y, group_dst=0, group=group)
    if me == 0:
        _eq(y, [sum(members) + n])
    out = torch.empty(n, 2, device="tpu")
    dist.all_gather_into_tensor(out, _t([[rank, me]]), group=group)
    _eq(out, [[r, i] for i, r in enumerate(members)])
    parts = [torch.empty(1, device="tpu") for _ in range(n)]
    dist.all_gather(parts, _t([rank]), group=group)
    _eq(torch.cat(parts), members)
    rs = torch.empty(1, device="tpu")
    dist.reduce_scatter_tensor(rs, _t([float(i + rank) for i in range(n)]), group=group)
    _eq(rs, [sum(members) + n * me])
    a2a = torch.empty(n, device="tpu")
    dist.all_to_all_single(a2a, _t([rank * 10.0 + i for i in range(n)]), group=group)
    _eq(a2a, [r * 10.0 + me for r in members])
    got = [torch.empty(1, device="tpu") for _ in range(n)] if me == 0 else None
    dist.gather(_t([rank]), got, group_dst=0, group=group)
    if me == 0:
        _eq(torch.cat(got), members)
    sc = torch.empty(1, device="tpu")
    dist.scatter(sc, [_t([10.0 + i]) for i in range(n)] if me == 0 else None, group_src=0, group=group)
    _eq(sc, [10.0 + me])
    if n > 1:  # a ring of send/recv inside the group
        buf = torch.empty(2, device="tpu")
        nxt, prv = (me + 1) % n, (me - 1) % n
        reqs = [dist.isend(_t([rank, 7.0]), group_dst=nxt, group=group),
                dist.irecv(buf, group_src=prv, group=group)]
        for r in reqs:
            r.wait()
        _eq(buf, [members[prv], 7.0])
    dist.barrier(group=group)
    objs = [None] * n
    dist.all_gather_object(objs, rank, group=group)
    assert objs == members, objs


@check("two", "four", "mixed")
def device_id_binds_the_default_group(rank, world):
    import torch
    import torch.distributed as dist
    pg = dist.group.WORLD
    assert pg.bound_device_id == torch.device("tpu", torch.tpu.current_device()), pg.bound_device_id
    backend = pg._get_backend(torch.device("tpu"))
    assert backend.supports_splitting and backend.name() == "tpu_dist", backend
    x = _t([rank, 1.0])
    dist.all_reduce(x)
    _eq(x, [sum(range(world)), world])


@check("two", "four", "mixed")
def split_group_into_one_group_per_rank(rank, world):
    import torch.distributed as dist
    g = dist.split_group(split_ranks=[[r] for r in range(world)])
    assert g is not None and g.size() == 1 and g.rank() == 0 and _ranks(g) == [rank], _ranks(g)
    assert dist.get_backend(g) == dist.get_backend(), (dist.get_backend(g), dist.get_backend())
    assert g.bound_device_id == dist.group.WORLD.bound_device_id
    _collectives_on(g, rank)


@check("two", "four", "mixed")
def split_group_over_every_rank(rank, world):
    import torch.distributed as dist
    g = dist.split_group(split_ranks=[list(reversed(range(world)))])  # sorted by split_group
    assert g.size() == world and g.rank() == rank and _ranks(g) == list(range(world)), _ranks(g)
    _collectives_on(g, rank)


@check("two", "four")
def ranks_outside_every_split_get_none(rank, world):
    import torch.distributed as dist
    members = list(range(1, world))  # rank 0 is in no split
    g = dist.split_group(split_ranks=[members])
    if rank == 0:
        assert g is None, g
    else:
        assert _ranks(g) == members, _ranks(g)
        _collectives_on(g, rank)
    x = _t([1.0])
    dist.all_reduce(x)  # the default group goes on
    _eq(x, [world])


@check("two", "four")
def split_of_a_split_group(rank, world):
    # After ranks_outside_every_split_get_none the ranks hold different numbers of groups,
    # so c10d names these groups differently on each rank: the members still meet.
    import torch.distributed as dist
    everyone = dist.split_group(split_ranks=[list(range(world))])
    # Ranks of the parent group: the split's rank k is global rank k here.
    g = dist.split_group(parent_pg=everyone, split_ranks=[[r] for r in range(world)])
    assert _ranks(g) == [rank], _ranks(g)
    _collectives_on(g, rank)


@check("two", "four")
def split_group_rank_out_of_range_is_refused_on_every_rank(rank, world):
    import torch.distributed as dist
    try:
        dist.split_group(split_ranks=[[0, world]])
    except ValueError as e:
        assert f"split rank {world} is out of range for {world} processes" in str(e), e
    else:
        raise AssertionError("split_group took a rank past the group")
    x = _t([rank])
    dist.all_reduce(x)  # the group is still usable
    _eq(x, [sum(range(world))])


@check("mixed")
def cpu_tensors_on_a_split_of_gloo_and_tpu_dist(rank, world):
    # "cpu:gloo,tpu:tpu_dist" with a device_id: split_group splits both backends. Gloo's
    # half meets on c10d's store under the new group's name, which split_group hashes
    # from the count of groups each process holds, so this runs before any check makes a
    # group that leaves a rank out (the counts then differ between ranks: Gloo's split
    # waits on different keys, upstream; tpu_dist's does not depend on the name).
    import torch
    import torch.distributed as dist
    g = dist.split_group(split_ranks=[list(range(world))])
    c = torch.tensor([rank, 1.0])
    dist.all_reduce(c, group=g)
    assert c.tolist() == [sum(range(world)), world], c
    x = _t([rank])
    dist.all_reduce(x, group=g)
    _eq(x, [sum(range(world))])


@check("two", "four", "mixed")
def new_group_with_a_device_id(rank, world):
    # Ranks outside a new group are asked to join a split (perform_nocolor_split, for
    # NCCL): tpu_dist has nothing for them to do.
    import torch.distributed as dist
    first = dist.new_group([0])
    if rank == 0:
        _collectives_on(first, rank)
    else:
        assert first is dist.GroupMember.NON_GROUP_MEMBER, first
    rev = dist.new_group(list(reversed(range(world))))
    _collectives_on(rev, rank)
    evens = dist.new_group(list(range(0, world, 2)))
    if rank % 2 == 0:
        _collectives_on(evens, rank)


@check("two")
def one_dimensional_mesh(rank, world):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("tpu", (world,))
    a = distribute_tensor(torch.arange(4.0 * world, device="tpu"), mesh, [Shard(0)])
    _eq(a.to_local(), [4.0 * rank + i for i in range(4)])
    _eq(a.full_tensor(), list(range(4 * world)))


def _mesh_2d(world):
    from torch.distributed.device_mesh import init_device_mesh
    assert world == 4
    return init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))


@check("four")
def two_dimensional_mesh_groups_are_splits(rank, world):
    import torch.distributed as dist
    mesh = _mesh_2d(world)
    dp, tp = mesh["dp"].get_group(), mesh["tp"].get_group()
    assert _ranks(tp) == [rank - rank % 2, rank - rank % 2 + 1], _ranks(tp)
    assert _ranks(dp) == [rank % 2, rank % 2 + 2], _ranks(dp)
    for g in (dp, tp):
        assert g.bound_device_id == dist.group.WORLD.bound_device_id
        _collectives_on(g, rank)


@check("four")
def two_dimensional_mesh_dtensor_ops(rank, world):
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    mesh = _mesh_2d(world)
    dpr, tpr = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    A = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    a = distribute_tensor(A.to("tpu"), mesh, [Shard(0), Shard(1)])
    _eq(a.to_local(), A[2 * dpr:2 * dpr + 2, 3 * tpr:3 * tpr + 3])
    _eq(a.full_tensor(), A)
    _eq(a.redistribute(mesh, [Replicate(), Shard(0)]).to_local(), A[2 * tpr:2 * tpr + 2])
    p = DTensor.from_local(A.to("tpu") * (rank + 1), mesh, [Partial(), Replicate()])
    _eq(p.full_tensor(), A * ((tpr + 1) + (tpr + 3)), tol=1e-5)
    _eq(F.softmax(a, -1).full_tensor(), F.softmax(A, -1), tol=1e-5)
    b = distribute_tensor(A.t().contiguous().to("tpu"), mesh, [Replicate(), Shard(0)])
    _eq((a @ b).full_tensor(), A @ A.t(), tol=1e-4)


@check("four")
def fsdp2_over_dp_with_tensor_parallel_over_tp(rank, world):
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = _mesh_2d(world)
    dpr = mesh["dp"].get_local_rank()
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
    model = copy.deepcopy(ref).to("tpu")
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    X = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    model(X[2 * dpr:2 * dpr + 2].to("tpu")).pow(2).mean().backward()
    (sum(ref(X[2 * i:2 * i + 2]).pow(2).mean() for i in range(2)) / 2).backward()
    opt, ref_opt = (torch.optim.Adam(m.parameters(), lr=1e-2) for m in (model, ref))
    for p, q in zip(model.parameters(), ref.parameters()):
        _eq(p.grad.full_tensor(), q.grad, tol=1e-5)
    opt.step()
    ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        _eq(p.full_tensor(), q, tol=1e-5)


def _init_with_device_id(init):
    """init_process_group as CUDA scripts call it: bound to this process's device."""
    def init_process_group(backend=None, **kwargs):
        import torch
        backend = os.environ.get("TPU_DIST_TEST_BACKEND", "tpu_dist")
        return init(backend, device_id=torch.device("tpu", torch.tpu.current_device()), **kwargs)
    return init_process_group


if __name__ == "__main__":
    import torch  # noqa: F401  (loads torch_tpu)
    import torch.distributed as dist
    dist.init_process_group = _init_with_device_id(dist.init_process_group)
    rank_main(SUITES, LAUNCHES, sys.argv)


def _names(launch_name):
    return [f"{m}/{fn.__name__}" for m, suite in LAUNCHES[launch_name] for fn in SUITES[suite]]


@pytest.fixture(scope="module")
def two_ranks():
    return launch("two", 2, script=HERE, timeout=240)


@pytest.mark.parametrize("name", _names("two"))
def test_two_ranks(two_ranks, name):
    assert_check(two_ranks, name)


@pytest.fixture(scope="module")
def four_ranks():
    return launch("four", 4, script=HERE, timeout=300)


@pytest.mark.parametrize("name", _names("four"))
def test_four_ranks(four_ranks, name):
    assert_check(four_ranks, name)


@pytest.fixture(scope="module")
def mixed_ranks():
    return launch("mixed", 2, script=HERE, env={"TPU_DIST_TEST_BACKEND": "cpu:gloo,tpu:tpu_dist"},
                  timeout=240)


@pytest.mark.parametrize("name", _names("mixed"))
def test_gloo_and_tpu_dist(mixed_ranks, name):
    assert_check(mixed_ranks, name)
