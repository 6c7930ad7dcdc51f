"""Evidence bundles in the service: asked on an evict/diagnose decision, delivered as a `bundle` directive, uploaded
with the agent token (size cap, auth), listed, downloaded, "agent unreachable" past the deadline, pruned."""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.bundles import service as bundles
from service.config import get_settings
from service.models import Directive, EvidenceBundle, Job
from tests import rows
from tests.conftest import bearer
from tests.decide import decide, finding
from tests.factories import batch

NODE = "gpu-node-017"


def _tarball(manifest: dict[str, Any] | None = None, *, files: dict[str, bytes] | None = None) -> bytes:
    manifest = manifest or {
        "format": 1,
        "node": NODE,
        "parts": [{"name": "kernel_log", "file": "kernel.log", "status": "ok", "bytes": 5, "seconds": 0.01}],
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in {"manifest.json": orjson.dumps(manifest), **(files or {"kernel.log": b"Xid\n"})}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _evict(session: Session, *, state: str = "pending", kind: str = "evict") -> tuple[Any, Any, Any]:
    job = rows.job(session, "llm-pretrain-42")
    node = rows.node(session, NODE)
    incident = rows.incident(session, job=job, suspects=[NODE])
    decision = rows.decision(session, incident=incident, node=node, kind=kind, state=state)
    return incident, node, decision


def test_an_evict_decision_sends_a_bundle_directive_to_its_node_agent(
    session: Session, client: TestClient, make_token: Any
) -> None:
    job = Job(external_id="llm-pretrain-42", source="registered", world_size=16)
    session.add(job)
    rows.node(session, NODE)
    session.flush()
    now = datetime.now(UTC)
    result = decide(session, job, [finding(NODE, detector="xid", category="gpu_hardware", at=now, key="x1")], now)
    assert result.decisions, "the finding decides an eviction"

    [bundle] = session.scalars(select(EvidenceBundle)).all()
    directive = session.get_one(Directive, bundle.id)
    decision_id = result.decisions[0]
    assert bundle.decision_id == decision_id and bundle.state == "requested"
    assert directive.kind == "bundle" and directive.node_id == bundle.node_id
    settings = get_settings()
    assert directive.params == {
        "decision_id": decision_id,
        "max_bytes": settings.bundle_max_bytes,
        "timeout_s": settings.bundle_timeout_s,
    }
    wait = settings.bundle_timeout_s + settings.bundle_grace_s
    assert abs((bundle.deadline_at - bundle.requested_at).total_seconds() - wait) < 1

    # The node's agent gets it with its next ingest answer (node-addressed: no job needed).
    answer = client.post("/api/v1/ingest", json=batch(NODE, job_id=None), headers=bearer(make_token("agent")))
    assert answer.status_code == 200, answer.text
    [sent] = [d for d in answer.json()["directives"] if d["kind"] == "bundle"]
    assert sent["id"] == str(bundle.id) and sent["decision_id"] == decision_id
    assert sent["max_bytes"] == settings.bundle_max_bytes
    other = client.post("/api/v1/ingest", json=batch("gpu-node-018", job_id=None), headers=bearer(make_token("agent")))
    assert not [d for d in other.json()["directives"] if d["kind"] == "bundle"], "only the decision's node"


@pytest.mark.parametrize(("kind", "state"), [("evict", "shadow"), ("reset_gpu", "pending"), ("restart", "pending")])
def test_no_bundle_for_decisions_that_do_not_take_the_node_out(session: Session, kind: str, state: str) -> None:
    job = rows.job(session)
    node = rows.node(session)
    incident = rows.incident(session, job=job, suspects=[node.name])
    decision = rows.decision(
        session, incident=incident, node=node, kind=kind, state=state, gpu=0 if kind == "reset_gpu" else None
    )
    assert bundles.request_for(session, decisions=[decision], now=datetime.now(UTC), settings=get_settings()) == []
    assert session.scalars(select(EvidenceBundle)).all() == []


def test_bundles_switched_off_ask_nothing(session: Session) -> None:
    _, _, decision = _evict(session)
    off = get_settings().model_copy(update={"bundle_enabled": False})
    assert bundles.request_for(session, decisions=[decision], now=datetime.now(UTC), settings=off) == []
    assert session.scalars(select(Directive).where(Directive.kind == "bundle")).all() == []


def test_asking_twice_for_one_decision_asks_once(session: Session) -> None:
    _, _, decision = _evict(session, kind="diagnose")
    now = datetime.now(UTC)
    settings = get_settings()
    assert len(bundles.request_for(session, decisions=[decision], now=now, settings=settings)) == 1
    assert bundles.request_for(session, decisions=[decision], now=now, settings=settings) == []
    assert len(session.scalars(select(Directive).where(Directive.kind == "bundle")).all()) == 1


def test_an_upload_is_stored_listed_and_downloaded(session: Session, client: TestClient, make_token: Any) -> None:
    incident, _, decision = _evict(session)
    [asked] = bundles.request_for(session, decisions=[decision], now=datetime.now(UTC), settings=get_settings())
    agent = bearer(make_token("agent", node=NODE))
    body = _tarball()

    put = client.put(f"/api/v1/nodes/{NODE}/bundles/{asked.id}", content=body, headers=agent)
    assert put.status_code == 201, put.text
    out = put.json()
    assert out["state"] == "stored" and out["size_bytes"] == len(body)
    assert out["manifest"]["parts"][0]["name"] == "kernel_log"
    assert out["status"].startswith("stored ") and out["seconds_after_decision"] >= 0

    reader = bearer(make_token("operator"))
    [listed] = client.get(f"/api/v1/incidents/{incident.id}/bundles", headers=reader).json()
    assert listed["id"] == str(asked.id) and listed["download"] == f"/api/v1/bundles/{asked.id}"
    assert listed["decision_id"] == decision.id and listed["decision_kind"] == "evict" and listed["node"] == NODE
    got = client.get(listed["download"], headers=reader)
    assert got.status_code == 200 and got.content == body
    assert got.headers["content-type"] == "application/gzip"
    assert f"decision-{decision.id}.tar.gz" in got.headers["content-disposition"]
    assert client.get(f"/api/v1/nodes/{NODE}/bundles", headers=reader).json()[0]["id"] == str(asked.id)
    assert client.get(f"/api/v1/bundles/{asked.id}/info", headers=reader).json()["state"] == "stored"

    # The same upload again (a retry whose answer was lost) is stored once; other content is a conflict.
    again = client.put(f"/api/v1/nodes/{NODE}/bundles/{asked.id}", content=body, headers=agent)
    assert again.status_code == 200
    other = client.put(f"/api/v1/nodes/{NODE}/bundles/{asked.id}", content=_tarball(files={"x": b"y"}), headers=agent)
    assert other.status_code == 409
    # Answered: the directive is no longer sent (a restarted agent must not collect it again).
    answer = client.post("/api/v1/ingest", json=batch(NODE, job_id=None), headers=agent).json()
    assert not [d for d in answer["directives"] if d["kind"] == "bundle"]


@pytest.fixture
def small_cap_client(factory: sessionmaker[Session]) -> Any:
    settings = get_settings().model_copy(update={"bundle_max_bytes": 64 * 1024})
    with TestClient(create_app(settings, factory=factory)) as client:
        yield client


def test_an_upload_over_the_cap_is_413_and_changes_nothing(
    session: Session, small_cap_client: TestClient, make_token: Any
) -> None:
    _, _, decision = _evict(session)
    [asked] = bundles.request_for(session, decisions=[decision], now=datetime.now(UTC), settings=get_settings())
    agent = bearer(make_token("agent", node=NODE))
    big = _tarball(files={"noise.bin": os.urandom(128 * 1024)})  # random: gzip cannot shrink it
    assert len(big) > 64 * 1024

    put = small_cap_client.put(f"/api/v1/nodes/{NODE}/bundles/{asked.id}", content=big, headers=agent)
    assert put.status_code == 413, put.text
    assert "over the limit of 65536 bytes" in put.json()["message"]

    def chunks() -> Any:  # no Content-Length: refused while streaming
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    streamed = small_cap_client.put(f"/api/v1/nodes/{NODE}/bundles/{asked.id}", content=chunks(), headers=agent)
    assert streamed.status_code == 413
    session.expire_all()
    assert session.get_one(EvidenceBundle, asked.id).state == "requested"


def test_uploads_need_the_node_agent_token(session: Session, client: TestClient, make_token: Any) -> None:
    _, _, decision = _evict(session)
    [asked] = bundles.request_for(session, decisions=[decision], now=datetime.now(UTC), settings=get_settings())
    url = f"/api/v1/nodes/{NODE}/bundles/{asked.id}"
    body = _tarball()

    assert client.put(url, content=body).status_code == 401
    assert client.put(url, content=body, headers=bearer("fl_not_a_token")).status_code == 401
    assert client.put(url, content=body, headers=bearer(make_token("operator"))).status_code == 403
    wrong_node = client.put(url, content=body, headers=bearer(make_token("agent", node="gpu-node-018")))
    assert wrong_node.status_code == 403 and "gpu-node-018" in wrong_node.json()["message"]
    # A bundle asked of another node, or none at all: 404.
    rows.node(session, "gpu-node-018")
    agent = bearer(make_token("agent"))
    assert client.put(f"/api/v1/nodes/gpu-node-018/bundles/{asked.id}", content=body, headers=agent).status_code == 404
    assert client.put(f"/api/v1/nodes/{NODE}/bundles/{uuid.uuid4()}", content=body, headers=agent).status_code == 404
    # Not a bundle: 422, nothing stored.
    for bad in (b"not gzip", _tarball(files={})[:40], _tar_without_manifest()):
        answer = client.put(url, content=bad, headers=agent)
        assert answer.status_code == 422, answer.text
    session.expire_all()
    assert session.get_one(EvidenceBundle, asked.id).state == "requested"
    # Reading needs a reader's token.
    assert client.get(f"/api/v1/bundles/{asked.id}").status_code == 401
    assert client.get(f"/api/v1/bundles/{asked.id}", headers=agent).status_code == 403


def _tar_without_manifest() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("kernel.log")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    return buffer.getvalue()


def test_a_node_whose_agent_never_answers_reads_agent_unreachable(
    session: Session, client: TestClient, make_token: Any
) -> None:
    incident, _, decision = _evict(session)
    settings = get_settings()
    asked_at = datetime.now(UTC) - timedelta(seconds=settings.bundle_timeout_s + settings.bundle_grace_s + 5)
    [asked] = bundles.request_for(session, decisions=[decision], now=asked_at, settings=settings)
    fresh_incident, _, fresh = _evict_other(session)
    bundles.request_for(session, decisions=[fresh], now=datetime.now(UTC), settings=settings)
    reader = bearer(make_token("operator"))

    [listed] = client.get(f"/api/v1/incidents/{incident.id}/bundles", headers=reader).json()
    assert listed["state"] == "unreachable" and listed["download"] is None
    assert listed["status"].startswith("no bundle: agent unreachable")
    download = client.get(f"/api/v1/bundles/{asked.id}", headers=reader)
    assert download.status_code == 404 and "agent unreachable" in download.json()["message"]
    [collecting] = client.get(f"/api/v1/incidents/{fresh_incident.id}/bundles", headers=reader).json()
    assert collecting["state"] == "collecting"
    assert client.get("/api/v1/incidents/999999/bundles", headers=reader).status_code == 404


def test_agent_unreachable_is_read_from_the_stored_request_whatever_the_service_runs_with_now(
    session: Session, factory: sessionmaker[Session], make_token: Any, ui: Any
) -> None:
    """Durable: the request stores its own deadline (asked at + timeout + grace), so a service restarted later, even
    with other bundle settings (or bundles switched off), says the same "no bundle: agent unreachable" in the API and
    on the incident and node pages, and the directive is no longer handed to the agent."""
    incident, _, decision = _evict(session)
    asked_with = get_settings().model_copy(update={"bundle_timeout_s": 60.0, "bundle_grace_s": 30.0})
    asked_at = datetime.now(UTC) - timedelta(seconds=100)
    [asked] = bundles.request_for(session, decisions=[decision], now=asked_at, settings=asked_with)
    restarted = get_settings().model_copy(
        update={"bundle_timeout_s": 3600.0, "bundle_grace_s": 3600.0, "bundle_enabled": False}
    )
    reader = bearer(make_token("operator"))
    with TestClient(create_app(restarted, factory=factory)) as client:
        [listed] = client.get(f"/api/v1/incidents/{incident.id}/bundles", headers=reader).json()
        assert listed["state"] == "unreachable" and listed["download"] is None
        assert listed["status"] == "no bundle: agent unreachable (nothing arrived within 90 s of the request)"
        [by_node] = client.get(f"/api/v1/nodes/{NODE}/bundles", headers=reader).json()
        info = client.get(f"/api/v1/bundles/{asked.id}/info", headers=reader).json()
        assert by_node["state"] == info["state"] == "unreachable"
        answer = client.post("/api/v1/ingest", json=batch(NODE, job_id=None), headers=bearer(make_token("agent")))
        assert not [d for d in answer.json()["directives"] if d["kind"] == "bundle"], "its time is up"
    for page in (f"/incidents/{incident.id}", f"/nodes/{NODE}"):
        html = ui.get(page).text
        assert "no bundle: agent unreachable (nothing arrived within 90 s of the request)" in html, page


def _evict_other(session: Session) -> tuple[Any, Any, Any]:
    job = rows.job(session)
    node = rows.node(session)
    incident = rows.incident(session, job=job, suspects=[node.name])
    return incident, node, rows.decision(session, incident=incident, node=node)


def test_retention_deletes_old_bundles_only(session: Session) -> None:
    settings = get_settings()
    _, _, old = _evict(session)
    _, _, new = _evict_other(session)
    now = datetime.now(UTC)
    bundles.request_for(session, decisions=[old], now=now - timedelta(days=100), settings=settings)
    bundles.request_for(session, decisions=[new], now=now, settings=settings)
    assert bundles.prune(session, now=now, retention=timedelta(days=90)) == 1
    assert [b.decision_id for b in session.scalars(select(EvidenceBundle))] == [new.id]


def test_the_retention_pass_runs_the_bundle_pruner() -> None:
    import service.bundles.retention  # noqa: F401 - registers the pruner, as the worker does
    from service.maintenance import service as maintenance

    assert "evidence_bundles" in maintenance._pruners


def test_the_incident_and_node_pages_show_bundles_with_their_manifest(
    session: Session, client: TestClient, make_token: Any, ui: Any
) -> None:
    incident, _, decision = _evict(session)
    [asked] = bundles.request_for(session, decisions=[decision], now=datetime.now(UTC), settings=get_settings())
    body = _tarball()
    stored = client.put(
        f"/api/v1/nodes/{NODE}/bundles/{asked.id}", content=body, headers=bearer(make_token("agent", node=NODE))
    )
    assert stored.status_code == 201
    _, _, gone = _evict_other(session)
    settings = get_settings()
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    [unreachable] = bundles.request_for(session, decisions=[gone], now=long_ago, settings=settings)

    page = ui.get(f"/incidents/{incident.id}")
    assert page.status_code == 200
    assert "Evidence bundles" in page.text
    assert f"/bundles/{asked.id}/download" in page.text
    assert "kernel.log" in page.text and "kernel_log" in page.text
    node_page = ui.get(f"/nodes/{NODE}")
    assert f"/bundles/{asked.id}/download" in node_page.text
    gone_page = ui.get(f"/incidents/{gone.incident_id}")
    assert "no bundle: agent unreachable" in gone_page.text
    assert f"/bundles/{unreachable.id}/download" not in gone_page.text
    download = ui.get(f"/bundles/{asked.id}/download")
    assert download.status_code == 200 and download.content == body
