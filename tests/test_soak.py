"""Soak: 1,000 training steps of a small GPT in Strict and in DeferAndFuse. Device memory
stays flat after warm-up, the process's resident memory grows by under 5 %, and a
checkpoint saved mid-run and loaded in a new process continues with identical losses.

Each run is a fresh interpreter (this file run as a script), so resident memory
measures only the training loop."""
import json
import os
import sys

import pytest

STEPS = 1000
CHECKPOINT_AT = 500
WARMUP = 100  # steps before memory is sampled (compiles, optimizer state, caches)
SAMPLE_EVERY = 50


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _worker(mode, ckpt_path, resume, out_path):
    import torch

    import torch_tpu

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    from gpt import GPT, batches

    torch_tpu.set_eager_mode(getattr(torch_tpu.EagerMode, mode))
    data = list(batches(vocab=32, seq=16, batch=4, steps=STEPS, seed=1))
    torch.manual_seed(0)
    model = GPT(vocab=32, d_model=32, n_heads=2, n_layers=1, seq=16, dropout=0.1).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    first = 0
    if resume:
        ck = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        torch.set_rng_state(ck["cpu_rng"])
        torch.tpu.set_rng_state(ck["tpu_rng"])
        first = ck["step"]
        # Saving cut the fused graph at the checkpoint (torch.save needs the values); cut it
        # here too, so the loads are not fused into the first step's program: XLA may round
        # the same step differently inside a different program.
        torch_tpu.synchronize()
    losses, allocated, rss = {}, [], []
    for step in range(first, STEPS):
        if step == CHECKPOINT_AT and not resume:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                        "cpu_rng": torch.get_rng_state(), "tpu_rng": torch.tpu.get_rng_state()}, ckpt_path)
        x, y = data[step]
        _, loss = model(x.to("tpu"), y.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[step] = loss.item()
        if not resume and step >= WARMUP and (step + 1) % SAMPLE_EVERY == 0:
            allocated.append(torch.tpu.memory_allocated())
            rss.append(_rss_bytes())
    with open(out_path, "w") as f:
        json.dump({"losses": losses, "allocated": allocated, "rss": rss,
                   "fallbacks": torch_tpu.metrics()["fallbacks"]}, f)


def _run(mode, ckpt, resume, out):
    import subprocess

    env = dict(os.environ, TPU_FALLBACK="error")
    r = subprocess.run([sys.executable, os.path.abspath(__file__), mode, str(ckpt), str(int(resume)), str(out)],
                       capture_output=True, text=True, env=env, timeout=600,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out) as f:
        return json.load(f)


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_a_thousand_steps_stay_flat_and_resume_from_a_checkpoint_exactly(mode, tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    run = _run(mode, ckpt, False, tmp_path / "run.json")
    losses = {int(k): v for k, v in run["losses"].items()}
    assert len(losses) == STEPS
    assert not run["fallbacks"]
    early = sum(losses[s] for s in range(20)) / 20
    late = sum(losses[s] for s in range(STEPS - 20, STEPS)) / 20
    assert late < 0.5 * early, (early, late)  # it trained
    allocated = run["allocated"]
    assert max(allocated) == min(allocated), f"device memory grew after warm-up: {allocated}"
    rss = run["rss"]
    assert rss[-1] < rss[0] * 1.05, f"resident memory grew {100 * (rss[-1] / rss[0] - 1):.1f} %: {rss}"
    resumed = _run(mode, ckpt, True, tmp_path / "resumed.json")
    again = {int(k): v for k, v in resumed["losses"].items()}
    assert sorted(again) == list(range(CHECKPOINT_AT, STEPS))
    diff = [s for s in again if again[s] != losses[s]]
    assert not diff, f"resumed losses differ from step {diff[0]}: {again[diff[0]]} vs {losses[diff[0]]}"



@pytest.mark.parametrize("dtype", ["bool", "bfloat16", "float16", "complex64", "int8", "uint8", "int64", "float64"])
def test_torch_load_keeps_values_views_and_shared_storages(dtype):
    # Loaded storages are given their tensor's dtype and shape (csrc/backend/serialization.cpp).
    import io

    import torch

    dt = getattr(torch, dtype)
    ref = torch.arange(-7.0, 8.0).reshape(3, 5) * 1.5
    ref = (ref > 0) if dt == torch.bool else (torch.complex(ref, -ref).to(dt) if dt.is_complex else ref.to(dt))
    x = ref.to("tpu")
    base = torch.arange(12.0, device="tpu")
    buf = io.BytesIO()
    torch.save({"x": x, "xt": x.t(), "part": base[2:5], "grid": base.view(3, 4),
                "scalar": torch.tensor(7.0, device="tpu")}, buf)
    buf.seek(0)
    o = torch.load(buf)
    assert o["x"].device.type == "tpu" and o["x"].dtype == dt
    assert torch.equal(o["x"].cpu(), ref) and torch.equal(o["xt"].cpu(), ref.t())
    assert o["part"].cpu().tolist() == [2.0, 3.0, 4.0]
    assert torch.equal(o["grid"].cpu(), torch.arange(12.0).view(3, 4))
    o["grid"][0, 2] = -1  # the two views still share one storage
    assert o["part"][0].item() == -1
    assert o["scalar"].item() == 7.0

if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4])
