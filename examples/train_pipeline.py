"""Pipeline-parallel GPT training on tpu, one process per stage (MPMD: each rank runs
its own program):

    torchrun --nproc-per-node 2 examples/train_pipeline.py [--steps N] [--schedule 1f1b]

The same program as on CUDA with "cuda" -> "tpu": `torch.distributed.pipelining` splits
the GPT in two stages (rank 0: embeddings and the first half of the blocks; rank 1: the
other blocks, the final norm and the head), each batch runs as micro-batches, and the
activations and their gradients cross between the stages as tpu_dist send/recv.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

sys.path.insert(0, os.path.dirname(__file__))
from gpt import GPT, batches  # noqa: E402


class FirstStage(nn.Module):
    def __init__(self, gpt: GPT, n_blocks: int):
        super().__init__()
        self.tok, self.pos = gpt.tok, gpt.pos
        self.blocks = nn.ModuleList(gpt.blocks[:n_blocks])

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return x


class LastStage(nn.Module):
    def __init__(self, gpt: GPT, n_blocks: int):
        super().__init__()
        self.blocks = nn.ModuleList(gpt.blocks[n_blocks:])
        self.ln, self.head = gpt.ln, gpt.head

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def loss_fn(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main(steps: int, schedule: str, microbatches: int):
    dist.init_process_group()   # cpu:gloo,tpu:tpu_dist
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, "two stages: run with --nproc-per-node 2"
    torch.manual_seed(0)        # the same full weights on every rank; each keeps its stage
    vocab, seq, batch, layers = 64, 32, 8, 4
    gpt = GPT(vocab=vocab, seq=seq, n_layers=layers)
    half = layers // 2
    module = (FirstStage(gpt, half) if rank == 0 else LastStage(gpt, half)).to("tpu")
    stage = PipelineStage(module, rank, world, torch.device("tpu"))
    sched_cls = Schedule1F1B if schedule == "1f1b" else ScheduleGPipe
    sched = sched_cls(stage, n_microbatches=microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(module.parameters(), lr=3e-3)
    t0 = time.time()
    for step, (x, y) in enumerate(batches(vocab, seq, batch, steps)):
        opt.zero_grad()
        if rank == 0:
            sched.step(x.to("tpu"))
        else:
            losses = []
            sched.step(target=y.to("tpu"), losses=losses)
            loss = torch.stack(losses).mean()
            print(f"step {step + 1}/{steps} loss {loss.item():.4f}", flush=True)
        opt.step()
    n = sum(p.numel() for p in module.parameters())
    print(f"rank {rank}: stage {rank} of {world} ({type(module).__name__}, {n} parameters), "
          f"{steps} steps of {microbatches} micro-batches ({schedule}) in "
          f"{time.time() - t0:.1f}s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    p.add_argument("--microbatches", type=int, default=4)
    a = p.parse_args()
    main(a.steps, a.schedule, a.microbatches)
