"""Tensor-parallel GPT training on tpu, one process per device:

    torchrun --nproc-per-node 2 examples/train_tp.py [--steps N]

The same program as on CUDA with "cuda" -> "tpu": a 1-D device mesh over the ranks, and
each block's MLP split Megatron-style with `parallelize_module` (the first linear by
output features, `ColwiseParallel`; the second by input features, `RowwiseParallel`,
whose partial sums tpu_dist all-reduces). Every rank sees the same batch; attention,
norms and embeddings stay whole on each rank.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, os.path.dirname(__file__))
from gpt import GPT, batches  # noqa: E402


def main(steps: int):
    dist.init_process_group()   # cpu:gloo,tpu:tpu_dist
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("tpu", (world,))
    torch.manual_seed(0)        # the same full weights on every rank; each keeps its part
    vocab, seq, batch = 64, 32, 8
    model = GPT(vocab=vocab, seq=seq).to("tpu")
    for block in model.blocks:
        parallelize_module(block, mesh, {"fc": ColwiseParallel(), "out": RowwiseParallel()})
    # DTensor (sharded) and plain (whole) parameters side by side: no foreach kernels.
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False)
    t0 = time.time()
    for step, (x, y) in enumerate(batches(vocab, seq, batch, steps)):
        _, loss = model(x.to("tpu"), y.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step + 1}/{steps} loss {loss.item():.4f}", flush=True)
    fc = model.blocks[0].fc.weight
    if rank == 0:
        print(f"{world} ranks, {steps} steps in {time.time() - t0:.1f}s; "
              f"fc weight {tuple(fc.shape)}, this rank holds {tuple(fc.to_local().shape)}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    main(p.parse_args().steps)
