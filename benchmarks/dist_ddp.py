"""A DDP training step of the example GPT, 2 ranks: tpu tensors over tpu_dist beside CPU
tensors over Gloo, in the same process group and run.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/dist_ddp.py [--world 2] [--steps 8]

Per device, medians over the measured steps:
  step_ms      forward + backward (with DDP's bucketed all-reduces) + optimizer step;
  compute_ms   the same step under model.no_sync() (no communication);
  comm_ms      time the bucket all-reduces were in flight (union of issue -> result
               written, recorded by a communication hook);
  exposed_ms   the median over steps of (synced step - the no_sync step right after it, on
               the same batch): communication the backward did not hide (paired, so a
               slow stretch of the machine falls on both halves of a difference);
  overlap      1 - exposed / comm: the share of communication hidden behind backward;
  execs        device executions of a synced step / of a no_sync step (tpu; exact).
Prints a table from rank 0 and writes --out as JSON.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

from _ranks import run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))


def union_ms(intervals):
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total * 1e3


def timed_allreduce_hook(log):
    """DDP's default averaging all-reduce, recording when each bucket's result is in."""
    import torch.distributed as dist

    def hook(process_group, bucket):
        t0 = time.perf_counter()
        buf = bucket.buffer().div_(dist.get_world_size(process_group))
        fut = dist.all_reduce(buf, group=process_group, async_op=True).get_future()

        def done(f):
            log.append((t0, time.perf_counter()))
            return f.value()[0]
        return fut.then(done)
    return hook


def rank_main(rank, world, port, a):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    from gpt import GPT, batches
    dist.init_process_group(timeout=datetime.timedelta(seconds=120))  # cpu:gloo,tpu:tpu_dist
    import torch_tpu

    def executions():
        return torch_tpu.metrics()["executions"]
    vocab = 256
    data = list(batches(vocab, a.seq, a.batch * world, a.steps + a.warmup))
    rows = []
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        model = GPT(vocab=vocab, d_model=a.d_model, n_layers=a.layers, seq=a.seq).to(device)
        ddp = DDP(model, bucket_cap_mb=a.bucket_mb)
        log = []
        ddp.register_comm_hook(None, timed_allreduce_hook(log))
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

        def step(x, y, sync):
            opt.zero_grad()
            if sync:
                _, loss = ddp(x, y)
                loss.backward()
            else:
                with ddp.no_sync():
                    _, loss = ddp(x, y)
                    loss.backward()
            opt.step()
            next(model.parameters())[:1].sum().item()  # wait for the device

        shards = [(x[rank::world].to(device), y[rank::world].to(device)) for x, y in data]
        for x, y in shards[:a.warmup]:  # compiles, buckets rebuilt after the first step
            step(x, y, True)
            step(x, y, False)
        full, alone, comm = [], [], []
        execs = {True: 0, False: 0}
        for x, y in shards[a.warmup:]:
            for sync, times in ((True, full), (False, alone)):
                log.clear()
                dist.barrier()
                e0 = executions()
                t0 = time.perf_counter()
                step(x, y, sync)
                times.append(time.perf_counter() - t0)
                execs[sync] = executions() - e0
                if sync:
                    comm.append(union_ms(log))
        step_ms, compute_ms = statistics.median(full) * 1e3, statistics.median(alone) * 1e3
        comm_ms = statistics.median(comm)
        exposed = max(statistics.median(a - b for a, b in zip(full, alone)) * 1e3, 0.0)
        rows.append({"device": device, "backend": "gloo" if device == "cpu" else "tpu_dist",
                     "params": sum(p.numel() for p in model.parameters()),
                     "step_ms": round(step_ms, 2), "compute_ms": round(compute_ms, 2),
                     "comm_ms": round(comm_ms, 2), "exposed_ms": round(exposed, 2),
                     "overlap": round(1 - exposed / comm_ms, 2) if comm_ms > 0 else None,
                     "execs": f"{execs[True]}/{execs[False]}" if device == "tpu" else "-"})
    if rank == 0:
        cols = ["backend", "params", "step_ms", "compute_ms", "comm_ms", "exposed_ms", "overlap", "execs"]
        print(" ".join(f"{c:>10}" for c in cols))
        for r in rows:
            print(" ".join(f"{str(r[c]):>10}" for c in cols))
        with open(a.out, "w") as f:
            json.dump({"world": world, "args": vars(a), "rows": rows}, f, indent=1)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--bucket-mb", type=float, default=1.0)
    p.add_argument("--out", default=os.path.join(HERE, "results", "dist_ddp.json"))
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--port", type=int, default=None)
    a = p.parse_args()
    if a.rank is not None:
        return rank_main(a.rank, a.world, a.port, a)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    run_ranks(__file__, a.world)


if __name__ == "__main__":
    main()
