"""Device-memory counters follow torch.cuda's: what they report is what the tensors need.

- The peak counts the first write into a fresh storage (`empty` then `fill_`, `normal_`,
  `copy_` from the CPU; the factories made that way: randn, full, ones, arange) once: an
  `empty` storage's bytes count from its allocation, and its first buffer replaces them.
- Launch checks count storages allocated but not written yet, as CUDA's allocator has
  handed their memory out: the op that passes the limit raises, not a later write into a
  pre-allocated buffer; that write itself does not count the buffer twice.
- Memory queries never raise (a deferred graph that fails with out-of-memory leaves its
  tensors failed, and reading them raises it).
Each case runs in a fresh process per mode (the limit is per process)."""
import textwrap

import pytest

import mode_scripts

MODES = mode_scripts.MODES

PRELUDE = mode_scripts.LIMIT_PRELUDE + "import gc\n"


def run_script(body, mode):
    return mode_scripts.run_in_mode(PRELUDE + textwrap.dedent(body) + "\nprint('done')\n", mode)


# One 20 MiB tensor under a 24 MiB limit, made each way: the peak is the tensor (plus the
# few bytes of scalar operands), never two of it (CUDA: 1.0x).
FIRST_WRITE_PEAKS = """
    set_limit(24 * MB)
    n = 20 * MB // 4
    makers = {
        "randn": lambda: torch.randn(n, device=d),
        "rand": lambda: torch.rand(n, device=d),
        "randint": lambda: torch.randint(0, 10, (n,), device=d, dtype=torch.int32),
        "arange": lambda: torch.arange(n, device=d, dtype=torch.float32),
        "full": lambda: torch.full((n,), 2.0, device=d),
        "ones": lambda: torch.ones(n, device=d),
        "zeros": lambda: torch.zeros(n, device=d),
        "empty.fill_": lambda: torch.empty(n, device=d).fill_(2.0),
        "empty.normal_": lambda: torch.empty(n, device=d).normal_(),
        "empty.uniform_": lambda: torch.empty(n, device=d).uniform_(),
        "empty.copy_(cpu)": lambda: torch.empty(n, device=d).copy_(torch.ones(n)),
        "cpu.to": lambda: torch.ones(n).to(d),
    }
    bad = []
    for name, make in makers.items():
        gc.collect()
        T.reset_peak_memory_stats()
        t = make()
        t[-1].item()
        del t
        peak = T.max_memory_allocated()
        if peak > 20 * MB + 4096:
            bad.append(f"{name}: peak {peak / MB:.3f} MiB")
    # model.to: the parameters, not the parameters plus the largest one
    m = torch.nn.Sequential(*[torch.nn.Linear(512, 1024) for _ in range(4)])
    need = sum(p.numel() * 4 for p in m.parameters())
    gc.collect()
    T.reset_peak_memory_stats()
    m.to(d)
    T.synchronize()
    if T.max_memory_allocated() > need + 4096:
        bad.append(f"model.to: peak {T.max_memory_allocated()} for {need} bytes of parameters")
    assert not bad, bad
"""


@pytest.mark.parametrize("mode", MODES)
def test_first_write_peak_counts_one_buffer(mode):
    run_script(FIRST_WRITE_PEAKS, mode)


# The probe's r8: 10 MiB allocated by `empty` and 2 MiB written under a 16 MiB limit; an
# 8 MiB cat passes the limit and raises there (CUDA does), not at a later fill of the
# pre-allocated tensor. Then writes into `empty` storages that exactly fit: counted once.
UNWRITTEN_IN_LAUNCH_CHECKS = """
    set_limit(16 * MB)
    e = torch.empty(10 * MB // 4, device=d)
    x = torch.randn(2 * MB // 4, device=d)
    try:
        z = torch.cat([x] * 4)
        z.sum().item()
        raise AssertionError(f"cat passed the limit: memory_allocated() = {T.memory_allocated()}")
    except torch.OutOfMemoryError:
        pass
    assert T.memory_allocated() <= 16 * MB, T.memory_allocated()
    free, total = T.mem_get_info()
    assert free >= 16 * MB - T.memory_allocated() - 4096, (free, T.memory_allocated())
    e.fill_(1.0)
    assert e[-1].item() == 1.0
    del e, x
    gc.collect()

    n = 10 * MB // 4
    writes = {
        "fill_": lambda e: e.fill_(1.0),
        "view fill_": lambda e: e[:].fill_(2.0),
        "normal_": lambda e: e.normal_(),
        "uniform_": lambda e: e.uniform_(),
        "copy_(cpu)": lambda e: e.copy_(torch.full((n,), 3.0)),
        "randn(out=)": lambda e: torch.randn(n, out=e),
    }
    set_limit(T.memory_allocated() + 12 * MB + 64 * 1024)
    for name, write in writes.items():
        e = torch.empty(n, device=d)
        x = torch.randn(2 * MB // 4, device=d)
        write(e)
        e[-1].item()
        x[-1].item()
        del e, x
        gc.collect()
"""


@pytest.mark.parametrize("mode", MODES)
def test_unwritten_storages_count_in_launch_checks(mode):
    run_script(UNWRITTEN_IN_LAUNCH_CHECKS, mode)


# The probe's r1: 40 tensors of 1 MiB under a 16 MiB limit. Strict and Debug raise at the
# call; DeferAndFuse at the flush, which a memory query makes: the query itself returns
# (torch.cuda's counters never raise), the failed tensors raise the out-of-memory when
# read, and the next sync raises it when nothing read them.
QUERIES_NEVER_RAISE = """
    set_limit(16 * MB)

    def fill_past_limit():
        made = []
        try:
            for i in range(40):
                made.append(torch.full((MB // 4,), float(i), device=d))
        except torch.OutOfMemoryError:
            return made, True
        return made, False

    def query():
        alloc = T.memory_allocated()
        stats = T.memory_stats()
        free, total = T.mem_get_info()
        T.max_memory_allocated()
        T.memory_reserved()
        assert alloc <= 16 * MB and free <= total, (alloc, free, total)
        return stats

    made, at_call = fill_past_limit()
    stats = query()
    assert stats["num_ooms"] >= 1, stats["num_ooms"]
    if not at_call:
        try:
            made[-1][0].item()
            raise AssertionError("read a value of a graph that ran out of memory")
        except torch.OutOfMemoryError:
            pass
    assert made[0][0].item() == 0.0
    del made
    gc.collect()

    made, at_call = fill_past_limit()
    query()
    if not at_call:
        try:
            T.synchronize()
            raise AssertionError("the out-of-memory was lost")
        except torch.OutOfMemoryError:
            pass
    T.synchronize()
"""


@pytest.mark.parametrize("mode", MODES)
def test_memory_queries_never_raise(mode):
    run_script(QUERIES_NEVER_RAISE, mode)


# A collective's result written into an `empty` output (all_gather_into_tensor on one
# rank): the output's first buffer, counted once, so an exact fit runs and peaks at it.
COLLECTIVE_INTO_EMPTY = """
    import torch.distributed as dist
    dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=1)
    x = torch.randn(10 * MB // 4, device=d)
    x.cpu()
    set_limit(T.memory_allocated() + 10 * MB + 64 * 1024)
    T.reset_peak_memory_stats()
    out = torch.empty(10 * MB // 4, device=d)
    dist.all_gather_into_tensor(out, x)
    assert torch.equal(out.cpu(), x.cpu())
    assert T.max_memory_allocated() <= 20 * MB + 64 * 1024, T.max_memory_allocated()
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("mode", MODES)
def test_collective_into_empty_output_counts_once(mode):
    run_script(COLLECTIVE_INTO_EMPTY, mode)
