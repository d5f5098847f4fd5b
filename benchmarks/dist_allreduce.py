"""all_reduce bus bandwidth: tpu_dist on tpu tensors (host-staged over Gloo) beside Gloo
on CPU tensors, in the same process group of --world ranks on this host.

    .venv/bin/python benchmarks/dist_allreduce.py [--world 2] [--sizes-kib 4,64,1024,16384]

Bus bandwidth = bytes * 2 (n - 1) / n / time (NCCL's convention for all_reduce): the rate
each rank's link would carry; "x gloo" is tpu_dist's over Gloo's (targets: >= 0.8 at
>= 1 MiB, >= 0.5 at 1 KiB). The two alternate call by call, so machine load hits both.
Run it with OMP_WAIT_POLICY=PASSIVE on a shared machine. Prints a table from rank 0 and
writes --out as JSON.
"""
import argparse
import datetime
import json
import os
import statistics
import time

from _ranks import run_ranks


def rank_main(rank, world, port, sizes_kib, iters, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist
    dist.init_process_group(timeout=datetime.timedelta(seconds=60))  # cpu:gloo,tpu:tpu_dist
    rows = []
    for kib in sizes_kib:
        n = kib * 1024 // 4
        xs = {d: torch.ones(n, device=d) for d in ("cpu", "tpu")}
        for x in xs.values():
            for _ in range(2):  # warm-up: compiles, connections, staging memory
                dist.all_reduce(x)
            x.sum().item()
        times = {d: [] for d in xs}
        # Gloo and tpu_dist alternate, so a busy machine's load falls on both alike.
        for _ in range(iters):
            for d, x in xs.items():
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(x)
                x[:1].cpu()  # the result is on the device: wait for it
                times[d].append(time.perf_counter() - t0)
        for d in xs:
            t = statistics.median(times[d])
            bus = n * 4 * 2 * (world - 1) / world / t
            rows.append({"KiB": kib, "device": d,
                         "backend": "gloo" if d == "cpu" else "tpu_dist",
                         "median_ms": round(t * 1e3, 3), "bus_GBps": round(bus / 1e9, 3)})
        # The same bytes: the bandwidth ratio is the inverse ratio of the times.
        rows[-1]["vs_gloo"] = round(rows[-2]["median_ms"] / rows[-1]["median_ms"], 2)
    if rank == 0:
        print(f"{'KiB':>8} {'backend':>9} {'median ms':>10} {'bus GB/s':>9} {'x gloo':>7}")
        for r in rows:
            print(f"{r['KiB']:>8} {r['backend']:>9} {r['median_ms']:>10} {r['bus_GBps']:>9}"
                  f" {r.get('vs_gloo', ''):>7}")
        with open(out, "w") as f:
            json.dump({"world": world, "iters": iters, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--sizes-kib", default="4,64,1024,16384")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "results", "dist_allreduce.json"))
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--port", type=int, default=None)
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes_kib.split(",")]
    if a.rank is not None:
        return rank_main(a.rank, a.world, a.port, sizes, a.iters, a.out)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    run_ranks(__file__, a.world)


if __name__ == "__main__":
    main()
