"""A view a program writes, starting past its storage's start, takes its offset as a
runtime operand as a read view does (test_view_offsets.py): a loop that fills the rows
of a preallocated output (`outputs[t] = h`) or of a KV cache (`cache[:, pos] = k`)
compiles one program (in DeferAndFuse one fused step) for every offset, not one per
offset. Each write lands where CPU's does, up to views ending at the storage's last
element (the offset is always in range: no clamped slice or update moves a write)."""

import math

import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode

ALL_MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING, EagerMode.DEFER_AND_FUSE]


def compiles():
    d = torch_tpu.metrics()
    return d["op_compiles"] + d["graph_compiles"]


def _index_put(buf, i, v):
    buf[i][torch.tensor([0, 2, 5])] = v[:3]


def _out_add(buf, i, v):
    torch.add(v, 1.5, out=buf[i])


def _out_mul_rows(buf, i, v):
    torch.mul(v.expand(2, -1), 2, out=buf[i:i + 2])


def _from_other_row(buf, i, v):
    buf[i].add_(buf[i - 1])  # reads one row of the storage it writes another of


def _column(buf, i):
    return buf[:, buf.shape[1] - ROWS + i]  # the last offset writes the last column


ROWS = 10  # of the written buffer; its columns: 10 and more

# name: (offsets' range end (exclusive): its last offset writes the storage's last
# element, the write)
WRITES = {
    "setitem_row": (10, lambda buf, i, v: buf.__setitem__(i, v * 2)),
    "setitem_scalar": (10, lambda buf, i, v: buf.__setitem__(i, float(i))),
    "setitem_from_host": (10, lambda buf, i, v: buf.__setitem__(i, v.cpu() * i)),
    "slice_copy": (9, lambda buf, i, v: buf[i:i + 2].copy_(v.expand(2, -1))),
    "row_from_view": (10, lambda buf, i, v: buf.__setitem__(i, buf[i - 1] * 2)),
    "add_row": (10, lambda buf, i, v: buf[i].add_(v)),
    "mul_rows": (8, lambda buf, i, v: buf[i:i + 3].mul_(1.5)),
    "fill_column": (10, lambda buf, i, v: _column(buf, i).fill_(1.0)),
    "copy_column": (10, lambda buf, i, v: _column(buf, i).copy_(v[:ROWS])),
    "out_add": (10, _out_add),
    "out_mul_rows": (9, _out_mul_rows),
    "index_put": (10, _index_put),
    "view_of_view": (9, lambda buf, i, v: buf[i:i + 2][1, 2:6].copy_(v[:4] + 1)),
    "other_row": (10, _from_other_row),
    "int16_view_fill": (10, lambda buf, i, v: buf.view(torch.int16)[i, -6:].fill_(7)),
}


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("case", sorted(WRITES))
def test_writes_into_views_compile_once_over_offsets(mode, case):
    end, write = WRITES[case]
    torch.manual_seed(0)
    # Storage sizes differ per case and mode: none finds programs another compiled.
    cols = ROWS + 3 * sorted(WRITES).index(case) + ALL_MODES.index(mode)
    buf = torch.randn(ROWS, cols)
    v = torch.randn(cols)
    buf_t, v_t = buf.to("tpu"), v.to("tpu")
    counts = []
    with torch_tpu.set_eager_mode(mode):
        # Three offsets compile (DeferAndFuse may run a new structure op by op once
        # before compiling it); the rest, up to the storage's last element, compile nothing.
        for i in range(1, end):
            write(buf_t, i, v_t)
            write(buf, i, v)
            got = buf_t.cpu()
            assert torch.equal(got, buf), (i, got, buf)
            counts.append(compiles())
    assert len(counts) >= 5
    assert counts[-1] == counts[2], counts


def test_an_rnn_filling_its_preallocated_output_compiles_once():
    # outputs[t] = h, read after every step (a stopping check), 3-D output.
    T, B, H = 12, 3, 5
    torch.manual_seed(1)
    w, x0 = torch.randn(H, H) * 0.3, torch.randn(B, H)
    out, out_t = torch.zeros(T, B, H), torch.zeros(T, B, H, device="tpu")
    w_t, h_t, h = w.to("tpu"), x0.to("tpu"), x0
    for mode in ALL_MODES:
        counts = []
        with torch_tpu.set_eager_mode(mode):
            for t in range(T):
                h_t = h_t * 0.5 + 1
                out_t[t] = h_t
                h = h * 0.5 + 1
                out[t] = h
                assert torch.equal(out_t.cpu(), out)
                counts.append(compiles())
        assert counts[-1] == counts[2], (mode, counts)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("one_storage", [False, True], ids=["cache_per_tensor", "one_storage_for_all"])
def test_a_decode_loop_with_a_hand_written_kv_cache_compiles_once(mode, one_storage):
    # Two layers; their keys and values in four caches, or in one storage (cache[l, 0] is
    # layer l's keys): four writes into it per step, all but the first into a value the
    # step computed.
    torch.manual_seed(2)
    L, B, S = 2, 2, 14
    D = 8 + 2 * ALL_MODES.index(mode) + (1 if one_storage else 0)  # no case reuses another's programs
    ws = [[torch.randn(D, D) / math.sqrt(D) for _ in range(4)] for _ in range(L)]
    x = torch.randn(B, 1, D)

    def run(device):
        wd = [[w.to(device) for w in layer] for layer in ws]
        if one_storage:
            whole = torch.zeros(L, 2, B, S, D, device=device)
            caches = [(whole[l, 0], whole[l, 1]) for l in range(L)]
        else:
            caches = [tuple(torch.zeros(B, S, D, device=device) for _ in range(2)) for _ in range(L)]
        h = x.to(device)
        steps, counts = [], []
        for pos in range(S):
            for (wq, wk, wv, wo), (cache_k, cache_v) in zip(wd, caches):
                q, k, v = h @ wq, h @ wk, h @ wv
                cache_k[:, pos:pos + 1] = k
                cache_v[:, pos:pos + 1] = v
                scores = q @ cache_k.transpose(1, 2) / math.sqrt(D)
                scores = scores.masked_fill(torch.arange(S, device=device) > pos, float("-inf"))
                h = torch.tanh(scores.softmax(-1) @ cache_v @ wo) + h
            steps.append(h.cpu())  # a stopping check reads each step
            counts.append(compiles())
        return steps, counts, [c.cpu() for pair in caches for c in pair]

    want, _, want_caches = run("cpu")
    with torch_tpu.set_eager_mode(mode):
        got, counts, got_caches = run("tpu")
    for g, w in zip(got + got_caches, want + want_caches):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)  # matmuls: f32 rounding
    # The first step writes unwritten caches at offset 0; from the fourth on, no compile.
    assert counts[-1] == counts[3], counts


def test_queued_writes_at_operand_offsets_keep_their_order():
    # Strict queues copies into parts of a storage and runs them as one program: writes
    # at operand offsets overlap and land in order, the later one winning.
    # A view taken before the writes sees them (it aliases the storage they replace).
    buf = torch.zeros(10, 4)
    buf_t = buf.to("tpu")
    alias, alias_t = buf[2:5, 1:], buf_t[2:5, 1:]
    for i in range(1, 7):
        for b in (buf, buf_t):
            b[i:i + 3] = float(i)
            b[i + 1] = -float(i)
            b[i + 1:i + 2, 1:3] = 10.0 * i
            b[i + 2:i + 4].mul_(2)
        assert torch.equal(buf_t.cpu(), buf), i
        assert torch.equal(alias_t.cpu(), alias), i
