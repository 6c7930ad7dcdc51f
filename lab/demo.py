"""`faultline demo`: embedded PostgreSQL and Redis, the API, a worker, beat and a simulated cluster in one command."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from service.embedded import port_is_free
from service.processes import stop
from service.stack import Services

DEMO_JOB = "demo-job"


def _say(message: str) -> None:
    _print(f"[faultline demo] {message}")


def _print(text: str) -> None:
    # Best effort: when the terminal or a `| tee` is gone, stopping the services matters more.
    with contextlib.suppress(OSError):
        print(text, flush=True)


def _demo_tokens(data_dir: Path) -> dict[str, str]:
    """Tokens printed at every start: created once, kept (mode 0600) in the data folder."""
    from service.db import session_scope
    from service.security import find_by_token
    from service.tokens import service as tokens

    path = data_dir / "demo-tokens.json"
    saved: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    with session_scope() as session:
        for scope in ("agent", "operator", "scheduler", "admin"):
            record = find_by_token(session, token=saved[scope]) if scope in saved else None
            if record is None or record.revoked_at is not None:
                saved[scope] = tokens.create(session, scope=scope, name=f"demo-{scope}").token
    path.write_text(json.dumps(saved, indent=2))
    path.chmod(0o600)
    return saved


def policy_env(*, simulate: bool, scheduler: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """Policy settings the demo sets for its services, unless the caller's environment sets them."""
    out: dict[str, str] = {}
    if simulate and scheduler and "FAULTLINE_POLICY_MAX_EVICT_SHARE_PER_HOUR" not in environ:
        # A fault every few minutes is months of a real fleet's: at the default 25% of the job's nodes per
        # hour, every eviction after the first would wait for a person, and the loop would stop.
        out["FAULTLINE_POLICY_MAX_EVICT_SHARE_PER_HOUR"] = "1.0"
    if (
        simulate
        and not scheduler
        and not {"FAULTLINE_POLICY_MODE", "FAULTLINE_POLICY_APPROVAL_REQUIRED_FOR"} & set(environ)
    ):
        # --approvals: a person stands where the scheduler would, so evictions and GPU resets wait for their
        # Approve or Reject in the UI (pending ones offer only Reject, and no adapter runs to take them).
        out["FAULTLINE_POLICY_APPROVAL_REQUIRED_FOR"] = '["evict", "reset_gpu"]'
    return out


def run_demo(
    *,
    data_dir: Path,
    port: int,
    simulate: bool,
    nodes: int,
    gpus_per_node: int,
    fault_after: float = 60.0,
    fault_every: float = 180.0,
    scheduler: bool = True,
    spares: int = 2,
    repair_time: float = 300.0,
    duration: float | None = None,
) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    logs = data_dir / "logs"
    logs.mkdir(exist_ok=True)
    services = Services(logs=logs, say=_say)
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        started = time.monotonic()
        if not port_is_free(port):
            raise RuntimeError(f"port {port} is already in use; choose another with --port")
        _say(f"data folder {data_dir}")
        services.start_embedded(data_dir, port=port)
        services.migrate()
        tokens = _demo_tokens(data_dir)

        services.env.update(policy_env(simulate=simulate, scheduler=scheduler, environ=os.environ))
        url = services.start_processes(port)
        # Set before the sim starts: its own bound (the same duration, for its fault plan) then ends after this one.
        deadline = None if duration is None else time.monotonic() + duration
        if simulate:
            # A simulated cluster: per node a dcgm-exporter endpoint, kernel and training logs, rank
            # processes and a real agent; a fault every FAULT_EVERY seconds, repaired before the next.
            sim = [
                "faultline", "sim", "--scenario", "demo", "--server", url,
                "--nodes", str(nodes), "--gpus-per-node", str(gpus_per_node), "--dir", str(data_dir / "sim"),
                "--fault-after", str(fault_after), "--fault-every", str(fault_every), "--job-id", DEMO_JOB,
                "--spares", str(spares), "--repair-time", str(repair_time),
            ]  # fmt: skip
            if duration is not None:  # no fault it would end before seeing through (lab/sim/scenarios.py)
                sim += ["--duration", str(duration)]
            env = {**services.env, "FAULTLINE_AGENT_TOKEN": tokens["agent"]}
            env.pop("FAULTLINE_SCHEDULER_TOKEN", None)
            if scheduler:  # the stand-in: the real scheduler API's long poll and acks, the simulated cluster acts
                env["FAULTLINE_SCHEDULER_TOKEN"] = tokens["scheduler"]
            services.spawn("sim", sim, env=env)

        _say(f"ready in {time.monotonic() - started:.1f} s")
        decisions = (
            "a scheduler stand-in acts on them (evict or diagnose: a spare swapped in, the job restarted from\n"
            "               its checkpoint; reset_gpu: the GPU reset) and acknowledges; --approvals turns it off"
            if simulate and scheduler
            else f"{url}/api/v1/decisions?state=pending&wait=30 (long poll, scheduler token), or try an\n"
            f"               adapter: FAULTLINE_TOKEN=<scheduler token> faultline adapter slurm --url {url} --dry-run"
        )
        cluster = (
            f"{nodes} simulated nodes x {gpus_per_node} GPUs running job {DEMO_JOB} and {spares} idle spare(s), "
            f"one agent each;\n               a fault after {fault_after:g} s, then every {fault_every:g} s\n"
            f"               (injections: {logs / 'sim.log'}; ground truth: {data_dir / 'sim' / 'ground_truth.json'})"
            if simulate
            else "none (--no-sim): point agents at the API with the agent token"
        )
        _print(
            f"""
  web UI       {url}/   (sign in with the operator or admin token below)
  API          {url}   (OpenAPI docs: {url}/docs, health: {url}/healthz)
  agent token     {tokens["agent"]}
  operator token  {tokens["operator"]}
  scheduler token {tokens["scheduler"]}
  admin token     {tokens["admin"]}
  logs         {logs}/ (api, worker, beat{", sim" if simulate else ""})
  cluster      {cluster}
  decisions    {decisions}

  Other commands reach this database with --data-dir {data_dir}
  {"Stops after " + _hms(duration) + " with a summary" if duration else "Press Ctrl-C to stop"}.
"""
        )
        while not stopping and (deadline is None or time.monotonic() < deadline):
            if (exited := services.exited()) is not None:
                name, code = exited
                if services.restart(name):
                    # A dead worker must not take diagnosis down with it: its unacknowledged task comes back
                    # after the broker's visibility timeout, and the periodic pass finds the job before that.
                    _say(f"{name} exited with code {code}; restarted it (see {logs / (name + '.log')})")
                    continue
                _say(f"{name} exited with code {code}; see {logs / (name + '.log')}; stopping")
                return 1
            time.sleep(0.5)
        if simulate:
            _summary(services, data_dir)
        return 0
    except RuntimeError as exc:
        _say(f"error: {exc}")
        return 1
    finally:
        _say("stopping ...")
        services.stop()
        _say("stopped")


def _hms(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m{s:02d}s" if minutes >= 60 else f"{minutes}m{s:02d}s"


def _summary(services: Services, data_dir: Path) -> None:
    """Stop the simulator (its ground truth final), then print what the run did."""
    from datetime import UTC, datetime

    from lab.demo_summary import format_summary, read_summary
    from service.db import session_scope

    for name, child in services.children:
        if name == "sim":
            stop(child)
    path = data_dir / "sim" / "ground_truth.json"
    try:
        truth = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        _say(f"no summary: cannot read {path} ({exc})")
        return
    with session_scope() as session:
        summary = read_summary(session, ground_truth=truth, job_id=DEMO_JOB, now=datetime.now(UTC))
    (data_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _print(f"\nsummary of the run ({data_dir / 'summary.json'}):\n{format_summary(summary)}\n")
