"""Sharded (FSDP2) GPT training on tpu, one process per device:

    torchrun --nproc-per-node 2 examples/train_fsdp.py [--steps N]

The same program as on CUDA: the model is built on the meta device, each block and the
whole model are sharded with `fully_shard`, then `to_empty(device="tpu")` allocates each
rank's shards, which are initialized in place (as on CUDA, where `reset_parameters` runs
on the real device).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(__file__))
from gpt import GPT, batches  # noqa: E402


def main(steps: int):
    dist.init_process_group()   # cpu:gloo,tpu:tpu_dist
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    vocab, seq, batch = 64, 32, 8
    with torch.device("meta"):
        model = GPT(vocab=vocab, seq=seq)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    model.to_empty(device="tpu")
    for m in model.modules():      # every rank draws the same full values, keeps its shard
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    t0 = time.time()
    for step, (x, y) in enumerate(batches(vocab, seq, batch * world, steps)):
        x, y = x[rank::world].to("tpu"), y[rank::world].to("tpu")  # this rank's shard
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().reshape(1)
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"step {step + 1}/{steps} loss {mean.item():.4f}", flush=True)
    local = sum(p.to_local().numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"{world} ranks, {steps} steps in {time.time() - t0:.1f}s; "
              f"this rank holds {local} of {total} parameters", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    main(p.parse_args().steps)
