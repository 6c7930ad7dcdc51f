"""The agent's real output on an NVIDIA H200 (tests/fixtures/hardware/h200, see its README) through the service.

Batches are posted byte for byte as `faultline agent --dry-run` wrote them; the only thing widened is the
service's ingest time window, so that readings recorded on 2026-11-26 stay acceptable however old they get.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from ml import stacks
from ml.metrics import FIELD_TO_COLUMN, clock_event_flags
from service.config import Settings, get_settings
from service.diagnosis import signals, stack_requests
from service.directives.service import request_stack_dump
from service.models import Directive, Job
from tests.conftest import bearer, count
from tests.paths import FIXTURES

H200 = FIXTURES / "hardware" / "h200"
NODE = "gpu-host"
JOB = "gpu-job"
CENTURY_S = 100 * 365 * 86400.0


def _batches(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (H200 / name).read_text().splitlines() if line.strip()]


def _settings() -> Settings:
    return get_settings().model_copy(update={"ingest_max_age_s": CENTURY_S})


@pytest.fixture
def app(factory: sessionmaker[Session]) -> Any:
    from service.app import create_app

    return create_app(_settings(), factory=factory)


@pytest.fixture
def agent(make_token: Any) -> dict[str, str]:
    return bearer(make_token("agent", node=NODE))


def _post_all(client: Any, batches: list[dict[str, Any]], headers: dict[str, str]) -> list[str]:
    statuses = []
    for payload in batches:
        response = client.post("/api/v1/ingest", json=payload, headers=headers)
        assert response.status_code == 200, response.text
        statuses.append(response.json()["status"])
    return statuses


def _of_this_node(session: Session, table: str) -> int:
    """Rows of the recording's node only: tests that commit may leave other nodes' rows behind."""
    query = f"SELECT count(*) FROM {table} t JOIN nodes n ON n.id = t.node_id WHERE n.name = 'gpu-host'"
    return int(session.execute(text(query)).scalar_one())


@pytest.mark.parametrize("name", ["xid_agent.jsonl", "job_agent.jsonl"])
def test_every_real_batch_is_stored_once_with_every_nvml_field_in_its_column(
    client: Any, session: Session, agent: dict[str, str], name: str
) -> None:
    batches = _batches(name)
    assert _post_all(client, batches, agent) == ["accepted"] * len(batches)
    # The agent's spool resends a batch it got no answer for: the second copy changes nothing.
    assert _post_all(client, batches, agent) == ["duplicate"] * len(batches)
    assert count(session, "agent_batches") == len(batches)
    sent = [m for b in batches for m in b["metrics"]]
    assert _of_this_node(session, "metric_samples") == len(sent)
    assert _of_this_node(session, "log_events") == sum(len(b["logs"]) for b in batches)
    assert _of_this_node(session, "node_samples") == sum(len(b["node_metrics"]) for b in batches)

    columns = sorted({FIELD_TO_COLUMN[f] for m in sent for f in m["fields"]})
    rows = session.execute(text(f"SELECT ts, gpu, extra, {', '.join(columns)} FROM metric_samples ORDER BY ts"))
    stored = rows.mappings().all()
    for sample, row in zip(sorted(sent, key=lambda m: m["ts"]), stored, strict=True):
        assert row["extra"] is None, row["extra"]  # no real field fell outside the known columns
        assert row["gpu"] == sample["gpu"] == 0
        for field, value in sample["fields"].items():
            assert row[FIELD_TO_COLUMN[field]] == (pytest.approx(value) if value is not None else None), field
        assert 0.0 <= row["sm_active"] <= 1.0
        assert clock_event_flags(row["clock_event_reasons"]) in ([], ["gpu_idle"])
    # Slow fields (PCIe link, row remapping, energy) are read every 10 s, so not every sample carries them.
    links = {
        (r["pcie_link_gen"], r["pcie_link_width"], r["pcie_max_link_gen"], r["pcie_max_link_width"]) for r in stored
    }
    assert links - {(None, None, None, None)} == {(5, 16, 5, 16)}

    gpu = session.execute(text("SELECT index, uuid, pci_bus_id, model FROM gpus")).one()
    assert tuple(gpu) == (0, "GPU-6a914832-41b4-1d2c-f8f3-579c123df910", "00000000:00:06.0", "NVIDIA H200")


def test_the_nvml_xid_31_is_stored_as_an_xid_event(client: Any, session: Session, agent: dict[str, str]) -> None:
    _post_all(client, _batches("xid_agent.jsonl"), agent)
    event = session.execute(text("SELECT source, kind, severity, line, fields FROM log_events")).one()
    assert (event.source, event.kind, event.severity) == ("nvml", "xid", "error")
    assert (event.fields["xid"], event.fields["pci"]) == (31, "0000:00:06")
    assert event.fields["mnemonic"] == "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT"
    assert event.line == "NVRM: Xid (PCI:0000:00:06): 31, (from NVML event)"


def test_the_jobs_ranks_and_step_lines_are_stored_against_the_job(
    client: Any, session: Session, agent: dict[str, str]
) -> None:
    _post_all(client, _batches("job_agent.jsonl"), agent)
    job = session.execute(text("SELECT id, world_size, source FROM jobs WHERE external_id = :j"), {"j": JOB}).one()
    assert (job.world_size, job.source) == (2, "agent")
    ranks = session.execute(
        text("SELECT r.rank, n.name, r.pid FROM ranks r JOIN nodes n ON n.id = r.node_id WHERE r.job_id = :j"),
        {"j": job.id},
    )
    assert sorted(map(tuple, ranks)) == [(0, NODE, 578), (1, NODE, 579)]
    procs = session.execute(text("SELECT rank, pid, job_id, state FROM process_snapshots ORDER BY rank")).all()
    assert [tuple(p) for p in procs] == [(0, 578, job.id, "S"), (1, 579, job.id, "S")]
    # Rank 1 hangs at step 25: both ranks' lines reach step 24, every one of them filed under the job.
    steps = session.execute(
        text(
            "SELECT rank, count(*), max((fields->>'step')::int), bool_and(job_id = :j) FROM log_events"
            " WHERE kind = 'step' GROUP BY rank ORDER BY rank"
        ),
        {"j": job.id},
    ).all()
    assert [tuple(s) for s in steps] == [(0, 24, 24, True), (1, 24, 24, True)]


def test_real_py_spy_dumps_single_out_the_rank_stuck_in_data_loading(
    client: Any, session: Session, agent: dict[str, str]
) -> None:
    _post_all(client, _batches("job_agent.jsonl"), agent)
    job = session.scalars(select(Job).where(Job.external_id == JOB)).one()
    directive = request_stack_dump(session, job=job, requested_by="test", reason="hang", ttl_s=60, purpose="hang")
    dumps = json.loads((H200 / "job_stacks.json").read_text())
    # check_gpu.py dumped the ranks itself, under the placeholder request id "gpu-check"; an agent answering
    # the service puts the request's id there, which is all that differs from how the dumps arrive.
    answer = {
        "batch_id": str(uuid.uuid4()),
        "node": NODE,
        "sent_at": max(d["ts"] for d in dumps),
        "job_id": JOB,
        "stacks": [{**d, "directive_id": str(directive.id)} for d in dumps],
    }
    assert _post_all(client, [answer], agent) == ["accepted"]

    samples = signals.stack_samples_for(session, directive_ids=[directive.id])[directive.id]
    analysis = stacks.analyze(signals.job_info(session, job=job), samples)
    # Two ranks make two groups of one; the group waiting in a collective is taken as the healthy one
    # (ml/stacks/analysis.py, _groups), so rank 1, elsewhere while rank 0 waits, is the culprit.
    assert analysis.dominant_state == stacks.COLLECTIVE
    assert [g.op for g in analysis.groups] == [
        "all_reduce (torch/distributed/distributed_c10d.py)",
        "_stuck_in_data_loading (train.py)",
    ]
    assert analysis.culprit_ranks == [1]
    assert (analysis.culprit_state, analysis.culprit_frames[0]) == (stacks.DATA, "_stuck_in_data_loading (train.py)")
    assert analysis.method == "named" and [s[0] for s in analysis.suspects] == [NODE]

    # The service's own passes say the same: the first look asks for a second one (a hang persists), which the
    # same stuck ranks answer the same way, and that one names the machine.
    info, settings = signals.job_info(session, job=job), _settings()
    later = directive.created_at + timedelta(seconds=settings.hang_confirm_s)
    (held,) = stack_requests.aggregate(session, job=job, info=info, settings=settings, now=later)[0]
    assert held.subject_kind == "job" and held.action == "none" and NODE in held.summary
    second = session.scalars(select(Directive).where(Directive.campaign_id == directive.id)).one()
    answer = {**answer, "batch_id": str(uuid.uuid4()), "stacks": [{**d, "directive_id": str(second.id)} for d in dumps]}
    assert _post_all(client, [answer], agent) == ["accepted"]
    found, _ = stack_requests.aggregate(session, job=job, info=info, settings=settings, now=later)
    named = [f for f in found if f.subject_kind == "node"]
    assert [f.subject for f in named] == [NODE], found
    assert "rank 1 in data loading (_stuck_in_data_loading)" in named[0].summary


def test_every_field_the_real_nvml_reader_produced_is_one_the_service_stores() -> None:
    readings = json.loads((H200 / "nvml_fields.json").read_text())
    idle, busy = readings["idle"][0]["fields"], readings["busy"][0]["fields"]
    assert len(busy) == 30 and set(idle) == set(busy)
    assert set(busy) - set(FIELD_TO_COLUMN) == set()
    asked = {
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_ROW_REMAP_PENDING": 0,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
        "DCGM_FI_DEV_PCIE_LINK_GEN": 5,
        "DCGM_FI_DEV_PCIE_LINK_WIDTH": 16,
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": 5,
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": 16,
    }
    assert {f: busy.get(f) for f in asked} == asked
    # Under bf16 matrix products the GPU capped its clocks for power (bit 0x4); idle, it reported idle (0x1).
    assert clock_event_flags(busy["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]) == ["sw_power_cap"]
    assert clock_event_flags(idle["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]) == ["gpu_idle"]
    # GPM activity is a fraction: busy, each is read and above zero; idle, DRAM activity may be unreadable (NaN).
    for field in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"):
        assert 0.0 < busy[field] <= 1.0, field
        assert math.isnan(idle[field]) or 0.0 <= idle[field] <= 1.0, field
    # Hopper remaps rows instead of retiring pages: the reader notes it and sends no retired-page field.
    assert not any("RETIRED" in f for f in busy)
    assert any("RetiredPages answers Not Supported" in note for note in readings["reader_notes"])
