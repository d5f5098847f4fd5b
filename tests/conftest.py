import contextlib
import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch

import torch_tpu

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Hermetic runs: a fresh persistent compile cache per session (subprocesses share it),
# unless one is set (`make test` makes one for all its phases).
os.environ.setdefault("TPU_COMPILE_CACHE_DIR", tempfile.mkdtemp(prefix="torch_tpu_compile_cache_"))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _fresh_shape_churn_history():
    """Each test starts with no fused-graph variants seen, as a fresh process: another
    test's model of the same architecture (at other sizes) would count as shape churn."""
    torch_tpu._C._forget_shape_churn()
    yield


def all_fallbacks() -> dict:
    """CPU fallbacks per op so far: the C++ fallback's and decomposition kernels' host trips."""
    from torch_tpu import _decompositions
    fb = dict(torch_tpu.metrics()["fallbacks"])
    for k, n in _decompositions.fallbacks.items():
        fb[k] = fb.get(k, 0) + n
    return fb


@contextlib.contextmanager
def no_fallbacks():
    """Asserts the block ran every op natively (no fallback of either kind)."""
    before = all_fallbacks()
    yield
    grown = {k: v - before.get(k, 0) for k, v in all_fallbacks().items() if v != before.get(k, 0)}
    assert not grown, f"ops fell back to the CPU: {grown}"


native = no_fallbacks


def assert_draws_follow_the_tpu_generator(draw_once):
    """draw_once(generator or None) draws with a random op: the tpu seed and rng state,
    and a tpu Generator's seed, reproduce its values, and each call draws anew."""
    torch.tpu.manual_seed(7)
    a, b = draw_once(None).cpu(), draw_once(None).cpu()
    torch.tpu.manual_seed(7)
    assert torch.equal(draw_once(None).cpu(), a)   # seeded: the same values
    assert not torch.equal(a, b)                   # and each call draws anew
    state = torch.tpu.get_rng_state()
    c = draw_once(None).cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(draw_once(None).cpu(), c)
    g = torch.Generator(device="tpu")
    g.manual_seed(11)
    d = draw_once(g).cpu()
    g.manual_seed(11)
    assert torch.equal(draw_once(g).cpu(), d)
    assert not torch.equal(draw_once(g).cpu(), d)


def run_python(code: str, env=None, timeout=300):
    """Runs `code` in a fresh interpreter; returns the CompletedProcess."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=e, timeout=timeout, cwd=ROOT)


def run_python_json(code: str, env=None, timeout=300):
    """Runs `code` in a fresh interpreter, which must succeed; returns the JSON value its
    last line of output prints."""
    r = run_python(code, env, timeout)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def dev(v):
    """Tensors (also inside lists/tuples) copied to tpu."""
    if isinstance(v, torch.Tensor):
        return v.to("tpu")
    if isinstance(v, (list, tuple)):
        return type(v)(dev(x) for x in v)
    return v


def host(v):
    """Tensors (also inside lists/tuples) copied back to the CPU."""
    if isinstance(v, torch.Tensor):
        return v.cpu()
    if isinstance(v, (list, tuple)):
        return type(v)(host(x) for x in v)
    return v


def check(fn, *args, **kw):
    """fn on CPU args vs fn on tpu copies: same dtype and shape, close values (NaN == NaN)."""
    opts = dict(equal_nan=True)
    opts.update(kw)
    want = fn(*args)
    got = host(fn(*dev(args)))
    if isinstance(want, tuple):  # named tuples (max.dim, sort, ...) compare as plain tuples
        want, got = tuple(want), tuple(got)
    torch.testing.assert_close(got, want, **opts)
    return got


@pytest.fixture
def tpu():
    return torch.device("tpu")


def run_in_spawned(target, args=(), send=None, timeout=120):
    """Runs `target(*args, q_out)` in a spawned process, or `target(q_in, q_out)` when
    `send` is given (then put on q_in); returns (its exit code, what it put on q_out).
    The child is killed if it outlives the wait."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q_out = ctx.Queue()
    q_in = ctx.Queue() if send is not None else None
    proc = ctx.Process(target=target, args=(q_in, q_out) if q_in is not None else (*args, q_out))
    proc.start()
    try:
        if q_in is not None:
            q_in.put(send)
        got = q_out.get(timeout=timeout)
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
    return proc.exitcode, got
