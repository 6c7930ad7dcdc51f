"""A small real DDP training job (PyTorch CPU, gloo) with fault injection, run by torchrun.

Every rank prints one progress line per step in a common format, which torchrun prefixes with the rank
(`--tee 3` and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]:"), e.g.

    [rank2]:step=12 loss=0.4312 grad_norm=1.2300 elapsed_ms=105.2

Faults, each named after what it looks like from outside:
- `--hang-rank R --hang-at-step S`: rank R blocks forever in `_stuck_in_data_loading` before step S's
  collectives, so every other rank waits in the step's first collective, `dist.all_reduce` of the global batch
  size (a real hang, visible to py-spy).
- `--crash-rank R --crash-at-step S`: rank R raises in `_injected_crash`, a real traceback; torchrun then
  prints its ChildFailedError summary and the job ends.
- `--slow-rank R --slow-factor F [--slow-at-step S]`: rank R's per-step work takes F times longer (from step
  S on), so the step time of every rank rises (synchronous training waits for the slowest rank).
- `--nan-at-step S`: the inputs of step S are NaN on every rank, so loss and grad_norm become NaN.
- `--device cuda`: the model, its batches and the per-step work on this host's GPU (real matrix products for
  --step-time seconds), the collectives still through gloo, so several ranks can share one GPU.
- `--user-bug-at-step S`: a bug in the training code: from step S every rank's batch goes through a broken
  feature transform, so the forward raises the same RuntimeError (a shape mismatch) on every rank.

Real-life healthy behaviour (issue 17), each off by default:
- `--warmup-steps N`: the learning rate ramps up linearly over the first N steps.
- `--checkpoint-every N`: every N steps every rank saves (rank 0 writes the model with torch.save into
  `--checkpoint-dir`; every rank spends `--checkpoint-seconds` writing its shard to slow storage), with
  Megatron's lines (`saving checkpoint at iteration N to D`, `successfully saved checkpoint from iteration N
  to D`), then the ranks meet in a barrier: no step line for that long.
- `--eval-every N`: `--eval-iters` forward-only steps in their own rhythm, then Megatron's `validation loss at
  iteration N | lm loss value: X |`.
- `--stall-every N`: every N steps one rank (a different one each time) waits `--stall-seconds` for data, then
  goes on; the others wait for it in the step's first collective.
- `--resume`: start from the newest checkpoint in `--checkpoint-dir` (a job restarted by its scheduler): the
  steps after it are trained again.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10**9, help="steps to run (default: effectively forever)")
    parser.add_argument(
        "--step-time",
        type=float,
        default=0.1,
        help="seconds of simulated compute per step; keeps the job at about 5-10 steps/s on a small machine",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank")
    parser.add_argument("--timeout", type=float, default=300.0, help="collective timeout in seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the model and the work run")
    parser.add_argument("--hang-rank", type=int)
    parser.add_argument("--hang-at-step", type=int, default=5)
    parser.add_argument("--crash-rank", type=int)
    parser.add_argument("--crash-at-step", type=int, default=5)
    parser.add_argument("--slow-rank", type=int)
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--slow-at-step", type=int, default=1)
    parser.add_argument("--nan-at-step", type=int)
    parser.add_argument("--user-bug-at-step", type=int)
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int)
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--checkpoint-seconds", type=float, default=5.0)
    parser.add_argument("--eval-every", type=int)
    parser.add_argument("--eval-iters", type=int, default=5)
    parser.add_argument("--stall-every", type=int)
    parser.add_argument("--stall-seconds", type=float, default=3.0)
    parser.add_argument("--resume", action="store_true", help="start from the newest checkpoint in --checkpoint-dir")
    return parser.parse_args(argv)


def _stuck_in_data_loading(rank: int, step: int) -> None:
    """Injected hang: never return, so the peers block in their next collective."""
    print(f"injected fault: rank {rank} stuck in data loading at step {step}", file=sys.stderr, flush=True)
    while True:
        time.sleep(3600)


def _injected_crash(rank: int, step: int) -> None:
    raise RuntimeError(f"injected fault: rank {rank} crashed at step {step}")


def _select_features(inputs: torch.Tensor) -> torch.Tensor:
    """Injected user-code bug: drops a feature column the model still expects (the same on every rank)."""
    return inputs[:, 1:]


def _simulate_compute(seconds: float, device: torch.device) -> None:
    if device.type == "cpu":
        # Sleep rather than burn CPU: the test machine may have 2 cores for 4 ranks plus 2 launchers.
        time.sleep(seconds)
        return
    # Real GPU work (kernels the GPU's counters and a stack dump see), for as long as asked.
    a = torch.randn(2048, 2048, device=device)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)
        torch.cuda.synchronize(device)


def _batches(dataset: TensorDataset, args: argparse.Namespace, rank: int) -> Iterator[list[torch.Tensor]]:
    """Endless batches; with --workers > 0 the DataLoader's worker processes stay alive between epochs."""
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        generator=torch.Generator().manual_seed(args.seed + rank),
    )
    while True:
        yield from loader


def _save_checkpoint(model: nn.Module, step: int, args: argparse.Namespace, rank: int) -> None:
    """Every rank pauses while the state is written; rank 0 prints Megatron's lines around it."""
    folder = Path(args.checkpoint_dir)
    if rank == 0:
        print(f"saving checkpoint at iteration {step:7d} to {folder} in torch_dist format", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"iter_{step:07d}.pt.tmp"
        torch.save({"step": step, "model": model.state_dict()}, tmp)
        tmp.replace(folder / f"iter_{step:07d}.pt")  # a restart never reads half a file
    time.sleep(args.checkpoint_seconds)  # this rank's shard going to slow storage
    dist.barrier()
    if rank == 0:
        print(f"  successfully saved checkpoint from iteration {step:7d} to {folder} [ t 1/1, p 1/1 ]", flush=True)


def _load_checkpoint(model: nn.Module, args: argparse.Namespace, rank: int) -> int:
    """The newest checkpoint's step (0: none) after loading it, as a restarted job does."""
    saved = sorted(Path(args.checkpoint_dir).glob("iter_*.pt"))
    if not saved:
        return 0
    state = torch.load(saved[-1], weights_only=True)
    model.load_state_dict(state["model"])
    step = int(state["step"])
    if rank == 0:
        print(f" loading distributed checkpoint from {args.checkpoint_dir} at iteration {step}", flush=True)
        print(
            f"  successfully loaded checkpoint from {args.checkpoint_dir} [ t 1/1, p 1/1 ] at iteration {step}",
            flush=True,
        )
    return step


def _evaluate(model: nn.Module, batches: Iterator[list[torch.Tensor]], step: int, args: argparse.Namespace) -> None:
    """Forward-only steps (a different rhythm from training's), then the validation line on rank 0."""
    device = next(model.parameters()).device
    total = torch.zeros(1)
    with torch.no_grad():
        for _ in range(args.eval_iters):
            inputs, targets = (t.to(device) for t in next(batches))
            _simulate_compute(args.step_time * 0.4, device)
            total += nn.functional.mse_loss(model(inputs), targets).to("cpu")
    dist.all_reduce(total)
    loss = total.item() / (args.eval_iters * dist.get_world_size())
    if dist.get_rank() == 0:
        text = f" validation loss at iteration {step} | lm loss value: {loss:.6E} | "
        print("-" * (len(text) + 1), text, "-" * (len(text) + 1), sep="\n", flush=True)


@record  # so torchrun's ChildFailedError summary carries this rank's traceback
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(
        f"started rank={rank} local_rank={os.environ.get('LOCAL_RANK')} group_rank={os.environ.get('GROUP_RANK')}"
        f" world_size={world} pid={os.getpid()}",
        flush=True,
    )

    device = torch.device(args.device)
    torch.manual_seed(args.seed)  # the same data and initial weights on every rank
    x = torch.randn(args.batch_size * 16, FEATURES)
    y = x @ torch.randn(FEATURES, 1) + 0.1 * torch.randn(x.shape[0], 1)
    batches = _batches(TensorDataset(x, y), args, rank)

    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(FEATURES, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1)).to(device)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    warmup = max(1, args.warmup_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warmup))
    loss_fn = nn.MSELoss()
    first = _load_checkpoint(model.module, args, rank) + 1 if args.resume else 1

    for step in range(first, args.steps + 1):
        started = time.perf_counter()
        if rank == args.hang_rank and step == args.hang_at_step:
            _stuck_in_data_loading(rank, step)
        if args.stall_every and step % args.stall_every == 0 and rank == (step // args.stall_every) % world:
            time.sleep(args.stall_seconds)  # a data-loader stall that recovers
        inputs, targets = (t.to(device) for t in next(batches))
        # The global batch size, counted across ranks before the forward as LLM trainers count tokens to
        # normalize the loss: a collective at the start of every step, where the peers of a stuck rank wait.
        global_batch = torch.tensor(float(len(inputs)))
        dist.all_reduce(global_batch)
        work = args.step_time
        if rank == args.slow_rank and step >= args.slow_at_step:
            work *= args.slow_factor
        _simulate_compute(work, device)
        if rank == args.crash_rank and step == args.crash_at_step:
            _injected_crash(rank, step)
        if step == args.nan_at_step:
            inputs = inputs * float("nan")
        if args.user_bug_at_step is not None and step >= args.user_bug_at_step:
            inputs = _select_features(inputs)

        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), targets)
        loss.backward()  # DDP all-reduces the gradients here
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
        optimizer.step()
        schedule.step()
        # Log the mean loss over all samples of all ranks, as real jobs do (one more collective per step).
        mean_loss = loss.detach().to("cpu", copy=True)
        dist.all_reduce(mean_loss)
        mean_loss *= len(inputs) / global_batch

        elapsed_ms = (time.perf_counter() - started) * 1000
        print(
            f"step={step} loss={mean_loss.item():.4f} grad_norm={grad_norm.item():.4f} elapsed_ms={elapsed_ms:.1f}",
            flush=True,
        )
        if args.eval_every and step % args.eval_every == 0:
            _evaluate(model, batches, step, args)
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            _save_checkpoint(model.module, step, args, rank)

    # Every rank done with its collectives before any tears gloo down: a rank whose peer had already closed
    # its pairs aborted at exit now and then ("terminate called without an active exception"), and DDP's
    # reducer goes before the group it holds.
    dist.barrier()
    del model, optimizer, schedule
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
