"""DLPack: tpu tensors round-trip through capsules sharing their storage; host copies are
explicit; capsules from elsewhere work or raise a clear error (never an internal assert)."""
import ctypes
import textwrap

import numpy as np
import pytest
import torch
from torch.utils.dlpack import DLDeviceType, to_dlpack

import torch_tpu
from conftest import run_python


def _values(dtype):
    base = torch.tensor([[0.0, 1.5, -2.0, 3.0], [4.0, -5.5, 6.0, 7.0], [8.0, 9.0, -10.0, 11.0]])
    if dtype == torch.bool:
        return base > 0
    if dtype.is_complex:
        return torch.complex(base, -base).to(dtype)
    return base.to(dtype)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool,
              torch.complex64]
)
def test_legacy_capsule_round_trip_shares_the_storage(dtype):
    ref = _values(dtype)
    x = ref.to("tpu")
    capsule = to_dlpack(x)
    y = torch.from_dlpack(capsule)
    assert y.device == x.device and y.dtype == dtype and y.shape == x.shape
    assert y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    torch.testing.assert_close(y.cpu(), ref, rtol=0, atol=0)
    y[0, 0] = ref[1, 1]  # a write through the import is seen by the exporter
    assert x[0, 0].cpu() == ref[1, 1]
    x[2, 3] = ref[0, 1]  # and the other way round
    assert y[2, 3].cpu() == ref[0, 1]


def test_from_dlpack_of_a_tpu_tensor_uses_the_versioned_protocol_and_shares():
    x = torch.arange(6.0, device="tpu")
    assert x.__dlpack_device__() == (DLDeviceType.kDLExtDev, 0)
    capsule = x.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(capsule)
    y = torch.from_dlpack(x)
    y.mul_(2)
    torch.testing.assert_close(x.cpu(), torch.arange(6.0) * 2, rtol=0, atol=0)


@pytest.mark.parametrize("make_view", [
    lambda t: t.t(),
    lambda t: t[1:, 2:],
    lambda t: t[:, 1],
    lambda t: t[::2, ::3],
    lambda t: t[1, 2],  # 0-dim with an offset
    lambda t: t[:0],  # empty
])
def test_views_keep_their_sizes_strides_and_offset(make_view):
    ref = torch.arange(20.0).reshape(4, 5)
    v = make_view(ref.to("tpu"))
    w = torch.from_dlpack(to_dlpack(v))
    assert w.shape == v.shape and w.storage_offset() == v.storage_offset()
    torch.testing.assert_close(w.cpu(), make_view(ref), rtol=0, atol=0)


def test_lazy_negative_and_conjugate_bits_are_applied_in_the_capsule():
    x = torch.tensor([1.0, -2.0, 3.0], device="tpu")
    neg = torch._neg_view(x)
    assert neg.is_neg()
    torch.testing.assert_close(torch.from_dlpack(to_dlpack(neg)).cpu(), torch.tensor([-1.0, 2.0, -3.0]))
    z = torch.tensor([1 + 2j, 3 - 4j], device="tpu").conj()
    torch.testing.assert_close(torch.from_dlpack(to_dlpack(z)).cpu(), torch.tensor([1 - 2j, 3 + 4j]))


def test_the_capsule_keeps_the_storage_alive_and_frees_it_when_dropped():
    size = 256 * 256 * 4
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()  # (scalars cached on the device may add a few bytes)
    x = torch.full((256, 256), 3.0, device="tpu")
    capsule = to_dlpack(x)
    del x
    y = torch.from_dlpack(capsule)
    torch.testing.assert_close(y.cpu(), torch.full((256, 256), 3.0))
    del y, capsule
    assert torch.tpu.memory_allocated() < base + size
    unused = to_dlpack(torch.ones(256, 256, device="tpu"))
    assert torch.tpu.memory_allocated() >= base + size
    del unused  # never consumed: the capsule's destructor releases the tensor
    assert torch.tpu.memory_allocated() < base + size


def test_a_capsule_is_consumed_once():
    capsule = to_dlpack(torch.ones(3, device="tpu"))
    torch.from_dlpack(capsule)
    with pytest.raises(RuntimeError, match="DLTensor capsule"):
        torch.from_dlpack(capsule)


def test_host_copies_are_explicit():
    ref = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    x = ref.to("tpu")
    host = torch.from_dlpack(x, device="cpu")
    assert host.device.type == "cpu"
    torch.testing.assert_close(host, ref, rtol=0, atol=0)
    host[0, 0] = 99  # a copy: the tpu tensor is unchanged
    assert x[0, 0].item() == 0
    cpu_capsule = x.__dlpack__(dl_device=(DLDeviceType.kDLCPU, 0))
    torch.testing.assert_close(torch.from_dlpack(cpu_capsule), ref, rtol=0, atol=0)
    np.testing.assert_array_equal(np.from_dlpack(x, device="cpu"), ref.numpy())
    with pytest.raises(BufferError, match="without a copy"):
        x.__dlpack__(dl_device=(DLDeviceType.kDLCPU, 0), copy=False)


def test_copy_true_gives_an_independent_tpu_tensor():
    x = torch.zeros(4, device="tpu")
    y = torch.from_dlpack(x, copy=True)
    assert y.device == x.device
    y.add_(1)
    assert x.sum().item() == 0 and y.sum().item() == 4


def test_numpy_without_a_host_copy_refuses_the_device_capsule():
    x = torch.ones(3, device="tpu")
    with pytest.raises((RuntimeError, BufferError), match="[Dd]evice"):
        np.from_dlpack(x)


def test_capsules_from_numpy_and_cpu_work_and_move_to_tpu_on_request():
    a = np.arange(6.0).reshape(2, 3)
    torch.testing.assert_close(torch.from_dlpack(a), torch.from_numpy(a))
    on_tpu = torch.from_dlpack(a, device="tpu")
    assert on_tpu.device.type == "tpu"
    torch.testing.assert_close(on_tpu.cpu(), torch.from_numpy(a))
    c = torch.arange(4.0)
    torch.testing.assert_close(torch.from_dlpack(to_dlpack(c)), c)


def test_requires_grad_is_refused_like_on_cpu():
    x = torch.ones(2, device="tpu", requires_grad=True)
    with pytest.raises(BufferError, match="require gradient"):
        torch.from_dlpack(x)
    torch.testing.assert_close(torch.from_dlpack(x.detach()).cpu(), torch.ones(2))


def test_deferred_values_are_exported_without_running_the_graph():
    with torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
        x = torch.arange(5.0, device="tpu")
        y = x * 3 + 1
        z = torch.from_dlpack(to_dlpack(y))
        z.add_(1)
        torch.testing.assert_close(y.cpu(), torch.arange(5.0) * 3 + 2)


def test_the_device_index_travels():
    r = run_python(textwrap.dedent("""
        import torch
        from torch.utils.dlpack import DLDeviceType
        x = torch.arange(3.0, device="tpu:1")
        assert x.__dlpack_device__() == (DLDeviceType.kDLExtDev, 1)
        y = torch.from_dlpack(x)
        assert y.device == torch.device("tpu:1"), y.device
        z = torch.from_dlpack(x.__dlpack__(dl_device=(DLDeviceType.kDLExtDev, 0)))
        assert z.device == torch.device("tpu:0"), z.device
        assert z.cpu().tolist() == [0.0, 1.0, 2.0]
        print("ok")
    """), env={"TPU_NUM_DEVICES": "2"}, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


# Capsules built by hand, as another library (or a broken one) would hand them over.
class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_keep = []


def _foreign_capsule(device_type, device_id=0):
    buf = (ctypes.c_float * 4)(1.0, 2.0, 3.0, 4.0)
    shape = (ctypes.c_int64 * 1)(4)
    m = _Managed()
    m.dl_tensor = _DLTensor(ctypes.cast(buf, ctypes.c_void_p), _Device(device_type, device_id), 1, _DType(2, 32, 1),
                            shape, None, 0)
    _keep.append((buf, shape, m))
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(m), b"dltensor", None)


def test_a_hand_built_cpu_capsule_imports():
    t = torch.from_dlpack(_foreign_capsule(int(DLDeviceType.kDLCPU)))
    torch.testing.assert_close(t, torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_a_foreign_extdev_capsule_raises_a_clear_error():
    with pytest.raises(BufferError, match="not exported by torch_tpu in this process"):
        torch.from_dlpack(_foreign_capsule(int(DLDeviceType.kDLExtDev)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA capsules are PyTorch's to import")
def test_a_cuda_capsule_without_cuda_raises_a_clear_error():
    with pytest.raises(BufferError, match="kDLCUDA device 0.*no CUDA"):
        torch.from_dlpack(_foreign_capsule(int(DLDeviceType.kDLCUDA)))


@pytest.mark.parametrize("device_type", [int(DLDeviceType.kDLVulkan), 99])
def test_an_unknown_device_type_raises_pytorchs_error(device_type):
    with pytest.raises(BufferError, match=f"Unsupported device_type: {device_type}"):
        torch.from_dlpack(_foreign_capsule(device_type))


def test_export_to_another_device_type_is_refused():
    with pytest.raises(BufferError, match="not to DLPack device type 2"):
        torch.ones(2, device="tpu").__dlpack__(dl_device=(DLDeviceType.kDLCUDA, 0))
