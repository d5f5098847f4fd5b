"""A plain Hugging Face Trainer script: no device code, yet it trains on tpu (torch_tpu
makes accelerate's default device tpu). `TrainingArguments(use_cpu=True)` keeps it on the CPU.

    .venv/bin/python examples/train_trainer.py
"""
import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main():
    torch.manual_seed(0)
    config = AutoConfig.for_model("gpt2", vocab_size=128, n_embd=64, n_layer=2, n_head=4,
                                  n_positions=64, bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(config)
    g = torch.Generator().manual_seed(1)
    # A learnable toy language: each sequence counts upwards from a random start.
    starts = torch.randint(0, 64, (256, 1), generator=g)
    seqs = (starts + torch.arange(32)) % 128
    data = [{"input_ids": s, "labels": s} for s in seqs]
    args = TrainingArguments(output_dir="/tmp/torch_tpu_trainer_demo", per_device_train_batch_size=8,
                             num_train_epochs=2, learning_rate=3e-3, logging_steps=8, report_to=[],
                             save_strategy="no", dataloader_pin_memory=False)
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:32])
    trainer.train()
    print("device:", next(model.parameters()).device, "eval loss:", trainer.evaluate()["eval_loss"])


if __name__ == "__main__":
    main()
