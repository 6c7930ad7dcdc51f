"""One simulated training rank (`python -m lab.sim.rank`, started by the launcher).

It does no work: it sleeps through functions named like a training loop, so that `py-spy dump` shows a
realistic stack (train -> train_step -> forward / backward -> all_reduce -> _wait_for_work) at ~0 CPU.
As in synchronous training, every rank leaves the gradient all-reduce at the same moment (a step boundary
of the host's clock, which all ranks of a simulated cluster share, every STEP_PERIOD_FACTOR steps), so at any
instant the ranks are in the same phase of the step and stacks dumped together agree, as a healthy job's do.
What it does is read from the node's control file (re-read every 0.5 s):

  normal             loop through steps
  hang_victim        block in all_reduce -> _wait_for_work (a collective whose peer never arrives)
  hang_culprit:data  block in the data loader (__next__ -> _next_data -> _get_data)
  hang_culprit:sync  block in a CUDA synchronize (a GPU that stopped answering)
  checkpoint         save a checkpoint (save_checkpoint -> torch.save -> _save -> write_record) until told
                     otherwise, then train on
  hang_culprit:ckpt  the same save, stuck in the write (a storage mount that stopped answering)
  hang_victim:barrier
                     saved, now blocked in the barrier after the save (barrier -> _wait_for_work)
  crash:ecc | crash:user_bug | crash:nccl
                     raise the matching exception (traceback on stderr, exit code 1)
  abort              what the NCCL watchdog does: "terminate called ...", SIGABRT
  terminated         what torchrun's SIGTERM does: exit by signal 15

Only the standard library, and little of it: a node runs eight of these.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time

POLL = 0.5


class DistBackendError(RuntimeError):
    """Named like torch.distributed.DistBackendError, for a realistic traceback."""


class Control:
    """The node's control file: `generation N`, then `<local_rank> <mode>` lines."""

    def __init__(self, path: str, local_rank: int) -> None:
        self.path = path
        self.local_rank = str(local_rank)
        self.parent = os.getppid()
        self._mode = "normal"
        self._key: tuple[int, int, int] | None = None
        self._checked = 0.0

    def mode(self) -> str:
        now = time.monotonic()
        if now - self._checked < POLL:
            return self._mode
        self._checked = now
        if os.getppid() != self.parent:  # the launcher is gone (PR_SET_PDEATHSIG covers Linux; this the rest)
            os._exit(1)
        try:
            st = os.stat(self.path)
        except OSError:
            return self._mode
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._key:
            self._key = key
            try:
                with open(self.path) as f:
                    for line in f:
                        parts = line.split()
                        if len(parts) == 2 and parts[0] == self.local_rank:
                            self._mode = parts[1]
            except OSError:
                pass
        return self._mode


OPTIMIZER_SHARE = 0.05  # of a step: the optimizer's update after the gradients' all-reduce
# The ranks' common step period, a little off the nominal step: an agent ships (and so dumps stacks) on whole
# seconds, and a step of exactly one second would catch every machine at the same phase in every round.
STEP_PERIOD_FACTOR = 1.037


class Context:
    def __init__(self) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.step_seconds = float(os.environ.get("FAULTLINE_SIM_STEP_SECONDS", "1.0"))
        self.control = Control(os.environ.get("FAULTLINE_SIM_CONTROL", "control"), self.local_rank)

    def mode(self) -> str:
        mode = self.control.mode()
        if mode == "abort":
            _abort(self.rank)
        if mode == "terminated":
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        return mode

    def run_kernels(self, share: float) -> None:
        """Sleep through a phase of the step, staying responsive to abort/terminate."""
        deadline = time.monotonic() + self.step_seconds * share
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, POLL))
            self.mode()


def _abort(rank: int) -> None:
    import resource  # only on the way out

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core dumps from a simulation
    sys.stderr.write(
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        f"  what():  [Rank {rank}] Process group watchdog thread terminated with exception: "
        "Watchdog caught collective operation timeout\n"
    )
    sys.stderr.flush()
    os.abort()


def _raise_for(mode: str) -> None:
    if mode == "crash:user_bug":
        apply_rotary_emb()
    if mode == "crash:ecc":
        raise RuntimeError(
            "CUDA error: uncorrectable ECC error encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
            "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
        )
    if mode == "crash:nccl":
        raise DistBackendError(
            "NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, remote process exited or there was "
            "a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a network error "
            "or a remote process exiting prematurely."
        )


def apply_rotary_emb() -> None:
    raise RuntimeError(
        "The size of tensor a (8192) must match the size of tensor b (4096) at non-singleton dimension 1"
    )


class DataLoaderIter:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.index = 0

    def __next__(self) -> int:
        return self._next_data()

    def _next_data(self) -> int:
        while self.ctx.mode() == "hang_culprit:data":
            self._get_data()
        self.ctx.run_kernels(0.03)
        self.index += 1
        return self.index

    def _get_data(self) -> None:
        # A worker that never delivers its batch (stuck on the filesystem, say).
        time.sleep(POLL)


def synchronize(ctx: Context) -> None:
    while ctx.mode() == "hang_culprit:sync":
        time.sleep(POLL)


def forward(ctx: Context, batch: int) -> float:
    mode = ctx.mode()
    if mode == "crash:user_bug":
        apply_rotary_emb()
    ctx.run_kernels(0.30)
    synchronize(ctx)
    return 2.5


def backward(ctx: Context, loss: float) -> None:
    _raise_for(ctx.mode())
    ctx.run_kernels(0.22)
    all_reduce(ctx, "gradients")


def all_reduce(ctx: Context, what: str) -> None:
    if ctx.mode() == "crash:nccl":
        _raise_for("crash:nccl")
    _wait_for_work(ctx, 0.20, synchronized=True)


def _wait_for_work(ctx: Context, share: float, *, synchronized: bool = False) -> None:
    """Wait `share` of a step; `synchronized`: at least that, then on to the moment every rank's collective
    completes (OPTIMIZER_SHARE of a step before the next boundary of the shared clock)."""
    deadline = time.monotonic() + ctx.step_seconds * share
    if synchronized:
        step, wall = ctx.step_seconds * STEP_PERIOD_FACTOR, time.time()
        done = (math.floor((wall + step * share) / step) + 1) * step - step * OPTIMIZER_SHARE
        deadline = time.monotonic() + max(done - wall, step * share)
    while True:
        mode = ctx.mode()
        if mode.startswith("crash:"):
            _raise_for(mode)
        waiting = mode in ("hang_victim", "hang_victim:barrier")
        if not waiting and time.monotonic() >= deadline:
            return
        time.sleep(POLL if waiting else max(0.0, min(POLL, deadline - time.monotonic())))


def optimizer_step(ctx: Context) -> None:
    _raise_for(ctx.mode())
    ctx.run_kernels(OPTIMIZER_SHARE)


def write_record(ctx: Context) -> None:
    # The shard's bytes going to storage; a stuck mount never returns from here.
    while ctx.mode() in ("checkpoint", "hang_culprit:ckpt"):
        time.sleep(POLL)


def _save(ctx: Context) -> None:
    write_record(ctx)


def save(ctx: Context) -> None:
    """Named like torch.save."""
    _save(ctx)


def barrier(ctx: Context) -> None:
    _wait_for_work(ctx, 0.0)


def save_checkpoint(ctx: Context) -> None:
    save(ctx)
    barrier(ctx)


def train_step(ctx: Context, loader: DataLoaderIter) -> None:
    if ctx.mode() in ("checkpoint", "hang_culprit:ckpt", "hang_victim:barrier"):
        save_checkpoint(ctx)
    batch = next(loader)
    loss = forward(ctx, batch)
    backward(ctx, loss)
    optimizer_step(ctx)


def train(ctx: Context) -> None:
    loader = DataLoaderIter(ctx)
    while True:
        train_step(ctx, loader)


def main() -> int:
    train(Context())
    return 0


if __name__ == "__main__":
    sys.exit(main())
