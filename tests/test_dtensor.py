"""DTensor on tpu over tpu_dist: `redistribute` between every pair of placements (Shard
on either dim, Replicate, Partial) on a 1-D mesh of 2 ranks and a 2-D mesh of 4 ranks,
shards even and uneven, in Strict and DeferAndFuse. The reference is the same
redistribute of the same DTensor on a CPU mesh over Gloo, in the same processes: every
result's placements and each rank's local tensor must equal it exactly (integer values:
sums are exact), and the full tensor must equal the global value. Run as a script, this
file is a rank process (see test_distributed.py)."""
import itertools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import launch, assert_check, rank_main  # noqa: E402

HERE = os.path.abspath(__file__)
SUITES = {"one_d": [], "two_d": []}
LAUNCHES = {"one_d": [("strict", "one_d"), ("fused", "one_d")],
            "two_d": [("strict", "two_d"), ("fused", "two_d")]}


def _placement(code):
    from torch.distributed.tensor import Partial, Replicate, Shard
    return {"S0": Shard(0), "S1": Shard(1), "R": Replicate(), "P": Partial()}[code]


def _local_of(value, mesh, placements, seed):
    """This rank's local tensor of `value` under `placements`: shards as torch.chunk cuts
    them (DTensor's rule; a rank past the last chunk holds an empty one), a Partial dim
    as parts that sum to it (coordinate 0 holds value - (n - 1) b, the others b)."""
    import torch
    local = value
    for dim, (p, c) in enumerate(zip(placements, mesh.get_coordinate())):
        n = mesh.size(dim)
        if p.is_shard():
            chunks = torch.chunk(local, n, dim=p.dim)
            local = chunks[c] if c < len(chunks) else local.narrow(p.dim, 0, 0)
        elif p.is_partial():
            b = torch.randint(-4, 5, local.shape, generator=torch.Generator().manual_seed(seed + dim)).float()
            local = local - b * (n - 1) if c == 0 else b
    return local.contiguous()


def _redistribute(value, mesh, src, dst, device, seed):
    """(placements, local, full) of the DTensor after redistributing, or the exception type."""
    from torch.distributed.tensor import DTensor
    local = _local_of(value, mesh, src, seed).to(device)
    d = DTensor.from_local(local, mesh, src, run_check=False, shape=value.shape, stride=value.stride())
    try:
        r = d.redistribute(mesh, dst)
        return tuple(r.placements), r.to_local().cpu(), r.full_tensor().cpu()
    except Exception as e:  # noqa: BLE001  (compared with CPU's)
        return type(e)


def _matrix(mesh_shape, placement_codes, shapes):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    meshes = {dev: init_device_mesh(dev, mesh_shape) for dev in ("cpu", "tpu")}
    assert meshes["tpu"].device_type == "tpu"
    options = [tuple(_placement(c) for c in codes) for codes in placement_codes]
    done = 0
    for k, shape in enumerate(shapes):
        value = torch.randint(-8, 9, shape, generator=torch.Generator().manual_seed(k)).float()
        for i, (src, dst) in enumerate(itertools.product(options, options)):
            want = _redistribute(value, meshes["cpu"], src, dst, "cpu", seed=100 * k + i)
            got = _redistribute(value, meshes["tpu"], src, dst, "tpu", seed=100 * k + i)
            what = f"{shape} {src} -> {dst}"
            if isinstance(want, type):
                assert got is want, (what, want, got)
                continue
            assert not isinstance(got, type), (what, got)
            assert got[0] == want[0] == dst, (what, got[0], want[0])
            assert got[1].shape == want[1].shape and torch.equal(got[1], want[1]), (what, got[1], want[1])
            assert torch.equal(got[2], value), (what, got[2], value)
            done += 1
    total = len(options) ** 2 * len(shapes)
    print(f"{mesh_shape}: {done} of {total} redistributes compared, {total - done} refused alike", flush=True)
    assert done >= total // 2, done  # most pairs are supported


def redistribute_every_pair_on_a_1d_mesh(rank, world):
    # 4 x 6: even shards on both dims; 5 x 3: uneven on both (2 ranks: 3 + 2, 2 + 1).
    _matrix((world,), [("S0",), ("S1",), ("R",), ("P",)], [(4, 6), (5, 3)])


def redistribute_every_pair_on_a_2d_mesh(rank, world):
    assert world == 4
    codes = [("S0", "S1"), ("S1", "S0"), ("S0", "R"), ("R", "S1"), ("S0", "S0"), ("R", "R"),
             ("P", "R"), ("R", "P"), ("P", "S0"), ("P", "P")]
    _matrix((2, 2), codes, [(4, 6), (5, 3)])


SUITES["one_d"].append(redistribute_every_pair_on_a_1d_mesh)
SUITES["two_d"].append(redistribute_every_pair_on_a_2d_mesh)


if __name__ == "__main__":
    rank_main(SUITES, LAUNCHES, sys.argv)


@pytest.fixture(scope="module")
def one_d():
    return launch("one_d", 2, script=HERE, timeout=240)


@pytest.fixture(scope="module")
def two_d():
    return launch("two_d", 4, script=HERE, timeout=300)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_redistribute_matrix_on_a_1d_mesh(one_d, mode):
    assert_check(one_d, f"{mode}/redistribute_every_pair_on_a_1d_mesh")


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_redistribute_matrix_on_a_2d_mesh(two_d, mode):
    assert_check(two_d, f"{mode}/redistribute_every_pair_on_a_2d_mesh")
