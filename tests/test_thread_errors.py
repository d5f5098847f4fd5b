"""An asynchronous error (a device check that failed, an out-of-memory launch) is raised
in the thread whose op caused it, at its next sync or read, and nowhere else: another
thread's values, read meanwhile, stay right (in DeferAndFuse too, where both threads'
ops share one fused graph)."""
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import threading, torch, torch_tpu

    def run(a_work, b_work):
        # A issues a failing op; then B issues and reads its own; then A syncs and reads.
        res = {}
        a_issued, b_read = threading.Event(), threading.Event()

        def A():
            try:
                r = a_work()
                res["A_op"] = "ok"
            except Exception as e:
                r, res["A_op"] = None, type(e).__name__
            a_issued.set()
            b_read.wait()
            try:
                torch.tpu.synchronize()
                r.cpu()
                res["A_later"] = "no error"
            except Exception as e:
                res["A_later"] = type(e).__name__

        def B():
            a_issued.wait()
            try:
                y = b_work()
                res["B"] = y.item()
                res["B_again"] = y.item()
            except Exception as e:
                res["B"] = f"{type(e).__name__}: {e}"
            b_read.set()

        ts = [threading.Thread(target=A), threading.Thread(target=B)]
        for t in ts: t.start()
        for t in ts: t.join()
        return res

    # A device-checked index out of bounds.
    def oob():
        t = torch.zeros(3, device="tpu")
        return t[torch.tensor([5], device="tpu")]

    r = run(oob, lambda: (torch.arange(4.0, device="tpu") * 2).sum())
    print("check", r)
    assert r["B"] == 12.0 and r["B_again"] == 12.0, r
    assert "IndexError" in (r["A_op"], r["A_later"]), r

    # Out of memory at launch.
    torch.tpu.set_per_process_memory_fraction(0.0005)
    # Floats per tensor: three fit, four do not, and B's small tensors fit beside the three
    # (the runtime empties its own caches before refusing, so nothing else takes that room).
    n = torch.tpu.mem_get_info()[1] // 4 // 3 - 256
    held = []
    def oom():
        t1 = torch.ones(n, device="tpu"); t2 = t1 + 1; t3 = t2 + 1
        held.extend([t1, t2, t3])
        return t3 * 2
    r = run(oom, lambda: (torch.ones(4, device="tpu") + 1).sum())
    print("oom", r)
    assert r["B"] == 8.0 and r["B_again"] == 8.0, r
    assert "OutOfMemoryError" in (r["A_op"], r["A_later"]), r
    held.clear()
    torch.tpu.set_per_process_memory_fraction(1.0)

    # The process stays usable in both threads' aftermath.
    assert (torch.ones(3, device="tpu") * 3).sum().item() == 9.0
    print("done")
    """
)


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_async_error_is_raised_in_its_own_thread(mode):
    env = {k: v for k, v in os.environ.items() if k not in ("TPU_LAUNCH_BLOCKING", "TPU_DEFER_AND_FUSE")}
    if mode == "debug":
        env["TPU_LAUNCH_BLOCKING"] = "1"
    if mode == "defer_and_fuse":
        env["TPU_DEFER_AND_FUSE"] = "1"
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "done" in p.stdout
