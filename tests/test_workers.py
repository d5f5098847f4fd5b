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
