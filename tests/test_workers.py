"""The tools' worker pool: a worker that exits between two jobs costs no job and no run."""
import time

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
    return key


def test_a_job_deadline_moves_past_the_time_it_reports_but_still_catches_a_hang(tmp_path):
    # 2 s of work against a 1.2 s timeout: the job that reports its 0.5 s steps as
    # compile time finishes; the same job without reports is killed at its deadline.
    pool = Pool(1, ("test_workers", "job_mostly_compiling"), (), str(tmp_path / "workers.log"))
    try:
        got = {key: msg for key, _, msg in pool.map(["reports", "silent"], timeout=1.2)}
    finally:
        pool.close()
    assert got == {"reports": "", "silent": "timeout"}
