"""`faultline eval --campaign --chaos`: the campaign with the service's hops made real and its processes killed at
random moments (lab/evaluation/chaos.py), to show that nothing is lost and nothing decided twice.

What changes from the calm campaign (lab/evaluation/campaign.py):
- The service runs as its own processes: embedded PostgreSQL and Redis in the data folder, the API (`faultline
  serve`) and a Celery worker (lab/evaluation/chaos_worker.py: `faultline work`'s tasks with results kept).
- The agents' batches go over HTTP through the agent's own spool and shipper (agents/spool.py, agents/shipper.py):
  a batch the API does not take (down, or answering 503 while PostgreSQL is) stays spooled and is sent again.
  Each batch id the agents made is counted as sent; the service's `agent_batches` rows are what was stored.
- Each diagnosis pass is asked of the worker over Redis with the simulated `now` (the harness keeps the clock,
  as the calm campaign does) and waited for; a pass lost with its worker (or Redis) is asked again, and the lost
  copy is redelivered by Celery (late acknowledgement) when the worker is back: the pass is idempotent, so it
  must decide nothing twice. The API's own critical-event triggers would run passes at the wall clock's now on
  simulated data: they go to a Redis database no worker reads.
- The harness's own steps as the scheduler and the operator (acknowledging decisions, registering rank maps,
  silences, the minute's maintenance) use the database too: they wait while PostgreSQL is down.

Reported beside the calm run's figures (`--calm FILE`, a calm campaign's JSON): batches sent and stored, duplicate
decisions, recall and time to decision, and every blow with its moment.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from celery import Celery
from sqlalchemy import select

from lab.evaluation import chaos as chaos_mod
from lab.evaluation.campaign import CAMPAIGN_POLICY, Campaign
from lab.evaluation.chaos import Chaos, Target
from lab.evaluation.chaos_worker import POLICY_ENV
from lab.evaluation.ettr_projection import project_report
from lab.evaluation.soak import JobRun, Soak
from lab.evaluation.soak_config import SoakConfig
from service.config import Settings
from service.db import session_scope
from service.ingest.schemas import IngestBatch
from service.models import AgentBatch, Decision, Job

SHIP_WAIT_S = 20.0  # wall seconds a ship tick waits for the spool to empty before the campaign goes on
PASS_WAIT_S = 30.0  # wall seconds a pass is waited for before it is asked again
PASS_ATTEMPTS = 6
UP_WAIT_S = 180.0  # wall seconds to wait for a killed target's restart
FINAL_DRAIN_S = 120.0
DUPLICATE_WINDOW_S = 120.0  # two decisions of one kind on one machine this close: the same fault decided twice
SHIP_BACKOFF_S = 2.0  # the shipper's longest wait between tries (the agent's default 30 s would outlast a blow)


class _RemotePasses(Soak):
    """The soak's pass, asked of the worker instead of run in-process (the campaign's `_pass` acts on its result)."""

    celery: Celery
    chaos: Chaos
    pass_stats: dict[str, int]

    def _pass(self, run: JobRun, now: datetime, *, fast: bool) -> None:
        name = "diagnosis.diagnose_events" if fast else "diagnosis.diagnose_job"
        began = time.perf_counter()
        out = None
        self.pass_stats["asked"] += 1
        for _ in range(PASS_ATTEMPTS):
            for target in ("postgres", "redis", "worker"):
                self.chaos.up[target].wait(UP_WAIT_S)
            try:
                result = self.celery.send_task(name, args=[run.job_id], kwargs={"now": now.isoformat()})
                out = self._wait(result.id)
                break
            except Exception as exc:  # the worker, Redis or PostgreSQL went down under it: ask again
                self.pass_stats["retried"] += 1
                self.say(f"chaos: pass of {run.job_id} at {now:%H:%M:%S} failed ({type(exc).__name__}); again")
                self.celery = _client(self.celery.conf.broker_url)  # fresh connections (Redis may be a new one)
        if out is None:
            self.pass_stats["lost"] += 1
        else:
            self._note_pass(run, now, out, fast=fast, began=began)
        self._poll_decisions(run, now)

    def _poll_decisions(self, run: JobRun, now: datetime) -> None:
        """The job's decisions the harness has not heard of, as a scheduler polling the API finds them: a pass whose
        answer was lost with its worker may have committed one, and its second run finds it already made."""
        self.chaos.db_up.wait(UP_WAIT_S)
        with session_scope() as session:
            ids = session.scalars(
                select(Decision.id)
                .join(Job, Job.id == Decision.job_id)
                .where(Job.external_id == run.job_id, Decision.id.not_in(run.decision_times or {0}))
            ).all()
        t = (now - self.start).total_seconds()
        for decision_id in ids:
            self.pass_stats["decisions_found_by_polling"] += 1
            run.decision_times.setdefault(decision_id, t)

    def _wait(self, task_id: str) -> dict[str, Any]:
        """The pass's result; TimeoutError after PASS_WAIT_S, or as soon as a blow took down what it needs.

        The result key is read, not subscribed to: a subscription left behind by a Redis that was killed under it
        fails at exit."""
        deadline = time.monotonic() + PASS_WAIT_S
        while True:
            meta = self.celery.backend.get_task_meta(task_id)
            if meta["status"] == "SUCCESS":
                return dict(meta["result"])
            if meta["status"] in ("FAILURE", "REVOKED"):
                raise RuntimeError(f"the pass failed: {meta.get('result')!r}")
            needed = all(self.chaos.up[t].is_set() for t in ("postgres", "redis", "worker"))
            if time.monotonic() > deadline or not needed:
                raise TimeoutError("no answer")
            time.sleep(0.05)

    def _note_pass(self, run: JobRun, now: datetime, out: dict[str, Any], *, fast: bool, began: float) -> None:
        run.pass_s += time.perf_counter() - began
        if fast:
            run.fast_passes += 1
        else:
            run.passes += 1
        t = (now - self.start).total_seconds()
        for decision_id in out.get("decisions", []):
            run.decision_times.setdefault(int(decision_id), t)


class ChaosCampaign(Campaign, _RemotePasses):
    """The campaign in one process against the service's own processes, with `chaos` dealing its blows."""

    def __init__(
        self,
        config: SoakConfig,
        settings: Settings,
        *,
        faults: int,
        say: Callable[[str], None],
        chaos: Chaos,
        api_url: str,
        agent_token: str,
        broker_url: str,
        spool_dir: Path,
        service_checks: bool = True,
    ) -> None:
        super().__init__(config, settings, faults=faults, say=say, service_checks=service_checks)
        from agents.shipper import Shipper
        from agents.spool import Spool

        self.chaos = chaos
        self.celery = _client(broker_url)
        self.pass_stats = {"asked": 0, "retried": 0, "lost": 0, "decisions_found_by_polling": 0}
        self.sent: list[uuid.UUID] = []
        self.spool = Spool(spool_dir, max_bytes=1 << 30, max_batches=1_000_000)
        self.shipper = Shipper(
            self.spool, server=api_url, token=agent_token, on_directives=lambda _d: None, max_backoff=SHIP_BACKOFF_S
        )
        self.ship_waits = 0  # ship ticks that went on with batches still spooled

    # -- the service's hops, made real --

    def _store(self, raw: list[dict[str, Any]], batches: list[IngestBatch]) -> None:
        for b in raw:
            self.sent.append(uuid.UUID(str(b["batch_id"])))
            counts = {k: len(b.get(k) or ()) for k in ("metrics", "node_metrics", "logs", "stacks", "processes")}
            self.spool.put(gzip.compress(orjson.dumps(b), compresslevel=1), counts)
        deadline = time.monotonic() + SHIP_WAIT_S
        while len(self.spool) and time.monotonic() < deadline:
            time.sleep(0.01)
        if len(self.spool):
            self.ship_waits += 1

    # -- the harness's own database steps wait for PostgreSQL --

    def _tick(self, t: float, now: datetime) -> None:
        self.chaos.due(t)
        self.chaos.db_up.wait(UP_WAIT_S)
        super()._tick(t, now)

    def _advance(self, run: JobRun, t: float, now: datetime) -> None:
        self.chaos.db_up.wait(UP_WAIT_S)
        super()._advance(run, t, now)

    def _ship(self, now: datetime, **kw: Any) -> None:
        self.chaos.db_up.wait(UP_WAIT_S)  # the stack requests are read from the database
        super()._ship(now, **kw)

    def _maintenance(self, now: datetime) -> None:
        self.chaos.db_up.wait(UP_WAIT_S)
        super()._maintenance(now)

    # -- the run --

    def run(self) -> dict[str, Any]:
        shipping = threading.Thread(target=self.shipper.run, name="agent-shipper", daemon=True)
        shipping.start()
        try:
            return super().run()
        finally:
            self.shipper.stopping.set()
            shipping.join(30)
            self.shipper.close()

    def report(self) -> dict[str, Any]:
        self.chaos.wait_idle()
        self.chaos.db_up.wait(UP_WAIT_S)
        deadline = time.monotonic() + FINAL_DRAIN_S
        while len(self.spool) and time.monotonic() < deadline:
            time.sleep(0.2)
        with session_scope() as session:
            stored = set(
                session.scalars(select(AgentBatch.batch_id).where(AgentBatch.batch_id.in_(self.sent))).all()
            )  # fmt: skip
        report = super().report()
        report["chaos"] = {
            "blows": list(self.chaos.log),
            "blows_scheduled": len(self.chaos.blows),
            "batches_sent": len(self.sent),
            "batches_stored": len(stored),
            "batches_lost": len(set(self.sent) - stored),
            "batches_still_spooled": len(self.spool),
            "ship_ticks_left_spooled": self.ship_waits,
            "passes": dict(self.pass_stats),
        }
        return report


# -- the service's processes --


@contextlib.contextmanager
def chaos_service(
    data_dir: Path, *, port: int, say: Callable[[str], None]
) -> Iterator[tuple[dict[str, Target], str, str, str]]:
    """Embedded PostgreSQL and Redis, migrated; the API and the chaos worker: the targets, the API's URL, an agent
    token and the broker's URL. Stopped after."""
    from service.embedded import start_redis
    from service.processes import wait_healthy
    from service.stack import Services
    from service.tokens import service as tokens

    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    services = Services(logs=logs, say=say)
    try:
        services.start_embedded(data_dir, port=port)
        services.migrate()
        with session_scope() as session:
            agent_token = tokens.create(session, scope="agent", name="faultline-chaos").token
        assert services.redis is not None and services.pg is not None
        broker = services.redis.url
        # The API's own critical-event triggers would run passes at the wall clock's now: a database nobody reads.
        api_env = {**services.env, "FAULTLINE_REDIS_URL": broker.rsplit("/", 1)[0] + "/1"}
        url = f"http://127.0.0.1:{port}"
        api = services.spawn("api", ["faultline", "serve", "--port", str(port)], env=api_env)
        policy = json.dumps(CAMPAIGN_POLICY)  # the campaign's policy, for the worker's passes too
        services.spawn("worker", ["lab.evaluation.chaos_worker"], env={**services.env, POLICY_ENV: policy})
        wait_healthy(url, api, log=logs / "api.log")
        redis_port = int(broker.rsplit(":", 1)[1].split("/")[0])
        pg = services.pg

        def child(name: str) -> Any:
            return next(c for n, c in services.children if n == name)

        def respawn(name: str) -> int:
            services.children = [(n, c) for n, c in services.children if n != name]
            args, env = services.specs[name]
            process = services.spawn(name, args, env)
            if name == "api":
                wait_healthy(url, process, log=logs / "api.log")
            return process.pid

        def kill_redis() -> int:
            assert services.redis is not None
            process = services.redis.process
            process.kill()  # SIGKILL
            process.wait(timeout=30)
            return process.pid

        def restart_redis() -> int:
            services.redis = start_redis(data_dir, port=redis_port)
            return services.redis.process.pid

        targets = {
            "worker": Target("worker", lambda: chaos_mod.kill_group(child("worker")), lambda: respawn("worker")),
            "api": Target("api", lambda: chaos_mod.kill_group(child("api")), lambda: respawn("api")),
            "redis": Target("redis", kill_redis, restart_redis),
            "postgres": Target(
                "postgres",
                lambda: chaos_mod.stop_postgres_immediately(Path(pg.server.pgdata)),
                lambda: chaos_mod.restart_postgres(pg.server),
            ),
        }
        yield targets, url, agent_token, broker
    finally:
        services.stop()


def _client(broker_url: str) -> Celery:
    """The harness's handle on the worker's queues: sends by task name, reads results (lab/evaluation/chaos_worker)."""
    app = Celery("faultline-chaos", broker=broker_url, backend=broker_url)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_routes={"diagnosis.*": {"queue": "diagnosis"}},
        broker_connection_retry_on_startup=False,
        broker_connection_max_retries=2,
        redis_socket_timeout=5,
        redis_socket_connect_timeout=2,
    )
    return app


def run_chaos_campaign(
    config: SoakConfig,
    settings_of: Callable[[], Settings],
    *,
    faults: int,
    data_dir: Path,
    port: int,
    blows: int,
    say: Callable[[str], None],
    service_checks: bool = True,
) -> dict[str, Any]:
    """One job group in this process, the service in its own; the scored report with its `chaos` section."""
    from lab.evaluation.campaign_report import scored

    span = (60.0, max(120.0, 120.0 * faults / max(1, len(config.jobs))))  # most of a campaign (~170 s a fault)
    blow_list = chaos_mod.schedule(config.seed, blows=blows, span_s=span)
    with chaos_service(data_dir, port=port, say=say) as (targets, url, token, broker):
        chaos = Chaos(blow_list, targets, say=say)
        say(f"chaos: {len(blow_list)} blows at t = " + ", ".join(f"{b.t_s:.0f}s {b.target}" for b in blow_list))
        campaign = ChaosCampaign(
            config, settings_of(), faults=faults, say=say, chaos=chaos, api_url=url, agent_token=token,
            broker_url=broker, spool_dir=data_dir / "spool", service_checks=service_checks,
        )  # fmt: skip
        report = scored(campaign.run())
    report["chaos"]["duplicate_decisions"] = duplicate_decisions(report["decisions"])
    return report


# -- the figures --


def duplicate_decisions(decisions: Sequence[Mapping[str, Any]], window_s: float = DUPLICATE_WINDOW_S) -> list[int]:
    """Ids of decisions that repeat one made within `window_s` (simulated) before: same job, machine and kind."""
    last: dict[tuple[Any, Any, Any], float] = {}
    out = []
    for d in sorted(decisions, key=lambda d: (d["t_s"], d["id"])):
        if d["node"] is None:
            continue
        key = (d["job_id"], d["node"], d["kind"])
        if key in last and d["t_s"] - last[key] <= window_s:
            out.append(d["id"])
        last[key] = d["t_s"]
    return out


def comparison(chaos: Mapping[str, Any], calm: Mapping[str, Any] | None) -> list[tuple[str, Any, Any]]:
    """(figure, calm, chaos) rows; calm None when no calm run was given."""

    def figures(r: Mapping[str, Any]) -> dict[str, Any]:
        t = r["totals"]
        # A calm JSON saved before the projection was reported has its measured times all the same.
        projection = r.get("ettr_projection") or (project_report(r) if r.get("faults") else None) or {}
        return {
            "faults": t["faults"],
            "recall (localizable)": t["recall"],
            "recall (all)": t["recall_all"],
            "time to decision median s": t["median_s"],
            "time to decision p95 s": t["p95_s"],
            "false accusations": t["false_accusations"],
            "decisions": t["decisions"],
            "incidents per fault": t["incidents_per_fault"],
            "duplicate decisions": len(duplicate_decisions(r["decisions"])),
            "projected ETTR (16k GPUs)": projection.get("ettr"),
        }

    mine = figures(chaos)
    theirs = figures(calm) if calm is not None else {}
    return [(k, theirs.get(k), v) for k, v in mine.items()]


def format_chaos(report: Mapping[str, Any], calm: Mapping[str, Any] | None) -> str:
    c = report["chaos"]
    lines = [
        f"chaos: {len(c['blows'])} of {c['blows_scheduled']} blows dealt; batches sent {c['batches_sent']}, stored "
        f"{c['batches_stored']}, lost {c['batches_lost']} ({c['batches_still_spooled']} still spooled at the end); "
        f"passes asked {c['passes']['asked']}, asked again {c['passes']['retried']}, lost {c['passes']['lost']}; "
        f"duplicate decisions {len(c['duplicate_decisions'])}",
        f"  {'t (sim)':>8} {'target':<9} {'killed at (UTC)':<30} {'pid':>8} {'down s':>6} {'start s':>9}",
    ]
    for b in c["blows"]:
        lines.append(
            f"  {b['tick_s']:>8.0f} {b['target']:<9} {b['killed_at']:<30} {b.get('pid') or '-':>8} "
            f"{b['down_s']:>6.1f} {b.get('restart_took_s', 0.0):>9.1f}" + (f"  {b['error']}" if "error" in b else "")
        )
    lines.append(f"  {'figure':<28} {'calm':>10} {'chaos':>10}")
    for name, before, after in comparison(report, calm):
        lines.append(f"  {name:<28} {_cell(before):>10} {_cell(after):>10}")
    if calm is None:
        lines.append("  (no calm run given: --calm FILE for the calm campaign's figures)")
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def load_calm(path: Path | None) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path is not None else None
