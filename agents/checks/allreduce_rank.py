"""One rank of the all-reduce check, run as its own process by collectives.py (rank and world from the environment,
as torchrun sets them). Prints one JSON line: the bus bandwidth it measured and whether the sums were right."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta


def main() -> int:
    import torch
    import torch.distributed as dist

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    backend = os.environ.get("FAULTLINE_CHECK_BACKEND", "nccl")
    size = int(os.environ.get("FAULTLINE_CHECK_BYTES", str(256 * 2**20))) // 4
    iters = int(os.environ.get("FAULTLINE_CHECK_ITERS", "20"))
    timeout = float(os.environ.get("FAULTLINE_CHECK_TIMEOUT", "120"))
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
    try:
        data = torch.full((size,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(data)  # warm-up: connections, and the first correctness test
        expected = world * (world + 1) / 2
        wrong = int((data != expected).sum().item())
        if backend == "nccl":
            torch.cuda.synchronize(local)
        dist.barrier()
        started = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(data)
        if backend == "nccl":
            torch.cuda.synchronize(local)
        seconds = (time.perf_counter() - started) / iters
    finally:
        dist.destroy_process_group()
    algbw = size * 4 / seconds / 1e9
    busbw = algbw * 2 * (world - 1) / world  # nccl-tests' bus bandwidth: comparable across world sizes
    print(
        json.dumps(
            {
                "rank": rank,
                "local_rank": local,
                "busbw_gbps": busbw,
                "algbw_gbps": algbw,
                "wrong_elements": wrong,
                "seconds_per_op": seconds,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
