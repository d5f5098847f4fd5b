"""After an out-of-memory error, state is as CUDA leaves it, in every eager mode.

- An op whose outputs pass the limit raises torch.OutOfMemoryError at its own call, in
  Strict too when its program is not compiled yet (its launch queued behind the compile):
  ops issued after it never run.
- A value lost to a failed launch (DeferAndFuse finds the failure when the graph runs)
  is never used silently: reading it, or an op reading it (an in-place update of a
  healthy tensor), raises a RuntimeError naming the earlier error, at the call, and the
  destination keeps its value. Tensors not made from lost values stay usable.
- Storages no op has written yet (`empty`, `zeros`) count as allocated from the start:
  memory figures include them and passing the limit raises at the allocation.
Each scenario runs in a fresh process per mode (the limit and the compile cache are
per process)."""
import textwrap

import pytest

import mode_scripts

MODES = mode_scripts.MODES

PRELUDE = textwrap.dedent(
    """
    import os, torch, torch_tpu
    mode = os.environ["OOM_TEST_MODE"]
    d = "tpu"

    def expect(exc, match, fn):
        try:
            fn()
        except exc as e:
            assert match in str(e), str(e)
            return str(e)
        raise AssertionError(f"expected {exc.__name__} ({match})")
    """
)


def run_script(body, mode):
    return mode_scripts.run_in_mode(PRELUDE + textwrap.dedent(body) + "\nprint('done')\n", mode)


LOST_VALUE = """
    a = torch.ones(100_003, device=d)          # 400 KB
    p = torch.zeros(4, device=d)
    torch.tpu.synchronize()
    torch_tpu._C.set_memory_limit(torch.tpu.memory_allocated() + 600_000)
    t = u = s = None
    try:
        t = a * 3                                # fits
        u = t * 2                                # 400 KB more: over the limit
        s = u[:4] * 1
        s.sum().item()
        raise AssertionError("no out-of-memory error")
    except torch.OutOfMemoryError as e:
        assert "out of memory" in str(e), str(e)
    if mode != "defer_and_fuse":
        assert u is None, "the op over the limit must raise at its call"
    if t is not None:
        assert t[:2].tolist() == [3.0, 3.0]      # not made from the lost value: usable
    if s is not None:
        # Every read of the lost value raises, naming the earlier out-of-memory.
        for _ in range(2):
            expect(RuntimeError, "lost to an earlier error", lambda: s.cpu())
        # An in-place update reading it raises at the call; the destination is unchanged.
        for _ in range(2):
            m = expect(RuntimeError, "lost to an earlier error", lambda: p.add_(s))
            assert "out of memory" in m, m
            # Not worded as a new out-of-memory (" out of memory.", which retry loops
            # such as accelerate's batch size finder match): a smaller size won't cure it.
            assert " out of memory." not in m, m
        torch.tpu.synchronize()                  # nothing left to raise
        assert p.tolist() == [0.0] * 4
        expect(RuntimeError, "lost to an earlier error", lambda: s * 2)
    p.add_(1)
    assert p.tolist() == [1.0] * 4
    assert (a[:3] + 1).tolist() == [2.0] * 3
"""


@pytest.mark.parametrize("mode", MODES)
def test_op_reading_a_lost_value_raises_and_leaves_destination(mode):
    run_script(LOST_VALUE, mode)


PENDING_READER = """
    a = torch.ones(100_003, device=d)
    p = torch.zeros(4, device=d)
    torch.tpu.synchronize()
    torch_tpu._C.set_memory_limit(torch.tpu.memory_allocated() + 600_000)
    raised = False
    s = None
    try:
        t = a * 3
        u = t * 2                                # over the limit
        s = u[:4] * 1
        p.add_(s)                                # recorded before the failure is known
        torch.tpu.synchronize()
    except torch.OutOfMemoryError:
        raised = True
    assert raised
    # As on CUDA, where the add_ never ran: p keeps its value and is usable; the lost
    # value keeps raising.
    assert p.tolist() == [0.0] * 4
    if s is not None:
        expect(RuntimeError, "lost to an earlier error", lambda: s.tolist())
    p.add_(2)
    assert p.tolist() == [2.0] * 4
"""


@pytest.mark.parametrize("mode", MODES)
def test_failure_found_later_is_raised_once_then_reads_are_exact(mode):
    run_script(PENDING_READER, mode)


COLD_STRICT = """
    # Shapes no other test compiles: in Strict the programs are cold, their launches
    # queued behind their compiles.
    a = torch.ones(100_019, device=d)
    b = torch.zeros(5, device=d)
    torch.tpu.synchronize()
    torch_tpu._C.set_memory_limit(torch.tpu.memory_allocated() + 700_000)
    raised_at = None
    try:
        t = a * 5                                # fits
        raised_at = "cat"
        u = torch.cat([a, t])                    # 800 KB: over the limit
        raised_at = "after"
        b.add_(1)
        u.sum().item()
    except torch.OutOfMemoryError as e:
        assert "Tried to allocate" in str(e), str(e)
    if mode != "defer_and_fuse":                 # DeferAndFuse defers by design
        assert raised_at == "cat", raised_at
        assert b.tolist() == [0.0] * 5
    assert t[:2].tolist() == [5.0, 5.0]
    b.add_(1)
    assert b.tolist() == [1.0] * 5 if mode != "defer_and_fuse" else b.tolist()[0] in (1.0, 2.0)
"""


@pytest.mark.parametrize("mode", MODES)
def test_out_of_memory_is_raised_by_the_op_with_cold_programs(mode):
    run_script(COLD_STRICT, mode)


LAZY_ACCOUNTING = """
    base = torch.tpu.memory_allocated()
    z = torch.zeros(250_000, device=d)
    e = torch.empty(250_000, device=d)
    zl = torch.zeros_like(z)
    nz = z.new_zeros(250_000)
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() - base == 4 * 1_000_000, torch.tpu.memory_allocated() - base
    free, total = torch.tpu.mem_get_info()
    assert total - free >= 4 * 1_000_000
    del z, e, zl, nz
    assert torch.tpu.memory_allocated() == base
    # Five 1 MB buffers fit under a 5.5 MB limit; the sixth raises at its allocation.
    torch_tpu._C.set_memory_limit(base + 5_500_000)
    bufs = []
    try:
        for i in range(10):
            bufs.append(torch.zeros(250_000, device=d))
        torch.tpu.synchronize()                  # DeferAndFuse: the fills run here
        raise AssertionError("no out-of-memory error")
    except torch.OutOfMemoryError as ex:
        assert "Tried to allocate 1000000 bytes" in str(ex), str(ex)
    if mode == "defer_and_fuse":                 # fills are recorded: counted when they run
        raise SystemExit(print("done"))
    assert len(bufs) == 5, len(bufs)
    assert torch.tpu.memory_allocated() - base == 5_000_000
    expect(torch.OutOfMemoryError, "Tried to allocate", lambda: torch.empty(250_000, device=d))
    # Writing them takes no more memory than they were counted for.
    for b in bufs:
        b.add_(1)
    assert [b[:2].tolist() for b in bufs] == [[1.0, 1.0]] * 5
    grown = torch.tpu.memory_allocated() - base - 5_000_000
    assert 0 <= grown <= 64, grown               # (the scalar 1's small cached buffer)
    del b
    bufs.clear()
    assert torch.tpu.memory_allocated() - base == grown
    torch_tpu._C.set_memory_limit(0)
"""


@pytest.mark.parametrize("mode", MODES)
def test_unwritten_storages_count_as_allocated(mode):
    run_script(LAZY_ACCOUNTING, mode)


TRAINING_RETRY = """
    import torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(d)
    data = torch.randn(4096, 64)
    target = torch.randint(0, 10, (4096,))
    torch.tpu.synchronize()
    torch_tpu._C.set_memory_limit(torch.tpu.memory_allocated() + 2_000_000)

    def step(opt, batch):
        x, y = data[:batch].to(d), target[:batch].to(d)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = [q.detach().cpu().clone() for q in model.parameters()]
    try:
        step(opt, 4096)                          # activations far over the limit
        raise AssertionError("no out-of-memory error")
    except torch.OutOfMemoryError:
        pass
    # The parameters are as before the failed step.
    assert all(torch.equal(q.detach().cpu(), b) for q, b in zip(model.parameters(), before))
    # Reusing the optimizer: either its state is clean (the step never ran) and training
    # goes on, or reading state the failed step made raises; never a silent no-op.
    try:
        losses = [step(opt, 32) for _ in range(3)]
        assert losses[0] > losses[1] > losses[2], losses
    except RuntimeError as e:
        assert "lost to an earlier error" in str(e), str(e)
    # A retry that recreates its state trains.
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = [step(opt, 32) for _ in range(3)]
    assert losses[0] > losses[1] > losses[2], losses
"""


@pytest.mark.parametrize("mode", MODES)
def test_training_retry_after_out_of_memory(mode):
    run_script(TRAINING_RETRY, mode)


CHECKED_READER_OF_FAILED_GRAPH = """
    # A compiled forward that fails at its launch (its OOM is found by the launcher), read
    # by a loss with a device-side index check queued before the failure is known: the
    # check's op never ran, so nothing reads its flag later. Its loss once surfaced at the
    # next read of anything, naming a parameter "lost to an earlier error".
    import torch.nn as nn, torch.nn.functional as F
    MB = 1 << 20
    total = torch.tpu.get_device_properties(0).total_memory
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(d)
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(4096, 256, device=d)
    y = torch.randint(0, 10, (4096,), device=d)
    w = torch.randn(512, 512, device=d)
    torch.tpu.synchronize()
    before = [q.detach().cpu().clone() for q in model.parameters()]
    for trial in range(4):
        torch.tpu.set_per_process_memory_fraction((torch.tpu.memory_allocated() + 4 * MB) / total)
        try:
            busy = w
            for _ in range(6):                   # the launcher is busy: the loss queues first
                busy = busy @ w
            out = compiled(x)                    # 16 MiB at its launch
            loss = F.cross_entropy(out, y)
            torch.tpu.synchronize()
            raise AssertionError("no out-of-memory error")
        except torch.OutOfMemoryError:
            pass
        finally:
            torch.tpu.set_per_process_memory_fraction(1.0)
        out = loss = busy = None
        for q, b in zip(model.parameters(), before):
            assert torch.equal(q.detach().cpu(), b), trial
    torch.tpu.synchronize()                      # nothing left to raise
    small = x[:64]
    assert torch.allclose(compiled(small).cpu(), model(small).cpu(), atol=1e-5)
"""


@pytest.mark.parametrize("mode", MODES)
def test_failed_compiled_graph_leaves_parameters_readable(mode):
    run_script(CHECKED_READER_OF_FAILED_GRAPH, mode)


STATE_MADE_IN_FAILED_STEP = """
    # A storage made in the failing work from a constant (zeros_like, as Adam's lazy
    # exp_avg) and then written goes back to that constant, as one made before goes back
    # to its value: a retry finds it usable. (Strict and Debug raise at the call that
    # passes the limit, before it is made.)
    MB = 1 << 20
    total = torch.tpu.get_device_properties(0).total_memory
    old = torch.ones(4, device=d)
    torch.tpu.synchronize()
    state = {}
    torch.tpu.set_per_process_memory_fraction((torch.tpu.memory_allocated() + 2 * MB) / total)
    try:
        parts = [torch.full((MB // 16,), 1.0, device=d) for _ in range(12)]   # 3 MiB
        g = parts[-1][:4]
        state["acc"] = torch.zeros(4, device=d)
        state["acc"].add_(g)
        state["full"] = torch.full((4,), 7.0, device=d)
        state["full"].mul_(g)
        old.add_(g)
        sum(p.sum() for p in parts).item()
        raise AssertionError("no out-of-memory error")
    except torch.OutOfMemoryError:
        pass
    finally:
        torch.tpu.set_per_process_memory_fraction(1.0)
    parts = g = None
    assert old.tolist() == [1.0] * 4
    if mode == "defer_and_fuse":
        assert state["acc"].tolist() == [0.0] * 4
        assert state["full"].tolist() == [7.0] * 4
    else:
        assert state == {}, state
    acc = state.setdefault("acc", torch.zeros(4, device=d))
    acc.add_(1)
    assert acc.tolist() == [1.0] * 4
"""


@pytest.mark.parametrize("mode", MODES)
def test_state_made_in_failed_work_goes_back_to_its_constant(mode):
    run_script(STATE_MADE_IN_FAILED_STEP, mode)


ADAM_FIRST_STEP_RETRY = """
    # "Catch OOM, halve the batch, retry" with Adam, whose state its first step makes: the
    # retry trains on at the size that fits (the failed tries' state was not kept lost).
    import torch.nn as nn, torch.nn.functional as F
    MB = 1 << 20
    total = torch.tpu.get_device_properties(0).total_memory
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(d)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    data, target = torch.randn(4096, 64), torch.randint(0, 10, (4096,))
    torch.tpu.synchronize()
    before = [q.detach().cpu().clone() for q in model.parameters()]

    def step(batch):
        x, y = data[:batch].to(d), target[:batch].to(d)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    torch.tpu.set_per_process_memory_fraction((torch.tpu.memory_allocated() + 2 * MB) / total)
    try:
        batch, ooms = 4096, 0
        while True:
            try:
                first = step(batch)
                break
            except torch.OutOfMemoryError:
                ooms += 1
                opt.zero_grad(set_to_none=True)
                assert all(torch.equal(q.detach().cpu(), b) for q, b in zip(model.parameters(), before))
                batch //= 2
                assert batch >= 16, "never fit"
        assert ooms >= 1 and batch < 4096, (ooms, batch)
        losses = [first] + [step(batch) for _ in range(4)]
    finally:
        torch.tpu.set_per_process_memory_fraction(1.0)
    assert losses[-1] < losses[0], losses
    assert not all(torch.equal(q.detach().cpu(), b) for q, b in zip(model.parameters(), before))
"""


@pytest.mark.parametrize("mode", MODES)
def test_adam_first_step_retry_trains_on(mode):
    run_script(ADAM_FIRST_STEP_RETRY, mode)


MESSAGE_NAMES_THIS_CALL = """
    # A cached program is named by its first call (its scalars then); an out-of-memory at
    # a later call names that call's own arguments.
    MB = 1 << 20
    total = torch.tpu.get_device_properties(0).total_memory
    x = torch.ones(MB // 4, device=d)
    keep = x.add(9, alpha=2)
    torch.tpu.synchronize()
    torch.tpu.set_per_process_memory_fraction((torch.tpu.memory_allocated() + MB // 2) / total)
    try:
        if mode == "defer_and_fuse":             # raised at the sync, by the graph's replay
            expect(torch.OutOfMemoryError, "Tried to allocate", lambda: x.add(13, alpha=5).sum().item())
        else:
            m = expect(torch.OutOfMemoryError, "Tried to allocate", lambda: x.add(13, alpha=5))
            assert "Long[], 5)" in m, m
    finally:
        torch.tpu.set_per_process_memory_fraction(1.0)
"""


@pytest.mark.parametrize("mode", MODES)
def test_out_of_memory_names_this_calls_scalars(mode):
    run_script(MESSAGE_NAMES_THIS_CALL, mode)
