"""Invalid indexing writes raise CPU's error at the call (s49 indexing probe): a value
or source of the wrong shape, float index tensors, indices that do not broadcast or are
too many, a slice_scatter/select_scatter src of the wrong shape, a non-bool mask for
masked_fill_, an index_reduce_ source of another dtype. Before, these wrote silently or
left a compile error that made the written tensor unreadable at every later read."""
import pytest
import torch

import torch_tpu
from conftest import run_python_json


def _t(v, d, **k):
    return torch.tensor(v, device=d, **k)


def _run(case, device):
    """(exception type, first line of its message) of case(x, device), and x after it."""
    x = torch.arange(12.0, device=device).view(3, 4)
    try:
        case(x, device)
        err = (None, "")
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        err = (type(e), str(e).splitlines()[0])
    return err, x


# name -> case(x, device), x a float32 [3, 4] tensor. Each raises on CPU.
CASES = {
    # 1: values and sources that do not fit
    "setitem value [3] into [3, 2]": lambda x, d: x.__setitem__((slice(None), _t([0, 3], d)), torch.ones(3, device=d)),
    "index_put_ acc value [2, 2]": lambda x, d: x.index_put_((_t([0, 2], d),), torch.ones(2, 2, device=d),
                                                             accumulate=True),
    "index_put (functional) value [2, 2]": lambda x, d: torch.index_put(x, (_t([0, 2], d),), torch.ones(2, 2, device=d)),
    "_index_put_impl_ value [2, 2]": lambda x, d: torch.ops.aten._index_put_impl_(x, (_t([0, 2], d),),
                                                                                  torch.ones(2, 2, device=d)),
    "value with extra leading 1s": lambda x, d: x.index_put_((_t([0, 2], d),), torch.ones(1, 1, 1, 4, device=d)),
    "1-d acc value [1, 2]": lambda x, d: x[0].index_put_((_t([0, 2], d),), torch.ones(1, 2, device=d),
                                                         accumulate=True),
    "setitem non-adjacent value [2]": lambda x, d: x.view(3, 2, 2).__setitem__(
        (_t([0, 1, 2], d), slice(None), _t([0], d)), torch.ones(3, device=d)),
    "setitem mask value [2, 3]": lambda x, d: x.__setitem__(_t([True, False, True], d), torch.ones(2, 3, device=d)),
    "index_reduce_ source [2, 3]": lambda x, d: x.index_reduce_(0, _t([0, 2], d), torch.ones(2, 3, device=d), "amax"),
    "index_reduce_ source [2]": lambda x, d: x.index_reduce_(0, _t([0, 2], d), torch.ones(2, device=d), "amin"),
    "index_reduce_ 2 indices, 3 slices": lambda x, d: x.index_reduce_(0, _t([0, 2], d), torch.ones(3, 4, device=d),
                                                                      "prod"),
    "index_reduce_ index 2-d": lambda x, d: x.index_reduce_(0, _t([[0, 2]], d), torch.ones(2, 4, device=d), "mean"),
    "put_ 2 indices, 3 sources": lambda x, d: x.put_(_t([0, 2], d), torch.ones(3, device=d)),
    "put_ acc 2 indices, 1 source": lambda x, d: x.put_(_t([0, 2], d), torch.ones(1, device=d), accumulate=True),
    # 2: float index tensors in writes
    "setitem float index": lambda x, d: x.__setitem__(_t([1.7], d), 1.0),
    "setitem int and float index": lambda x, d: x.__setitem__((_t([1], d), _t([1.7], d)), 1.0),
    "index_put_ float index": lambda x, d: x.index_put_((_t([2.9], d),), _t(5.0, d)),
    "index_put_ acc float index": lambda x, d: x.index_put_((_t([2.9], d),), _t(5.0, d), accumulate=True),
    "_index_put_impl_ float index": lambda x, d: torch.ops.aten._index_put_impl_(x, (_t([2.9], d),), _t(5.0, d)),
    "index_put_ int16 index": lambda x, d: x.index_put_((_t([2], d, dtype=torch.int16),), _t(5.0, d)),
    "put_ float index": lambda x, d: x.put_(_t([1.7, 6.2], d), torch.ones(2, device=d)),
    "put_ int32 index": lambda x, d: x.put_(_t([1, 6], d, dtype=torch.int32), torch.ones(2, device=d)),
    # 3: indices that do not broadcast together, or too many
    "setitem indices [2] and [3]": lambda x, d: x.__setitem__((_t([0, 1], d), _t([0, 1, 2], d)), 1.0),
    "index_put_ acc indices [2] and [3]": lambda x, d: x.index_put_((_t([0, 1], d), _t([0, 1, 2], d)), _t(1.0, d),
                                                                    accumulate=True),
    "index_put_ 3 indices on 2-d": lambda x, d: x.index_put_((_t([0], d),) * 3, _t(1.0, d)),
    "index_put_ acc 3 indices on 2-d": lambda x, d: x.index_put_((_t([0], d),) * 3, _t(1.0, d), accumulate=True),
    # 4: slice_scatter / select_scatter src shapes
    "slice_scatter src [4] into [2]": lambda x, d: x[0].copy_(
        torch.slice_scatter(x[0], torch.arange(1.0, 5.0, device=d), 0, 1, 3)),
    "slice_scatter src [3, 3]": lambda x, d: x.copy_(torch.slice_scatter(x, torch.ones(3, 3, device=d), 1, 0, 2)),
    "slice_scatter src [2, 2]": lambda x, d: x.copy_(torch.slice_scatter(x, torch.ones(2, 2, device=d), 1, 0, 2)),
    "slice_scatter step 2 src [3, 1]": lambda x, d: x.copy_(
        torch.slice_scatter(x, torch.ones(3, 1, device=d), 1, 0, None, 2)),
    "select_scatter src [3]": lambda x, d: x.copy_(torch.select_scatter(x, torch.ones(3, device=d), 0, 0)),
    "select_scatter src [1, 4]": lambda x, d: x.copy_(torch.select_scatter(x, torch.ones(1, 4, device=d), 0, -1)),
    # 5: masked_fill_ with a non-bool mask
    "masked_fill_ long mask": lambda x, d: x[0].masked_fill_(_t([0, 1, 2, 0], d), 7.0),
    "masked_fill_ float mask": lambda x, d: x[0].masked_fill_(_t([0, 0.5, 2, -1], d), 7.0),
    "masked_fill_ uint8 mask": lambda x, d: x[0].masked_fill_(_t([0, 1, 2, 0], d, dtype=torch.uint8), 7.0),
    # 6: index_reduce_ with a source of another dtype
    "index_reduce_ float64 source": lambda x, d: x[0].index_reduce_(0, _t([1], d), _t([1.5], d, dtype=torch.float64),
                                                                    "amax"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_invalid_write_raises_like_cpu_and_leaves_x_intact(name):
    case = CASES[name]
    (cpu_type, cpu_msg), _ = _run(case, "cpu")
    assert cpu_type is not None, "the case must be invalid on CPU"
    (tpu_type, tpu_msg), x = _run(case, "tpu")
    assert tpu_type is cpu_type, f"cpu: {cpu_type} {cpu_msg}; tpu: {tpu_type} {tpu_msg}"
    if "mask value" in name:  # the count a mask selects is known on the device only
        assert tpu_msg.startswith(cpu_msg.rsplit("[", 1)[0] + "[n, 4]"), tpu_msg
    else:
        assert tpu_msg == cpu_msg
    # Raised at the call, before anything was written: x stays readable and unchanged.
    for _ in range(2):
        assert torch.equal(x.cpu(), torch.arange(12.0).view(3, 4))
    torch_tpu.synchronize()


# Valid calls next to the checks keep working (and agree with CPU).
VALID = {
    "setitem broadcast value": lambda x, d: x.__setitem__((slice(None), _t([0, 3], d)), torch.ones(2, device=d)),
    "setitem value [3, 1]": lambda x, d: x.__setitem__((slice(None), _t([0, 3], d)), _t([[1.0], [2.0], [3.0]], d)),
    "index_put_ leading 1 within rank": lambda x, d: x.index_put_((_t([0, 2], d),), torch.ones(1, 4, device=d)),
    "index_put_ int32 index": lambda x, d: x.index_put_((_t([1], d, dtype=torch.int32),), _t(5.0, d)),
    "setitem non-adjacent": lambda x, d: x.view(3, 2, 2).__setitem__(
        (_t([0, 1, 2], d), slice(None), _t([0], d)), _t([[1.0, 2.0]] * 3, d)),
    "setitem broadcasting indices": lambda x, d: x.__setitem__((_t([[0], [2]], d), _t([1, 3], d)), _t(9.0, d)),
    "setitem mask values per row": lambda x, d: x.__setitem__(_t([True, False, True], d), torch.ones(2, 4, device=d)),
    "setitem mask one value": lambda x, d: x.__setitem__(_t([True, False, True], d), 4.0),
    "setitem mask and index": lambda x, d: x.__setitem__((_t([True, False, True], d), _t([1, 3], d)), 5.0),
    # One CPU value through one mask is filled as masked_fill_ does (cast, not checked).
    "index_put_ cpu float64 value through mask": lambda x, d: x.index_put_((_t([True, False, True], d),),
                                                                           torch.tensor(2.0, dtype=torch.float64)),
    "index_reduce_": lambda x, d: x.index_reduce_(1, _t([0, 0, 3], d), torch.ones(3, 3, device=d), "amax"),
    "put_": lambda x, d: x.put_(_t([[0, 11]], d), _t([1.0, 2.0], d), accumulate=True),
    "slice_scatter": lambda x, d: x.copy_(torch.slice_scatter(x, torch.ones(3, 2, device=d), 1, 1, None, 2)),
    "slice_scatter clamped end": lambda x, d: x.copy_(torch.slice_scatter(x, torch.ones(1, 4, device=d), 0, -1, 99)),
    "select_scatter": lambda x, d: x.copy_(torch.select_scatter(x, torch.ones(3, device=d), 1, -1)),
    "masked_fill_ bool mask": lambda x, d: x[0].masked_fill_(_t([False, True, True, False], d), 7.0),
}


@pytest.mark.parametrize("name", list(VALID))
def test_valid_writes_match_cpu(name):
    case = VALID[name]
    (cpu_type, cpu_msg), want = _run(case, "cpu")
    assert cpu_type is None, cpu_msg
    (tpu_type, tpu_msg), x = _run(case, "tpu")
    assert tpu_type is None, tpu_msg
    torch.testing.assert_close(x.cpu(), want)


COMPILED = {
    "float index setitem": (lambda x, i: x.__setitem__(i, 1.0) or x,
                            lambda d: (torch.zeros(4, device=d), _t([1.7], d))),
    "slice_scatter big src": (lambda x, s: torch.slice_scatter(x, s, 0, 1, 3),
                              lambda d: (torch.zeros(6, device=d), torch.arange(1.0, 5.0, device=d))),
    "setitem bad value shape": (lambda x, v: x.__setitem__((slice(None), torch.tensor([0, 3], device=x.device)), v) or x,
                                lambda d: (torch.zeros(3, 4, device=d), torch.ones(3, device=d))),
    "masked_fill_ int mask": (lambda x, m: x.masked_fill_(m, 7.0),
                              lambda d: (torch.zeros(4, device=d), _t([0, 1, 2, 0], d))),
    "index_reduce_ float64 source": (lambda x, s: x.index_reduce_(0, torch.tensor([1], device=x.device), s, "amax"),
                                     lambda d: (torch.zeros(2, device=d), _t([1.5], d, dtype=torch.float64))),
}


@pytest.mark.parametrize("name", list(COMPILED))
def test_compiled_invalid_write_raises_like_cpu(name):
    fn, make = COMPILED[name]
    with pytest.raises(Exception) as cpu:  # noqa: PT011 - compared below
        fn(*make("cpu"))
    torch._dynamo.reset()
    args = make("tpu")
    with pytest.raises(type(cpu.value)) as got:
        torch.compile(fn, backend="tpu")(*args)
    assert str(cpu.value).splitlines()[0] in str(got.value)
    assert torch.equal(args[0].cpu(), make("cpu")[0])  # untouched and readable


def test_defer_and_fuse_raises_at_the_call_and_x_stays_readable():
    code = r"""
import json, torch, torch_tpu
x = torch.zeros(3, 4, device="tpu")
out = []
for f in [lambda: x.__setitem__((slice(None), torch.tensor([0, 3], device="tpu")), torch.ones(3, device="tpu")),
          lambda: x.__setitem__((torch.tensor([0, 1], device="tpu"), torch.tensor([0, 1, 2], device="tpu")), 1.0),
          lambda: x.put_(torch.tensor([0, 2], device="tpu"), torch.ones(3, device="tpu")),
          lambda: torch.select_scatter(x, torch.ones(3, device="tpu"), 0, 0).sum().item()]:
    try:
        f()
        out.append(None)
    except Exception as e:
        out.append(type(e).__name__)
    out.append(x.sum().item())
print(json.dumps(out))
"""
    got = run_python_json(code, env={"TPU_DEFER_AND_FUSE": "1"})
    assert got == ["RuntimeError", 0.0, "IndexError", 0.0, "IndexError", 0.0, "RuntimeError", 0.0]
