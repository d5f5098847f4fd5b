"""A recurrence written into slices of a buffer, recorded in DeferAndFuse, compiles in
time linear in its length.

A GAE loop (`last = delta[t] + g*lam*nonterminal[t]*last; adv[t] = last`) became one fused
program in which XLA copied the cheap recurrence into each of the T slice writes' fusions:
the optimized program grew with T² (T=32: 21,777 instructions, against 1,624 at T=8) and
its compile with it (T=64: 60 s; T=128 did not finish in 400 s). Each written update that
the recurrence goes on from is now kept whole (Builder::materialized), so the program
grows with T. The measure is the size of XLA's optimized program (no timing)."""
import glob
import os
import shutil
import tempfile

import pytest
import torch

from conftest import run_python_json

# The loops, as `run(kind, T, device)`; the probe also imports them for the values.
LOOPS = r'''
import torch

def run(kind, T, dev):
    g = torch.Generator().manual_seed(0)
    rew, val = torch.randn(T, 8, generator=g).to(dev), torch.randn(T, 8, generator=g).to(dev)
    done = (torch.rand(T, 8, generator=g) < 0.1).float().to(dev)
    nextv = torch.randn(8, generator=g).to(dev)
    if kind == "gae":  # PPO's advantages, written backwards into rows
        adv = torch.zeros(T, 8, device=dev)
        last = torch.zeros(8, device=dev)
        for i in reversed(range(T)):
            nv = nextv if i == T - 1 else val[i + 1]
            nonterm = 1.0 - done[i]
            delta = rew[i] + 0.99 * nv * nonterm - val[i]
            last = delta + 0.99 * 0.95 * nonterm * last
            adv[i] = last
        return adv
    if kind == "column":  # a state written into columns (a strided view)
        out = torch.zeros(8, T, device=dev)
        h = torch.zeros(8, device=dev)
        for t in range(T):
            h = 0.9 * h + rew[t] * done[t]
            out[:, t] = h
        return out
    if kind == "index_copy":
        out = torch.zeros(T, 8, device=dev)
        h = torch.zeros(8, device=dev)
        for t in range(T):
            h = 0.9 * h - rew[t]
            out.index_copy_(0, torch.tensor([t], device=dev), h[None])
        return out
    if kind == "scale":  # one operand per step (XLA copies such ops most freely)
        out = torch.zeros(T, 8, device=dev)
        h = rew[0]
        for t in range(T):
            h = h * 0.5
            out[t] = h
        return out
    raise ValueError(kind)
'''

PROBE = LOOPS + r'''
import glob, json, os, sys, torch_tpu
torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)
got = run(KIND, STEPS, "tpu").cpu()
want = run(KIND, STEPS, "cpu")
sizes = [sum(" = " in line for line in open(f))
         for f in glob.glob(os.path.join(os.environ["DUMP"], "*torch_tpu_fused*after_optimizations.txt"))]
m = torch_tpu.metrics()
print(json.dumps({"diff": (got - want).abs().max().item(), "largest": max(sizes, default=0),
                  "materialized": m.get("materialized_values", 0)}))
'''


def _probe(kind, steps):
    dump = tempfile.mkdtemp(prefix="tpu_recurrence_dump_")
    try:
        return run_python_json(PROBE.replace("KIND", repr(kind)).replace("STEPS", str(steps)),
                               env={"XLA_FLAGS": f"--xla_dump_to={dump}", "DUMP": dump,
                                    "TPU_COMPILE_CACHE": "0"})
    finally:
        shutil.rmtree(dump, ignore_errors=True)


@pytest.mark.parametrize("kind", ["gae", "column", "index_copy", "scale"])
def test_optimized_program_grows_linearly_with_the_recurrence(kind):
    short, long = _probe(kind, 8), _probe(kind, 32)
    assert short["diff"] < 1e-5 and long["diff"] < 1e-5
    assert short["largest"] > 0
    # 4x the steps: at most 5x the instructions (main: 9x to 13x, growing with T).
    assert long["largest"] <= 5 * short["largest"], (short, long)
    assert long["materialized"] >= 31


def _loops():
    scope = {}
    exec(LOOPS, scope)
    return scope["run"]


@pytest.mark.parametrize("mode", ["DEFER_AND_FUSE", "DEFER_NEVER"])
@pytest.mark.parametrize("kind", ["gae", "column", "index_copy", "scale"])
def test_recurrence_writes_match_cpu(tpu, mode, kind):
    import torch_tpu

    run = _loops()
    old = torch_tpu.get_eager_mode()
    torch_tpu.set_eager_mode(getattr(torch_tpu.EagerMode, mode))
    try:
        got = run(kind, 24, "tpu").cpu()
    finally:
        torch_tpu.set_eager_mode(old)
    torch.testing.assert_close(got, run(kind, 24, "cpu"), rtol=1e-5, atol=1e-5)


def test_kept_values_keep_every_bit():
    """The kept value is the written one bit for bit: NaN, infinities and -0.0 (floats),
    integers and bools, as Strict's programs (which keep nothing) write them. (Strict, not
    CPU: CPU's bfloat16 negation leaves a NaN's sign bit.)"""
    code = r'''
import json, torch, torch_tpu
out = {}
for dtype in ["float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8", "bool"]:
    dt = getattr(torch, dtype)
    def loop(dev):
        if dt is torch.bool:
            h = torch.tensor([True, False, True, False], device=dev)
        elif dt.is_floating_point:
            h = torch.tensor([float("nan"), float("inf"), -0.0, 1.5], dtype=dt, device=dev)
        else:
            h = torch.tensor([1, 2, 3, 250], dtype=dt, device=dev)
        buf = torch.zeros(6, 4, dtype=dt, device=dev)
        for t in range(6):
            h = (h ^ (t % 2 == 0)) if dt is torch.bool else (-h if dt.is_floating_point else h + 1)
            buf[t] = h
        return buf
    torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)
    got = loop("tpu").cpu()
    torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_NEVER)
    want = loop("tpu").cpu()
    same = got.view(torch.uint8).equal(want.view(torch.uint8)) if dt is not torch.bool else got.equal(want)
    out[dtype] = same
out["materialized"] = torch_tpu.metrics().get("materialized_values", 0)
print(json.dumps(out))
'''
    r = run_python_json(code, env={"TPU_COMPILE_CACHE": "0"})
    assert r.pop("materialized") > 0
    assert all(r.values()), r
