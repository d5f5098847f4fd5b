"""Results of nonzero / masked_select (and the ops built on them: argwhere, where(cond),
nonzero(as_tuple=True), boolean-mask indexing) own a buffer sized to the result, not to
the input; a loop whose counts vary compiles one program per bucket of counts, not one
per count; values, dtypes and shapes match CPU's."""
import itertools

import pytest
import torch

import torch_tpu

from conftest import no_fallbacks


def sync():
    torch.tpu.synchronize()


def storage_bytes(t):
    return t.untyped_storage().nbytes()  # an int: a failing assert does not print the storage


def one_hot_mask(shape, positions):
    m = torch.zeros(shape, dtype=torch.bool).view(-1)
    m[list(positions)] = True
    return m.view(shape)


# ---- storage sized to the result ----

def test_nonzero_result_owns_a_result_sized_storage():
    mask = one_hot_mask((1024, 1024), [5, 1024 * 1024 - 1]).to("tpu")
    nz = mask.nonzero()
    assert nz.tolist() == [[0, 5], [1023, 1023]]
    assert nz.dtype == torch.int64 and nz.is_contiguous()
    # Before: the [n, 2] int64 buffer of every element's coordinates (16 MiB) stayed attached.
    assert storage_bytes(nz) <= 1.5 * nz.nbytes, (storage_bytes(nz), nz.nbytes)


@pytest.mark.parametrize("count", [1, 2, 3, 5, 7, 13, 100, 1000])
def test_result_storage_is_at_most_one_and_a_half_times_the_result(count):
    g = torch.Generator().manual_seed(count)
    pos = torch.randperm(64 * 1024, generator=g)[:count].tolist()
    mask = one_hot_mask((64, 1024), pos)
    nz = mask.to("tpu").nonzero()
    assert torch.equal(nz.cpu(), mask.nonzero())
    assert storage_bytes(nz) <= 1.5 * nz.nbytes, (storage_bytes(nz), nz.nbytes)
    x = torch.randn(64, 1024)
    sel = torch.masked_select(x.to("tpu"), mask.to("tpu"))
    assert torch.equal(sel.cpu(), torch.masked_select(x, mask))
    assert storage_bytes(sel) <= 1.5 * sel.nbytes, (storage_bytes(sel), sel.nbytes)


def test_masked_select_result_owns_a_result_sized_storage():
    mask = one_hot_mask((1 << 20,), [5, (1 << 20) - 1]).to("tpu")
    x = torch.arange(1 << 20, dtype=torch.float32).to("tpu")
    sel = torch.masked_select(x, mask)
    assert sel.tolist() == [5.0, float((1 << 20) - 1)]
    # Before: a storage of the whole input's size (4 MiB) for 2 floats.
    assert storage_bytes(sel) <= 1.5 * sel.nbytes, (storage_bytes(sel), sel.nbytes)


def test_memory_returns_to_baseline_after_the_input_is_freed():
    sync()
    base = torch.tpu.memory_allocated()
    mask = one_hot_mask((1024, 1024), [3, 77, 1000]).to("tpu")
    x = torch.ones(1024, 1024, device="tpu")
    nz = mask.nonzero()
    rows = torch.where(mask)
    sel = x[mask]
    ms = torch.masked_select(x, mask)
    del mask, x
    sync()
    held = torch.tpu.memory_allocated() - base
    # Only the results' own (bucketed) buffers are left: a few hundred bytes, not MiBs.
    assert held <= 1024, held
    assert nz.tolist() == [[0, 3], [0, 77], [0, 1000]]
    assert [r.tolist() for r in rows] == [[0, 0, 0], [3, 77, 1000]]
    assert sel.tolist() == [1.0] * 3 and ms.tolist() == [1.0] * 3
    del nz, rows, sel, ms
    sync()
    assert torch.tpu.memory_allocated() == base


# ---- one program per bucket of counts, not per count ----

def test_varying_counts_do_not_compile_a_program_per_count():
    shape = (97, 89)  # a shape no other test uses: its programs are compiled here
    g = torch.Generator().manual_seed(0)
    counts = list(range(1, 41)) + [500, 511, 600, 700]
    masks = []
    for c in counts:
        pos = torch.randperm(97 * 89, generator=g)[:c].tolist()
        masks.append(one_hot_mask(shape, pos))
    on_tpu = [m.to("tpu") for m in masks]
    x = torch.randn(shape)
    xt = x.to("tpu")
    sync()
    before = torch_tpu.metrics()["op_compiles"]
    got = [(mt.nonzero(), torch.masked_select(xt, mt)) for mt in on_tpu]
    compiles = torch_tpu.metrics()["op_compiles"] - before
    for m, (nz, sel) in zip(masks, got):
        assert torch.equal(nz.cpu(), m.nonzero())
        assert torch.equal(sel.cpu(), torch.masked_select(x, m))
    # Buckets 1 2 3 4 6 8 12 16 24 32 48 512 768 (13), for each of two ops, and the
    # count program: 27 at most, where one per count would be 88.
    assert compiles <= 27, compiles


# ---- values against CPU ----

SHAPES = [(), (0,), (3, 0, 2), (1,), (5,), (4, 7), (2, 3, 4), (1, 1, 1, 5), (33, 17)]
PATTERNS = ["false", "true", "random", "last"]


def pattern_of(shape, pattern, seed=0):
    n = 1
    for s in shape:
        n *= s
    if pattern == "false":
        return torch.zeros(shape, dtype=torch.bool)
    if pattern == "true":
        return torch.ones(shape, dtype=torch.bool)
    if pattern == "last":
        m = torch.zeros(n, dtype=torch.bool)
        if n:
            m[-1] = True
        return m.view(shape)
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) < 0.4)


def values_of(mask, dtype):
    """A tensor of `dtype` nonzero exactly where `mask` is (NaN and -0.0 among floats)."""
    if dtype == torch.bool:
        return mask.clone()
    if dtype.is_floating_point:
        v = torch.full(mask.shape, -0.0, dtype=dtype)
        if mask.numel():
            v[mask] = torch.tensor([float("nan"), 2.5, -1.0], dtype=dtype).repeat(mask.numel())[: int(mask.sum())]
        return v
    if dtype.is_complex:
        v = torch.zeros(mask.shape, dtype=dtype)
        v[mask] = torch.tensor(1j, dtype=dtype)
        return v
    v = torch.zeros(mask.shape, dtype=dtype)
    v[mask] = torch.tensor(-3 if dtype != torch.uint8 else 200, dtype=dtype)
    return v


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float32,
                                   torch.bfloat16, torch.complex64])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_nonzero_family_matches_cpu(shape, dtype):
    for pattern in PATTERNS:
        c = values_of(pattern_of(shape, pattern), dtype)
        t = c.to("tpu")
        with no_fallbacks():
            got = {
                "nonzero": t.nonzero(),
                "argwhere": torch.argwhere(t),
                "as_tuple": t.nonzero(as_tuple=True),
                "where": torch.where(t),
            }
        want = {
            "nonzero": c.nonzero(),
            "argwhere": torch.argwhere(c),
            "as_tuple": c.nonzero(as_tuple=True),
            "where": torch.where(c),
        }
        for k in want:
            g, w = got[k], want[k]
            gs, ws = (g, w) if isinstance(w, tuple) else ((g,), (w,))
            assert len(gs) == len(ws), (k, pattern)
            for a, b in zip(gs, ws):
                assert a.device.type == "tpu" and a.dtype == b.dtype and a.shape == b.shape, (k, pattern)
                assert torch.equal(a.cpu(), b), (k, pattern)
        out = torch.empty(0, dtype=torch.int64, device="tpu")
        torch.nonzero(t, out=out)
        assert torch.equal(out.cpu(), want["nonzero"])


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int64, torch.float32, torch.float16,
                                   torch.complex64])
def test_masked_select_matches_cpu(dtype):
    cases = [((), ()), ((0,), (0,)), ((5,), (5,)), ((4, 7), (4, 7)), ((4, 7), (7,)), ((7,), (4, 7)),
             ((3, 1), (1, 5)), ((2, 3, 4), (3, 1)), ((33, 17), (33, 17)), ((2, 0), (1, 1))]
    for (xs, ms), pattern in itertools.product(cases, PATTERNS):
        mask = pattern_of(ms, pattern, seed=len(xs))
        x = torch.arange(torch.Size(xs).numel()).view(xs) % 5 + 1
        x = x.to(dtype) if not dtype.is_complex else (x + 1j * x).to(dtype)
        with no_fallbacks():
            got = torch.masked_select(x.to("tpu"), mask.to("tpu"))
        want = torch.masked_select(x, mask)
        assert got.dtype == want.dtype and got.shape == want.shape, (xs, ms, pattern)
        assert torch.equal(got.cpu(), want), (xs, ms, pattern)
        if xs == ms:
            assert torch.equal(x.to("tpu")[mask.to("tpu")].cpu(), x[mask]), (xs, pattern)
        out = torch.empty(0, dtype=dtype, device="tpu")
        torch.masked_select(x.to("tpu"), mask.to("tpu"), out=out)
        assert torch.equal(out.cpu(), want)


def test_many_true_values_across_blocks():
    # Counts spread over several levels of the blocked prefix sum (37000 = 2313 blocks
    # of 16, 145 of those, 10 of those).
    for p in (0.001, 0.5, 0.999):
        g = torch.Generator().manual_seed(int(p * 1000))
        mask = torch.rand(1000, 37, generator=g) < p
        x = torch.randn(1000, 37, generator=g)
        assert torch.equal(mask.to("tpu").nonzero().cpu(), mask.nonzero())
        assert torch.equal(torch.masked_select(x.to("tpu"), mask.to("tpu")).cpu(), torch.masked_select(x, mask))
        y = x.clone()
        y[mask] = 7.0
        yt = x.to("tpu")
        yt[mask.to("tpu")] = 7.0
        assert torch.equal(yt.cpu(), y)


def test_nonzero_static_matches_cpu():
    for shape, pattern, size in itertools.product([(5,), (4, 7), (2, 3, 4)], PATTERNS, [0, 1, 3, 100]):
        c = pattern_of(shape, pattern).to(torch.float32)
        got = torch.nonzero_static(c.to("tpu"), size=size, fill_value=-7)
        want = torch.nonzero_static(c, size=size, fill_value=-7)
        assert got.shape == want.shape and torch.equal(got.cpu(), want), (shape, pattern, size)


def test_errors_are_cpus():
    m = torch.ones(3, dtype=torch.uint8)
    x = torch.ones(3)
    with pytest.raises(RuntimeError, match="masked_select: expected BoolTensor for mask"):
        torch.masked_select(x.to("tpu"), m.to("tpu"))
    with pytest.raises(RuntimeError, match="Long"):
        torch.nonzero(x.to("tpu"), out=torch.empty(0, dtype=torch.int32, device="tpu"))


def test_deferred_input_is_read_in_one_cut_and_the_result_is_computed():
    # DeferAndFuse: counting runs the pending work once; the packing then launches at
    # once, so the result is a computed value (not pending work whose reads cut again).
    x = torch.tensor([0.0, 1.0, 0.0, 2.0, 3.0], device="tpu")
    with torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
        for op in (lambda y: y.nonzero(), lambda y: torch.masked_select(y, y > 1)):
            y = x * 2
            before = torch_tpu.metrics()["flushes"].get("value needed", 0)
            r = op(y)
            assert torch_tpu._C.is_materialized(r)
            assert torch_tpu.metrics()["flushes"].get("value needed", 0) - before == 1
    assert x.nonzero().tolist() == [[1], [3], [4]]
