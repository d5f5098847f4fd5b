"""tpu tensors through torch.multiprocessing arrive as copies on the same device index (PJRT
has no cross-process buffer sharing); before, the queue's feeder thread failed to pickle
them and the receiver waited forever."""
import io

import pytest
import torch
import torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler


def _child(q_in, q_out):
    x, p = q_in.get(timeout=60)
    q_out.put((x.device.type, x.cpu().tolist(), x.requires_grad, type(p).__name__, p.device.type,
               p.requires_grad, (p * 2).sum().item()))


def test_tpu_tensors_cross_a_spawn_queue_as_copies():
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_child, args=(q_in, q_out))
    proc.start()
    try:
        x = torch.arange(6.0, device="tpu").view(2, 3).t()  # a non-contiguous view
        p = torch.nn.Parameter(torch.ones(4, device="tpu"))
        q_in.put((x, p))
        dev, values, rg, cls, pdev, prg, psum = q_out.get(timeout=120)
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
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
