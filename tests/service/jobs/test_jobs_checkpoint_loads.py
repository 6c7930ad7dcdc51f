"""The checkpoint a restarted job resumed from (issue 40): a log with load lines and no save lines (Megatron at its
usual verbosity, the demo's trainer) still says which checkpoint each restart went back to, in the ETTR API and on
the job page, where "last checkpoint —" stood beside "resumed at step 6"."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update

from service.models import Job
from tests import rows
from tests.conftest import bearer

T0 = (datetime.now(UTC) - timedelta(hours=1)).replace(microsecond=0)


def _t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _step(seconds: float, step: int) -> dict:  # type: ignore[type-arg]
    line = f" iteration {step:8d}/  500000 | elapsed time per iteration (ms): 10000.0 |"
    return {"ts": _t(seconds).isoformat(), "source": "training", "kind": "step", "line": line, "rank": 0,
            "severity": "debug", "fields": {"step": step, "total": 500000}}  # fmt: skip


# Steps 1-10 every 10 s, no save line; the job fails at 105 s; at 195 s the restarted job loads step 5's checkpoint
# (the agent's checkpoint_loaded event for Megatron's "successfully loaded checkpoint ... at iteration 5") and
# logs step 6 at 200 s, back at 10 at 240 s, 11 at 250 s.
LOAD = {
    "ts": _t(195).isoformat(),
    "source": "training",
    "kind": "checkpoint_loaded",
    "line": "  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 5",
    "fields": {"framework": "megatron", "step": 5, "path": "/ckpt"},
}
LOGS = [_step(10 * k, k) for k in range(1, 11)] + [LOAD] + [_step(200 + 10 * i, 6 + i) for i in range(6)]


@pytest.fixture
def stored(client, session, make_token) -> Job:  # type: ignore[no-untyped-def]
    batch = {"batch_id": str(uuid.uuid4()), "node": "load-node-1", "sent_at": datetime.now(UTC).isoformat(),
             "job_id": "load-42", "logs": LOGS}  # fmt: skip
    response = client.post("/api/v1/ingest", json=batch, headers=bearer(make_token("agent")))
    assert response.status_code == 200, response.text
    job = session.scalar(select(Job).where(Job.external_id == "load-42"))
    assert job is not None
    session.execute(update(Job).where(Job.id == job.id).values(created_at=T0, state="finished", last_seen_at=_t(260)))
    rows.incident(session, job=job, opened_at=_t(105), resolved_at=_t(260), state="resolved")
    session.flush()
    session.expire_all()
    return job


def test_the_checkpoint_a_restart_loaded_is_the_one_it_resumed_from(client, stored, make_token) -> None:  # type: ignore[no-untyped-def]
    body = client.get("/api/v1/jobs/load-42/ettr", headers=bearer(make_token("scheduler"))).json()
    assert body["checkpoints"] == 1 and body["last_checkpoint_step"] == 5
    (restart,) = body["restarts"]
    assert (restart["from_step"], restart["to_step"], restart["checkpoint_step"]) == (10, 6, 5)
    (loss,) = body["incidents"]
    # Redone: steps 6-10, back from the loaded checkpoint of step 5, as if its save line had been read.
    assert (loss["step_reached"], loss["resumed_step"], loss["checkpoint_step"], loss["steps_redone"]) == (10, 6, 5, 5)


def test_the_job_page_shows_it(ui, stored) -> None:  # type: ignore[no-untyped-def]
    page = ui.get("/jobs/load-42").text
    assert "last checkpoint 5" in page and "last checkpoint —" not in page


@pytest.mark.parametrize("step", ["5", -1, 2.5, True])
def test_a_load_event_with_a_bad_step_is_422(client, make_token, step) -> None:  # type: ignore[no-untyped-def]
    event = {**LOAD, "fields": {"step": step}}
    batch = {"batch_id": str(uuid.uuid4()), "node": "load-node-1", "sent_at": datetime.now(UTC).isoformat(),
             "job_id": "load-43", "logs": [event]}  # fmt: skip
    response = client.post("/api/v1/ingest", json=batch, headers=bearer(make_token("agent")))
    assert response.status_code == 422 and "checkpoint_loaded" in response.text
