"""`torch.distributed` on the simulated node: the ranks meet at MASTER_ADDR:MASTER_PORT as torchrun's do (rank 0
listens, the others connect, each waiting up to the group's timeout), and an all-reduce sums what every rank holds,
so a rank that never comes hangs the others as it would NCCL's. Each all-reduce takes, on the virtual clock, the
time its bytes take at the node's NVLink bus bandwidth (nccl-tests' definition), so the check measures that figure.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import IO, TYPE_CHECKING

from torch import _node

if TYPE_CHECKING:
    from torch import Tensor

CONNECT_RETRY_S = 0.1


class _Group:
    def __init__(self, rank: int, world: int, addr: str, port: int, timeout: float) -> None:
        self.rank, self.world = rank, world
        self.links: list[IO[str]] = []
        if rank == 0:
            with socket.create_server((addr, port)) as server:
                server.settimeout(timeout)
                for _ in range(world - 1):
                    conn, _ = server.accept()  # socket.timeout when a rank never comes
                    conn.settimeout(timeout)
                    self.links.append(conn.makefile("rw"))
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn = socket.create_connection((addr, port), timeout=timeout)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(CONNECT_RETRY_S)
        self.links.append(conn.makefile("rw"))

    def sum(self, value: float) -> float:
        """Every rank's value summed, on every rank."""
        if self.rank == 0:
            total = value + sum(_receive(link) for link in self.links)
            for link in self.links:
                _send(link, total)
            return total
        _send(self.links[0], value)
        return _receive(self.links[0])

    def close(self) -> None:
        for link in self.links:
            link.close()


def _send(link: IO[str], value: float) -> None:
    link.write(f"{value!r}\n")
    link.flush()


def _receive(link: IO[str]) -> float:
    line = link.readline()
    if not line:
        raise RuntimeError("NCCL error: a peer closed its connection")
    return float(line)


_group: _Group | None = None


def init_process_group(
    backend: str = "nccl", *, rank: int, world_size: int, timeout: timedelta = timedelta(minutes=10)
) -> None:
    global _group
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    _group = _Group(rank, world_size, addr, port, timeout.total_seconds())


def _joined() -> _Group:
    if _group is None:
        raise RuntimeError("Default process group has not been initialized: call init_process_group first")
    return _group


def all_reduce(tensor: Tensor) -> None:
    group = _joined()
    if tensor.device.type == "cuda":
        moved = tensor.nbytes() * 2 * (group.world - 1) / group.world  # per rank, as nccl-tests count it
        _node.launch(
            tensor.device.index or 0, "all-reduce", lambda _: moved / (_node.state()["allreduce_busbw_gbps"] * 1e9)
        )
    tensor.fill = group.sum(tensor.fill)


def barrier() -> None:
    _joined().sum(0.0)


def destroy_process_group() -> None:
    global _group
    _joined().close()
    _group = None
