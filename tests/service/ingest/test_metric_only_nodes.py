"""Nodes that only have dcgm-exporter: their GPU samples reach the job through the exporter's labels or the
registered rank map (no batch job, no training process), and counter faults are found from them with any
optional field absent."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from agents.agent import _sample
from agents.gpu import parse_exporter
from ml.windows import floor_time
from service.config import get_settings
from service.diagnosis import service as diagnosis
from service.ingest.schemas import IngestBatch
from service.ingest.service import UpsertCache, store_batches
from service.jobs import service as jobs
from service.jobs.schemas import JobIn
from service.jobs.signal_sources import job_signal_sources
from service.models import Decision, Finding, Job, Node, NodeEvent, metric_samples
from tests.conftest import bearer

GPUS = 2
# dcgm-exporter's default field list, plus the optional counters its file leaves commented out (ECC volatile,
# NVLink errors): a node may report any subset of OPTIONAL.
ALWAYS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP")
OPTIONAL = (
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
Fault = Callable[[str, int, float, dict[str, float]], None]


def _page(node: str, values: dict[int, dict[str, float]], labels: dict[int, str]) -> str:
    """The node's /metrics page in dcgm-exporter 3.x's label set (gpu, UUID, device, modelName, Hostname)."""
    lines = []
    for field in (*ALWAYS, *OPTIONAL):
        lines.append(f"# TYPE {field} gauge")
        for gpu, fields in values.items():
            if field in fields:
                extra = labels.get(gpu, "")
                lines.append(
                    f'{field}{{gpu="{gpu}",UUID="GPU-{node}-{gpu}",device="nvidia{gpu}",'
                    f'modelName="NVIDIA H100 80GB HBM3",Hostname="{node}"{extra}}} {fields[field]}'
                )
    return "\n".join(lines) + "\n"


def _batches(
    nodes: list[str],
    start: datetime,
    seconds: int,
    *,
    fault: Fault | None = None,
    absent: tuple[str, ...] = (),
    labels: Callable[[str, int], str] | None = None,
) -> list[IngestBatch]:
    """Every 5 s, one batch per node as an agent with only --dcgm-url ships it: no job, no processes."""
    totals = {(n, g): dict.fromkeys(OPTIONAL, 0.0) for n in nodes for g in range(GPUS)}
    batches = []
    for t in range(0, seconds, 5):
        ts = start + timedelta(seconds=t)
        for node in nodes:
            values = {}
            for gpu in range(GPUS):
                acc = totals[(node, gpu)]
                acc["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] += 1 if (t // 5 + gpu) % 7 == 0 else 0  # a little noise
                gauges = {"DCGM_FI_DEV_GPU_UTIL": 98.0, "DCGM_FI_DEV_SM_CLOCK": 1980.0,
                          "DCGM_FI_DEV_POWER_USAGE": 650.0, "DCGM_FI_DEV_GPU_TEMP": 60.0}  # fmt: skip
                if fault is not None:
                    fault(node, gpu, t, acc)  # the counters accumulate what the fault adds
                values[gpu] = {k: v for k, v in (gauges | acc).items() if k not in absent}
            readings = parse_exporter(_page(node, values, {g: labels(node, g) for g in range(GPUS)} if labels else {}))
            batches.append(
                IngestBatch.model_validate(
                    {
                        "batch_id": str(uuid.uuid4()),
                        "node": node,
                        "sent_at": ts,
                        "heartbeat": {"gpus": [r.inventory() for r in readings]},
                        "metrics": [_sample(ts.isoformat(), r) for r in readings],
                    }
                )
            )
    return batches


def _register(session: Session, nodes: list[str], **extra: Any) -> Job:
    ranks = [
        {"rank": r, "node": n, "local_rank": g} for r, (n, g) in enumerate((n, g) for n in nodes for g in range(GPUS))
    ]
    return jobs.register(
        session,
        job_in=JobIn.model_validate(
            {
                "job_id": f"dcgm-{uuid.uuid4().hex[:8]}",
                "world_size": max(len(ranks), 8),
                "ranks": ranks or None,
                **extra,
            }
        ),
    )


def _nodes(count: int = 4) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"dcgm-{tag}-{n:03d}" for n in range(count)]


def _store(session: Session, batches: list[IngestBatch]) -> None:
    store_batches(session, batches=batches, cache=UpsertCache())
    session.flush()


def _jobs_of_samples(session: Session, node: str) -> dict[int, set[int | None]]:
    rows = session.execute(
        select(metric_samples.c.gpu, metric_samples.c.job_id)
        .join(Node, Node.id == metric_samples.c.node_id)
        .where(Node.name == node)
    ).all()
    out: dict[int, set[int | None]] = {}
    for gpu, job in rows:
        out.setdefault(gpu, set()).add(job)
    return out


def test_the_registered_rank_map_attributes_a_node_without_processes(session: Session) -> None:
    nodes = _nodes(2)
    job = _register(session, nodes)
    now = datetime.now(UTC)
    _store(session, _batches(nodes, now - timedelta(seconds=10), 10))
    assert _jobs_of_samples(session, nodes[0]) == {0: {job.id}, 1: {job.id}}
    session.refresh(job)
    assert job.last_seen_at is not None
    assert {session.scalar(select(Node.current_job_id).where(Node.name == n)) for n in nodes} == {job.id}


def test_by_gpu_two_jobs_on_one_node_and_the_newer_registration_wins(session: Session) -> None:
    (node,) = _nodes(1)
    placements = [{"rank": 0, "node": node, "gpu": 0}, {"rank": 1, "node": node, "gpu": 1}]
    first = jobs.register(session, job_in=JobIn(job_id=f"a-{uuid.uuid4().hex[:6]}", world_size=2, ranks=placements))
    later = [{"rank": 0, "node": node, "gpu": 1}]
    second = jobs.register(session, job_in=JobIn(job_id=f"b-{uuid.uuid4().hex[:6]}", world_size=1, ranks=later))
    newer = func.now() + timedelta(seconds=1)  # one transaction: now() is the same for both registrations
    session.execute(Job.__table__.update().where(Job.id == second.id).values(updated_at=newer))
    _store(session, _batches([node], datetime.now(UTC) - timedelta(seconds=5), 5))
    assert _jobs_of_samples(session, node) == {0: {first.id}, 1: {second.id}}


def test_a_node_evicted_after_its_placement_or_a_finished_job_attributes_nothing(session: Session) -> None:
    nodes = _nodes(2)
    job = _register(session, nodes)
    evicted = session.scalar(select(Node).where(Node.name == nodes[1]))
    assert evicted is not None
    evicted.state = "healthy"  # evicted, repaired, back: out of the job until a registration names it again
    session.add(NodeEvent(node_id=evicted.id, kind="state", from_state="healthy", to_state="evicted", actor="test",
                          source="decision_ack", at=datetime.now(UTC) + timedelta(seconds=1)))  # fmt: skip
    session.flush()
    now = datetime.now(UTC)
    _store(session, _batches(nodes, now - timedelta(seconds=5), 5))
    assert _jobs_of_samples(session, nodes[0]) == {0: {job.id}, 1: {job.id}}
    assert _jobs_of_samples(session, nodes[1]) == {0: {None}, 1: {None}}
    job.state = "finished"
    session.flush()
    (other,) = _nodes(1)
    _register(session, [other]).state = "finished"
    session.flush()
    _store(session, _batches([other], now, 5))
    assert _jobs_of_samples(session, other) == {0: {None}, 1: {None}}


def test_exporter_labels_name_the_job_before_the_rank_map(session: Session) -> None:
    nodes = _nodes(2)
    mapped = _register(session, nodes)  # the map says these nodes are `mapped`'s...
    pods = _register(session, [], pods={"namespace": "ml", "prefix": f"llama-{mapped.id}-"})
    hpc = _register(session, [], scheduler_job_id=f"81{mapped.id}")

    def labels(node: str, gpu: int) -> str:  # ...but the exporter says who holds each GPU now
        if node == nodes[0]:
            return f',container="trainer",namespace="ml",pod="llama-{mapped.id}-worker-{gpu}"'
        return f',hpc_job="81{mapped.id}"' if gpu == 0 else ',container="",namespace="",pod=""'

    _store(session, _batches(nodes, datetime.now(UTC) - timedelta(seconds=5), 5, labels=labels))
    assert _jobs_of_samples(session, nodes[0]) == {0: {pods.id}, 1: {pods.id}}
    assert _jobs_of_samples(session, nodes[1]) == {0: {hpc.id}, 1: {mapped.id}}  # a blank label names nobody


def test_a_batch_naming_its_job_keeps_it(session: Session) -> None:
    nodes = _nodes(1)
    _register(session, nodes)
    own = _register(session, [])
    batches = _batches(nodes, datetime.now(UTC) - timedelta(seconds=5), 5)
    _store(session, [b.model_copy(update={"job_id": own.external_id}) for b in batches])
    assert _jobs_of_samples(session, nodes[0]) == {0: {own.id}, 1: {own.id}}


def _nvlink(bad: str) -> Fault:
    def fault(node: str, gpu: int, t: float, values: dict[str, float]) -> None:
        if node == bad and gpu == 1 and t >= 60 and "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" in values:
            values["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] += 40
            values["DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"] += 15

    return fault


def _pcie(bad: str) -> Fault:
    def fault(node: str, gpu: int, t: float, values: dict[str, float]) -> None:
        if node == bad and gpu == 0 and t >= 60 and "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" in values:
            values["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] += 30

    return fault


def _remapped_row(bad: str) -> Fault:
    def fault(node: str, gpu: int, t: float, values: dict[str, float]) -> None:
        if node == bad and gpu == 1 and t == 120 and "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS" in values:
            values["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] += 1  # one row, no remap failure, no ECC counter

    return fault


_CRC = ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL")
FAULTS: dict[str, tuple[Callable[[str], Fault], tuple[str, ...]]] = {
    "nvlink_crc": (_nvlink, _CRC),
    "pcie_replay": (_pcie, ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",)),
    "remapped_row": (_remapped_row, ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",)),
}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "absent"),
    [(kind, field) for kind, (_, needs) in FAULTS.items() for field in OPTIONAL if field not in needs],
)
def test_a_counter_fault_is_found_whatever_optional_counter_is_absent(session: Session, kind: str, absent: str) -> None:
    """Issue 30: an unreported counter made the pre-filter's sum NULL, so the node was never looked at closely."""
    nodes = _nodes(4)
    bad = nodes[2]
    job = _register(session, nodes)
    now = floor_time(datetime.now(UTC))
    make, _ = FAULTS[kind]
    _store(session, _batches(nodes, now - timedelta(seconds=240), 240, fault=make(bad), absent=(absent,)))
    diagnosis.diagnose_job(session, job_id=job.external_id, settings=get_settings(), now=now)
    found = session.scalars(select(Finding).where(Finding.job_id == job.id, Finding.detector == "counters")).all()
    bad_id = session.scalar(select(Node.id).where(Node.name == bad))
    assert found and {f.node_id for f in found} == {bad_id}
    decided = session.scalars(select(Decision).where(Decision.job_id == job.id)).all()
    assert decided and {d.node_id for d in decided} == {bad_id}


def test_the_job_and_incident_pages_say_which_signals_a_metric_only_job_lacks(session: Session, ui: Any) -> None:
    nodes = _nodes(4)
    job = _register(session, nodes)
    now = floor_time(datetime.now(UTC))
    _store(session, _batches(nodes, now - timedelta(seconds=240), 240, fault=_nvlink(nodes[1])))
    diagnosis.diagnose_job(session, job_id=job.external_id, settings=get_settings(), now=now)
    sources = {s.name: s.present for s in job_signal_sources(session, job=job)}
    assert sources == {
        "GPU counters (dcgm-exporter or NVML)": True,
        "machine metrics (network ports, host)": False,
        "training log": False,
        "training processes": False,
    }
    page = ui.get(f"/jobs/{job.external_id}").text
    signals = page.split('id="job-signals"', 1)[1].split("</dd>", 1)[0]
    assert "training log: none" in signals and "no step source: hang detection reads only GPU activity" in signals
    incident = session.scalars(select(Finding.incident_id).where(Finding.job_id == job.id)).first()
    assert incident is not None
    shown = ui.get(f"/incidents/{incident}").text.split('id="incident-signals"', 1)[1].split("</dd>", 1)[0]
    assert "training processes: none" in shown and "no stacks can be dumped" in shown


def test_the_api_registers_and_returns_the_workload_selectors_and_refuses_bad_ones(
    client: Any, make_token: Any, session: Session
) -> None:
    headers = bearer(make_token("scheduler"))
    name = f"api-{uuid.uuid4().hex[:6]}"
    body = {"job_id": name, "world_size": 8, "pods": {"namespace": "ml", "prefix": "llama-"}, "scheduler_job_id": "42"}
    response = client.post("/api/v1/jobs", json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert (response.json()["pods"], response.json()["scheduler_job_id"]) == (
        {"namespace": "ml", "prefix": "llama-"},
        "42",
    )
    for bad in (
        {"pods": {"namespace": "ml"}},
        {"pods": {"namespace": "ml", "prefix": "a b"}},
        {"scheduler_job_id": ""},
    ):
        refused = client.post("/api/v1/jobs", json={**body, "job_id": f"{name}-x", **bad}, headers=headers)
        assert refused.status_code == 422, (bad, refused.text)
    assert session.scalar(select(func.count()).select_from(Job).where(Job.external_id == f"{name}-x")) == 0
