"""A plain Hugging Face `Trainer` script (no device code) trains on tpu, as it would on CUDA,
and matches the same run on the CPU."""
import os

import pytest
import torch

from conftest import no_fallbacks, run_python

transformers = pytest.importorskip("transformers")
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification,  # noqa: E402
                          Trainer, TrainingArguments)


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    """In-process runs are one process: no launcher variables from elsewhere."""
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)


def gpt2(dropout=0.0):
    cfg = AutoConfig.for_model("gpt2", vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=32,
                               bos_token_id=0, eos_token_id=0, resid_pdrop=dropout, embd_pdrop=dropout,
                               attn_pdrop=dropout)
    return AutoModelForCausalLM.from_config(cfg)


def bert():
    cfg = AutoConfig.for_model("bert", vocab_size=64, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=64, max_position_embeddings=32,
                               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)
    return AutoModelForSequenceClassification.from_config(cfg)


def lm_data(n=24):
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": ids, "labels": ids} for ids in torch.randint(1, 64, (n, 16), generator=g)]


def cls_data(n=24):
    g = torch.Generator().manual_seed(2)
    ids, labels = torch.randint(1, 64, (n, 12), generator=g), torch.randint(0, 3, (n,), generator=g)
    return [{"input_ids": i, "labels": y} for i, y in zip(ids, labels)]


def run(make_model, data, out, use_cpu, steps=6, resume=None, **kw):
    torch.manual_seed(0)
    model = make_model()
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=steps,
                             logging_steps=1, learning_rate=1e-3, report_to=[], use_cpu=use_cpu,
                             seed=0, dataloader_pin_memory=False, **kw)
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:8])
    trainer.train(resume_from_checkpoint=resume)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, model, losses


@pytest.mark.parametrize("make_model,data", [(gpt2, lm_data), (bert, cls_data)], ids=["gpt2", "bert"])
def test_trainer_trains_on_tpu_like_cpu(tmp_path, make_model, data):
    """Gradient accumulation and clipping included; evaluation after training."""
    kw = dict(gradient_accumulation_steps=2, max_grad_norm=0.5, save_strategy="no")
    cpu_trainer, cpu_model, cpu_losses = run(make_model, data(), tmp_path / "cpu", True, **kw)
    with no_fallbacks():
        tpu_trainer, tpu_model, tpu_losses = run(make_model, data(), tmp_path / "tpu", False, **kw)
    assert next(cpu_model.parameters()).device.type == "cpu"
    assert {p.device.type for p in tpu_model.parameters()} == {"tpu"}
    assert len(tpu_losses) == 6
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=1e-4, atol=1e-4)
    for p, q in zip(cpu_model.parameters(), tpu_model.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-4)
    ev_cpu, ev_tpu = cpu_trainer.evaluate()["eval_loss"], tpu_trainer.evaluate()["eval_loss"]
    assert ev_tpu == pytest.approx(ev_cpu, rel=1e-4)


@pytest.mark.parametrize("backend", [None, "tpu"], ids=["default", "tpu"])
def test_torch_compile_trainer_matches_cpu(tmp_path, backend):
    """TrainingArguments(torch_compile=True) as a CUDA script has it (inductor, routed to
    tpu's compiler for tpu tensors), or with torch_compile_backend="tpu" (accelerate's
    backend enum refused it)."""
    import torch_tpu
    kw = dict(torch_compile=True, save_strategy="no")
    if backend:
        kw["torch_compile_backend"] = backend
    _, _, cpu_losses = run(gpt2, lm_data(8), tmp_path / "cpu", True, steps=2, save_strategy="no")
    torch._dynamo.reset()
    before = torch_tpu.metrics()["compiled_graphs"]
    _, model, tpu_losses = run(gpt2, lm_data(8), tmp_path / "tpu", False, steps=2, **kw)
    assert torch_tpu.metrics()["compiled_graphs"] > before
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()


def test_checkpoint_resume_continues_with_identical_losses(tmp_path):
    """With dropout: the checkpoint keeps tpu's random state (Trainer saves only the devices
    of its list), so the resumed steps draw the uninterrupted run's masks."""
    kw = dict(save_strategy="steps", save_steps=3)
    _, _, full = run(lambda: gpt2(dropout=0.1), lm_data(), tmp_path / "full", False, **kw)
    ckpt = tmp_path / "full" / "checkpoint-3"
    assert (ckpt / "model.safetensors").exists() and (ckpt / "optimizer.pt").exists()
    assert (ckpt / "tpu_rng_state.pth").exists()
    trainer, model, resumed = run(lambda: gpt2(dropout=0.1), lm_data(), tmp_path / "resumed", False,
                                  resume=str(ckpt), **kw)
    assert {p.device.type for p in model.parameters()} == {"tpu"}
    # The resumed state's log keeps the first three losses; the last three are new.
    assert len(resumed) == 6
    torch.testing.assert_close(resumed[3:], full[3:], rtol=1e-6, atol=1e-6)
    # save_model writes weights a CPU process loads back unchanged.
    trainer.save_model(str(tmp_path / "saved"))
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "saved"))
    for p, q in zip(back.parameters(), model.parameters()):
        torch.testing.assert_close(p, q.detach().cpu())


def test_accelerate_save_state_and_load_state_restore_tpu_random_state(tmp_path):
    from accelerate import Accelerator
    acc = Accelerator()
    torch.manual_seed(3)
    torch.rand(4, device="tpu")
    acc.save_state(str(tmp_path / "state"))
    want = torch.rand(8, device="tpu").cpu()
    torch.rand(100, device="tpu")
    acc.load_state(str(tmp_path / "state"))
    assert torch.equal(torch.rand(8, device="tpu").cpu(), want)


def test_accelerate_defaults_to_tpu_but_explicit_choices_win():
    code = """
import torch
from accelerate import Accelerator, PartialState
print(Accelerator().device.type)
PartialState._reset_state(); from accelerate.state import AcceleratorState; AcceleratorState._reset_state(True)
print(Accelerator(cpu=True).device.type)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["tpu", "cpu"]
    r = run_python("from accelerate import Accelerator; print(Accelerator().device.type)",
                   env={"ACCELERATE_TORCH_DEVICE": "cpu"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cpu"]
    r = run_python("from accelerate import Accelerator; print(Accelerator().device.type)",
                   env={"TPU_ACCELERATE": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cpu"]


def test_device_map_auto_places_a_pretrained_model_on_tpu(tmp_path):
    """from_pretrained(device_map="auto"), as CUDA scripts load models: accelerate's memory
    inventory found no accelerator of its list and put every weight on the CPU."""
    gpt2().save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="auto")
    assert {p.device for p in model.parameters()} == {torch.device("tpu", 0)}
    from accelerate.utils import get_max_memory
    inventory = get_max_memory()
    assert inventory[0] == torch.tpu.mem_get_info(0)[0] and "cpu" in inventory
    ids = torch.randint(1, 64, (1, 8))
    want = AutoModelForCausalLM.from_pretrained(tmp_path)(ids).logits
    torch.testing.assert_close(model(ids.to("tpu")).logits.cpu(), want, rtol=1e-4, atol=1e-4)


def test_bf16_trainer_uses_autocast_on_tpu_like_cpu(tmp_path):
    """TrainingArguments(bf16=True): autocast("tpu", bfloat16) around the forward, as CUDA's
    run would be; losses close to the same bf16 autocast run on the CPU."""
    kw = dict(bf16=True, save_strategy="no")
    _, _, cpu_losses = run(gpt2, lm_data(), tmp_path / "cpu", True, **kw)
    with no_fallbacks():
        _, model, tpu_losses = run(gpt2, lm_data(), tmp_path / "tpu", False, **kw)
    assert {p.device.type for p in model.parameters()} == {"tpu"}
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast, not a cast
    # bf16 matmuls round differently on each backend: a loose tolerance, and not equal to the
    # float32 run (so autocast really ran).
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=2e-2, atol=2e-2)
    _, _, f32 = run(gpt2, lm_data(), tmp_path / "f32", False, save_strategy="no")
    assert tpu_losses != f32


def test_fp16_trainer_uses_autocast_and_a_tpu_grad_scaler(tmp_path):
    """TrainingArguments(fp16=True), as a CUDA script has it: accelerate refused any device
    outside its fixed list; now autocast("tpu", float16) runs the forward and a tpu
    GradScaler scales the loss (accelerate's fallback scaler is CUDA's, which disables
    itself without CUDA). Losses close to the float32 run's, and not equal to them."""
    kw = dict(save_strategy="no")
    with no_fallbacks():
        trainer, model, fp16 = run(gpt2, lm_data(), tmp_path / "fp16", False, fp16=True, **kw)
    scaler = trainer.accelerator.scaler
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.is_enabled() and scaler._device == "tpu"
    assert scaler._scale.device.type == "tpu" and scaler.get_scale() > 1
    assert {p.device.type for p in model.parameters()} == {"tpu"}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    _, _, f32 = run(gpt2, lm_data(), tmp_path / "f32", False, **kw)
    torch.testing.assert_close(fp16, f32, rtol=1e-2, atol=1e-2)
    assert fp16 != f32
    # A script importing accelerate before torch (torch_tpu loads while accelerate's
    # module is still executing): patched once it has run.
    r = run_python("from accelerate import Accelerator\n"
                   "a = Accelerator(mixed_precision='fp16'); print(a.device.type, a.scaler._device)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["tpu", "tpu"]


DDP_SCRIPT = '''
import json, os, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments
torch.manual_seed(0)
cfg = AutoConfig.for_model("gpt2", vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=32,
                           bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = AutoModelForCausalLM.from_config(cfg)
g = torch.Generator().manual_seed(1)
data = [{"input_ids": i, "labels": i} for i in torch.randint(1, 64, (32, 16), generator=g)]
args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=2, max_steps=4,
                         logging_steps=1, learning_rate=1e-3, report_to=[], seed=0, save_strategy="no",
                         dataloader_pin_memory=False, use_cpu=sys.argv[2] == "cpu")
trainer = Trainer(model=model, args=args, train_dataset=data)
trainer.train()
if int(os.environ["RANK"]) == 0:
    print("RESULT " + json.dumps({
        "device": next(model.parameters()).device.type, "world": args.world_size,
        "wrapped": type(trainer.model_wrapped).__name__,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "params": [p.detach().cpu().sum().item() for p in model.parameters()]}))
'''


def test_torchrun_trainer_runs_ddp_over_tpu_dist_like_cpu(tmp_path):
    """`torchrun --nproc-per-node 2` with a plain Trainer script: DDP over tpu_dist, each rank
    on tpu, the same losses and parameters as the same launch on the CPU (Gloo)."""
    import json
    import socket
    import subprocess
    import sys
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    results = {}
    for dev in ("tpu", "cpu"):
        with socket.socket() as s:  # a free port: runs side by side must not collide
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        r = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(port),
                            str(script), str(tmp_path / dev), dev],
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1"))
        lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
        assert r.returncode == 0 and lines, r.stderr[-3000:]
        results[dev] = json.loads(lines[0][len("RESULT "):])
    tpu, cpu = results["tpu"], results["cpu"]
    assert (tpu["device"], tpu["world"], tpu["wrapped"]) == ("tpu", 2, "DistributedDataParallel")
    assert len(tpu["losses"]) == 4
    torch.testing.assert_close(tpu["losses"], cpu["losses"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tpu["params"], cpu["params"], rtol=1e-4, atol=1e-4)
