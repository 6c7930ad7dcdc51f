"""One rank of the all-reduce check, run as its own process by collectives.py (rank and world from the environment,
as torchrun sets them). Prints one JSON line: the bus bandwidth it measured and whether the sums were right."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import Any


def main() -> int:
    import torch
    import torch.distributed as dist

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    backend = os.environ.get("FAULTLINE_CHECK_BACKEND", "nccl")
    size = int(os.environ.get("FAULTLINE_CHECK_BYTES", str(256 * 2**20))) // 4
    iters = int(os.environ.get("FAULTLINE_CHECK_ITERS", "20"))
    timeout = float(os.environ.get("FAULTLINE_CHECK_TIMEOUT", "120"))
    # The preflight's extras (agents/preflight/): small-message latency, and an all-to-all, which (unlike the
    # all-reduce's ring) sends between every pair of ranks, so one broken link between two nodes shows.
    latency_iters = int(os.environ.get("FAULTLINE_CHECK_LATENCY_ITERS", "0"))
    alltoall = os.environ.get("FAULTLINE_CHECK_ALLTOALL") == "1"
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
        extra: dict[str, float] = {}
        if latency_iters:
            tiny = torch.ones(1, dtype=torch.float32, device=device)
            dist.all_reduce(tiny)
            _sync(torch, backend, local)
            started = time.perf_counter()
            for _ in range(latency_iters):
                dist.all_reduce(tiny)
            _sync(torch, backend, local)
            extra["latency_us"] = (time.perf_counter() - started) / latency_iters * 1e6
        if alltoall:
            chunk = 1024
            sent = torch.full((world * chunk,), float(rank + 1), dtype=torch.float32, device=device)
            got = torch.empty_like(sent)
            dist.all_to_all_single(got, sent)
            expected_parts = torch.arange(1, world + 1, dtype=torch.float32, device=device).repeat_interleave(chunk)
            wrong += int((got != expected_parts).sum().item())
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
                **extra,
            }
        )
    )
    return 0


def _sync(torch: Any, backend: str, local: int) -> None:
    if backend == "nccl":
        torch.cuda.synchronize(local)


if __name__ == "__main__":
    sys.exit(main())
