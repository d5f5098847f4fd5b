"""Every op of PyTorch's Core ATen IR (ops tagged torch.Tag.core) runs natively on tpu.

Each Core ATen op reaches tpu by one of: a lowering rule, a glue kernel of the backend
(allocation, views, copies), a decomposition kernel (torch_tpu._decompositions), or a
composite kernel of PyTorch's that calls other ops. The static test names the route of
every op; the ops whose route is a composite or a decomposition are then run, since only
running shows that what they call is native too. Exceptions are listed with a reason.
"""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import _decompositions
from test_coverage_ops import native

aten = torch.ops.aten

# Core ATen ops with no native route yet, and why.
MISSING: dict = {}
# Symbolic-shape queries: answered from metadata, nothing runs on the device.
METADATA = {"aten::sym_is_contiguous", "aten::sym_numel", "aten::sym_size.int",
            "aten::sym_storage_offset", "aten::sym_stride.int"}


def name(op) -> str:
    s = op._schema
    return s.name + ("." + s.overload_name if s.overload_name else "")


def core_ops():
    # torch.ops.aten creates its packets lazily, so dir(aten) lists only those some code has
    # touched: ask for every registered schema first, so the set does not depend on test order.
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith("aten::"):
            getattr(aten, schema.name.split("::", 1)[1], None)
    ops = []
    for packet_name in dir(aten):
        packet = getattr(aten, packet_name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for ov in packet.overloads():
            op = getattr(packet, ov)
            if torch.Tag.core in op.tags:
                ops.append(op)
    return sorted(ops, key=name)


def route(op) -> str:
    n = name(op)
    has = lambda key: torch._C._dispatch_has_kernel_for_dispatch_key(n, key)  # noqa: E731
    lowered = set(torch_tpu._C.lowered_ops())
    if n.split("::", 1)[1] in lowered:
        return "rule"
    if n in _decompositions.registered:
        return "decomposition"
    if has("PrivateUse1"):
        return "glue"
    if n in METADATA:
        return "metadata"
    if any(has(k) for k in ("CompositeImplicitAutograd", "CompositeExplicitAutograd",
                            "CompositeExplicitAutogradNonFunctional")):
        return "composite"
    return "missing"


CORE = core_ops()


def test_core_aten_op_set_is_known():
    assert len(CORE) > 150
    names = {name(op) for op in CORE}
    assert set(MISSING) <= names and METADATA <= names


def test_every_core_aten_op_has_a_native_route():
    routes = {name(op): route(op) for op in CORE}
    missing = {n for n, r in routes.items() if r == "missing"}
    assert missing == set(MISSING), f"new gaps: {missing - set(MISSING)}; " \
                                    f"now covered, drop from MISSING: {set(MISSING) - missing}"
    counts = {r: sum(1 for v in routes.values() if v == r) for r in set(routes.values())}
    assert counts["rule"] > 100, counts


# Where CALLS build their tensors: "tpu", or "cpu" for the reference values.
DEV = ["tpu"]


def t(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(DEV[0])


# One call per Core ATen op routed through a composite or a decomposition.
CALLS = {
    "aten::adaptive_avg_pool1d": lambda: aten.adaptive_avg_pool1d(t(2, 3, 7), [3]),
    "aten::alias": lambda: aten.alias(t(3)),
    "aten::arange.start_step": lambda: aten.arange.start_step(1, 10, 2, device=DEV[0]),
    "aten::avg_pool1d": lambda: aten.avg_pool1d(t(2, 3, 9), [3], [2], [1], False, False),
    "aten::diagonal": lambda: aten.diagonal(t(3, 4), 1),
    "aten::expand": lambda: aten.expand(t(3, 1), [3, 4]),
    "aten::full": lambda: aten.full([2, 3], 1.5, device=DEV[0]),
    "aten::full_like": lambda: aten.full_like(t(2, 3), 2.0),
    "aten::permute": lambda: aten.permute(t(2, 3, 4), [2, 0, 1]),
    "aten::rand": lambda: aten.rand([3, 4], device=DEV[0]),
    "aten::randn": lambda: aten.randn([3, 4], device=DEV[0]),
    "aten::randperm": lambda: aten.randperm(7, device=DEV[0]),
    "aten::reflection_pad1d": lambda: aten.reflection_pad1d(t(2, 3, 5), [2, 1]),
    "aten::reflection_pad2d": lambda: aten.reflection_pad2d(t(2, 3, 5, 4), [2, 1, 1, 2]),
    "aten::reflection_pad3d": lambda: aten.reflection_pad3d(t(1, 2, 3, 5, 4), [1, 1, 2, 1, 1, 2]),
    "aten::replication_pad2d": lambda: aten.replication_pad2d(t(2, 3, 5, 4), [2, 1, 1, 2]),
    "aten::replication_pad3d": lambda: aten.replication_pad3d(t(1, 2, 3, 5, 4),
                                                              [1, 1, 2, 1, 1, 2]),
    "aten::scalar_tensor": lambda: aten.scalar_tensor(2.5, device=DEV[0]),
    "aten::select.int": lambda: aten.select.int(t(3, 4), 1, 2),
    "aten::slice.Tensor": lambda: aten.slice.Tensor(t(5, 4), 0, 1, 4, 2),
    "aten::split_with_sizes": lambda: aten.split_with_sizes(t(5, 4), [2, 3]),
    "aten::squeeze.dim": lambda: aten.squeeze.dim(t(3, 1), 1),
    "aten::squeeze.dims": lambda: aten.squeeze.dims(t(1, 3, 1), [0, 2]),
    "aten::unsqueeze": lambda: aten.unsqueeze(t(3), 0),
    "aten::upsample_bilinear2d.vec": lambda: aten.upsample_bilinear2d.vec(t(1, 2, 3, 4), [6, 8],
                                                                          False, None),
    "aten::upsample_nearest2d.vec": lambda: aten.upsample_nearest2d.vec(t(1, 2, 3, 4), [6, 8],
                                                                        None),
    "aten::var.dim": lambda: aten.var.dim(t(3, 4), [1]),
    "aten::_native_batch_norm_legit": lambda: aten._native_batch_norm_legit(
        t(4, 3, 5), t(3), t(3), t(3), t(3).abs(), True, 0.1, 1e-5),
    "aten::grid_sampler_2d": lambda: aten.grid_sampler_2d(t(1, 2, 4, 5), t(1, 3, 3, 2).tanh(),
                                                          0, 0, False),
    "aten::max_pool3d_with_indices": lambda: aten.max_pool3d_with_indices(t(1, 2, 4, 5, 6),
                                                                          [2, 2, 2]),
}

INDIRECT = [name(op) for op in CORE if route(op) in ("composite", "decomposition")]


def test_every_indirect_core_op_has_a_call():
    assert set(INDIRECT) <= set(CALLS), set(INDIRECT) - set(CALLS)


# Random ops: checked by what their values must satisfy, not against CPU's stream.
RANDOM_CHECKS = {
    "aten::rand": lambda x: x.shape == (3, 4) and bool(((x >= 0) & (x < 1)).all()) and x.std() > 0.05,
    "aten::randn": lambda x: x.shape == (3, 4) and bool(x.isfinite().all()) and x.std() > 0.1,
    "aten::randperm": lambda x: torch.equal(x.sort().values, torch.arange(7)),
}


def leaves(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("op", INDIRECT)
def test_indirect_core_op_runs_natively(op):
    with native():
        outs = [x for x in leaves(CALLS[op]()) if isinstance(x, torch.Tensor)]
        assert outs and all(x.device.type == "tpu" for x in outs)
        got = [x.cpu() for x in outs]
    if op in RANDOM_CHECKS:
        assert all(RANDOM_CHECKS[op](x) for x in got), got
        return
    DEV[0] = "cpu"
    try:
        want = [x for x in leaves(CALLS[op]()) if isinstance(x, torch.Tensor)]
    finally:
        DEV[0] = "tpu"
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)
