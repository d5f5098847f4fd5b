"""torch.profiler on tpu: positive, sane times for tpu ops, key_averages, traces, and no
"PrivateUse1 used in profiler but not enabled" (each profile runs in a fresh process,
since PyTorch reports profiler callback failures only on stderr)."""
import json
import textwrap

import pytest

from conftest import run_python

BAD = ("not enabled", "INTERNAL ASSERT", "Exception in RecordFunction callback")


def _run(body, env=None):
    code = textwrap.dedent("""
        import json, torch, torch_tpu
        from torch.profiler import ProfilerActivity, profile, record_function
        x = torch.randn(128, 128, device="tpu")
        w = torch.randn(128, 128, device="tpu")
        (x @ w).relu().sum().item()  # compiled before profiling
    """) + textwrap.dedent(body)
    r = run_python(code, env=env, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    for bad in BAD:
        assert bad not in r.stderr, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _averages_body(profile_call):
    return f"""
        import time
        start = time.perf_counter()
        with {profile_call} as prof:
            with record_function("my_block"):
                for _ in range(4):
                    y = (x @ w).relu()
            y.sum().item()
        wall_us = (time.perf_counter() - start) * 1e6
        # Each op call as recorded, before PyTorch nests events by their timestamps (a child
        # whose parent has its name and no other child is merged into it).
        raw = [e.name() for e in getattr(prof, "profiler", prof).kineto_results.events()]
        out = {{"wall": dict(count=0, cpu=wall_us, self_cpu=0, dev=0, self_dev=0),
                "raw": {{n: raw.count(n) for n in set(raw)}}}}
        for e in prof.key_averages():  # an op's calls with and without device time: two rows
            row = out.setdefault(e.key, dict(count=0, cpu=0, self_cpu=0, dev=0, self_dev=0))
            for k, v in dict(count=e.count, cpu=e.cpu_time_total, self_cpu=e.self_cpu_time_total,
                             dev=e.device_time_total, self_dev=e.self_device_time_total).items():
                row[k] += v
        print(json.dumps(out))
    """


@pytest.mark.parametrize("mode", ["", "1"])
def test_kineto_profile_with_privateuse1_gives_positive_host_times(mode):
    env = {"TPU_DEFER_AND_FUSE": "1"} if mode else {}
    out = _run(_averages_body("profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])"), env)
    for op in ("aten::mm", "aten::relu", "my_block"):
        assert op in out, sorted(out)
    assert out["aten::mm"]["count"] == 4 and out["aten::relu"]["count"] == 4
    assert out["my_block"]["count"] == 1
    for op in ("aten::mm", "aten::relu", "aten::matmul", "my_block"):
        assert 0 < out[op]["cpu"] < 60e6, (op, out[op])  # µs: positive, under a minute
        assert out[op]["self_cpu"] >= 0
    assert out["my_block"]["cpu"] >= out["aten::matmul"]["cpu"]  # the block contains its ops
    if not mode:  # Strict: each program's device time, attributed to the op that launched it
        mm, relu = out["aten::mm"]["self_dev"], out["aten::relu"]["self_dev"]
        assert mm > 0 and relu > 0, (out["aten::mm"], out["aten::relu"])
        # One in-order queue: the programs' intervals do not overlap, and all ran in the window.
        assert mm + relu <= out["wall"]["cpu"], (mm, relu, out["wall"])


def test_event_based_profile_gives_device_times_per_op():
    out = _run(_averages_body('torch.autograd.profiler.profile(use_device="tpu", use_kineto=False)'))
    mm, relu, block = out["aten::mm"], out["aten::relu"], out["my_block"]
    assert mm["count"] == 4 and relu["count"] == 4
    assert 0 < mm["self_dev"] < 60e6 and 0 < relu["self_dev"] < 60e6, (mm, relu)
    # Events wait for the device in Strict mode: a block's device time covers its ops'.
    assert block["dev"] >= mm["self_dev"] + relu["self_dev"] - 1, (block, mm, relu)


def test_event_based_profile_in_defer_and_fuse_runs_cleanly():
    out = _run(_averages_body('torch.autograd.profiler.profile(use_device="tpu", use_kineto=False)'),
               {"TPU_DEFER_AND_FUSE": "1"})
    assert out.pop("raw")["aten::mm"] == 4
    # A deferred op runs nothing: no device time (it had the host's recording time, and
    # calls under a microsecond, which PyTorch reads as none, were a separate row: count 1
    # in one CI run). The graph runs inside the read of the result.
    assert out["aten::mm"]["count"] == 4 and out["aten::relu"]["count"] == 4, out
    assert out["aten::mm"]["self_dev"] == 0 and out["aten::relu"]["self_dev"] == 0, out
    assert out["aten::item"]["dev"] > 0, out
    assert all(v["dev"] >= 0 and v["cpu"] >= 0 for v in out.values())


def test_training_step_profile_and_chrome_trace(tmp_path):
    trace = tmp_path / "trace.json"
    out = _run(f"""
        model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to("tpu")
        opt = torch.optim.AdamW(model.parameters())
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], record_shapes=True) as prof:
            for _ in range(2):
                loss = model(x).square().mean()
                opt.zero_grad(); loss.backward(); opt.step()
            loss.item()
        prof.export_chrome_trace({str(trace)!r})
        keys = {{}}
        for e in prof.key_averages(group_by_input_shape=True):  # one row per key and shapes
            keys[e.key] = keys.get(e.key, 0) + e.count
        print(json.dumps(keys))
    """)
    assert out.get("aten::addmm", 0) >= 4 and any("backward" in k.lower() for k in out), sorted(out)
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    names = {e.get("name") for e in events}
    assert "aten::addmm" in names
    assert all(e.get("dur", 0) >= 0 for e in events)


def test_a_cpu_only_profile_after_a_tpu_one_records_no_device_events():
    out = _run("""
        def device_events(activities):
            with profile(activities=activities) as prof:
                (x @ w).relu().sum().item()
            return sum(1 for e in prof.events() if e.device_type != torch.autograd.DeviceType.CPU)
        both = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
        print(json.dumps([device_events(both), device_events([ProfilerActivity.CPU]), device_events(both)]))
    """)
    assert out[0] > 0 and out[1] == 0 and out[2] > 0, out


def test_ops_whose_launch_waits_for_their_compile_keep_their_device_time():
    # Cold (no compile cache): Strict queues each launch behind its program's compile,
    # and another thread launches it; the device time is still the op's, backward too.
    out = _run("""
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to("tpu")
        h = torch.randn(32, 64, device="tpu")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            m(h).square().mean().backward()
            torch.tpu.synchronize()
        rows = {e.key: e.self_device_time_total for e in prof.key_averages()}
        print(json.dumps({k: rows.get(k, 0.0) for k in ("aten::addmm", "aten::gelu", "aten::mm",
                                                        "aten::gelu_backward")}))
    """, env={"TPU_COMPILE_CACHE": "0"})
    assert all(v > 0 for v in out.values()), out


def test_profile_memory_counts_tpu_storages_per_op():
    out = _run("""
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True) as prof:
            y = torch.empty(1024, 1024, device="tpu").fill_(1.0)
            z = y * 2
            del y
            z.sum().item()
        rows = {e.key: e.self_device_memory_usage for e in prof.key_averages()}
        print(json.dumps([rows["aten::empty"], rows["aten::mul"]]))
    """)
    assert out == [4 << 20, 4 << 20], out


def test_cuda_activity_from_gpu_code_profiles_the_tpu_device():
    # A GPU program's profiler call, unchanged: CUDA is not available, so its CUDA activity
    # records tpu device time and memory instead of host events only.
    out = _run("""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                         profile_memory=True) as prof:
                z = (x @ w).relu()
                z.sum().item()
        rows = {e.key: e for e in prof.key_averages()}
        with warnings.catch_warnings(record=True) as caught_legacy:
            warnings.simplefilter("always")
            with torch.autograd.profiler.profile(use_cuda=True, use_kineto=False) as legacy:
                (x @ w).relu().sum().item()
        legacy_mm = [e for e in legacy.key_averages() if e.key == "aten::mm"][0]
        print(json.dumps(dict(
            mm_dev=rows["aten::mm"].self_device_time_total,
            mm_mem=rows["aten::mm"].self_device_memory_usage,
            warned=[str(c.message) for c in caught],
            where=[c.filename for c in caught],
            legacy_mm_dev=legacy_mm.self_device_time_total,
            legacy_warned=[str(c.message) for c in caught_legacy])))
    """, env={"TPU_DEFER_AND_FUSE": "0"})  # Strict: device times are linked to their ops
    assert out["mm_dev"] > 0 and out["mm_mem"] == 128 * 128 * 4, out
    assert out["legacy_mm_dev"] > 0, out
    for warned in (out["warned"], out["legacy_warned"]):
        assert any("records the tpu device" in w for w in warned), warned
        assert not any("CUDA is not available, disabling" in w for w in warned), warned
    assert out["where"] == ["<string>"], out  # the warning points at the user's call
