"""Data-parallel GPT training on tpu, one process per device:

    torchrun --nproc-per-node 2 examples/train_ddp.py [--steps N]

The same program as on CUDA with "nccl" -> no backend argument (or "tpu_dist") and
"cuda" -> "tpu": init_process_group() picks "cpu:gloo,tpu:tpu_dist".
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(__file__))
from gpt import GPT, batches  # noqa: E402

from torch_tpu._internal.distributed.launchers.singlehost_wrapper import (  # noqa: E402
    prepare_tpu_environment,
)


def main(steps: int):
    prepare_tpu_environment()  # under torchrun: only picks the chip (TPU_VISIBLE_CHIPS)
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    vocab, seq, batch = 64, 32, 8
    model = DDP(GPT(vocab=vocab, seq=seq).to("tpu"))
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
    if rank == 0:
        print(f"{world} ranks, {steps} steps in {time.time() - t0:.1f}s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    main(p.parse_args().steps)
