"""Python scalars meeting the less common dtypes (uint16/32/64, float8, float8_e8m0fnu,
complex32): checked and converted as CPU does it, at the call, in every eager mode."""
import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING, EagerMode.DEFER_AND_FUSE]
F8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


@pytest.fixture(params=MODES, ids=lambda m: m.name)
def mode(request):
    with torch_tpu.set_eager_mode(request.param):
        yield request.param


def outcome(fn, device):
    """fn(device)'s values on the CPU (bit patterns for float8), or its error's type and message."""
    try:
        r = fn(device)
    except Exception as e:  # noqa: BLE001 - the error is the outcome compared
        return type(e).__name__, str(e).splitlines()[0]
    if r.dtype in F8:
        return r.dtype, r.cpu().view(torch.uint8).tolist()
    return r.dtype, r.cpu().tolist()


def same_as_cpu(fn):
    want = outcome(fn, "cpu")
    assert outcome(fn, "tpu") == want
    return want


# ---- fills of the barebones unsigned types: host-side range check ----------------------

@pytest.mark.parametrize("dtype,value", [
    (torch.uint16, 70000), (torch.uint16, 70000.0), (torch.uint16, 1e10), (torch.uint16, -1.5),
    (torch.uint32, 1e10), (torch.uint32, 2**40), (torch.uint64, -1.5),
])
def test_uint_fill_out_of_range_raises_at_the_call(mode, dtype, value):
    # DeferAndFuse filled [4464, 4464] / [65535, 65535] silently: the check was device-side.
    for n in (2, 5000):  # a small fill (host bytes in Strict) and a program fill
        t = torch.full((n,), 7, dtype=dtype, device="tpu")
        with pytest.raises(RuntimeError, match="without overflow"):
            t.fill_(value)
        with pytest.raises(RuntimeError, match="without overflow"):
            torch.full_like(t, value)
        assert t.cpu().tolist() == [7] * n  # untouched, and readable


@pytest.mark.parametrize("dtype,value", [
    (torch.uint16, -1), (torch.uint16, 65535), (torch.uint16, 2.5), (torch.uint32, 70000),
    (torch.uint32, -1), (torch.uint64, 1e10), (torch.uint64, -1), (torch.uint64, -2**63),
])
def test_uint_fill_in_range_matches_cpu(mode, dtype, value):
    for n in (2, 5000):
        same_as_cpu(lambda d: torch.zeros(n, dtype=dtype, device=d).fill_(value))


# ---- uint64 scalars above INT64_MAX --------------------------------------------------

BIG = {
    "full": lambda d: torch.full((2,), 2**64 - 1, dtype=torch.uint64, device=d),
    "fill_": lambda d: torch.zeros(2, dtype=torch.uint64, device=d).fill_(2**63),
    "fill_big": lambda d: torch.zeros(5000, dtype=torch.uint64, device=d).fill_(2**63 + 5),
    "full_like": lambda d: torch.full_like(torch.zeros(2, dtype=torch.uint64, device=d), 2**63 + 1),
    "new_full": lambda d: torch.zeros(2, dtype=torch.uint64, device=d).new_full((2,), 2**63 + 1),
    "eq": lambda d: torch.tensor([2**64 - 1, 5], dtype=torch.uint64, device=d) == 2**64 - 1,
    "ne": lambda d: torch.tensor([2**63, 5], dtype=torch.uint64, device=d) != 2**63,
    "int64_fill_refused": lambda d: torch.zeros(2, dtype=torch.int64, device=d).fill_(2**63),
}


@pytest.mark.parametrize("case", list(BIG))
def test_uint64_scalar_above_int64_max(mode, case):
    # Every integer Scalar travelled as an i64 operand: "value cannot be converted to type
    # int64_t without overflow" for a uint64 value CPU takes.
    same_as_cpu(BIG[case])


def test_uint64_big_and_small_scalars_share_no_program(mode):
    # The same op with an i64-sized and a u64-only value: each gets its own operand type.
    t = torch.tensor([2**64 - 1, 7], dtype=torch.uint64, device="tpu")
    for v in (7, 2**64 - 1, 7, 2**63):
        assert (t == v).cpu().tolist() == (t.cpu() == v).tolist()


def test_uint64_scalar_compiled():
    def f(x):
        return x == 2**64 - 1, torch.full_like(x, 2**63 + 1)

    x = torch.tensor([2**64 - 1, 5], dtype=torch.uint64)
    got = torch.compile(f, backend="tpu")(x.to("tpu"))
    assert got[0].cpu().tolist() == [True, False]
    assert got[1].cpu().tolist() == [2**63 + 1] * 2


# ---- float8: where's Python number converts as .to() does; fill_ stays checked ------------

@pytest.mark.parametrize("dtype", F8, ids=str)
@pytest.mark.parametrize("value", [1000.0, 1e5, 1e10, float("inf"), -float("inf"), 300.0, 61440.0, -1e-10])
def test_float8_where_python_number_matches_cpu(mode, dtype, value):
    cond = [True, False, True]
    same_as_cpu(lambda d: torch.where(torch.tensor(cond, device=d),
                                      torch.ones(3, dtype=dtype, device=d), value))
    same_as_cpu(lambda d: torch.where(torch.tensor(cond, device=d), value,
                                      torch.ones(3, dtype=dtype, device=d)))


@pytest.mark.parametrize("dtype", F8, ids=str)
def test_float8_fill_out_of_range_raises_at_the_call(mode, dtype):
    t = torch.ones(4, dtype=dtype, device="tpu")
    with pytest.raises(RuntimeError, match="without overflow"):
        t.fill_(1e10)
    assert t.cpu().float().tolist() == [1.0] * 4
    # One element is filled unchecked by CPU (as scalar_tensor): the value as .to() makes it.
    for shape in [(), (1,)]:
        same_as_cpu(lambda d: torch.zeros(shape, dtype=dtype, device=d).fill_(1e10))


# ---- unsupported dtypes: a NotImplementedError, never a TypeError --------------------------

def test_unsupported_dtype_comparison_raises_instead_of_a_python_bool(mode):
    # A TypeError made Tensor.__eq__ return NotImplemented, and `x == y` a plain False.
    x = torch.zeros(2, device="tpu").view(torch.complex32)
    y = torch.zeros(2, device="tpu").view(torch.complex32)
    with pytest.raises(NotImplementedError, match="ComplexHalf is not supported on tpu"):
        x == y  # noqa: B015
    with pytest.raises(NotImplementedError, match="ComplexHalf is not supported on tpu"):
        x != y  # noqa: B015
    with pytest.raises(NotImplementedError, match="not supported on tpu"):
        torch.zeros(3, dtype=torch.complex32, device="tpu")



def test_float8_e8m0fnu_is_a_clear_error(mode):
    # Not held on tpu (yet): every use says so, as a NotImplementedError.
    with pytest.raises(NotImplementedError, match="Float8_e8m0fnu is not supported on tpu"):
        torch.ones(3, dtype=torch.float8_e8m0fnu, device="tpu")
    with pytest.raises(NotImplementedError, match="Float8_e8m0fnu is not supported on tpu"):
        torch.ones(3, device="tpu").to(torch.float8_e8m0fnu)
    x = torch.tensor([127, 128], dtype=torch.uint8, device="tpu").view(torch.float8_e8m0fnu)
    with pytest.raises(NotImplementedError, match="Float8_e8m0fnu is not supported on tpu"):
        x == x  # noqa: B015
    with pytest.raises(NotImplementedError, match="Float8_e8m0fnu is not supported on tpu"):
        x.float()
    assert (torch.ones(2, device="tpu") == 1).cpu().tolist() == [True, True]  # still usable

# ---- CPU's argument checks that were missing (tpu computed a value) ------------------------

REFUSED = {
    "uint16 + int64": lambda d: torch.tensor([1, 40000], dtype=torch.uint16, device=d) + torch.tensor([1, 2], device=d),
    "uint64 + int64": lambda d: torch.tensor([1, 2**63], dtype=torch.uint64, device=d) + torch.tensor([1, 2], device=d),
    "uint32 * uint8": lambda d: torch.ones(2, dtype=torch.uint32, device=d) * torch.ones(2, dtype=torch.uint8, device=d),
    "int64 < 1+2j": lambda d: torch.tensor([1, 0, 3], device=d) < (1 + 2j),
    "float32 >= 1+2j": lambda d: torch.tensor([1., 0., 3.], device=d) >= (1 + 2j),
    "add(int, alpha=True)": lambda d: torch.add(torch.tensor([1, 2], device=d), torch.tensor([1, 2], device=d),
                                                alpha=True),
    "add(bool, alpha=2.5)": lambda d: torch.add(torch.tensor([True], device=d), torch.tensor([True], device=d),
                                                alpha=2.5),
    "add(int, 3, alpha=2.5)": lambda d: torch.add(torch.tensor([1, 2], device=d), 3, alpha=2.5),
    "sub(float, alpha=1j)": lambda d: torch.sub(torch.ones(2, device=d), torch.ones(2, device=d), alpha=1j),
    "sub(bool, alpha=2.5)": lambda d: torch.sub(torch.tensor([True], device=d), torch.tensor([True], device=d),
                                                alpha=2.5),
    "addcmul(int8, value=1e10)": lambda d: torch.addcmul(*(torch.ones(2, dtype=torch.int8, device=d),) * 3, value=1e10),
    "addcmul(int8, value=1000)": lambda d: torch.addcmul(*(torch.ones(2, dtype=torch.int8, device=d),) * 3, value=1000),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_cpu_refusals_at_the_call(mode, case):
    want, got = outcome(REFUSED[case], "cpu"), outcome(REFUSED[case], "tpu")
    assert want[0] in ("RuntimeError", "NotImplementedError")
    if "+2j" in case:  # CPU names its kernel ("lt_cpu"); the dtype is the same
        assert got[0] == want[0] and "not implemented for 'ComplexFloat'" in got[1]
    else:
        assert got == want


ALLOWED = {
    "uint16 + float32": lambda d: torch.tensor([1, 40000], dtype=torch.uint16, device=d) + torch.ones(2, device=d),
    "add(float, alpha=2.5)": lambda d: torch.add(torch.ones(2, device=d), torch.ones(2, device=d), alpha=2.5),
    "add(bool, alpha=True)": lambda d: torch.add(torch.tensor([True, False], device=d),
                                                 torch.tensor([False, False], device=d), alpha=True),
    "add(int, 2.5, alpha=2)": lambda d: torch.add(torch.tensor([1, 2], device=d), 2.5, alpha=2),
    "addcmul(int8, value=3)": lambda d: torch.addcmul(*(torch.ones(2, dtype=torch.int8, device=d),) * 3, value=3),
    "float32 == 1+2j": lambda d: torch.tensor([1., 0.], device=d) == (1 + 2j),
}


@pytest.mark.parametrize("case", list(ALLOWED))
def test_neighbours_of_the_refusals_still_compute(mode, case):
    kind, _ = same_as_cpu(ALLOWED[case])
    assert isinstance(kind, torch.dtype)


def test_uint16_with_a_0dim_int64_raises_like_cpu(mode):
    # A 0-dim tensor takes no part in promotion: no promotion error, but CPU's add kernel
    # (and CUDA's) has no uint16, and tpu, which computed it before, raises as CPU does.
    fn = lambda d: torch.tensor([1, 40000], dtype=torch.uint16, device=d) + torch.tensor(3, device=d)  # noqa: E731
    want, got = outcome(fn, "cpu"), outcome(fn, "tpu")
    assert want[0] == got[0] == "NotImplementedError" and "not implemented for 'UInt16'" in got[1]
