"""The `tpu` device as PyTorch sees it: device module, accelerator API, autoload, errors."""
import textwrap

import pytest
import torch

import torch_tpu
from conftest import run_python


def test_device_module_shaped_like_cuda():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0
    torch.tpu.set_device(0)
    torch.tpu.synchronize()
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    # torch.cuda.memory_stats' keys, which tools read
    for key in ("active_bytes.all.peak", "active_bytes.all.current", "num_alloc_retries", "num_ooms",
                "reserved_bytes.all.peak", "requested_bytes.all.current", "inactive_split_bytes.all.current"):
        assert key in stats, key
    torch.tpu.empty_cache()


def test_accelerator_api():
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.accelerator.device_count() == torch.tpu.device_count()
    torch.accelerator.synchronize()
    assert torch.accelerator.current_device_index() == 0
    s = torch.accelerator.current_stream()
    assert s.device == torch.device("tpu", 0)


def test_streams_and_events_follow_the_device_queue():
    s = torch.Stream(device="tpu")
    assert s.device == torch.device("tpu", 0)
    x = torch.randn(256, 256, device="tpu")
    with s:
        y = x @ x
    e = torch.Event(device="tpu")
    e.record()
    e.synchronize()
    assert e.query() and s.query()
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu(), rtol=1e-4, atol=1e-4)


def test_api_names_match_torchtpu():
    assert torch_tpu.api.tpu_device() == torch.device("tpu", 0)
    from torch_tpu._internal import execution_mode, sync
    assert execution_mode.EagerMode.DEFER_NEVER in execution_mode.EagerMode
    sync.synchronize()


def test_tensor_and_module_to_tpu():
    x = torch.randn(4, 5)
    t = x.to("tpu")
    assert t.device.type == "tpu" and t.is_tpu
    assert torch.equal(t.cpu(), x)
    m = torch.nn.Linear(5, 3).to("tpu")
    assert all(p.device.type == "tpu" for p in m.parameters())
    assert torch.allclose(m(t).cpu(), torch.nn.functional.linear(x, m.weight.cpu(), m.bias.cpu()), atol=1e-6)


def test_memory_counts_live_device_bytes():
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    t = torch.empty(1024, 256, device="tpu").fill_(1.0)
    # the tensor, plus at most a few cached scalar operands (the fill value)
    assert 0 <= torch.tpu.memory_allocated() - base - 1024 * 256 * 4 <= 64
    torch.tpu.reset_peak_memory_stats()
    u = t * 2
    assert torch.tpu.max_memory_allocated() >= base + 2 * 1024 * 256 * 4
    del t, u
    assert torch.tpu.memory_allocated() - base <= 64


def test_accelerator_memory_functions_read_the_tpu_allocator():
    # torch.accelerator's memory functions ask the device allocator (as CUDA's do).
    acc = torch.accelerator
    t = torch.empty(1024, 256, device="tpu").fill_(1.0)
    assert acc.memory_allocated() == torch.tpu.memory_allocated() >= 1024 * 256 * 4
    assert acc.memory_reserved() == torch.tpu.memory_reserved()
    acc.reset_peak_memory_stats()
    assert acc.max_memory_allocated() == acc.memory_allocated()
    u = t * 2
    assert acc.max_memory_allocated() >= torch.tpu.memory_allocated() - 64
    stats = acc.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    assert stats["allocation.all.allocated"] == torch.tpu.memory_stats()["num_alloc.all"] > 0
    for reset in (acc.reset_accumulated_memory_stats, torch.tpu.reset_accumulated_memory_stats):
        del u
        u = t * 3
        torch.tpu.synchronize()
        reset()  # every accumulated count and total, as CUDA's (torch.tpu's reset only one)
        stats = torch.tpu.memory_stats()
        for key in ("allocation.all.allocated", "allocation.all.freed", "allocated_bytes.all.allocated",
                    "allocated_bytes.all.freed", "num_alloc.all", "num_ooms"):
            assert stats[key] == 0, (reset, key, stats[key])
    free, total = acc.get_memory_info()
    assert (free, total) == torch.tpu.mem_get_info()
    acc.empty_cache()
    del t, u


def test_memory_stats_count_allocations_as_cuda_does():
    # The counts and accumulated keys were 0 beside nonzero byte totals (a CUDA leak check
    # watching allocation.all.current always saw 0; found by the s46 soak probe).
    torch.tpu.synchronize()
    before = torch.tpu.memory_stats()
    ts = [torch.arange(1000.0).add(i).to("tpu") for i in range(5)]  # 5 transfers: 5 buffers
    torch.tpu.synchronize()
    mid = torch.tpu.memory_stats()
    assert mid["allocation.all.current"] - before["allocation.all.current"] == 5
    assert mid["active.all.current"] == mid["allocation.all.current"]
    assert mid["allocated_bytes.all.allocated"] - before["allocated_bytes.all.allocated"] >= 20000
    del ts[:3]
    torch.tpu.synchronize()
    after = torch.tpu.memory_stats()
    assert after["allocation.all.current"] - before["allocation.all.current"] == 2
    assert after["allocation.all.freed"] - mid["allocation.all.freed"] == 3
    assert after["allocated_bytes.all.freed"] - mid["allocated_bytes.all.freed"] == 12000
    assert after["allocation.all.peak"] >= mid["allocation.all.current"]


def test_cuda_module_names_a_port_uses():
    s = torch.tpu.Stream(priority=-1)
    assert s.priority == -1 and torch.tpu.Stream().priority == 0
    x = torch.ones(4, device="tpu")
    with torch.tpu.StreamContext(s) as entered:
        assert torch.tpu.current_stream() == s == entered
        assert torch.tpu.current_stream().priority == -1  # rebuilt from its id, priority kept
        y = x + 1
    assert torch.tpu.current_stream() == torch.tpu.default_stream()
    with torch.tpu.device_of(y), torch.tpu.device_of(torch.ones(1)):
        assert torch.tpu.current_device() == 0
    gens = torch.tpu.default_generators
    assert len(gens) == torch.tpu.device_count() and gens[0].device == torch.device("tpu", 0)
    gens[0].manual_seed(5)
    a = torch.rand(8, device="tpu").cpu()
    torch.tpu.manual_seed(5)
    assert torch.equal(torch.rand(8, device="tpu").cpu(), a)
    assert torch.equal(y.cpu(), torch.full((4,), 2.0))


def test_out_of_memory_is_torch_oom_and_keeps_tensors():
    keep = torch.arange(10.0, device="tpu")
    ooms = torch.tpu.memory_stats()["num_ooms"]
    torch_tpu._C.set_memory_limit(torch.tpu.memory_allocated() + 1000)
    try:
        with pytest.raises(torch.OutOfMemoryError, match="TPU out of memory. Tried to allocate"):
            # Strict raises at the op; DeferAndFuse when the value is needed.
            (torch.ones(1000, 1000, device="tpu") + 1).cpu()
    finally:
        torch_tpu._C.set_memory_limit(0)
    assert keep.sum().item() == 45.0
    assert torch.tpu.memory_stats()["num_ooms"] > ooms  # counted, as CUDA's allocator does


def test_a_tensor_larger_than_the_device_is_refused_at_allocation():
    # As on CUDA, at the allocation, not at a later launch (fills are recorded lazily).
    keep = torch.arange(10.0, device="tpu")
    limit = torch.tpu.mem_get_info()[1]
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        torch.empty(limit // 4 + 1, device="tpu")
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        torch.zeros(limit // 2 + 8, dtype=torch.float16, device="tpu")
    assert keep.sum().item() == 45.0


def test_per_process_memory_fraction_caps_allocations_as_on_cuda():
    keep = torch.arange(10.0, device="tpu")
    capacity = torch.tpu.mem_get_info()[1]
    try:
        fraction = (torch.tpu.memory_allocated() + 4000) / capacity
        torch.tpu.set_per_process_memory_fraction(fraction)
        # The cap is whole bytes (truncated, as CUDA's): the fraction read back is within a byte.
        assert torch.tpu.get_per_process_memory_fraction() == pytest.approx(fraction, rel=0, abs=1 / capacity)
        assert torch.tpu.mem_get_info()[1] == int(fraction * capacity)
        with pytest.raises(torch.OutOfMemoryError, match="TPU out of memory. Tried to allocate"):
            (torch.ones(1000, 1000, device="tpu") + 1).cpu()
        assert (keep + 1).sum().item() == 55.0  # small work still fits
    finally:
        torch.tpu.set_per_process_memory_fraction(1.0)
    assert torch.tpu.get_per_process_memory_fraction() == 1.0
    assert (torch.ones(1000, 1000, device="tpu") + 1).sum().item() == 2e6
    with pytest.raises(ValueError, match="Allowed range"):
        torch.tpu.set_per_process_memory_fraction(1.5)
    with pytest.raises(TypeError):
        torch.tpu.set_per_process_memory_fraction(1)


def test_runtime_caches_give_way_under_a_memory_fraction():
    # Views read at many offsets leave each offset cached on the device (as are scalars):
    # runtime caches count towards the limit, not memory_allocated(). A cap just above
    # the user's tensors empties them before refusing, as CUDA's allocator frees its
    # cached blocks, instead of refusing work that fits.
    base = torch.arange(4096.0, device="tpu")
    with torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_NEVER):  # each read its own program
        for i in range(0, 4000, 4):
            base[i:i + 2].sum()
        torch.tpu.synchronize()
    assert torch_tpu.metrics()["scalar_cache_bytes"] > 4000
    capacity = torch.tpu.mem_get_info()[1]
    try:
        torch.tpu.set_per_process_memory_fraction((torch.tpu.memory_allocated() + 4000) / capacity)
        assert (base[:10] + 1).sum().item() == 55.0
        with pytest.raises(torch.OutOfMemoryError, match="TPU out of memory. Tried to allocate"):
            (torch.ones(1000, 1000, device="tpu") + 1).cpu()
        assert torch_tpu.metrics()["scalar_cache_bytes"] < 4000
        assert (base[5:8] * 2).tolist() == [10.0, 12.0, 14.0]  # cached again as needed
    finally:
        torch.tpu.set_per_process_memory_fraction(1.0)
    assert base.sum().item() == 4095 * 4096 / 2


def test_bf16_support_and_memory_summary():
    assert torch.tpu.is_bf16_supported() is True
    t = torch.ones(1024, 256, device="tpu")
    summary = torch.tpu.memory_summary()
    assert "allocated" in summary and "limit" in summary
    mib = torch.tpu.memory_allocated() / 2**20
    assert f"{mib:.1f} MiB" in summary
    del t


def test_missing_device_index_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"tpu:7 does not exist"):
        torch.zeros(3, device="tpu:7")
    assert torch.ones(2, device="tpu").sum().item() == 2.0


def test_unsupported_dtype_names_the_dtype():
    with pytest.raises(NotImplementedError, match="ComplexHalf|complex32"):
        torch.zeros(3, dtype=torch.complex32, device="tpu")


def test_import_torch_alone_autoloads_the_backend():
    r = run_python("import torch; x = torch.ones(2, device='tpu'); print((x + 1).sum().item())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("4.0")


def test_import_torch_tpu_first_works():
    r = run_python("import torch_tpu, torch; print(torch.ones(2, device='tpu').sum().item())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("2.0")


def test_autoload_can_be_disabled():
    r = run_python("import torch, sys; print('torch_tpu' in sys.modules)",
                   env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_no_plugin_says_how_to_install_one():
    r = run_python("import sys, types; m = types.ModuleType('torch_tpu._plugins');"
                   "m.candidates = lambda: []; sys.modules['torch_tpu._plugins'] = m;"
                   "import torch_tpu, torch; torch.ones(1, device='tpu')",
                   env={"TPU_PJRT_PLUGIN": "", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode != 0
    assert "pip install xla-cpu-pjrt" in r.stderr


def test_several_devices_keep_tensors_apart():
    code = """
import torch
assert torch.tpu.device_count() == 2, torch.tpu.device_count()
a = torch.arange(4.0, device='tpu:0'); b = torch.arange(4.0, device='tpu:1')
c = b * 2
assert c.device == torch.device('tpu:1'), c.device
d = a.to('tpu:1') + c
assert d.device.index == 1 and d.cpu().tolist() == [0.0, 3.0, 6.0, 9.0]
try:
    a + b
    raise SystemExit('mixed devices were accepted')
except RuntimeError as e:
    assert 'same device' in str(e), e
with torch.tpu.device(1):
    assert torch.empty(1, device='tpu').device.index == 1
print('ok')
"""
    r = run_python(code, env={"TPU_NUM_DEVICES": "2"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_metrics_report_lists_counters():
    (torch.ones(3, device="tpu") * 3).cpu()
    m = torch_tpu.metrics()
    for key in ("compiles", "signature_hits", "signature_misses", "executions", "fallbacks",
                "h2d_bytes", "d2h_bytes", "lowered_ops"):
        assert key in m
    assert m["executions"] > 0 and m["lowered_ops"] > 100
    assert "compiles" in torch_tpu.metrics_report()


def test_data_parallel_over_tpu_devices_matches_cpu():
    # torch.nn.DataParallel scatters the batch, replicates the module, gathers outputs and
    # sums the replicas' gradients: device-to-device copies between tpu devices.
    r = run_python(
        "import torch, torch_tpu\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))\n"
        "x = torch.randn(6, 4)\n"
        "want = m(x); want.square().sum().backward(); grads = [p.grad.clone() for p in m.parameters()]\n"
        "m.to('tpu:0')\n"
        "for ids in ([0, 1], None, [0]):\n"
        "    for p in m.parameters(): p.grad = None\n"
        "    dp = torch.nn.DataParallel(m, device_ids=ids) if ids else torch.nn.DataParallel(m)\n"
        "    out = dp(x.to('tpu:0'))\n"
        "    out.square().sum().backward()\n"
        "    assert out.device == torch.device('tpu', 0)\n"
        "    torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-5)\n"
        "    for p, g in zip(m.parameters(), grads):\n"
        "        assert p.grad.device == torch.device('tpu', 0)\n"
        "        torch.testing.assert_close(p.grad.cpu(), g, rtol=1e-5, atol=1e-5)\n"
        "print('ok', len(torch.nn.DataParallel(m).device_ids))\n",
        env={"TPU_NUM_DEVICES": "4"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "4"]


def test_safetensors_loads_onto_a_tpu_device(tmp_path):
    # safetensors checks device strings against its own list (Rust) and refused "tpu".
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    path = str(tmp_path / "w.safetensors")
    save_file({"w": torch.arange(6.0).view(2, 3), "i": torch.arange(3)}, path)
    for device in ("tpu", "tpu:0", torch.device("tpu"), torch.device("tpu", 0), 0):
        got = load_file(path, device=device)
        assert {t.device for t in got.values()} == {torch.device("tpu", 0)}, device
        assert torch.equal(got["w"].cpu(), torch.arange(6.0).view(2, 3)) and torch.equal(got["i"].cpu(), torch.arange(3))
    with safe_open(path, framework="pt", device="tpu") as f:
        assert f.get_slice("w")[1:].device.type == "tpu"
    assert load_file(path)["w"].device.type == "cpu"


def test_cuda_spellings_of_amp_memory_and_errors_exist_for_tpu():
    # torch.cuda.amp.autocast() / GradScaler(), torch.cuda.memory.*, `except
    # torch.cuda.OutOfMemoryError`: what scripts say after "cuda" becomes "tpu".
    from torch.tpu.amp import GradScaler, autocast
    import torch.tpu.memory
    assert torch.tpu.memory.memory_allocated() == torch.tpu.memory_allocated()
    assert torch.tpu.OutOfMemoryError is torch.OutOfMemoryError
    torch.tpu.ipc_collect()
    lin = torch.nn.Linear(4, 4).to("tpu")
    x = torch.randn(2, 4, device="tpu")
    with autocast():
        assert lin(x).dtype == torch.float16
    with torch.tpu.amp.autocast(dtype=torch.bfloat16):
        assert lin(x).dtype == torch.bfloat16
    with autocast(enabled=False):
        assert lin(x).dtype == torch.float32
    scaler = GradScaler(init_scale=4.0)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    before = lin.weight.detach().cpu()
    scaler.scale(lin(x).sum()).backward()
    torch.testing.assert_close(lin.weight.grad.cpu(), 4.0 * x.cpu().sum(0).expand(4, 4))
    scaler.step(opt)
    scaler.update()
    torch.testing.assert_close(lin.weight.detach().cpu(), before - 0.1 * x.cpu().sum(0).expand(4, 4))
    assert scaler.get_scale() == 4.0 and scaler._scale.device.type == "tpu"
    with pytest.raises(torch.tpu.OutOfMemoryError):
        torch.empty(1 << 50, device="tpu")


def test_memory_history_snapshot_names_the_python_code_that_made_each_storage(tmp_path):
    import pickle

    def make_weights():
        return torch.randn(64, 64, device="tpu")
    torch.tpu.memory._record_memory_history(max_entries=100)
    try:
        w = make_weights()
        y = w @ w
        del w
        snap = torch.tpu.memory._snapshot()
        torch.tpu.memory._dump_snapshot(str(tmp_path / "snap.pickle"))
    finally:
        torch.tpu.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][0]
    assert [(e["action"], e["size"]) for e in trace] == [("alloc", 16384), ("alloc", 16384), ("free_completed", 16384)]
    assert any(f["name"] == "make_weights" for f in trace[0]["frames"])
    assert trace[2]["addr"] == trace[0]["addr"]  # the freed storage is the first one made
    (seg,) = snap["segments"]  # only y is still live
    assert seg["total_size"] == 16384 and seg["blocks"][0]["state"] == "active_allocated"
    assert pickle.load(open(tmp_path / "snap.pickle", "rb"))["device_traces"][0][0]["size"] == 16384
    from torch.cuda import _memory_viz
    assert "16.0KiB" in _memory_viz.segsum(snap)  # PyTorch's reader takes it
    assert torch.tpu.memory._snapshot()["segments"] == [] and torch.tpu.memory_snapshot() == []
    del y


@pytest.mark.parametrize("mode", ["strict", "debug", "fused"])
def test_an_out_of_memory_in_place_update_leaves_its_tensor_as_it_was(mode):
    """A device OOM in an in-place update (raised at the op in Debug, at the next sync in
    Strict's first compile and DeferAndFuse) leaves the tensor's value, as on CUDA where the
    op never ran; accelerate's batch-size finder recognizes the error and retries."""
    env = {"strict": {}, "debug": {"TPU_LAUNCH_BLOCKING": "1"}, "fused": {"TPU_DEFER_AND_FUSE": "1"}}[mode]
    r = run_python(textwrap.dedent("""
        import gc, torch, torch_tpu
        from accelerate.utils.memory import should_reduce_batch_size
        t = torch.tpu
        p = torch.randn(1024, 1024, device="tpu")
        ref = p.cpu()
        t.set_per_process_memory_fraction(22 * 2**20 / t.mem_get_info()[1])  # p and big fit, not a temporary
        try:
            big = torch.arange(4096 * 1024.0, device="tpu").view(4096, 1024)  # made, not a lazy fill
            big.sum().item()
            p.add_(big[:1024] * 2)
            p.sum().item()
            raise SystemExit("no OOM")
        except torch.OutOfMemoryError as e:
            assert should_reduce_batch_size(e), e
        del big
        gc.collect()
        t.set_per_process_memory_fraction(1.0)
        assert torch.equal(p.cpu(), ref)
        p.add_(1)
        assert torch.equal(p.cpu(), ref + 1)
        print("ok")
    """), env=env, timeout=180)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_deprecated_and_introspection_names_of_torch_cuda():
    # Names older or library code calls on torch.cuda, answered as torch.cuda does.
    import warnings
    x = torch.ones(1024, device="tpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.tpu.memory_cached() == torch.tpu.memory_reserved() >= x.nbytes
        assert torch.tpu.max_memory_cached() == torch.tpu.max_memory_reserved()
        torch.tpu.reset_max_memory_cached()
    assert [w.category for w in caught] == [FutureWarning] * 3
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()  # the peak was reset
    nested = torch.tpu.memory_stats_as_nested_dict()
    flat = torch.tpu.memory_stats()
    assert nested["allocated_bytes"]["all"]["current"] == flat["allocated_bytes.all.current"]
    assert nested["bytes_limit"] == flat["bytes_limit"]
    assert torch.tpu.get_allocator_backend() == "native"
    assert torch.tpu.is_current_stream_capturing() is False
    del x


def test_nvtx_ranges_are_profiler_ranges():
    from torch.profiler import profile
    nvtx = torch.tpu.nvtx
    with profile() as prof:
        with nvtx.range("step {}", 7):
            assert nvtx.range_push("forward") == 1
            (torch.ones(4, device="tpu") + 1).sum().item()
            assert nvtx.range_pop() == 1
        rid = nvtx.range_start("across")
        nvtx.range_end(rid)
        nvtx.mark("instant")
    assert nvtx.range_pop() == -1  # nothing open
    names = {e.name for e in prof.events()}
    assert {"step 7", "forward", "across", "instant"} <= names, names
    by_name = {e.name: e for e in prof.events()}
    assert by_name["step 7"].time_range.start <= by_name["forward"].time_range.start
    assert by_name["forward"].time_range.end <= by_name["step 7"].time_range.end


def test_legacy_tensor_types_as_torch_cuda_has_them():
    T = torch.tpu.FloatTensor
    t = T(2, 3)
    assert t.device.type == "tpu" and t.dtype == torch.float32 and t.shape == (2, 3)
    assert T().shape == torch.FloatTensor().shape == (0,)
    assert T(torch.Size([4])).shape == (4,)
    assert T([1, 2]).cpu().tolist() == [1.0, 2.0]
    assert isinstance(t, T) and not isinstance(t, torch.tpu.LongTensor)
    assert not isinstance(torch.ones(1), T)  # a CPU tensor is no tpu type
    x = torch.tensor([1.5, -2.5])
    y = x.type(torch.tpu.LongTensor)
    assert isinstance(y, torch.tpu.LongTensor) and y.cpu().tolist() == [1, -2]
    assert x.type(torch.DoubleTensor).dtype == torch.float64  # CPU types as before
    assert y.type() == "torch.tpu.LongTensor"
    assert torch.tpu.ByteTensor([1, 2]).fill_(3).cpu().tolist() == [3, 3]
    assert torch.tpu.BFloat16Tensor(3).dtype == torch.bfloat16


def test_torch_cuda_submodules_and_queries():
    import importlib
    for sub in ("random", "streams", "nvtx", "graphs", "amp", "memory"):
        assert importlib.import_module(f"torch.tpu.{sub}") is getattr(torch.tpu, sub)
    torch.tpu.random.manual_seed(3)
    a = torch.randn(3, device="tpu").cpu()
    torch.tpu.manual_seed(3)
    assert torch.equal(a, torch.randn(3, device="tpu").cpu())
    assert torch.tpu.streams.Stream is torch.tpu.Stream and torch.tpu.streams.Event is torch.tpu.Event
    assert torch.tpu.is_tf32_supported() is False and torch.tpu.has_half is True
    assert torch.tpu.can_device_access_peer(0, torch.tpu.device_count() - 1) is True
    with pytest.raises(RuntimeError, match="does not exist"):
        torch.tpu.can_device_access_peer(0, torch.tpu.device_count())
