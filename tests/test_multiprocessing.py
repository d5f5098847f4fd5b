"""tpu tensors through torch.multiprocessing arrive as copies on the same device index (PJRT
has no cross-process buffer sharing); before, the queue's feeder thread failed to pickle
them and the receiver waited forever."""
import io

import pytest
import torch
from multiprocessing.reduction import ForkingPickler

from conftest import run_in_spawned


def _child(q_in, q_out):
    x, p = q_in.get(timeout=60)
    q_out.put((x.device.type, x.cpu().tolist(), x.requires_grad, type(p).__name__, p.device.type,
               p.requires_grad, (p * 2).sum().item()))


def test_tpu_tensors_cross_a_spawn_queue_as_copies():
    x = torch.arange(6.0, device="tpu").view(2, 3).t()  # a non-contiguous view
    p = torch.nn.Parameter(torch.ones(4, device="tpu"))
    code, got = run_in_spawned(_child, send=(x, p))
    assert code == 0
    dev, values, rg, cls, pdev, prg, psum = got
    assert dev == "tpu" and not rg and values == x.cpu().tolist()
    assert (cls, pdev, prg, psum) == ("Parameter", "tpu", True, 8.0)


def test_pickling_is_immediate_and_refuses_non_leaves_like_cpu():
    a = torch.ones(3, device="tpu", requires_grad=True)
    ForkingPickler.dumps(a)  # a leaf: fine
    for t in (a * 2, (a.cpu() * 2)):
        with pytest.raises(RuntimeError, match="non-leaf tensor which requires_grad"):
            ForkingPickler(io.BytesIO()).dump(t)


def test_cpu_tensors_keep_torch_shared_memory_path():
    t = torch.ones(3)
    ForkingPickler.dumps(t)
    assert t.is_shared()  # torch's own reducer moved it to shared memory, as before


def _echo(args, q_out):
    q_out.put([(t.device.type, t.dtype, tuple(t.shape), t.cpu().tolist()) for t in args])


def test_tpu_tensors_as_spawned_process_arguments():
    # A spawned child's arguments are pickled before it starts: a host copy sent as shared
    # memory lost its file descriptor first, and the child died unpickling it.
    args = [torch.arange(3.0, device="tpu"), torch.tensor([1.5, -2.0], dtype=torch.bfloat16, device="tpu"),
            torch.tensor([[True], [False]], device="tpu"), torch.zeros(0, 2, device="tpu"),
            torch.tensor(7, device="tpu")]
    code, got = run_in_spawned(_echo, (args,))
    assert code == 0
    assert got == [("tpu", t.dtype, tuple(t.shape), t.cpu().tolist()) for t in args]
