"""Log lines in the shapes real systems write them: dmesg -T kernel lines, NCCL, PyTorch c10d,
torchrun (elastic) and Megatron-style step lines. Pure string formatting; the model decides when."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

DRIVER_BANNER = "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024"
NVLINK_BANNER = "nvidia-nvlink: Nvlink Core is being initialized, major device number 508"
PYTHON = "/usr/bin/python3"
SITE = "/usr/local/lib/python3.10/dist-packages"
TRAIN_SCRIPT = "/workspace/llm/train.py"
MODEL_FILE = "/workspace/llm/model/transformer.py"
DATASET_FILE = "/workspace/llm/data/shards.py"
ELASTIC_ERRORS_URL = "https://pytorch.org/docs/stable/elastic/errors.html"


# --- kernel log (dmesg -T) ---


def dmesg_prefix(ts: datetime) -> str:
    # ctime layout, as dmesg -T prints it: day of month space-padded.
    return f"[{ts:%a %b} {ts.day:2d} {ts:%H:%M:%S %Y}] "


def kern(ts: datetime, *messages: str) -> str:
    """One kernel record; extra messages are continuation lines, indented under the first, as dmesg shows them."""
    prefix = dmesg_prefix(ts)
    pad = " " * len(prefix)
    return "\n".join([prefix + messages[0], *(pad + m for m in messages[1:])])


def xid_bus(bus: int) -> str:
    """The PCI address as NVRM prints it in Xid lines (no function number)."""
    return f"PCI:0000:{bus:02x}:00"


def pci_addr(bus: int) -> str:
    return f"0000:{bus:02x}:00.0"


def xid(bus: int, code: int, text: str, pid: int | None = None, name: str | None = None) -> str:
    who = f"pid={pid}, name={name}" if pid is not None else "pid='<unknown>', name=<unknown>"
    return f"NVRM: Xid ({xid_bus(bus)}): {code}, {who}, {text}"


def nvlink5_xid(bus: int, code: int, unit: str, *, fatal: bool, link: int, info: int) -> str:
    """A Blackwell NVLink5 Xid (144-150) as the driver logs it on GB200: the unit, its severity, the link, then six
    words of interrupt info (tests/fixtures/logs/xid149_xid145_nvlink5_gb200_gpud_1174.txt)."""
    words = " ".join([f"0x{info:08x}"] + ["0x00000000"] * 5)
    severity = "Fatal" if fatal else "Nonfatal"
    return f"NVRM: Xid ({xid_bus(bus)}): {code}, {unit} {severity} XC0 i0 Link {link:02d} ({words})"


def sxid(chip: int, code: int, *, fatal: bool, link: int, text: str) -> str:
    """An NVSwitch SXid as the nvidia-nvswitch driver logs it on the switch's host (a switch tray, an HGX board)."""
    severity = "Fatal" if fatal else "Non-fatal"
    return f"nvidia-nvswitch{chip}: SXid (PCI:0000:{0x05 + chip:02x}:00.0): {code}, {severity}, Link {link:02d} {text}"


def fallen_off_bus(bus: int, pci_id: str) -> list[str]:
    return [
        f"NVRM: The NVIDIA GPU {pci_addr(bus)}",
        f"NVRM: (PCI ID: {pci_id}) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    ]


def aer_corrected(root_port: str) -> list[str]:
    return [
        f"pcieport {root_port}: AER: Corrected error received: {root_port}",
        f"pcieport {root_port}: PCIe Bus Error: severity=Corrected, type=Data Link Layer, (Transmitter ID)",
        f"pcieport {root_port}:   device [8086:352a] error status/mask=00001000/00002000",
        f"pcieport {root_port}:    [12] Timeout               ",
    ]


# --- training log: PyTorch, NCCL, torchrun ---


def glog(level: str, ts: datetime, tid: int, where: str) -> str:
    """glog/c10 header: `E1122 10:00:00.123456 1234 ProcessGroupNCCL.cpp:632]`."""
    return f"{level}{ts:%m%d %H:%M:%S.%f} {tid} {where}]"


def nccl_ib_error(
    host: str, pid: int, tid: int, dev: int, peer_ip: str, local_ip: str, direction: str, vendor_err: int = 129
) -> list[str]:
    """NCCL's report of an InfiniBand work completion with status 12 (transport retry counter exceeded)."""
    head = f"{host}:{pid}:{tid} [{dev}]"
    opcode, length = (0, 0) if direction == "Recv" else (1, 1048576)
    return [
        f"{head} transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer {peer_ip}<{40000 + dev * 131}> "
        f"with error 12, opcode {opcode}, len {length}, vendor err {vendor_err} ({direction}) "
        f"localGid ::ffff:{local_ip} remoteGids::ffff:{peer_ip}",
        f"{head} NCCL INFO transport/net.cc:1134 -> 6",
        f"{head} NCCL INFO proxy.cc:679 -> 6",
        f"{head} NCCL INFO proxy.cc:858 -> 6 [Proxy Thread]",
    ]


def work_nccl(seq: int, numel: int, timeout_ms: int) -> str:
    return f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, Timeout(ms)={timeout_ms})"


def watchdog_timeout(
    rank: int, ts: datetime, tid: int, seq: int, numel: int, timeout_ms: int, ran_ms: int
) -> list[str]:
    """What ProcessGroupNCCL's watchdog prints before it takes the process down (PyTorch 2.4 shape)."""
    work = work_nccl(seq, numel, timeout_ms)
    caught = (
        f"[Rank {rank}] Watchdog caught collective operation timeout: {work} ran for {ran_ms} milliseconds "
        "before timing out."
    )
    pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}]"

    def c10(where: str) -> str:
        # PyTorch prefixes its C++ log lines with the rank: `[rank5]:[E1122 10:00:00.123456 1234 file:line]`.
        return f"[rank{rank}]:[{glog('E', ts, tid, where)}"

    return [
        f"{c10('ProcessGroupNCCL.cpp:616')} {caught}",
        f"{c10('ProcessGroupNCCL.cpp:1785')} {pg} Exception (either an error or timeout) detected by watchdog at "
        f"work: {seq}, last enqueued NCCL work: {seq + 1}, last completed NCCL work: {seq - 1}.",
        f"{c10('ProcessGroupNCCL.cpp:1834')} {pg} Timeout at NCCL work: {seq}, last enqueued NCCL work: {seq + 1}, "
        f"last completed NCCL work: {seq - 1}.",
        f"{c10('ProcessGroupNCCL.cpp:630')} [Rank {rank}] Some NCCL operations have failed or timed out. Due to the "
        "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        f"{c10('ProcessGroupNCCL.cpp:636')} [Rank {rank}] To avoid data inconsistency, we are taking the entire "
        "process down.",
        f"{c10('ProcessGroupNCCL.cpp:1595')} {pg} Process group watchdog thread terminated with exception: {caught}",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        f"  what():  {pg} Process group watchdog thread terminated with exception: {caught}",
    ]


def _frames(rank: int, frames: Sequence[tuple[str, int, str, str]], exc: Sequence[str]) -> list[str]:
    p = f"[rank{rank}]:"
    out = [f"{p} Traceback (most recent call last):"]
    for path, line, func, code in frames:
        out.append(f'{p}   File "{path}", line {line}, in {func}')
        out.append(f"{p}     {code}")
    out.extend(f"{p} {e}" for e in exc)
    return out


_TRAIN_FRAMES = (
    (TRAIN_SCRIPT, 412, "<module>", "main(parse_args())"),
    (TRAIN_SCRIPT, 398, "main", "train(model, optimizer, loader, args)"),
    (TRAIN_SCRIPT, 311, "train", "loss, grad_norm = train_step(model, optimizer, batch)"),
)


def traceback_user_bug(rank: int) -> list[str]:
    """A shape bug in the model's forward: identical (file, line, message) on every rank."""
    return _frames(
        rank,
        (
            *_TRAIN_FRAMES,
            (TRAIN_SCRIPT, 254, "train_step", "logits = model(batch.tokens, batch.positions)"),
            (
                f"{SITE}/torch/nn/modules/module.py",
                1553,
                "_wrapped_call_impl",
                "return self._call_impl(*args, **kwargs)",
            ),
            (f"{SITE}/torch/nn/modules/module.py", 1562, "_call_impl", "return forward_call(*args, **kwargs)"),
            (MODEL_FILE, 187, "forward", "h = layer(h, freqs_cis[positions])"),
            (MODEL_FILE, 96, "apply_rotary_emb", "return x * cos + rotate_half(x) * sin"),
        ),
        [
            "RuntimeError: The size of tensor a (8192) must match the size of tensor b (4096) at non-singleton "
            "dimension 1",
        ],
    )


def traceback_ecc(rank: int) -> list[str]:
    return traceback_cuda(rank, "uncorrectable ECC error encountered")


def traceback_cuda(rank: int, error: str) -> list[str]:
    """A rank's CUDA error in the backward pass (the error as torch words it, e.g. "unspecified launch failure")."""
    return _frames(
        rank,
        (
            *_TRAIN_FRAMES,
            (TRAIN_SCRIPT, 262, "train_step", "loss.backward()"),
            (f"{SITE}/torch/_tensor.py", 521, "backward", "torch.autograd.backward("),
            (f"{SITE}/torch/autograd/__init__.py", 289, "backward", "_engine_run_backward("),
            (
                f"{SITE}/torch/autograd/graph.py",
                768,
                "_engine_run_backward",
                "return Variable._execution_engine.run_backward(",
            ),
        ),
        [
            f"RuntimeError: CUDA error: {error}",
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
            "might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        ],
    )


def traceback_storage(rank: int, path: str) -> list[str]:
    """A rank's data loader failing to read its shard: the file system answered EIO (a storage outage)."""
    return _frames(
        rank,
        (
            *_TRAIN_FRAMES[:2],
            (TRAIN_SCRIPT, 305, "train", "batch = next(loader_iter)"),
            (f"{SITE}/torch/utils/data/dataloader.py", 631, "__next__", "data = self._next_data()"),
            (f"{SITE}/torch/utils/data/dataloader.py", 675, "_next_data", "data = self._dataset_fetcher.fetch(index)"),
            (DATASET_FILE, 88, "__getitem__", "with open(self.shards[shard], 'rb') as f:"),
        ),
        [f"OSError: [Errno 5] Input/output error: '{path}'"],
    )


def traceback_nccl_remote(rank: int, host: str) -> list[str]:
    return _frames(
        rank,
        (
            *_TRAIN_FRAMES,
            (TRAIN_SCRIPT, 268, "train_step", "dist.all_reduce(grad_norm_sq, group=dp_group)"),
            (f"{SITE}/torch/distributed/c10d_logger.py", 79, "wrapper", "return func(*args, **kwargs)"),
            (
                f"{SITE}/torch/distributed/distributed_c10d.py",
                2288,
                "all_reduce",
                "work = group.allreduce([tensor], opts)",
            ),
        ),
        [
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
            "remote process exited or there was a network error, NCCL version 2.21.5",
            "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
            "Last error:",
            f"NET/IB : Got completion from peer with error 12 (host {host})",
        ],
    )


def torchrun_failure(
    ts: datetime,
    agent_pid: int,
    host: str,
    failures: Sequence[tuple[int, int, int, int]],
    sigterm_pids: Sequence[int],
) -> list[str]:
    """torchrun's teardown: SIGTERM to the survivors, then the ChildFailedError summary.

    failures: (global rank, local rank, exitcode, pid), first observed failure first.
    """
    out = [
        f"{glog('W', ts, agent_pid, 'torch/distributed/elastic/multiprocessing/api.py:897')} "
        f"Sending process {pid} closing signal SIGTERM"
        for pid in sigterm_pids
    ]
    _, local0, code0, pid0 = failures[0]
    out.append(
        f"{glog('E', ts, agent_pid, 'torch/distributed/elastic/multiprocessing/api.py:869')} failed "
        f"(exitcode: {code0}) local_rank: {local0} (pid: {pid0}) of binary: {PYTHON}"
    )
    out += [
        "Traceback (most recent call last):",
        '  File "/usr/local/bin/torchrun", line 8, in <module>',
        "    sys.exit(main())",
        f'  File "{SITE}/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper',
        "    return f(*args, **kwargs)",
        f'  File "{SITE}/torch/distributed/run.py", line 919, in main',
        "    run(args)",
        f'  File "{SITE}/torch/distributed/run.py", line 910, in run',
        "    elastic_launch(",
        f'  File "{SITE}/torch/distributed/launcher/api.py", line 138, in __call__',
        "    return launch_agent(self._config, self._entrypoint, list(args))",
        f'  File "{SITE}/torch/distributed/launcher/api.py", line 269, in launch_agent',
        "    raise ChildFailedError(",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=" * 60,
        "train.py FAILED",
        "-" * 60,
        "Failures:",
    ]
    others = failures[1:]
    if not others:
        out.append("  <NO_OTHER_FAILURES>")
    for i, failure in enumerate(others, start=1):
        out += [f"[{i}]:", *_failure_block(ts, host, *failure)]
    out += ["-" * 60, "Root Cause (first observed failure):", "[0]:", *_failure_block(ts, host, *failures[0])]
    out.append("=" * 60)
    return out


def _failure_block(ts: datetime, host: str, rank: int, local_rank: int, exitcode: int, pid: int) -> list[str]:
    if exitcode < 0:
        sig = {-6: "SIGABRT", -9: "SIGKILL", -15: "SIGTERM"}.get(exitcode, f"SIG{-exitcode}")
        tb = f"Signal {-exitcode} ({sig}) received by PID {pid}"
    else:
        tb = f"To enable traceback see: {ELASTIC_ERRORS_URL}"
    return [
        f"  time      : {ts:%Y-%m-%d_%H:%M:%S}",
        f"  host      : {host}",
        f"  rank      : {rank} (local_rank: {local_rank})",
        f"  exitcode  : {exitcode} (pid: {pid})",
        "  error_file: <N/A>",
        f"  traceback : {tb}",
    ]


def torchrun_restart(ts: datetime, agent_pid: int, restart: int, max_restarts: int) -> str:
    return (
        f"{glog('W', ts, agent_pid, 'torch/distributed/elastic/agent/server/api.py:704')} [default] Worker group "
        f"FAILED. {max_restarts - restart + 1}/{max_restarts} attempts left; will restart worker group"
    )


# --- step lines ---


def megatron_step(
    ts: datetime,
    iteration: int,
    total_iters: int,
    consumed: int,
    step_ms: float,
    tflops: float,
    lr: float,
    global_batch: int,
    loss: float,
    grad_norm: float,
    nan_iters: int,
) -> str:
    """Megatron-LM's training log line (printed by the last rank)."""
    return (
        f" [{ts:%Y-%m-%d %H:%M:%S}] iteration {iteration:>8d}/{total_iters:>8d} |"
        f" consumed samples: {consumed:>12d} |"
        f" elapsed time per iteration (ms): {step_ms:.1f} |"
        f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
        f" learning rate: {lr:.6E} |"
        f" global batch size: {global_batch:>5d} |"
        f" lm loss: {loss:.6E} |"
        f" loss scale: 1.0 |"
        f" grad norm: {grad_norm:.3f} |"
        f" number of skipped iterations:   0 |"
        f" number of nan iterations: {nan_iters:>3d} |"
    )


def simple_step(ts: datetime, rank: int, step: int, loss: float, grad_norm: float, lr: float, step_s: float) -> str:
    """A plain `logging` line from the node's first rank."""
    loss_s = "nan" if math.isnan(loss) else f"{loss:.4f}"
    gn_s = "nan" if math.isnan(grad_norm) else ("inf" if math.isinf(grad_norm) else f"{grad_norm:.4f}")
    return (
        f"{ts:%Y-%m-%d %H:%M:%S},{ts.microsecond // 1000:03d} INFO train.py:297 rank={rank} step={step} "
        f"loss={loss_s} grad_norm={gn_s} lr={lr:.4e} step_time={step_s:.3f}s"
    )


# --- checkpoints, evaluation, restarts (Megatron-LM's print_rank_0 / print_rank_last lines: no timestamp) ---

CHECKPOINT_DIR = "/checkpoints/llm"


def megatron_saving(iteration: int, path: str = CHECKPOINT_DIR) -> str:
    return f"saving checkpoint at iteration {iteration:7d} to {path} in torch_dist format"


def megatron_saved(iteration: int, path: str = CHECKPOINT_DIR) -> str:
    return f"  successfully saved checkpoint from iteration {iteration:7d} to {path} [ t 1/1, p 1/1 ]"


def megatron_timer(name: str, low_ms: float, high_ms: float) -> list[str]:
    """Megatron's timers after a save or an evaluation: min and max across ranks."""
    return [
        "(min, max) time across ranks (ms):",
        f"    {name} {'.' * max(3, 48 - len(name))}: ({low_ms:.2f}, {high_ms:.2f})",
    ]


def megatron_loading(iteration: int, path: str = CHECKPOINT_DIR) -> list[str]:
    return [
        f" loading distributed checkpoint from {path} at iteration {iteration}",
        f"  successfully loaded checkpoint from {path} [ t 1/1, p 1/1 ] at iteration {iteration}",
    ]


def megatron_validation(iteration: int, loss: float) -> list[str]:
    """Megatron's evaluate_and_print_results: the validation loss between two rules of its length."""
    ppl = math.exp(min(20.0, loss))
    text = f" validation loss at iteration {iteration} | lm loss value: {loss:.6E} | lm loss PPL: {ppl:.6E} | "
    rule = "-" * (len(text) + 1)
    return [rule, text, rule]


def torchrun_death_signal(ts: datetime, agent_pid: int, pids: Sequence[int]) -> list[str]:
    """torchrun told to stop (a preemption, a requeue): it passes SIGTERM on to its workers."""
    where = "torch/distributed/elastic/agent/server/api.py:738"
    out = [f"{glog('W', ts, agent_pid, where)} Received Signals.SIGTERM death signal, shutting down workers"]
    out += [
        f"{glog('W', ts, agent_pid, 'torch/distributed/elastic/multiprocessing/api.py:897')} "
        f"Sending process {pid} closing signal SIGTERM"
        for pid in pids
    ]
    return out


def resuming(ts: datetime, rank: int, step: int) -> str:
    return f"{ts:%Y-%m-%d %H:%M:%S},000 INFO train.py:141 rank={rank} resuming from checkpoint at step={step}"


def nccl_async_event(host: str, pid: int, tid: int, dev: int, event: str) -> str:
    """An IB async event NCCL reports as a warning and carries on through (transport/net_ib.cc)."""
    return (
        f"{host}:{pid}:{tid} [{dev}] transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_{dev}:1 Got async event : {event}"
    )
