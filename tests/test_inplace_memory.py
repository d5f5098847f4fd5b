"""In-place writes need one buffer of the written storage, as CUDA's in-place kernels do.

- Strict and Debug: an in-place op (x.add_(1), x[:100].zero_(), x[5] = 7, ...) donates
  the storage's old buffer to its program where nothing else holds it, so a 10 MiB tensor
  is updated under a 16 MiB limit and the peak counter reads one buffer. Donation follows
  the fused graphs' rule: on the XLA CPU plugin only with TPU_FUSE_DONATE=1 at process
  start (runtime::Client::donation_safe).
  A buffer the op reads again through another operand (x.add_(x)) is passed once.
- DeferAndFuse: a fused graph that donates counts the donated buffer once (its peak too);
  a graph run op by op (its first run, where the fused program does not fit) donates
  where a call would not fit otherwise.
- copy_ from the CPU over a whole storage (load_state_dict) drops the old buffer before
  the upload, in every mode, donation or not; so do Strict's and Debug's ops that overwrite
  a whole storage without reading it (x.normal_(), a broadcast copy_, x[:] = 2).
- A failing op (a device-side index check, an out-of-memory) leaves the tensor readable
  and unchanged (in a DeferAndFuse run op by op that donated it: as its last write that
  ran left it).
Each case runs in a fresh process per mode (the limit and donation are per process)."""
import textwrap

import pytest

import mode_scripts

MODES = mode_scripts.MODES

PRELUDE = mode_scripts.LIMIT_PRELUDE + textwrap.dedent(
    """
    def donated():
        return torch_tpu.metrics()["donated_buffers"]

    def failed_index_check_leaves_unchanged(x):
        # A device-side check that fails: the tensor is left as it was, and readable.
        bad = torch.tensor([x.numel() + 5], device=d)
        snapshot = x.cpu()
        try:
            x.index_fill_(0, bad, 1.0)
            x[0].item()
            raise AssertionError("no index error")
        except IndexError:
            pass
        assert torch.equal(x.cpu(), snapshot)
        return snapshot
    """
)


def run_script(body, mode, donate):
    script = PRELUDE + textwrap.dedent(body) + "\nprint('done')\n"
    return mode_scripts.run_in_mode(script, mode, {"TPU_FUSE_DONATE": "1" if donate else None})


# The memory probe's r9 ops on a 10 MiB tensor under a 16 MiB limit (one buffer fits, two
# do not), each compared with the same op on CPU, each peaking at one buffer.
EAGER_IN_PLACE = """
    n = 10 * MB // 4
    ref = torch.randn(n)
    x = ref.to(d)
    T.synchronize()
    set_limit(16 * MB)
    ops = [
        ("add_", lambda t: t.add_(1)),
        ("mul_.add_", lambda t: t.mul_(2).add_(1)),
        ("slice zero_", lambda t: t[:100].zero_()),
        ("clamp_", lambda t: t.clamp_(min=0)),
        ("setitem", lambda t: t.__setitem__(5, 7.0)),
        ("div_", lambda t: t.div_(4)),
        # The written buffer read again through another operand: passed once.
        ("add_(x)", lambda t: t.add_(t)),
        ("addcmul_(x, x)", lambda t: t.addcmul_(t, t, value=0.5)),
        ("mul_(x)", lambda t: t.mul_(t)),
    ]
    before = donated()
    for name, op in ops:
        T.reset_peak_memory_stats()
        op(x)
        op(ref)
        got = x.cpu()
        assert torch.allclose(got, ref, rtol=1e-6, atol=1e-6), name
        peak = T.max_memory_allocated()
        assert peak <= 10 * MB + 64 * 1024, (name, peak)
    assert donated() >= before + len(ops), (before, donated())
    assert T.memory_allocated() <= 10 * MB + 64 * 1024

    snapshot = failed_index_check_leaves_unchanged(x)
    x.add_(1)
    assert torch.equal(x.cpu(), snapshot + 1)

    # An op that cannot fit even in place (a float64 result is 20 MiB): out of memory,
    # the tensor unchanged and still updated in place afterwards.
    try:
        x.add_(torch.ones(n, dtype=torch.float64, device=d))
        x[0].item()
        raise AssertionError("no out-of-memory error")
    except torch.OutOfMemoryError:
        pass
    assert torch.equal(x.cpu(), snapshot + 1)
    x.mul_(3)
    assert torch.equal(x.cpu(), (snapshot + 1) * 3)

    # Other holders of the old buffer keep it: nothing is donated from under them.
    set_limit(T.get_device_properties(0).total_memory)
    y = torch.arange(1000.0, device=d)
    z = y.clone()                      # its own storage (possibly the same buffer)
    w = y * 2                          # may still be queued, reading y's buffer
    v = y[10:20]                       # a view: sees the update
    y.add_(1)
    assert torch.equal(z.cpu(), torch.arange(1000.0))
    assert torch.equal(w.cpu(), torch.arange(1000.0) * 2)
    assert torch.equal(v.cpu(), torch.arange(10.0, 20.0) + 1)
    assert torch.equal(y.cpu(), torch.arange(1000.0) + 1)
"""


@pytest.mark.parametrize("mode", ["strict", "debug"])
def test_eager_in_place_ops_fit_one_buffer_with_donation(mode):
    run_script(EAGER_IN_PLACE, mode, donate=True)


# A fused graph that donates: the donated buffer leaves the counts at its launch, so the
# peak is one buffer, not two (the first run of a new graph runs op by op and does not
# donate: warmed up first, without the limit).
FUSED_PEAK = """
    n = 10 * MB // 4
    ref = torch.randn(n)
    x = ref.to(d)
    for _ in range(3):
        x.add_(1)
        x[0].item()
    ref += 3
    set_limit(16 * MB)
    before = donated()
    T.reset_peak_memory_stats()
    x.add_(1)
    ref += 1
    assert torch.allclose(x.cpu(), ref)
    assert donated() > before
    assert T.max_memory_allocated() <= 10 * MB + 64 * 1024, T.max_memory_allocated()
"""


def test_fused_donation_peaks_at_one_buffer():
    run_script(FUSED_PEAK, "defer_and_fuse", donate=True)


# copy_ from the CPU over a whole storage, and load_state_dict into a model that fills the
# device: no donation needed (the default on the CPU plugin).
COPY_FROM_CPU = """
    n = 10 * MB // 4
    x = torch.randn(n, device=d)
    T.synchronize()
    set_limit(16 * MB)
    T.reset_peak_memory_stats()
    src = torch.linspace(-1, 1, n)
    x.copy_(src)
    assert torch.equal(x.cpu(), src)
    assert T.max_memory_allocated() <= 10 * MB + 64 * 1024, T.max_memory_allocated()
    assert donated() == 0

    # A copy that cannot fit (the float64 source is uploaded as it is, 20 MiB): out of
    # memory with x unchanged, and x still written in place afterwards.
    try:
        x.copy_(torch.zeros(n, dtype=torch.float64))
        x[0].item()
        raise AssertionError("no out-of-memory error")
    except torch.OutOfMemoryError:
        pass
    assert torch.equal(x.cpu(), src)
    x.copy_(src * 2)
    assert torch.equal(x.cpu(), src * 2)
    del x
    T.synchronize()

    # load_state_dict with less free memory than the largest parameter.
    set_limit(T.get_device_properties(0).total_memory)
    m = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]).to(d)
    need = sum(p.numel() * 4 for p in m.parameters())
    T.synchronize()
    set_limit(T.memory_allocated() + 64 * 1024)
    sd = {k: torch.full_like(v, 0.25, device="cpu") for k, v in m.state_dict().items()}
    m.load_state_dict(sd)
    for k, v in m.state_dict().items():
        assert torch.equal(v.cpu(), sd[k]), k
    assert T.memory_allocated() <= need + 64 * 1024
"""


@pytest.mark.parametrize("mode", MODES)
def test_copy_from_cpu_over_whole_storage_needs_one_buffer(mode):
    run_script(COPY_FROM_CPU, mode, donate=False)


# Ops that overwrite a whole storage without reading it (random fills, a broadcast copy_,
# x[:] = 2) drop the old buffer before their launch: no donation needed.
WHOLE_OVERWRITES = """
    n = 10 * MB // 4
    x = torch.randn(n, device=d)
    T.synchronize()
    set_limit(16 * MB)
    for name, op, check in [
        ("normal_", lambda: x.normal_(2.0, 0.5), lambda v: abs(v.mean().item() - 2.0) < 0.01),
        ("uniform_", lambda: x.uniform_(3.0, 4.0), lambda v: v.min().item() >= 3.0 and v.max().item() <= 4.0),
        ("copy_ broadcast", lambda: x.copy_(torch.tensor(5.0)), lambda v: bool((v == 5.0).all())),
        ("x[:] = 2", lambda: x.__setitem__(slice(None), 2.0), lambda v: bool((v == 2.0).all())),
        ("x[:] = tpu scalar", lambda: x.__setitem__(slice(None), torch.tensor(6.0, device=d)),
         lambda v: bool((v == 6.0).all())),
    ]:
        T.reset_peak_memory_stats()
        op()
        assert check(x.cpu()), name
        assert T.max_memory_allocated() <= 10 * MB + 64 * 1024, (name, T.max_memory_allocated())

    # Another holder of the buffer keeps its values: nothing is dropped from under it.
    set_limit(T.get_device_properties(0).total_memory)
    y = torch.arange(1000.0, device=d)
    z = y.clone()
    y.normal_()
    y.copy_(torch.tensor(1.0))
    assert torch.equal(z.cpu(), torch.arange(1000.0))
    assert bool((y.cpu() == 1.0).all())
    u = torch.arange(1000.0, device=d)
    v = u.clone()
    u[:] = 3
    assert torch.equal(v.cpu(), torch.arange(1000.0))
    assert bool((u.cpu() == 3.0).all())
"""


@pytest.mark.parametrize("mode", ["strict", "debug"])
def test_whole_storage_overwrites_need_one_buffer(mode):
    run_script(WHOLE_OVERWRITES, mode, donate=False)


# DeferAndFuse, the first run of each new graph: where the fused launch does not fit, the
# replay op by op donates what nothing else holds, where a call would not fit otherwise
# (the graph input to its own update, an intermediate to its last reader). A write after
# one that failed leaves the storage with the value of its last write that ran, as CUDA's
# eager ops leave it.
FUSED_FIRST_RUN = """
    n = 10 * MB // 4
    ref = torch.randn(n)
    x = ref.to(d)
    T.synchronize()
    set_limit(16 * MB)
    before = donated()
    for name, op in [
        ("add_ then item", lambda t: (t.add_(1), t[5].item())),
        ("mul_.add_ then item", lambda t: (t.mul_(2).add_(1), t[7].item())),
        ("clamp_", lambda t: t.clamp_(min=0)),
        ("setitem", lambda t: t.__setitem__(5, 7.0)),
        ("div_", lambda t: t.div_(4)),
        ("mul_(x) then item", lambda t: (t.mul_(t), t[1].item())),
        ("addcmul_(x, x) then item", lambda t: (t.addcmul_(t, t, value=0.5), t[2].item())),
    ]:
        T.reset_peak_memory_stats()
        op(x)
        op(ref)
        assert torch.allclose(x.cpu(), ref, rtol=1e-6, atol=1e-6), name
        assert T.max_memory_allocated() <= 10 * MB + 64 * 1024, (name, T.max_memory_allocated())
    assert donated() > before

    snapshot = failed_index_check_leaves_unchanged(x)

    # add_ runs (its input donated), the mul making y does not fit: x keeps add_'s value,
    # y's read raises, and x is still written afterwards.
    try:
        x.add_(1)
        y = x * 3
        x.sub_(y)
        y[0].item()
        raise AssertionError("no out-of-memory error")
    except torch.OutOfMemoryError:
        pass
    assert torch.equal(x.cpu(), snapshot + 1)
    x.mul_(2)
    assert torch.equal(x.cpu(), (snapshot + 1) * 2)
"""


def test_fused_first_run_fits_one_buffer_with_donation():
    run_script(FUSED_FIRST_RUN, "defer_and_fuse", donate=True)
