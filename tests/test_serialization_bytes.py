"""torch.save / torch.load of tpu tensors move bytes, never run programs: a save copies
each storage's buffer to the host as it is (its bytes, whatever the dtype and shape), a
load uploads each storage's bytes once, as a buffer of its tensor's dtype and shape.
Before, both ran a bitcast program per storage shape (one compile per distinct shape)."""
import io

import pytest
import torch

import torch_tpu
from torch_tpu import EagerMode

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING]
MODE_IDS = ["strict", "fused", "debug"]

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.complex64, torch.complex128,
          torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
          torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16]


@pytest.fixture(params=MODES, ids=MODE_IDS)
def mode(request):
    with torch_tpu.set_eager_mode(request.param):
        yield request.param


def sample(dtype, *shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (*shape, torch.empty((), dtype=dtype).element_size()), dtype=torch.uint8,
                        generator=g)
    if dtype == torch.bool:
        return raw[..., 0] % 2 == 1
    # Every bit pattern (NaNs, infinities, -0, denormals): bytes must come back as they are.
    return raw.view(dtype).reshape(shape)


def bits(t):
    """The tensor's values as bytes, for a bitwise comparison (NaN payloads included)."""
    t = t.cpu().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), (a, b)
    assert torch.equal(bits(a), bits(b))


def roundtrip(obj, **load_args):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_args)


def counts():
    m = torch_tpu.metrics()
    return m["compiles"], m["executions"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_keeps_every_bit(mode, dtype):
    x = sample(dtype, 5, 7)
    t = x.to("tpu")
    for loaded in (roundtrip(t), roundtrip(t, map_location="cpu"), roundtrip(x, map_location="tpu")):
        same_bits(loaded, x)
    back = roundtrip(t)
    assert back.device.type == "tpu"
    same_bits(back.clone(), x)  # usable by programs after the load
    assert torch.equal((back == back).cpu(), x == x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64, torch.bool, torch.int8],
                         ids=str)
def test_views_and_shared_storages(mode, dtype):
    x = sample(dtype, 6, 4, seed=1)
    t = x.to("tpu")
    objs = {"view": t[1:, ::2], "t": t.t(), "base": t, "row": t[3]}
    want = {"view": x[1:, ::2], "t": x.t(), "base": x, "row": x[3]}
    for map_location in (None, "cpu"):
        got = roundtrip(objs, map_location=map_location)
        for k in objs:
            same_bits(got[k], want[k])
            assert got[k].storage_offset() == want[k].storage_offset()
    # A view saved before its base, and the sharing kept after a load onto tpu.
    for src in ({"view": t[2:], "base": t}, {"view": x[2:], "base": x}):
        got = roundtrip(src, map_location="tpu")
        assert got["view"].untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr()
        same_bits(got["view"], x[2:])
        got["base"][2] = got["base"][0]
        same_bits(got["view"][0], x[0])  # a write through the base shows in the view


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_reinterpreted_views_and_lone_storages(mode):
    x = sample(torch.float32, 3, 8, seed=2)
    t = x.to("tpu")
    same_bits(roundtrip(t.view(torch.uint8)), x.view(torch.uint8))
    same_bits(roundtrip(t.view(torch.int16)[1:]), x.view(torch.int16)[1:])
    same_bits(roundtrip(t.view(torch.complex64).t()), x.view(torch.complex64).t())
    # A storage saved by itself (no tensor rebuilt over it) and a typed one.
    st = roundtrip(t.untyped_storage())
    assert type(st) is type(roundtrip(x.untyped_storage()))  # as CPU: a uint8 TypedStorage
    st = st.untyped()
    assert st.device.type == "tpu" and st.nbytes() == x.nbytes
    same_bits(torch.empty(0, device="tpu").set_(st).view(3, 8), x)
    same_bits(torch.empty(0, dtype=torch.uint8, device="tpu").set_(st), x.view(-1).view(torch.uint8))
    ts = roundtrip(t.untyped_storage(), map_location="cpu").untyped()
    same_bits(torch.empty(0).set_(ts).view(3, 8), x)


def test_empty_zero_size_and_scalars(mode):
    z = torch.zeros(0, 3, device="tpu")
    assert roundtrip(z).shape == (0, 3)
    assert roundtrip(z, map_location="cpu").shape == (0, 3)
    s = torch.tensor(2.5, device="tpu")
    assert roundtrip(s).item() == 2.5 and roundtrip(s).dim() == 0
    # Never written (reads as zeros).
    e = torch.empty(4, 5, device="tpu", dtype=torch.bfloat16)
    assert torch.equal(roundtrip(e, map_location="cpu"), torch.zeros(4, 5, dtype=torch.bfloat16))
    assert torch.equal(roundtrip(e).cpu(), torch.zeros(4, 5, dtype=torch.bfloat16))


def test_pending_writes_are_saved(mode):
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    t = x.to("tpu")
    t[1] = 7.0           # a write into part of the storage, queued (Strict) or recorded (fused)
    t.view(torch.int32)[0, 0] = 3
    x[1] = 7.0
    x.view(torch.int32)[0, 0] = 3
    same_bits(roundtrip(t, map_location="cpu"), x)
    same_bits(roundtrip(t), x)
    u = (t * 2)[1:]      # computed, possibly not run yet
    same_bits(roundtrip(u, map_location="cpu"), (x * 2)[1:])


def test_legacy_format_and_parameters(mode):
    x = sample(torch.float16, 3, 5, seed=3)
    buf = io.BytesIO()
    torch.save(x.to("tpu"), buf, _use_new_zipfile_serialization=False)
    buf.seek(0)
    same_bits(torch.load(buf), x)
    m = torch.nn.Linear(5, 3).to("tpu")
    got = roundtrip(m.state_dict())
    same_bits(got["weight"], m.weight.detach().cpu())
    p = roundtrip(m.weight)
    assert isinstance(p, torch.nn.Parameter) and p.requires_grad
    same_bits(p.detach(), m.weight.detach().cpu())


def test_save_runs_no_program(mode):
    # Shapes no other test uses: a program per shape would be compiled here.
    xs = {f"w{i}": torch.randn(29 + 3 * i, 11 + i) for i in range(10)}
    ts = {k: v.to("tpu") for k, v in xs.items()}
    torch_tpu.synchronize()
    before = counts()
    buf = io.BytesIO()
    torch.save(ts, buf)
    assert counts() == before, "torch.save of tpu tensors compiled or ran a program"
    buf.seek(0)
    got = torch.load(buf, map_location="cpu")
    assert all(torch.equal(got[k], xs[k]) for k in xs)


def test_load_runs_no_program(mode, tmp_path):
    xs = {f"w{i}": torch.randn(31 + 3 * i, 13 + i) for i in range(10)}
    tpu_file, cpu_file, path = io.BytesIO(), io.BytesIO(), tmp_path / "ckpt.pt"
    torch.save({k: v.to("tpu") for k, v in xs.items()}, tpu_file)
    torch.save(xs, cpu_file)
    torch.save(xs, path)
    torch_tpu.synchronize()
    for f, kw in ((tpu_file, {}), (cpu_file, {"map_location": "tpu"}), (tpu_file, {"weights_only": True}),
                  (path, {"map_location": "tpu", "mmap": True})):
        if hasattr(f, "seek"):
            f.seek(0)
        before = counts()
        got = torch.load(f, **kw)
        torch_tpu.synchronize()
        assert counts() == before, f"torch.load {kw} compiled or ran a program"
        assert all(got[k].device.type == "tpu" and torch.equal(got[k].cpu(), xs[k]) for k in xs)


def test_loaded_storage_holds_its_tensors_dtype_and_shape():
    # The loaded storage is the tensor's own buffer: reading it back is a host copy.
    x = torch.randn(19, 23)
    got = roundtrip(x, map_location="tpu")
    torch_tpu.synchronize()
    before = counts()
    assert torch.equal(got.cpu(), x)
    assert torch.equal(got.view(-1).cpu(), x.view(-1))
    assert counts() == before


def test_load_onto_a_second_device():
    from conftest import run_python_json
    got = run_python_json("""
import io, json, torch, torch_tpu
x = torch.randn(7, 5)
b = io.BytesIO(); torch.save({"x": x.to("tpu:1"), "v": x.to("tpu:1")[2:]}, b)
out = []
for ml in (None, "tpu:1", {"tpu:1": "tpu:0"}):
    b.seek(0)
    before = torch_tpu.metrics()["executions"]
    l = torch.load(b, map_location=ml)
    n = torch_tpu.metrics()["executions"] - before
    out.append([str(l["x"].device), str(l["v"].device), n, torch.equal(l["x"].cpu(), x),
                torch.equal(l["v"].cpu(), x[2:]), (l["x"] * 2).cpu().equal(x * 2)])
print(json.dumps(out))
""", env={"TPU_NUM_DEVICES": "2"})
    assert got == [["tpu:1", "tpu:1", 0, True, True, True], ["tpu:1", "tpu:1", 0, True, True, True],
                   ["tpu:0", "tpu:0", 0, True, True, True]]
