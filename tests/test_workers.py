"""The tools' worker pool: a worker that exits between two jobs costs no job and no run."""
import time

import pytest

from torch_tpu._workers import Pool


def test_a_worker_gone_before_its_next_job_is_replaced(tmp_path):
    # max_jobs=1: each worker retires right after its result; the pause at each result
    # lets it exit before the pool hands it the next key, so every send after the first
    # meets a closed pipe.
    pool = Pool(1, ("builtins", "len"), (), str(tmp_path / "workers.log"), max_jobs=1)
    try:
        got = {}
        for key, res, msg in pool.map(["a", "bb", "ccc", "dddd"], timeout=60):
            got[key] = (res, msg)
            time.sleep(0.5)
    finally:
        pool.close()
    assert got == {"a": (1, ""), "bb": (2, ""), "ccc": (3, ""), "dddd": (4, "")}


def job_mostly_compiling(key):
    """Four steps of 0.5 s, each reported as compile time, as a cold-cache entry would."""
    from torch_tpu import _workers
    for step in range(1, 5):
        time.sleep(0.5)
        if key == "reports":
            _workers.extend_deadline(0.5 * step)
        elif key == "progress":  # no compiles, but progress earns time (conformance's samples)
            _workers.extend_deadline(0.0, 0.5 * step)
    return key


def test_a_job_deadline_moves_past_the_time_it_reports_but_still_catches_a_hang(tmp_path):
    # 2 s of work against a 1.2 s timeout: the job that reports its 0.5 s steps as
    # compile time finishes; the same job without reports is killed at its deadline.
    pool = Pool(1, ("test_workers", "job_mostly_compiling"), (), str(tmp_path / "workers.log"))
    try:
        got = {key: msg for key, _, msg in pool.map(["reports", "silent", "progress"], timeout=1.2)}
        seconds = dict(pool.job_seconds)
    finally:
        pool.close()
    assert got == {"reports": "", "silent": "timeout", "progress": ""}
    # The allowance moves the deadline but is not compile time.
    assert seconds["reports"][1] == pytest.approx(2.0) and seconds["progress"][1] == 0.0


def job_in_one_long_compile(key):
    """A compile in flight for 2 s, as the runtime writes it to its clock file (one blocking
    call: nothing reported until it returns), then `key` seconds more of the job's own."""
    import os
    import struct
    path = os.environ["TPU_COMPILE_CLOCK_FILE"]
    done = struct.unpack("<qqq", open(path, "rb").read())[0] if os.path.exists(path) else 0
    start = int(time.monotonic() * 1e6)
    with open(path, "wb") as f:
        f.write(struct.pack("<qqq", done, 1, start))
    time.sleep(2.0)
    with open(path, "wb") as f:
        f.write(struct.pack("<qqq", done + int(time.monotonic() * 1e6) - start, 0, 0))
    time.sleep(float(key))
    return key


def test_a_compile_in_flight_moves_the_deadline_and_is_timed(tmp_path):
    # A 1.2 s timeout: 2 s in one compile and 0.1 s of its own pass; 2 s of its own after
    # the compile do not.
    pool = Pool(1, ("test_workers", "job_in_one_long_compile"), (), str(tmp_path / "workers.log"))
    try:
        got = {key: msg for key, _, msg in pool.map(["0.1", "2.0"], timeout=1.2)}
        seconds = dict(pool.job_seconds)
    finally:
        pool.close()
    assert got == {"0.1": "", "2.0": "timeout"}
    wall, compiling = seconds["0.1"]
    assert 1.9 < compiling < 2.5 and wall >= compiling
    assert seconds["2.0"][1] > 1.9


def test_the_runtime_writes_its_compile_clock(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from torch_tpu._workers import compile_seconds_in
    clock = tmp_path / "clock"
    code = ("import json, torch, torch_tpu\n"
            "(torch.arange(7.0, device='tpu') * 3 + 1).cpu()\n"
            "print(json.dumps(torch_tpu.metrics()['compile_seconds']))\n")
    env = dict(os.environ, TPU_COMPILE_CLOCK_FILE=str(clock), TPU_COMPILE_CACHE="0")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    reported = json.loads(r.stdout.strip().splitlines()[-1])
    import struct
    done_us, in_flight, start_sum = struct.unpack("<qqq", clock.read_bytes())
    assert in_flight == 0 and start_sum == 0  # every compile finished
    assert reported > 0 and abs(compile_seconds_in(str(clock)) - reported) < 0.05 + 0.1 * reported


def job_reporting_then_hanging(key):
    from torch_tpu import _workers
    _workers.report_progress(("first part done", key))
    time.sleep(60)


def test_a_timed_out_job_leaves_its_last_progress(tmp_path):
    # The compatibility pipeline keeps the modes a model finished before its timeout.
    pool = Pool(1, ("test_workers", "job_reporting_then_hanging"), (), str(tmp_path / "workers.log"))
    try:
        got = {key: msg for key, _, msg in pool.map(["k"], timeout=1.0)}
    finally:
        pool.close()
    assert got == {"k": "timeout"} and pool.progress == {"k": ("first part done", "k")}
