"""Ops that only move elements keep every bit of bf16, f16 and float8 values, NaN
payloads and signs included, as CPU's byte copies do (XLA:CPU widens these types and
canonicalized NaNs on the way back), in every eager mode and compiled; and signbit of
float8 reads the sign bit."""
import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode
from conftest import no_fallbacks

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING, EagerMode.DEFER_AND_FUSE]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


@pytest.fixture(params=MODES, ids=lambda m: m.name)
def mode(request):
    with torch_tpu.set_eager_mode(request.param):
        yield request.param


def nan_bits_16(dtype):
    """Every NaN bit pattern of a 16-bit float (as int16), with 1.0, -0.0 and inf."""
    exp_bits = 8 if dtype == torch.bfloat16 else 5
    inf = ((1 << exp_bits) - 1) << (15 - exp_bits)
    nans = [s | inf | m for s in (0, 0x8000) for m in range(1, 1 << (15 - exp_bits))]
    one = torch.ones((), dtype=dtype).view(torch.int16).item()
    pats = nans + [one & 0xFFFF, 0x8000, inf]
    return torch.tensor([p - 0x10000 if p >= 0x8000 else p for p in pats], dtype=torch.int16)


def bits_of(dtype):
    """(bit patterns on CPU, the integer dtype they are held in)."""
    if dtype in FP8:
        return torch.arange(256, dtype=torch.int32).to(torch.uint8), torch.uint8
    return nan_bits_16(dtype), torch.int16


def ar(a):
    return torch.arange(a.shape[0], device=a.device)


# Each takes and returns a tensor of any dtype and only moves its elements, so applied
# to the bit patterns on CPU it gives the expected bits.
MOVES = {
    "cat": lambda a: torch.cat([a, a.flip(0)]),
    "stack": lambda a: torch.stack([a, a]),
    "where": lambda a: torch.where(ar(a) % 3 == 0, a, a.flip(0)),
    "index": lambda a: a[ar(a).flip(0)],
    "index_select": lambda a: a.index_select(0, ar(a).roll(5)),
    "flip": lambda a: a.flip(0),
    "roll": lambda a: a.roll(7),
    "gather": lambda a: a.gather(0, ar(a).roll(-3)),
    "take": lambda a: a.take(ar(a).flip(0)),
    "slice": lambda a: a[3:-2].contiguous(),
    "strided": lambda a: a[1::3].contiguous(),
    "narrow_clone": lambda a: a.narrow(0, 2, a.shape[0] - 4).clone(),
    "expand": lambda a: a[None].expand(3, -1).contiguous(),
    "repeat": lambda a: a.repeat(2),
    "transpose": lambda a: a[: a.shape[0] // 2 * 2].reshape(2, -1).t().contiguous(),
    "pad": lambda a: torch.nn.functional.pad(a, (2, 3)),
    "tril": lambda a: a[:16 * 16].reshape(16, 16).tril() if a.shape[0] >= 256 else a[:16].reshape(4, 4).tril(),
    "diagonal": lambda a: a[:16].reshape(4, 4).diagonal().contiguous(),
    "setitem_index": lambda a: (lambda z: (z.__setitem__(ar(a).flip(0), a), z)[1])(a.flip(0).clone()),
    "index_put": lambda a: a.flip(0).index_put((ar(a).roll(2),), a),
    "scatter": lambda a: a.flip(0).scatter(0, ar(a).roll(1), a),
    "index_copy": lambda a: a.flip(0).index_copy(0, ar(a).roll(3), a),
    "masked_scatter": lambda a: a.flip(0).masked_scatter(ar(a) % 2 == 0, a),
    "slice_assign": lambda a: (lambda z: (z.__setitem__(slice(2, 9), a[:7]), z)[1])(a.flip(0).clone()),
    "chunk_cat": lambda a: torch.cat(a.chunk(3)[::-1]),
}


def check_moves(dtype, fns):
    bits, held = bits_of(dtype)
    x = bits.to("tpu").view(dtype)
    bad = {}
    for name, fn in fns.items():
        want = fn(bits)
        got = fn(x).cpu().view(held)
        if not torch.equal(got, want):
            diff = (got != want).nonzero().flatten()[:4].tolist()
            bad[name] = [(hex(int(want.flatten()[i]) & 0xFFFF), hex(int(got.flatten()[i]) & 0xFFFF))
                         for i in diff]
    assert not bad, f"{dtype}: (expected, got) bits: {bad}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16] + FP8, ids=str)
def test_moves_keep_bits(mode, dtype):
    with no_fallbacks():
        check_moves(dtype, MOVES)


def test_fused_moves_keep_bits():
    # A chain of moves left pending and fused into one program, then read.
    bits = nan_bits_16(torch.bfloat16)
    chain = lambda a: torch.cat([a.roll(3), a.flip(0)])[ar(a).roll(1)].index_select(0, ar(a).flip(0))
    with torch_tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE):
        got = chain(bits.to("tpu").view(torch.bfloat16)).cpu().view(torch.int16)
    assert torch.equal(got, chain(bits))


def test_masked_fill_and_where_scalar_keep_other_bits(mode):
    bits = nan_bits_16(torch.bfloat16)
    x = bits.to("tpu").view(torch.bfloat16)
    keep = ar(bits) % 2 == 0
    want = torch.where(keep, bits, torch.tensor(2.0, dtype=torch.bfloat16).view(torch.int16))
    got = x.masked_fill(~keep.to("tpu"), 2.0).cpu().view(torch.int16)
    assert torch.equal(got, want)
    got = torch.where(keep.to("tpu"), x, 2.0).cpu().view(torch.int16)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e5m2], ids=str)
def test_compiled_moves_keep_bits(dtype):
    torch._dynamo.reset()
    bits, held = bits_of(dtype)
    x = bits.to("tpu").view(dtype)

    def moves(a):
        i = ar(a).flip(0)
        return (torch.cat([a, a.flip(0)]), torch.where(i % 2 == 0, a, a.roll(1)), a[i],
                a.index_select(0, i), torch.stack([a, a])[1:, 3:].contiguous())

    try:
        got = torch.compile(moves, backend="tpu")(x)
    finally:
        torch._dynamo.reset()
    for g, w in zip(got, moves(bits)):
        assert torch.equal(g.cpu().view(held), w)


def test_arithmetic_unchanged_around_moves(mode):
    # The moves' bitcasts change no values: a small bf16 computation through them
    # matches CPU's.
    g = torch.Generator().manual_seed(0)
    a = torch.randn(8, 16, generator=g).bfloat16()

    def f(t):
        y = torch.cat([t * 2, t.flip(1)], 1)[:, 3:20]
        return torch.where(y > 0, y, y.exp()).sum(1) + y.roll(1, 0)[:, 0]

    assert torch.equal(f(a.to("tpu")).cpu(), f(a))


# ---- signbit on float8 --------------------------------------------------------------------

def signbit_from_bytes(byte, dtype):
    # The sign bit (bit 7); the fnuz formats spend 0x80 on their one NaN, which has no
    # sign (it converts to +NaN).
    fnuz = dtype in (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
    return [(v & 0x80) != 0 and not (fnuz and v == 0x80) for v in byte.tolist()]


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_signbit_float8_raises_like_cpu(mode, dtype):
    # CPU's signbit kernel has no float8 (nor, as far as we know, CUDA's): tpu computed it
    # before; CPU parity now. The sign is still read through a float32 view.
    byte = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    with pytest.raises(NotImplementedError, match="not implemented for"):
        torch.signbit(byte.view(dtype))
    x = byte.to("tpu").view(dtype)
    with pytest.raises(NotImplementedError, match=f"not implemented for '{str(dtype)[6:].capitalize()}'"):
        torch.signbit(x)
    assert torch.signbit(x.float()).cpu().tolist() == signbit_from_bytes(byte, dtype)


def test_signbit_float8_compiled_raises_like_cpu():
    torch._dynamo.reset()
    byte = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    try:
        with pytest.raises(Exception, match="not implemented for 'Float8_e4m3fn'"):
            torch.compile(torch.signbit, backend="tpu")(byte.to("tpu").view(torch.float8_e4m3fn))
    finally:
        torch._dynamo.reset()
