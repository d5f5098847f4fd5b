"""DeferAndFuse reuses a fused graph's executable when a new graph has the same key: its
calls (programs and wiring) and which values it hands out. Graphs that look alike but
differ in what they compute or return must never reuse another graph's program; the
key is built without formatting text and a graph's uses of its own values are counted
while recording, so these tests pin down each part of it."""
import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode
from conftest import run_python_json

FUSED = EagerMode.DEFER_AND_FUSE


def _graphs():
    return torch_tpu.metrics()["fused_graphs"]


def _hits():
    return torch_tpu.metrics()["fused_graph_cache_hits"]


def test_same_structure_different_constants_gives_each_graphs_values():
    with torch_tpu.set_eager_mode(FUSED):
        x = torch.arange(8, dtype=torch.float32, device="tpu")
        outs = []
        for c in [1.0, 2.5, -3.0, 1.0]:
            outs.append(((x + c) * c).cpu())  # one graph per loop, same calls each time
    for c, got in zip([1.0, 2.5, -3.0, 1.0], outs):
        want = (torch.arange(8, dtype=torch.float64) + c) * c
        torch.testing.assert_close(got, want.float(), rtol=0, atol=0)


@pytest.mark.parametrize("shape,dtype", [((8,), torch.float32), ((2, 4), torch.float32),
                                         ((8,), torch.float64), ((8,), torch.int64)])
def test_same_calls_on_other_shapes_and_dtypes(shape, dtype):
    with torch_tpu.set_eager_mode(FUSED):
        x = torch.arange(8, dtype=dtype).reshape(shape)
        got = ((x.to("tpu") + 2) * 3).cpu()
    assert got.dtype == dtype and got.shape == shape
    assert torch.equal(got, (x + 2) * 3)


def test_which_values_a_graph_hands_out_is_part_of_its_key():
    with torch_tpu.set_eager_mode(FUSED):
        x = torch.arange(6, dtype=torch.float32, device="tpu")
        # Both graphs record the same three calls; the first keeps only the last value,
        # the second also the middle one, which must then be an output of its program.
        c = ((x + 1) * 2) - 3
        torch_tpu.synchronize()
        g0 = _graphs()
        b = (x + 1) * 2
        c2 = b - 3
        torch_tpu.synchronize()
        assert _graphs() == g0 + 1
        # The same structure as the second graph: its program is reused.
        h0 = _hits()
        b3 = (x + 1) * 2
        c3 = b3 - 3
        torch_tpu.synchronize()
        assert _hits() == h0 + 1
    want_b = (torch.arange(6, dtype=torch.float64) + 1) * 2
    torch.testing.assert_close(c.cpu(), (want_b - 3).float(), rtol=0, atol=0)
    torch.testing.assert_close(b.cpu(), want_b.float(), rtol=0, atol=0)
    torch.testing.assert_close(c2.cpu(), (want_b - 3).float(), rtol=0, atol=0)
    torch.testing.assert_close(b3.cpu(), want_b.float(), rtol=0, atol=0)
    torch.testing.assert_close(c3.cpu(), (want_b - 3).float(), rtol=0, atol=0)


def test_a_value_read_twice_inside_the_graph_is_not_handed_out():
    with torch_tpu.set_eager_mode(FUSED):
        x = torch.arange(6, dtype=torch.float32, device="tpu")
        torch_tpu.synchronize()
        m0 = torch_tpu.metrics()
        y = x * 2
        z = y + y * y  # y read three times inside the graph, then dropped
        del y
        got = z.cpu()
        m1 = torch_tpu.metrics()
    assert m1["fused_outputs"] - m0["fused_outputs"] == 1  # z only
    assert m1["elided_intermediates"] - m0["elided_intermediates"] == 2  # y and y * y
    w = torch.arange(6, dtype=torch.float64) * 2
    torch.testing.assert_close(got, (w + w * w).float(), rtol=0, atol=0)


def test_in_place_updates_and_functional_results_of_the_same_calls():
    with torch_tpu.set_eager_mode(FUSED):
        a = torch.arange(4, dtype=torch.float32, device="tpu")
        b = a.clone()
        a.add_(1).mul_(3)          # written back into a's storage
        c = b.add(1).mul(3)        # new tensors; b keeps its value
        got = [a.cpu(), b.cpu(), c.cpu()]
    base = torch.arange(4, dtype=torch.float64)
    for g, w in zip(got, [(base + 1) * 3, base, (base + 1) * 3]):
        torch.testing.assert_close(g, w.float(), rtol=0, atol=0)


def test_graph_cut_by_the_size_bound_keeps_values_the_rest_reads():
    # With a bound of 8 ops the chain is cut mid-way: values of a flushed prefix that the
    # pending rest reads are outputs of the prefix's program; the ones nobody reads are not.
    code = (
        "import json, torch, torch_tpu\n"
        "torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)\n"
        "x = torch.arange(5, dtype=torch.float32, device='tpu') / 4\n"
        "keep = []\n"
        "y = x\n"
        "for i in range(30):\n"
        "    y = y * 0.5 + x * (i % 3)\n"
        "    if i % 7 == 0: keep.append(y)\n"
        "vals = [k.cpu().tolist() for k in keep] + [y.cpu().tolist()]\n"
        "print(json.dumps({'vals': vals, 'cuts': torch_tpu.metrics()['flushes'].get('graph size bound', 0)}))\n")
    r = run_python_json(code, env={"TPU_FUSE_MAX_OPS": "8"})
    assert r["cuts"] >= 3
    x = torch.arange(5, dtype=torch.float64) / 4
    y, keep = x, []
    for i in range(30):
        y = y * 0.5 + x * (i % 3)
        if i % 7 == 0:
            keep.append(y)
    for got, want in zip(r["vals"], keep + [y]):
        torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), want, rtol=1e-6, atol=1e-6)
