"""Spawned worker processes for the tools that run many independent jobs (the conformance
tool's op entries, the compatibility pipeline's models): each job runs under a deadline in
a worker, so a crash or a hang costs one job, not the run. A job's deadline counts its own work:
XLA compiles, which a cold cache adds, move it on, so a cold run and a warm one reach the same
verdicts. Each worker's runtime keeps its compile time, a compile in flight included, in a
file the pool reads (TPU_COMPILE_CLOCK_FILE, csrc/runtime/compile_clock.h): a job is not
killed in the middle of a long compile. Time a job reports with `extend_deadline` counts
as well."""
import collections
import importlib
import os
import shutil
import struct
import tempfile
import time
import traceback


_conn = None  # this worker's pipe to the pool, while it runs a job


def extend_deadline(seconds: float, allowance: float = 0.0):
    """Tells the pool that `seconds` of the running job so far were not the job's own
    work (compiling), and that its progress earned `allowance` more: its deadline becomes
    its start + timeout + seconds + allowance (only `seconds` is recorded as compiling).
    Only a job that keeps reporting gets more time, so a hang is still caught. No-op
    outside a worker."""
    if _conn is not None:
        _conn.send(("extend", float(seconds), float(allowance)))


def report_progress(value):
    """Tells the pool how far the running job got (any picklable value): when the job then
    times out or its worker dies, `Pool.progress[key]` holds the last value, so the caller
    keeps the job's finished parts. No-op outside a worker."""
    if _conn is not None:
        _conn.send(("progress", value))


def first_line(e: BaseException) -> str:
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def compile_seconds_in(path: str) -> float:
    """A worker's compile seconds so far, its compiles in flight counted to now (0 before
    its first compile)."""
    try:
        with open(path, "rb") as f:
            data = f.read(24)
    except OSError:
        return 0.0
    if len(data) < 24:
        return 0.0
    done_us, in_flight, start_sum_us = struct.unpack("<qqq", data)
    now_us = int(time.monotonic() * 1e6)  # CLOCK_MONOTONIC, the runtime's clock
    return max(0.0, (done_us + in_flight * now_us - start_sum_us) / 1e6)


def _worker(conn, target, args, log_path, max_jobs, clock_path=None):
    global _conn
    if clock_path:
        os.environ["TPU_COMPILE_CLOCK_FILE"] = clock_path  # before the runtime starts
    # The plugin and the ops write to fd 2; keep it in a log, not in the progress lines.
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    module = importlib.import_module(target[0])
    fn = getattr(module, target[1])
    if hasattr(module, "worker_setup"):
        module.worker_setup()
    conn.send(("ready",))
    for _ in range(max_jobs):
        try:
            key = conn.recv()
        except EOFError:  # the pool closed: exit cleanly (Pool.close)
            return
        _conn = conn
        try:
            res, msg = fn(key, *args), ""
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res, msg = None, f"tool: {first_line(e)}"
        _conn = None
        conn.send(("done", key, res, msg))
    conn.send(("bye",))


class Pool:
    """`jobs` spawned workers, each running `module.fn(key, *args)` for one key at a time
    (after `module.worker_setup()` once, if the module has it) under a deadline; a worker
    that hangs is killed and replaced, one that dies is replaced, and each retires after
    `max_jobs` keys so memory stays bounded."""

    def __init__(self, jobs, target, args, log_path, max_jobs=150):
        import multiprocessing as mp
        self.ctx, self.args = mp.get_context("spawn"), (target, args, log_path, max_jobs)
        self.clocks = tempfile.mkdtemp(prefix="tpu_worker_clocks_")
        self.started = 0
        # conn -> [process, key or None, deadline, ready, start, reported, clock file,
        #          its compile seconds at the job's start]
        self.workers = {}
        # key -> (wall seconds, seconds it reported with extend_deadline) of each finished job
        self.job_seconds = {}
        # key -> the last value its job sent with report_progress
        self.progress = {}
        for _ in range(jobs):
            self.start()

    def start(self):
        parent, child = self.ctx.Pipe()
        self.started += 1
        clock = os.path.join(self.clocks, f"worker{self.started}")
        p = self.ctx.Process(target=_worker, args=(child, *self.args, clock), daemon=True)
        p.start()
        child.close()
        self.workers[parent] = [p, None, None, False, None, 0.0, clock, 0.0]

    def compile_seconds(self, w) -> float:
        """Compile seconds of w's running job: its runtime's clock, or what it reported."""
        return max(w[5], compile_seconds_in(w[6]) - w[7])

    def stop(self, conn):
        p = self.workers.pop(conn)[0]
        p.kill()
        p.join()
        conn.close()

    def map(self, keys, timeout):
        """Yields (key, result or None, message) as jobs finish."""
        from multiprocessing.connection import wait
        todo, failures = collections.deque(keys), 0
        while todo or any(w[1] for w in self.workers.values()):
            for conn, w in self.workers.items():
                if w[3] is True and w[1] is None and todo:
                    w[1], w[4], w[5] = todo.popleft(), time.monotonic(), 0.0
                    w[2], w[7] = w[4] + timeout, compile_seconds_in(w[6])
                    try:
                        conn.send(w[1])
                    except OSError:  # it retired or died since its last result
                        todo.appendleft(w[1])
                        w[1], w[3] = None, "gone"  # replaced when its pipe reads EOF
            deadlines = [w[2] for w in self.workers.values() if w[1]]
            wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else 60.0
            for conn in wait(list(self.workers), timeout=wait_s):
                w = self.workers[conn]
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    key = w[1]
                    self.stop(conn)
                    self.start()
                    if key:
                        self.job_seconds[key] = (time.monotonic() - w[4], self.compile_seconds(w))
                        yield key, None, f"worker died (exit {w[0].exitcode})"
                    elif not w[3] and (failures := failures + 1) > 3:
                        raise RuntimeError("workers fail to start; see the log")
                    continue
                if msg[0] == "ready":
                    w[3] = True
                elif msg[0] == "extend":
                    if w[1]:
                        w[2], w[5] = w[4] + timeout + msg[1] + (msg[2] if len(msg) > 2 else 0.0), msg[1]
                elif msg[0] == "progress":
                    if w[1]:
                        self.progress[w[1]] = msg[1]
                elif msg[0] == "done":
                    w[1] = None
                    self.job_seconds[msg[1]] = (time.monotonic() - w[4], self.compile_seconds(w))
                    yield msg[1], msg[2], msg[3]
                elif msg[0] == "bye":  # the worker retires
                    if w[1]:
                        todo.appendleft(w[1])  # sent after its last job: not run
                    self.stop(conn)
                    self.start()
            now = time.monotonic()
            for conn, w in list(self.workers.items()):
                if w[1] and now > w[2]:
                    w[2] = max(w[2], w[4] + timeout + self.compile_seconds(w))
                if w[1] and now > w[2]:
                    key = w[1]
                    self.job_seconds[key] = (now - w[4], self.compile_seconds(w))
                    self.stop(conn)
                    self.start()
                    yield key, None, "timeout"

    def close(self):
        # An idle worker exits by itself when its pipe closes; a killed one leaves what it
        # registered with multiprocessing's resource tracker (a "leaked semaphore" at exit).
        idle = [conn for conn, w in self.workers.items() if w[3] is True and w[1] is None]
        for conn in idle:
            conn.close()
        for conn in idle:
            self.workers[conn][0].join(5)
        for conn in list(self.workers):
            self.stop(conn)
        shutil.rmtree(self.clocks, ignore_errors=True)
