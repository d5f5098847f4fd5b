"""Runs a test script in a fresh process under one eager mode: the memory and OOM tests
set a per-process limit, so each case gets its own process."""
import os
import subprocess
import sys

MODES = ["strict", "debug", "defer_and_fuse"]

# The start of a script that sets a device-memory limit.
LIMIT_PRELUDE = """
import torch, torch_tpu
T = torch.tpu
d = "tpu"
MB = 1 << 20

def set_limit(nbytes):
    T.set_per_process_memory_fraction(nbytes / T.get_device_properties(0).total_memory)
"""

# Mode switches a parent's environment may carry; each script sets its own.
_MODE_VARS = ("TPU_LAUNCH_BLOCKING", "TPU_DEFER_AND_FUSE", "TPU_MEMORY_LIMIT")


def run_in_mode(script, mode, extra_env=None):
    """Runs `script` (which must end by printing 'done') in `mode`; returns its stdout.
    OOM_TEST_MODE names the mode inside the script; `extra_env` sets variables (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k not in _MODE_VARS}
    env["OOM_TEST_MODE"] = mode
    if mode == "debug":
        env["TPU_LAUNCH_BLOCKING"] = "1"
    elif mode == "defer_and_fuse":
        env["TPU_DEFER_AND_FUSE"] = "1"
    for k, v in (extra_env or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "done" in p.stdout, p.stdout + p.stderr
    return p.stdout
