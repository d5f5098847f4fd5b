"""The torch.cuda-shaped device contract of torch.tpu: initialization, device facts,
RNG state, and fork safety."""
import textwrap

import pytest
import torch

import torch_tpu  # noqa: F401
from conftest import run_python

FORK_ERROR = "Cannot re-initialize TPU in forked subprocess"


def test_init_and_is_initialized():
    r = run_python(textwrap.dedent("""
        import torch
        assert not torch.tpu.is_initialized()
        torch.tpu.init()
        assert torch.tpu.is_initialized()
        torch.tpu.init()  # idempotent
        print("ok")
    """))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    torch.ones(1, device="tpu").cpu()
    assert torch.tpu.is_initialized()


def test_device_facts():
    props = torch.tpu.get_device_properties(0)
    assert props.name == torch.tpu.get_device_name() == torch.tpu.get_device_name("tpu:0")
    assert props.name  # "tpu (cpu PJRT plugin)" here, the chip ("TPU v4") on a TPU
    assert props.total_memory == torch.tpu.mem_get_info()[1] > 0
    assert "total_memory" in repr(props)
    cap = torch.tpu.get_device_capability()
    assert cap == (props.major, props.minor)
    assert all(isinstance(c, int) for c in cap)
    if props.platform != "tpu":
        assert cap == (0, 0)
    with pytest.raises(AssertionError, match="Invalid device"):
        torch.tpu.get_device_properties(torch.tpu.device_count())


def test_capability_parses_tpu_generations():
    from torch_tpu.tpu import _capability
    assert _capability("TPU v4") == (4, 0)
    assert _capability("TPU v5 lite") == (5, 0)
    assert _capability("TPU v6e") == (6, 0)
    assert _capability("cpu") == (0, 0)


def test_rng_state_round_trip():
    torch.tpu.manual_seed(123)
    state = torch.tpu.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.randn(5, device="tpu").cpu()
    b = torch.randn(5, device="tpu").cpu()
    assert not torch.equal(a, b)
    torch.tpu.set_rng_state(state)
    torch.testing.assert_close(torch.randn(5, device="tpu").cpu(), a, rtol=0, atol=0)
    states = torch.tpu.get_rng_state_all()
    assert len(states) == torch.tpu.device_count()
    c = torch.rand(3, device="tpu").cpu()
    torch.tpu.set_rng_state_all(states)
    torch.testing.assert_close(torch.rand(3, device="tpu").cpu(), c, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="16 uint8"):
        torch.tpu.set_rng_state(torch.zeros(3, dtype=torch.uint8))
    # A state on the device (map_location="tpu") or of another dtype raises CPU's and
    # CUDA's TypeError (the device one was read as its storage handle); a non-contiguous
    # one is copied, as torch.cuda.set_rng_state does.
    for bad in (state.to("tpu"), state.float()):
        with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
            torch.tpu.set_rng_state(bad)
        with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
            torch.Generator(device="tpu").set_state(bad)
    spread = torch.zeros(32, dtype=torch.uint8)
    spread[::2] = state
    torch.tpu.set_rng_state(spread[::2])
    assert torch.equal(torch.tpu.get_rng_state(), state)
    with pytest.raises(RuntimeError, match="contiguous"):
        torch.Generator(device="tpu").set_state(spread[::2])


# Each fork scenario runs in a fresh interpreter: this process started the runtime long
# ago, and the point is what the child of a known parent state may do.
FORK_CHILD = textwrap.dedent("""
    import os, sys, torch
    {parent}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            {child}
            msg = "ok"
        except Exception as e:
            msg = type(e).__name__ + ": " + str(e)
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    msg = os.read(r, 4096).decode()
    _, status = os.waitpid(pid, 0)
    print("CHILD:", msg)
    print("STATUS:", status)
    {after}
""")


REFUSED_IN_CHILD = [
    "torch.ones(2, device='tpu')",
    "(x + 1).cpu()",
    "x.add_(1)",
    "x.cpu()",
    "torch.tpu.synchronize()",
    "torch.randn(2).to('tpu')",
]


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_fork_after_init_refuses_the_device_in_the_child(mode):
    env = {"TPU_DEFER_AND_FUSE": "1"} if mode == "fused" else {}
    code = "\n".join(FORK_CHILD.format(
        parent="x = torch.ones(3, device='tpu') * 2; y = x + 1",  # pending work in fused mode
        child=child,
        after="assert torch.equal((y + 1).cpu(), torch.full((3,), 4.0)); print('PARENT OK')")
        for child in REFUSED_IN_CHILD)
    r = run_python(code, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    children = [line for line in r.stdout.splitlines() if line.startswith("CHILD:")]
    assert len(children) == len(REFUSED_IN_CHILD), r.stdout
    for line in children:
        assert line.startswith(f"CHILD: RuntimeError: {FORK_ERROR}"), line
        assert "'spawn' start method" in line
    assert r.stdout.count("STATUS: 0") == r.stdout.count("PARENT OK") == len(REFUSED_IN_CHILD)


def test_forked_child_reports_its_state_and_exits_cleanly():
    # The child keeps CPU work, torch.manual_seed (which must skip the tpu generators),
    # and a normal interpreter exit (atexit, tensor teardown) with the parent's tensors.
    code = FORK_CHILD.format(
        parent="x = torch.ones(3, device='tpu')",
        child=("assert torch.tpu._is_in_bad_fork() and not torch.tpu.is_initialized(); "
               "torch.manual_seed(1); assert torch.randn(3).sum() == torch.randn(3).sum() or True"),
        after="assert not torch.tpu._is_in_bad_fork(); print('PARENT OK')")
    r = run_python(code, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "CHILD: ok" in r.stdout and "PARENT OK" in r.stdout, r.stdout
    exit_code = run_python(textwrap.dedent("""
        import os, sys, torch
        x = torch.ones(3, device="tpu") + 1
        pid = os.fork()
        if pid == 0:
            del x
            sys.exit(3)  # normal exit: atexit handlers and teardown run
        _, status = os.waitpid(pid, 0)
        print("EXIT", os.waitstatus_to_exitcode(status))
    """), timeout=120)
    assert "EXIT 3" in exit_code.stdout, exit_code.stdout + exit_code.stderr


def test_fork_before_init_leaves_the_child_free_to_use_the_device():
    code = FORK_CHILD.format(
        parent="assert not torch.tpu.is_initialized()",
        child="assert torch.equal((torch.ones(2, device='tpu') * 3).cpu(), torch.full((2,), 3.0))",
        after="print('PARENT OK', torch.ones(1, device='tpu').cpu().item())")
    r = run_python(code, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "CHILD: ok" in r.stdout and "PARENT OK 1.0" in r.stdout, r.stdout


def test_dataloader_fork_workers_feed_a_tpu_training_loop():
    r = run_python(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        w = torch.zeros(4, 1, device="tpu", requires_grad=True)  # runtime started first
        loader = DataLoader(data, batch_size=8, num_workers=2,
                            multiprocessing_context="fork", shuffle=True)
        total = torch.zeros((), device="tpu")
        for epoch in range(2):
            for xb, yb in loader:
                assert xb.device.type == "cpu"
                loss = ((xb.to("tpu") @ w - yb.to("tpu")) ** 2).mean()
                loss.backward()
                with torch.no_grad():
                    w -= 0.1 * w.grad
                    w.grad = None
                total += loss.detach()
        print("TOTAL", total.item())
    """), timeout=180)
    assert r.returncode == 0, r.stderr
    assert "TOTAL" in r.stdout and FORK_ERROR not in r.stderr


# ---- streams and events ---------------------------------------------------------------

def test_streams_are_distinct_and_stream_contexts_restore_device_and_stream():
    r = run_python(textwrap.dedent("""
        import torch
        assert torch.tpu.device_count() == 2
        s1, s2, s3 = torch.tpu.Stream(), torch.tpu.Stream(), torch.Stream(device="tpu:1")
        ids = {s.stream_id for s in (s1, s2, s3)}
        assert len(ids) == 3 and 0 not in ids, ids
        assert s1 != s2 and s3.device_index == 1
        assert torch.tpu.current_stream() == torch.tpu.default_stream() and torch.tpu.current_stream().stream_id == 0

        def state():
            return (torch.tpu.current_device(), torch.tpu.current_stream(0).stream_id,
                    torch.tpu.current_stream(1).stream_id)

        with torch.tpu.stream(s1):
            assert state() == (0, s1.stream_id, 0)
            x = torch.ones(4, device="tpu") * 2  # work is ordinary inside a stream
        with s3:  # torch.Stream's own context switches the device too
            assert state() == (1, 0, s3.stream_id)
            assert torch.accelerator.current_stream() == s3
            y = torch.ones(2, device="tpu")
            assert y.device == torch.device("tpu:1")
        with torch.tpu.stream(s3):
            assert state() == (1, 0, s3.stream_id)
        assert state() == (0, 0, 0)
        for ctx in (lambda: s3, lambda: torch.tpu.stream(s3), lambda: torch.tpu.stream(s1)):
            try:
                with ctx():
                    raise KeyError("boom")
            except KeyError:
                pass
            assert state() == (0, 0, 0), state()
        with torch.tpu.stream(None):
            assert state() == (0, 0, 0)
        torch.tpu.set_stream(s2)
        assert torch.tpu.current_stream() == s2
        torch.tpu.set_stream(torch.tpu.default_stream())
        assert x.cpu().tolist() == [2.0] * 4
        print("ok")
    """), env={"TPU_NUM_DEVICES": "2"}, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_wait_stream_and_record_stream_behave_as_on_cuda():
    side = torch.tpu.Stream()
    main = torch.tpu.current_stream()
    x = torch.arange(6.0, device="tpu")
    side.wait_stream(main)  # side sees x's value
    with torch.tpu.stream(side):
        y = x * 2
    x.record_stream(side)  # no fallback, no error: buffers outlive their readers anyway
    main.wait_stream(side)
    del x
    assert y.cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    ev = side.record_event()
    assert isinstance(ev, torch.tpu.Event)
    main.wait_event(ev)
    ev.synchronize()
    assert ev.query() and side.query()
    timed = main.record_event(torch.tpu.Event(enable_timing=True))  # as torch.cuda's, a given event
    timed.synchronize()
    assert timed.query()
    side.synchronize()
    assert torch_tpu.metrics()["fallbacks"].get("aten::record_stream", 0) == 0


def test_timing_events_measure_the_work_between_them():
    a = torch.randn(256, 256, device="tpu")
    (a @ a).cpu()  # compiled before timing
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    assert torch.tpu.Event().query()  # never recorded: complete
    start.record()
    for _ in range(20):
        a = (a @ a).tanh()
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    assert 0 < ms < 60_000
    assert end.query()
    # torch.Event created directly works the same.
    s2, e2 = torch.Event(device="tpu", enable_timing=True), torch.Event(device="tpu", enable_timing=True)
    s2.record()
    e2.record()
    assert 0 <= s2.elapsed_time(e2) < 60_000
    plain = torch.tpu.Event()
    plain.record()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        start.elapsed_time(plain)
    with pytest.raises(RuntimeError, match="recorded"):
        start.elapsed_time(torch.tpu.Event(enable_timing=True))


# ---- pinned host memory ----------------------------------------------------------------

def test_pin_memory_and_is_pinned():
    a = torch.randn(1000)
    assert not a.is_pinned()
    p = a.pin_memory()
    assert p.is_pinned() and p.device.type == "cpu"
    assert p.data_ptr() != a.data_ptr() and torch.equal(p, a)
    assert p[10:].is_pinned()  # an address inside a pinned block
    assert p.pin_memory().data_ptr() == p.data_ptr()  # already pinned: the same tensor
    e = torch.empty(3, 4, pin_memory=True)
    assert e.is_pinned()
    e.copy_(torch.ones(3, 4))
    on_tpu = p.to("tpu", non_blocking=True)
    torch.testing.assert_close(on_tpu.cpu(), a, rtol=0, atol=0)
    back = torch.empty(1000, pin_memory=True)
    back.copy_(on_tpu, non_blocking=True)
    torch.tpu.synchronize()
    torch.testing.assert_close(back, a, rtol=0, atol=0)


def test_dataloader_pin_memory_batches_are_pinned():
    from torch.utils.data import DataLoader, TensorDataset
    data = TensorDataset(torch.randn(16, 3), torch.arange(16))
    seen = 0
    for x, y in DataLoader(data, batch_size=4, pin_memory=True):
        assert x.is_pinned() and y.is_pinned()
        assert torch.equal(x.to("tpu", non_blocking=True).cpu(), x)
        seen += 1
    assert seen == 4


def test_autograd_across_streams():
    # The autograd engine replays each node on its forward stream and orders streams
    # with events: with streams now distinct, that must still give CPU's gradients.
    w0 = torch.randn(4, 4)
    w = w0.to("tpu").requires_grad_()
    with torch.tpu.stream(torch.tpu.Stream()):
        y = (w @ w).tanh().sum()
    y.backward()
    ref = w0.clone().requires_grad_()
    (ref @ ref).tanh().sum().backward()
    torch.testing.assert_close(w.grad.cpu(), ref.grad, atol=1e-5, rtol=1e-4)


def test_a_storage_slice_past_byte_zero_is_refused_clearly_and_one_from_zero_works():
    t = torch.arange(4.0, device="tpu")
    assert t.untyped_storage()[0:8].tolist() == torch.arange(4.0).untyped_storage()[0:8].tolist()
    with pytest.raises(NotImplementedError, match="must start at byte 0"):
        t.untyped_storage()[4:8].tolist()
    assert (t + 1).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_device_indices_as_cuda_takes_them_and_ops_across_devices_raise():
    """A negative index to set_device/device() changes nothing, an index past the last
    device is refused by every torch.tpu call, and kernels that run their own programs
    refuse operands on two devices with PyTorch's error (they reached PJRT)."""
    r = run_python(textwrap.dedent("""
        import torch, torch_tpu
        torch.tpu.set_device(-1)
        with torch.tpu.device(-1):
            assert torch.tpu.current_device() == 0
        assert torch.zeros(2, device="tpu").device == torch.device("tpu:0")
        calls = [lambda: torch.tpu.synchronize(3), lambda: torch.tpu.synchronize("tpu:3"),
                 lambda: torch.tpu.memory_allocated(3), lambda: torch.tpu.memory_stats(3),
                 lambda: torch.tpu.mem_get_info(3), lambda: torch.tpu.reset_peak_memory_stats(3),
                 lambda: torch.tpu.current_stream(3), lambda: torch.Generator(device="tpu:3")]
        for c in calls:
            try:
                c()
                raise AssertionError("no error")
            except RuntimeError as e:
                assert "tpu:3" in str(e), e
        a, b = torch.arange(4.0, device="tpu:0"), torch.arange(4.0, device="tpu:1")
        i = torch.tensor([0, 1, 1], device="tpu:0")
        for c in [lambda: torch.masked_select(a, b > 1), lambda: torch.bincount(i, torch.ones(3, device="tpu:1")),
                  lambda: torch.histogramdd(a.view(2, 2), bins=[2, 2], weight=b[:2]),
                  lambda: torch.masked_select(a, torch.ones(4, dtype=torch.bool)),
                  # a decomposition or the meta kernel refusing the mix is not rescued by the CPU fallback
                  lambda: torch.linalg.cross(a[:3].view(1, 3), b[:3].view(1, 3)), lambda: torch.isin(a, b),
                  lambda: torch.nn.functional.batch_norm(a.view(2, 2), b[:2], b[2:]),
                  lambda: torch.stack([torch.tensor(1.0), b[0]]), lambda: torch.stack([b[0], torch.tensor(1.0)])]:
            try:
                c()
                raise AssertionError("no error")
            except RuntimeError as e:
                assert "same device" in str(e), e
        assert torch.masked_select(b, b > 1).tolist() == [2.0, 3.0]
        for c in [lambda: torch.add(b, b, out=torch.empty(4)), lambda: torch.cat([b, b], out=torch.empty(8)),
                  lambda: torch.exp(b, out=torch.empty(4, device="tpu:0"))]:
            try:
                c()
                raise AssertionError("no error")
            except RuntimeError as e:
                assert "Expected out tensor to have device tpu:1, but got" in str(e), e
        # cpu inputs and a tpu out: refused as on CUDA, which takes only 0-dim cpu inputs
        for c in [lambda: torch.add(torch.ones(4), torch.ones(4), out=b), lambda: torch.exp(torch.ones(4), out=b),
                  lambda: torch.exp(torch.tensor(1.0), out=b[0])]:  # a unary iterator takes no cpu scalar
            try:
                c()
                raise AssertionError("no error")
            except RuntimeError as e:
                assert "same device, but found at least two devices, tpu:1 and cpu" in str(e), e
        # ... and a binary op of 0-dim cpu inputs computes on the out's device, as CUDA's
        o = torch.empty((), device="tpu:1")
        assert torch.add(torch.tensor(2.0), torch.tensor(3.0), alpha=2, out=o) is o and o.item() == 8.0
        assert torch.mul(torch.tensor(2.0), 5, out=o).item() == 10.0 and o.device == torch.device("tpu:1")
        print("ok")
    """), env={"TPU_NUM_DEVICES": "2"}, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
