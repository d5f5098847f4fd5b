import contextlib
import os
import subprocess
import sys

import pytest
import torch

import torch_tpu

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def no_fallbacks():
    """Asserts the block ran every op natively."""
    before = dict(torch_tpu.metrics()["fallbacks"])
    yield
    after = torch_tpu.metrics()["fallbacks"]
    grown = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert not grown, f"ops fell back to the CPU: {grown}"


def run_python(code: str, env=None, timeout=300):
    """Runs `code` in a fresh interpreter; returns the CompletedProcess."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=e, timeout=timeout, cwd=ROOT)


@pytest.fixture
def tpu():
    return torch.device("tpu")
