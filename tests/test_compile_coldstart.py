"""A compiled training step's cold start: what it compiles, what it imports, what a
second process reuses. Each run is a fresh interpreter (imports and Dynamo's state are
per process) on a compile cache of its own."""
import pytest

from conftest import run_python_json

# The small GPT, forward and AdamW compiled with backend="tpu", eager parts in `MODE`;
# per step: graph programs compiled, executions. Also: which of Inductor's modules got
# imported, and how often Dynamo's guard-latency measurement ran for tpu frames and for a
# CPU frame compiled with the "eager" backend afterwards.
PROGRAM = (
    "import json, os, sys, torch, torch_tpu\n"
    "sys.path.insert(0, os.path.join(os.environ['ROOT'], 'examples'))\n"
    "from gpt import GPT, batches\n"
    "import torch._dynamo.guards as guards\n"
    "profiled = []\n"
    "measure = guards.profile_guard_manager\n"
    "def counting(*a):\n"
    "    profiled.append(1)\n"
    "    return measure(*a)\n"
    "guards.profile_guard_manager = counting  # before the first torch.compile, as Dynamo's own\n"
    "torch.manual_seed(0)\n"
    "mode = getattr(torch_tpu.EagerMode, os.environ['MODE'])\n"
    "steps = []\n"
    "with torch_tpu.set_eager_mode(mode):\n"
    "    model = GPT().to('tpu')\n"
    "    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)\n"
    "    loss_of = torch.compile(lambda x, y: model(x, y)[1], backend='tpu')\n"
    "    update = torch.compile(lambda: opt.step(), backend='tpu')\n"
    "    for x, y in batches(64, 32, 4, 4):\n"
    "        x, y = x.to('tpu'), y.to('tpu')\n"
    "        before = torch_tpu.metrics()\n"
    "        loss = loss_of(x, y)\n"
    "        opt.zero_grad(); loss.backward(); update()\n"
    "        v = loss.item(); torch_tpu.synchronize()\n"
    "        m = torch_tpu.metrics()\n"
    "        steps.append({'loss': v, 'flushes': {r: n - before['flushes'].get(r, 0) for r, n in m['flushes'].items()\n"
    "                                             if n > before['flushes'].get(r, 0)},\n"
    "                      **{k: m[k] - before[k] for k in ('graph_compiles', 'executions', 'compiled_replays')}})\n"
    "m = torch_tpu.metrics()\n"
    "tpu_profiled = len(profiled)\n"
    "torch.compile(lambda a: a * 2 + 1, backend='eager')(torch.ones(3))\n"
    "print(json.dumps({'steps': steps, 'compiles': m['compiles'], 'hits': m.get('disk_cache_hits', 0),\n"
    "                  'cudagraph_trees': 'torch._inductor.cudagraph_trees' in sys.modules,\n"
    "                  'select_algorithm': 'torch._inductor.select_algorithm' in sys.modules,\n"
    "                  'tpu_profiled': tpu_profiled, 'cpu_profiled': len(profiled) - tpu_profiled}))\n"
)


def run(cache, mode):
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return run_python_json(PROGRAM, env={"TPU_COMPILE_CACHE_DIR": str(cache), "MODE": mode, "ROOT": root},
                           timeout=600)


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_cold_compiled_step_then_a_second_process_compiles_nothing(tmp_path, mode):
    cold = run(tmp_path, mode)
    steps = [s["graph_compiles"] for s in cold["steps"]]
    # Step 1: the forward, the backward and the update are each recorded apart (three
    # flushes, explained, not run) and replayed into one pending graph: the steady step's
    # one joined program, compiled at step 1, which later steps only run. In Strict the
    # update's fresh state gets its zeros first (a small program) where it was never
    # written. In DeferAndFuse the eager work pending before the update (the optimizer's
    # state, made while Dynamo traces the step) joins step 1's program, so the steady
    # program (without it) compiles at step 2 (before: 5 programs at step 1, 1 at step 2).
    first = cold["steps"][0]
    assert first["flushes"].get("compiled graph") == 3, first
    made = first["flushes"].get("before compiled graph", 0) + first["flushes"].get("zeros and queued copies of compiled graph inputs", 0)
    assert steps == ([1 + made, 0, 0, 0] if mode == "DEFER_NEVER" else [1, 1, 0, 0]), cold["steps"]
    assert all(s["executions"] == 1 and s["compiled_replays"] == 3 for s in cold["steps"][1:]), cold["steps"]
    assert cold["hits"] == 0
    warm = run(tmp_path, mode)
    assert warm["compiles"] == 0 and warm["hits"] >= sum(steps), warm
    assert [s["loss"] for s in warm["steps"]] == [s["loss"] for s in cold["steps"]]
    assert all(s["executions"] == 1 for s in warm["steps"][1:]), warm["steps"]
    # Nothing of Inductor's CUDA graph machinery is imported for a tpu optimizer step,
    # and tpu frames skip Dynamo's guard-latency measurement; the CPU frame keeps it.
    for r in (cold, warm):
        assert not r["cudagraph_trees"] and not r["select_algorithm"], r
        assert r["tpu_profiled"] == 0 and r["cpu_profiled"] >= 1, r
