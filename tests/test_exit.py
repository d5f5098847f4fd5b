"""At exit, autograd's tpu device threads finish their last backward before Python finalizes.

PyTorch's engine frees a backward's state (holding the caller's thread-local Python objects)
on the device thread that finished it, after the caller already saw it done. If that thread
got to it only once Python was finalizing, the process aborted ("terminate called without an
active exception"; seen in CI). torch_tpu's atexit drain passes one more backward through
each tpu device thread, which runs after whatever that thread held.
"""
import threading
import time
import weakref

import torch
import torch_tpu  # noqa: F401
from torch_tpu import _C


class _Marker:
    pass


def test_the_exit_drain_waits_for_a_backward_still_on_the_device_thread():
    entered, release = threading.Event(), threading.Event()
    marker = _Marker()
    gone = weakref.ref(marker)

    def backward():
        # the engine captures this thread's stashed objects into the backward's state
        torch._C._stash_obj_in_tls("tpu_exit_test", marker)
        x = torch.ones(3, device="tpu", requires_grad=True)
        y = x * 2

        def hook(g):  # runs on the tpu device thread
            entered.set()
            release.wait(20)
            return g

        y.register_hook(hook)
        y.sum().backward()
        torch._C._remove_obj_from_tls("tpu_exit_test")
        assert torch.equal(x.grad.cpu(), torch.full((3,), 2.0))

    b = threading.Thread(target=backward)
    b.start()
    assert entered.wait(30), "the hook never ran"
    drained = threading.Event()
    d = threading.Thread(target=lambda: (_C._drain(), drained.set()))
    d.start()
    time.sleep(0.5)
    # the drain waits behind the device thread's blocked backward
    assert not drained.is_set(), "the exit drain returned while a backward still ran"
    release.set()
    d.join(30)
    b.join(30)
    assert drained.is_set() and not b.is_alive()
    del marker
    assert gone() is None, "the finished backward's state still holds the caller's objects"


def test_a_process_that_exits_right_after_a_backward_ends_cleanly(tmp_path):
    import subprocess
    import sys
    code = ("import torch, torch_tpu\n"
            "m = torch.nn.Linear(8, 8).to('tpu')\n"
            "for _ in range(3):\n"
            "    m(torch.randn(4, 8, device='tpu')).sum().backward()\n")
    for _ in range(3):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
        assert p.returncode == 0, p.stderr[-2000:]
        assert "terminate called" not in p.stderr
