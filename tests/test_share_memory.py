"""tpu tensors cannot be put in shared memory: PJRT has no cross-process device memory, and a
tpu tensor passed to another process arrives as a copy (torch_tpu/_multiprocessing.py).
share_memory_() used to do nothing and is_shared() said True, so hogwild-style training
(model.share_memory(), spawned children update it in place) silently lost every update.
Now sharing raises, is_shared() is False, and queues still carry tpu tensors as copies."""
import pytest
import torch

from conftest import run_in_spawned

NOT_SHAREABLE = "tpu tensors cannot be shared between processes"


def test_tensor_share_memory_refuses_a_tpu_tensor():
    t = torch.arange(4.0, device="tpu")
    assert not t.is_shared()
    with pytest.raises(RuntimeError, match=NOT_SHAREABLE) as e:
        t.share_memory_()
    assert "arrives as a copy" in str(e.value) and "CPU copy" in str(e.value)
    assert not t.is_shared()
    assert t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]  # untouched and usable
    view = t[1:]
    assert not view.is_shared()
    with pytest.raises(RuntimeError, match=NOT_SHAREABLE):
        view.share_memory_()


def test_storage_share_memory_refuses_a_tpu_storage():
    t = torch.ones(3, device="tpu")
    s = t.untyped_storage()
    assert not s.is_shared()
    with pytest.raises(RuntimeError, match=NOT_SHAREABLE):
        s.share_memory_()
    with pytest.raises(RuntimeError, match=NOT_SHAREABLE):
        t._typed_storage()._share_memory_()
    assert not t._typed_storage()._is_shared()


def test_module_share_memory_refuses_a_tpu_model():
    model = torch.nn.Linear(2, 1).to("tpu")
    before = [p.detach().cpu().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match=NOT_SHAREABLE):
        model.share_memory()
    assert not any(p.is_shared() for p in model.parameters())
    for p, b in zip(model.parameters(), before):
        assert p.device.type == "tpu" and torch.equal(p.detach().cpu(), b)


def test_cpu_sharing_is_unchanged():
    t = torch.ones(3)
    assert not t.is_shared()
    assert t.share_memory_() is t and t.is_shared()
    s = torch.UntypedStorage(8)
    assert s.share_memory_() is s and s.is_shared()
    model = torch.nn.Linear(2, 1)
    assert model.share_memory() is model
    assert all(p.is_shared() for p in model.parameters())


def _add_one(model, q_out):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    q_out.put([p.device.type for p in model.parameters()])


def test_hogwild_on_a_cpu_copy_sees_the_childrens_updates():
    # What the error message points to: the shared model stays on the CPU.
    model = torch.nn.Linear(2, 1).to("tpu")
    with pytest.raises(RuntimeError, match=NOT_SHAREABLE):
        model.share_memory()
    shared = model.cpu().share_memory()
    before = [p.detach().clone() for p in shared.parameters()]
    code, devices = run_in_spawned(_add_one, (shared,))
    assert code == 0 and devices == ["cpu", "cpu"]
    for p, b in zip(shared.parameters(), before):
        assert torch.equal(p.detach(), b + 1)


def _echo(q_in, q_out):
    x = q_in.get(timeout=60)
    q_out.put((x.device.type, x.is_shared(), (x * 2).cpu().tolist()))


def test_tpu_tensors_still_cross_a_queue_as_copies():
    x = torch.arange(3.0, device="tpu")
    code, got = run_in_spawned(_echo, send=x)
    assert code == 0
    assert got == ("tpu", False, [0.0, 2.0, 4.0])
    assert not x.is_shared()
