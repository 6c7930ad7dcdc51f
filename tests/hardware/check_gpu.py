"""Checks of the agent on a real NVIDIA GPU host, for what no test here can show (no GPU in CI).

Run on a host with a GPU, PyTorch (CUDA), CuPy and the agent's dependencies, from a source checkout:

    python tests/hardware/check_gpu.py OUT_DIR [STEP,...]

It writes, each step's result to OUT_DIR and a summary to stdout:
1. `nvml_fields.json`: what the agent's NVML reader (agents/nvml.py) ships for every GPU, idle and under a
   matrix-product load (GPM activity, PCIe throughput and link, clock event reasons, remapped rows, NVLink),
   the readings the driver answered NotSupported, and the reader's own CPU and wall time per read;
   `nvml_call_costs.json` the wall time of each NVML function per read (step `nvml_call_costs`); step
   `nvml_events` prints which NVML event types the GPU supports and what arrives around a faulting kernel.
2. `xid_agent.jsonl`, `xid_kernel.txt` (the agents' own logs in `agents.log`): a CUDA kernel writes to an
   unmapped address (an MMU fault, Xid 31 on the driver's side); the agent, run with `--nvml-xid on --dry-run`,
   must ship the Xid from NVML's event API, and the kernel log (when readable) is saved beside it to compare.
3. `job_agent.jsonl`, `job_stacks.json`, `job.log`: a real two-rank torchrun job on the GPU
   (lab/evaluation/torchjob/train.py --device cuda) whose rank 1 hangs; the agent (`--once --dry-run`)
   reports its processes and progress, and py-spy (agents/stacks.py) dumps both ranks' stacks.
One run's files, from an H200, are tests/fixtures/hardware/h200/ (its README says how they were made); tests
replay them into the service.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEVICE = os.environ.get("FAULTLINE_CHECK_DEVICE", "cuda")  # "cpu" tries the job step without a GPU
sys.path.insert(0, str(REPO))

# A write far outside any allocation: the GPU's MMU faults and the driver reports an Xid (31 on Hopper).
_BAD_WRITE = r"""
import cupy
kernel = cupy.RawKernel(r'''
extern "C" __global__ void bad(int* p) { p[(1ull << 38) + threadIdx.x] = 1; }
''', "bad")
p = cupy.zeros(32, dtype=cupy.int32)
kernel((1,), (32,), (p,))
cupy.cuda.runtime.deviceSynchronize()
"""

# Real GPU work while the reader reads: the activity counters must move.
_LOAD = r"""
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    a = torch.tanh(a @ a)
    torch.cuda.synchronize()
"""


def _agent(*args: str) -> list[str]:
    return [sys.executable, "-m", "faultline", "agent", "--node-name", "gpu-host", "--log-level", "info", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def nvml_fields(out: Path) -> None:
    import pynvml

    from agents.nvml import open_nvml
    from lab.bench.agent import nvml_source_cost

    notes: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            notes.append(record.getMessage())

    logging.getLogger("agents").addHandler(Keep())
    logging.getLogger("agents").setLevel(logging.DEBUG)
    reader = open_nvml()
    assert reader is not None, "NVML found no GPU"
    driver = getattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "?")()
    idle = [asdict(r) for r in reader.read()]
    load = subprocess.Popen([sys.executable, "-c", _LOAD, "12"])
    time.sleep(6)
    reader.clock = lambda: time.monotonic() + 3600  # the slow readings are due again
    busy = [asdict(r) for r in reader.read()]
    load.wait()
    reader.close()
    cost = nvml_source_cost(gpus=0, sample_interval=1.0, seconds=30, real=True)
    result = {
        "driver": driver,
        "idle": idle,
        "busy": busy,
        "reader_notes": notes,
        "reader_cost": cost,
    }
    (out / "nvml_fields.json").write_text(json.dumps(result, indent=1, default=str))
    for r in idle:
        print(f"idle GPU {r['gpu']}: {sum(v is not None for v in r['fields'].values())} fields")
    for r in busy:
        shown = {k.removeprefix("DCGM_FI_"): v for k, v in r["fields"].items() if v is not None}
        print(f"busy GPU {r['gpu']} ({r['model']}): {len(shown)} fields: {shown}")
    print("reader notes:", *notes, sep="\n  ")
    print("reader cost:", cost)


def nvml_call_costs(out: Path) -> None:
    """Wall time of each NVML function over 30 reads of the agent's reader (the slow readings in proportion)."""

    import pynvml

    from agents.nvml import Nvml

    spent: dict[str, list[float]] = {}

    class Timed:
        def __getattr__(self, name: str) -> Any:
            value = getattr(pynvml, name)
            if not (name.startswith("nvml") and callable(value) and not isinstance(value, type)):
                return value

            def timed(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return value(*args, **kwargs)
                finally:
                    spent.setdefault(name, []).append(time.perf_counter() - t0)

            return timed

    pynvml.nvmlInit()
    reader = Nvml(Timed(), pynvml.nvmlDeviceGetCount())
    clock = [time.monotonic()]
    reader.clock = lambda: clock[0]
    reader.read()
    spent.clear()
    for _ in range(30):
        clock[0] += 1.0
        reader.read()
    reader.close()
    rows = sorted(((sum(v) / 30 * 1000, len(v) / 30, k) for k, v in spent.items()), reverse=True)
    (out / "nvml_call_costs.json").write_text(json.dumps(rows, indent=1))
    print("ms per read, calls per read, function:")
    for ms, calls, name in rows:
        print(f"  {ms:8.3f} {calls:5.1f}  {name}")


def nvml_events(out: Path) -> None:
    """NVML's event API alone: which event types the GPU supports, and what arrives around a faulting kernel."""
    import pynvml as nv

    nv.nvmlInit()
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    supported = nv.nvmlDeviceGetSupportedEventTypes(handle)
    print(f"supported event types: {supported:#x} (Xid critical: {nv.nvmlEventTypeXidCriticalError:#x})")
    events = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(handle, supported, events)
    bad = subprocess.Popen([sys.executable, "-c", _BAD_WRITE], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 12
    seen = []
    while time.monotonic() < deadline:
        try:
            data = nv.nvmlEventSetWait_v2(events, 500)
        except nv.NVMLError_Timeout:
            continue
        seen.append({"type": data.eventType, "data": data.eventData, "gi": data.gpuInstanceId})
    bad.wait()
    nv.nvmlEventSetFree(events)
    nv.nvmlShutdown()
    print("events seen:", seen)


def xid(out: Path) -> None:
    spool = out.parent / "spool-xid"
    log = open(out / "agents.log", "ab")  # noqa: SIM115
    agent = subprocess.Popen(
        _agent("--dry-run", "--nvml-xid", "on", "--kmsg", "none", "--ship-interval", "1", "--spool-dir", str(spool)),
        stdout=open(out / "xid_agent.jsonl", "wb"),  # noqa: SIM115
        stderr=log,
        env=_env(),
    )
    time.sleep(8)
    bad = subprocess.run([sys.executable, "-c", _BAD_WRITE], capture_output=True, text=True, check=False)
    print("bad write exited", bad.returncode, bad.stderr.strip().splitlines()[-1:] if bad.stderr else "")
    time.sleep(6)
    agent.send_signal(signal.SIGTERM)
    agent.wait(timeout=30)
    kernel = subprocess.run(["dmesg"], capture_output=True, text=True, check=False)
    lines = [line for line in kernel.stdout.splitlines() if "NVRM" in line or "Xid" in line]
    (out / "xid_kernel.txt").write_text("\n".join(lines[-50:]) + ("\n" if lines else kernel.stderr))
    events = [
        e
        for line in (out / "xid_agent.jsonl").read_text().splitlines()
        if line.startswith("{")
        for e in json.loads(line).get("logs", [])
    ]
    print(f"agent shipped {len(events)} events:", [(e.get("kind"), e.get("source"), e.get("line")) for e in events])
    print("kernel log:", lines[-5:] or kernel.stderr.strip())


def job(out: Path) -> None:
    from agents.stacks import dump_all

    train = REPO / "service" / "evaluation" / "torchjob" / "train.py"
    env = {**_env(), "FAULTLINE_JOB_ID": "gpu-job", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:"}
    log_path = out / "job.log"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--tee", "3",
         "--master-port", "29517", str(train), "--device", DEVICE, "--step-time", "0.2",
         "--hang-rank", "1", "--hang-at-step", "25", "--timeout", "600"],
        stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True,  # noqa: SIM115
    )  # fmt: skip
    try:
        time.sleep(30)  # about 20 steps at 0.2 s, then the hang
        ranks = _ranks(launcher.pid)
        print("ranks:", ranks)
        stacks = dump_all(
            [{"pid": pid, "rank": rank, "job_id": "gpu-job"} for rank, pid in sorted(ranks.items())],
            directive_id="gpu-check",
            timeout=20,
        )
        (out / "job_stacks.json").write_text(json.dumps(stacks, indent=1))
        for item in stacks:
            main = [t for t in item.get("threads", []) if t.get("thread_name") == "MainThread"][:1]
            frames = [f["name"] for t in main for f in t.get("frames", [])[:6]]
            print(f"rank {item['rank']} (pid {item['pid']}): {frames or item.get('error')}")
        agent = subprocess.run(
            _agent("--once", "--dry-run", "--from-start", "--kmsg", "none", "--watch-pid", str(launcher.pid),
                   "--log", str(log_path), "--spool-dir", str(out.parent / "spool-job")),
            capture_output=True, env=env, timeout=120, check=False,
        )  # fmt: skip
        (out / "job_agent.jsonl").write_bytes(agent.stdout)
        with open(out / "agents.log", "ab") as log:
            log.write(agent.stderr[-20000:])
        batches = [json.loads(line) for line in agent.stdout.decode().splitlines() if line.startswith("{")]
        summary: dict[str, Any] = {
            "batches": len(batches),
            "samples": sum(len(b.get("samples", [])) for b in batches),
            "processes": [p for b in batches for p in b.get("processes", [])][:4],
            "logs": [(e.get("kind"), e.get("line", "")[:80]) for b in batches for e in b.get("logs", [])][:10],
        }
        print("agent on the job:", json.dumps(summary, default=str)[:3000])
    finally:
        for pid in [*_ranks(launcher.pid).values(), launcher.pid]:  # workers may sit in sessions of their own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        launcher.wait()


def _ranks(launcher: int) -> dict[int, int]:
    """{rank: pid} of the job's workers, from their environment."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = dict(item.split(b"=", 1) for item in (proc / "environ").read_bytes().split(b"\0") if b"=" in item)
        except OSError:
            continue
        if env.get(b"FAULTLINE_JOB_ID") == b"gpu-job" and b"RANK" in env and int(proc.name) != launcher:
            found[int(env[b"RANK"])] = int(proc.name)
    return found


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-check")
    out.mkdir(parents=True, exist_ok=True)
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else None
    steps = [s for s in (nvml_fields, nvml_call_costs, nvml_events, xid, job) if names is None or s.__name__ in names]
    failed = 0
    for step in steps:
        print(f"\n== {step.__name__}", flush=True)
        started = time.monotonic()
        try:
            step(out)
        except Exception as exc:  # each step's result stands alone: one failing must not hide the others
            failed += 1
            print(f"{step.__name__} FAILED: {type(exc).__name__}: {exc}", flush=True)
        print(f"({time.monotonic() - started:.1f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
