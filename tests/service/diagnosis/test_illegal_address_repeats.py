"""Issue 41: an illegal memory access with no hardware signal is the application's (restart it, accuse no machine);
the machine becomes the suspect only when it had the same fault alone under other jobs while the other machines of
those jobs did not. Real lines: the CUDA error of tests/fixtures/logs/illegal_memory_access_thc77_detectron2_1439.txt,
in the `[rankN]:` traceback form torchrun's --tee writes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from agents.parsers import parse_text
from agents.parsers.training import TrainingLogParser
from service.config import get_settings
from service.diagnosis import service as diagnosis
from service.jobs import service as jobs
from service.models import Decision, Finding, Incident, Node
from tests import jobs as seeded
from tests import paths

FIXTURE = paths.FIXTURES / "logs" / "illegal_memory_access_thc77_detectron2_1439.txt"
ERROR = next(line for line in FIXTURE.read_text().splitlines() if "illegal memory access was encountered" in line)
TRACEBACK = """[rank{rank}]: Traceback (most recent call last):
[rank{rank}]:   File "/app/train.py", line 88, in <module>
[rank{rank}]:     loss.backward()
[rank{rank}]: RuntimeError: CUDA error: an illegal memory access was encountered
"""


def test_the_fixture_holds_the_real_line() -> None:
    assert "an illegal memory access was encountered" in ERROR


def _store(session: Session, node: str, job: str, rank: int, at: datetime) -> None:
    seeded.store(session, node, job, at, parse_text(TrainingLogParser(), TRACEBACK.format(rank=rank), now=at))


def _job(session: Session, nodes: list[str]) -> str:
    return seeded.register(session, nodes, prefix="iam")


def _decided(session: Session, job: str) -> list[tuple[str, str | None, str]]:
    rows = session.execute(
        select(Decision.kind, Node.name, Incident.blame)
        .join(Incident, Incident.id == Decision.incident_id)
        .outerjoin(Node, Node.id == Decision.node_id)
        .where(Incident.job_id == jobs.get_by_external_id(session, job_id=job).id)
    ).all()
    return sorted((kind, node, blame) for kind, node, blame in rows)


def test_alone_it_restarts_the_application_and_accuses_no_machine(session: Session) -> None:
    nodes = [f"iam-{uuid.uuid4().hex[:6]}-{n}" for n in range(2)]
    job = _job(session, nodes)
    now = datetime.now(UTC)
    _store(session, nodes[1], job, 13, now - timedelta(seconds=20))
    diagnosis.diagnose_job(session, job_id=job, settings=get_settings(), now=now)
    assert _decided(session, job) == [("restart", None, "user_code")]


def test_a_machine_that_had_it_alone_under_another_job_is_diagnosed(session: Session) -> None:
    nodes = [f"iam-{uuid.uuid4().hex[:6]}-{n}" for n in range(2)]
    now = datetime.now(UTC)
    earlier = _job(session, nodes)
    _store(session, nodes[1], earlier, 9, now - timedelta(hours=5))
    job = _job(session, nodes)
    _store(session, nodes[1], job, 13, now - timedelta(seconds=20))
    diagnosis.diagnose_job(session, job_id=job, settings=get_settings(), now=now)
    assert _decided(session, job) == [("diagnose", nodes[1], "infrastructure")]
    finding = session.scalars(
        select(Finding).where(Finding.dedup_key.contains(f"cuda:illegal_address:{nodes[1]}:repeated"))
    ).one()
    assert finding.evidence["repeated_elsewhere"] == [f"job {earlier}"]
    assert "not the code" in finding.summary


def test_a_job_whose_every_machine_had_it_does_not_count_against_one(session: Session) -> None:
    nodes = [f"iam-{uuid.uuid4().hex[:6]}-{n}" for n in range(2)]
    now = datetime.now(UTC)
    earlier = _job(session, nodes)
    # The earlier job's code failed on both machines: its bug, no evidence against either.
    _store(session, nodes[0], earlier, 1, now - timedelta(hours=5))
    _store(session, nodes[1], earlier, 9, now - timedelta(hours=5))
    job = _job(session, nodes)
    _store(session, nodes[1], job, 13, now - timedelta(seconds=20))
    diagnosis.diagnose_job(session, job_id=job, settings=get_settings(), now=now)
    assert _decided(session, job) == [("restart", None, "user_code")]
