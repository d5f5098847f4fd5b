"""Trains a small GPT on `tpu` and prints loss, tokens/s and the backend's metrics.

The training loop is ordinary PyTorch: the only tpu-specific word is the device.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from gpt import GPT, batches  # noqa: E402

import torch_tpu  # noqa: E402,F401  (optional: `import torch` already loads it)


def main(steps: int = 40, device: str = "tpu"):
    torch.manual_seed(0)
    vocab, seq, batch = 64, 32, 8
    model = GPT(vocab=vocab, seq=seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    print(f"training a {sum(p.numel() for p in model.parameters())}-parameter GPT on {device}")
    t0, tokens = None, 0
    for step, (x, y) in enumerate(batches(vocab, seq, batch, steps)):
        x, y = x.to(device), y.to(device)
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 4:  # after warm-up compiles
            torch.tpu.synchronize()
            t0, tokens = time.perf_counter(), 0
        tokens += x.numel()
        if step % 10 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {loss.item():.4f}")
    torch.tpu.synchronize()
    dt = time.perf_counter() - t0
    print(f"throughput: {tokens / dt:,.0f} tokens/s (after warm-up)")
    print(torch_tpu.metrics_report())


if __name__ == "__main__":
    main()
