"""An incident's life on the real database: one finding per climbing counter, `updated_at` on new evidence only,
and the quiet resolution that depends on it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session

from ml import counters, node_signals, peers, training_metrics
from ml.findings import JobInfo
from ml.metrics import NVLINK_CRC_FLIT_ERRORS
from service.config import get_settings
from service.decisions.lifecycle import acknowledge
from service.diagnosis.service import DiagnosisResult
from service.incidents.service import resolve, resolve_quiet
from service.models import Decision, Finding, Incident, Job
from tests import rows
from tests.decide import decide
from tests.ml.test_ml_node_signals import JOB as NODE_JOB
from tests.ml.test_ml_node_signals import NODES, START, WINDOWS, _frame
from tests.ml.test_ml_peers import JOB as PEER_JOB
from tests.ml.test_ml_peers import NOW as PEER_NOW
from tests.ml.test_ml_peers import frame as peer_frame
from tests.ml.test_ml_training_metrics import JOB as NAN_JOB
from tests.ml.test_ml_training_metrics import START as NAN_START
from tests.ml.test_ml_training_metrics import sim_records

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=5)


def _climbing(job: Job, nodes: list[str], *, bad: str, until: timedelta, stop: timedelta | None = None) -> pd.DataFrame:
    """Every GPU samples its NVLink CRC counter each 10 s; `bad`'s GPU 1 adds 40 errors a sample until `stop`."""
    samples = []
    for step in range(int(until.total_seconds() // 10) + 1):
        ts = T0 + timedelta(seconds=10 * step)
        for node in nodes:
            for gpu in range(2):
                climbing = node == bad and gpu == 1 and (stop is None or ts - T0 <= stop)
                errors = 40 * step if climbing else step // 30
                if node == bad and gpu == 1 and stop is not None and ts - T0 > stop:
                    errors = 40 * int(stop.total_seconds() // 10)
                samples.append({"ts": ts, "node": node, "gpu": gpu, NVLINK_CRC_FLIT_ERRORS: float(errors)})
    return pd.DataFrame(samples)


def _pass(session: Session, job: Job, info: JobInfo, metrics: pd.DataFrame, now: datetime) -> DiagnosisResult:
    """One diagnosis pass's counters over the last window, through the service's store/demarcate/decide step."""
    window = metrics[(metrics["ts"] > now - WINDOW) & (metrics["ts"] <= now)]
    return decide(session, job, counters.detect(info, window, now=now), now)


def _setup(session: Session) -> tuple[Job, JobInfo, list[str]]:
    job = rows.job(session)
    nodes = [rows.node(session).name for _ in range(4)]
    info = JobInfo(job_id=job.external_id, world_size=8, rank_nodes={r: nodes[r // 2] for r in range(8)})
    return job, info, nodes


def test_a_climbing_counter_is_one_finding_updated_pass_after_pass(session: Session) -> None:
    job, info, nodes = _setup(session)
    metrics = _climbing(job, nodes, bad=nodes[2], until=timedelta(minutes=20))
    keys = set()
    for minute in range(5, 21, 1):
        now = T0 + timedelta(minutes=minute)
        window = metrics[(metrics["ts"] > now - WINDOW) & (metrics["ts"] <= now)]
        keys |= {f.key for f in counters.detect(info, window, now=now)}
        _pass(session, job, info, metrics, now)
    assert len(keys) > 5, "the premise: the sliding window gives the detector a new key most passes"

    (finding,) = session.scalars(select(Finding).where(Finding.job_id == job.id, Finding.detector == "counters"))
    assert finding.node_id is not None and finding.category == "nvlink"
    assert finding.observed_at < T0 + timedelta(minutes=1), "first seen stays the first rise"
    assert finding.last_seen_at == T0 + timedelta(minutes=20), "the counter's last rise"
    assert finding.evidence["errors"] >= 40 * 29, "the last pass's count, not the first one's"
    (incident,) = session.scalars(select(Incident).where(Incident.job_id == job.id))
    assert incident.updated_at == T0 + timedelta(minutes=20), "a counter that keeps climbing is new evidence"


def test_updated_at_moves_only_on_new_evidence_and_a_quiet_incident_resolves(session: Session) -> None:
    job, info, nodes = _setup(session)
    stop = timedelta(minutes=6)
    metrics = _climbing(job, nodes, bad=nodes[1], until=timedelta(minutes=40), stop=stop)
    quiet_s = get_settings().incident_quiet_resolve_s
    _pass(session, job, info, metrics, T0 + timedelta(minutes=5))
    (incident,) = session.scalars(select(Incident).where(Incident.job_id == job.id))
    last_evidence = incident.updated_at
    # Passes over a window that still holds the old rise (and then none): nothing new, nothing moves.
    for seconds in range(330, 660, 10):
        result = _pass(session, job, info, metrics, T0 + timedelta(seconds=seconds))
        if seconds > 6 * 60 + 10:
            assert result.new_findings == 0
    assert incident.updated_at <= T0 + stop + timedelta(seconds=20)
    assert incident.updated_at >= last_evidence
    # The beat's quiet resolution: not yet, then once the quiet time has passed since the last evidence.
    # Its decision is still waiting for a scheduler: reject it, as a person would.
    for decision in session.scalars(select(Decision).where(Decision.incident_id == incident.id)):
        decision.state = "rejected"
    session.flush()
    soon = incident.updated_at + timedelta(seconds=quiet_s - 30)
    assert resolve_quiet(session, now=soon, quiet_s=quiet_s) == []
    later = incident.updated_at + timedelta(seconds=quiet_s + 1)
    assert resolve_quiet(session, now=later, quiet_s=quiet_s) == [incident.id]
    assert incident.state == "resolved" and incident.resolution.startswith("quiet")


def test_a_host_pressure_that_persists_is_one_finding_updated_pass_after_pass(session: Session) -> None:
    """Host memory pressure seen pass after pass (the 200-fault campaign stored a row per 10 s pass, ~14 per
    incident): one row, moved to the latest windows."""
    job = rows.job(session)
    for name in NODES:
        rows.node(session, name=name)

    def pressed(node: str, subject: str, i: int, row: dict[str, Any], acc: dict[str, float]) -> None:
        if node == "node-002" and subject == "host" and i >= 10:
            row.update(mem_available_mib=30_000.0, psi_mem_some_avg10=45.0 + i, psi_mem_full_avg10=20.0)

    frame = _frame(pressed)
    keys = set()
    for i in range(15, WINDOWS):
        # Each pass reads the windows up to its time, like the service's cursor.
        now = START + timedelta(seconds=10 * i + 10)
        found = node_signals.detect(NODE_JOB, frame[frame["window_start"] < now - timedelta(seconds=1)], now=now)
        keys |= {f.key for f in found}
        decide(session, job, found, now)
    assert len(keys) > 5, "the premise: the sliding windows give the rule a new key every pass"

    (finding,) = session.scalars(select(Finding).where(Finding.job_id == job.id, Finding.detector == "node_signals"))
    assert finding.category == "host"
    assert finding.last_seen_at == START + timedelta(seconds=10 * (WINDOWS - 1) + 9), "the latest window's end"
    assert finding.evidence["value"] == 45.0 + WINDOWS - 1, "the latest pass's figures"


def test_a_loss_that_stays_nan_is_one_finding_updated_pass_after_pass(session: Session) -> None:
    """A NaN loss read by passes whose window slides over its run of bad steps (the campaign stored a row per pass,
    ~11 per incident): one row, its last bad step moving."""
    job = rows.job(session)
    records = sim_records("nan_loss", 1, until=150.0)
    keys = set()
    for seconds in range(60, 151, 10):
        now = NAN_START + timedelta(seconds=seconds)
        window = [r for r in records if now - timedelta(seconds=40) < r.ts <= now]
        found = training_metrics.detect(NAN_JOB, window)
        keys |= {f.key for f in found}
        decide(session, job, found, now)
    assert len(keys) > 3, "the premise: the sliding window gives the detector a new key most passes"

    query = select(Finding).where(Finding.job_id == job.id, Finding.detector == "training_metrics")
    by_metric = {(f.series_key or "").rsplit(":", 1)[-1]: f for f in session.scalars(query)}
    assert sorted(by_metric) == ["grad_norm", "loss"] and len(session.scalars(query).all()) == 2, "a row per metric"
    last_bad = max(r.ts for r in records if r.fields.get("loss") == "nan")
    assert by_metric["loss"].last_seen_at == last_bad, "the last bad step read"


def test_a_gpu_that_lags_again_in_the_same_long_job_is_a_new_finding_and_incident(session: Session) -> None:
    """The 200-fault campaign missed 4 slow GPUs and runaway loaders: each on a GPU that had been its peers'
    outlier once before in the same weeks-long job. The detectors' keys had no time in them, so the second episode
    was the first one's key, already stored, and stored nothing. Each detector that names a GPU or a rank again."""
    job = rows.job(session)
    for name in ("n0", "n1", "n2", "n3"):
        rows.node(session, name=name)
    data = peer_frame(bad={5: {"power_usage": 0.6}})
    first = decide(session, job, peers.detect(PEER_JOB, data, now=PEER_NOW), PEER_NOW)
    (incident,) = session.scalars(select(Incident).where(Incident.id.in_(first.incidents)))
    resolve(session, incident=incident, resolution="mitigated: evict n2 done", now=PEER_NOW + timedelta(minutes=1))

    later = PEER_NOW + timedelta(hours=2)  # repaired, back in the job, and its GPU lags again
    again = decide(
        session, job, peers.detect(PEER_JOB, data.assign(ts=data["ts"] + timedelta(hours=2)), now=later), later
    )
    assert again.new_findings == 1 and len(again.incidents) == 1 and again.incidents != first.incidents
    rows_of = session.scalars(select(Finding).where(Finding.job_id == job.id, Finding.detector == "peers")).all()
    assert len(rows_of) == 2 and {f.subject for f in rows_of} == {"n2/1"}


def test_an_eviction_settles_the_jobs_other_incidents_about_its_machine(session: Session) -> None:
    """A straggler's diagnose sent a node for its checks; under memory pressure there, it opened an incident of its
    own; the checks' eviction of the node (the first incident's) settles it too. Another node's, or one with a
    decision still waiting, stays open."""
    job = rows.job(session)
    node, other = rows.node(session), rows.node(session)
    first = rows.incident(session, job=job, anchor="", root_cause="straggler", suspects=[node.name])
    pressure = rows.incident(session, job=job, anchor=node.name, root_cause="host", suspects=[node.name], state="open")
    elsewhere = rows.incident(session, job=job, anchor=other.name, root_cause="host", suspects=[other.name])
    waiting = rows.incident(session, job=job, anchor=node.name, root_cause="nvlink", suspects=[node.name])
    rows.decision(session, incident=waiting, node=node, kind="reset_gpu")
    evict = rows.decision(session, incident=first, node=node)

    acknowledge(session, decision_id=evict.id, outcome="done", message="drained", actor="scheduler:s", now=T0,
                settings=get_settings())  # fmt: skip

    session.refresh(pressure)
    assert pressure.state == "resolved"
    assert pressure.resolution == f"mitigated: its machine {node.name} evicted from the job (decision {evict.id})"
    assert [session.get_one(Incident, i.id).state for i in (elsewhere, waiting)] == ["mitigating", "mitigating"]
