"""POST /api/v1/alertmanager on the real database: Alertmanager's webhook in, log events and decisions out."""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select
from sqlalchemy.orm import sessionmaker

from agents.parsers import parse_text
from agents.parsers.kernel import KernelLogParser
from lab.sim import logformat as fmt
from ml import signatures
from ml.findings import LogRecord
from service.config import get_settings
from service.diagnosis import signals
from service.diagnosis.service import diagnose_job
from service.jobs import service as jobs
from service.models import Decision, Finding, Job, LogEvent, Node
from service.security import Principal
from tests import paths
from tests.conftest import bearer, count

SAMPLE = paths.FIXTURES / "formats" / "alertmanager_webhook_v4_sample.json"
URL = "/api/v1/alertmanager"
NODES, GPUS = 4, 2


def sample() -> dict[str, Any]:
    """Alertmanager's own sample notification (its `_source` key is an unknown field, ignored)."""
    return json.loads(SAMPLE.read_text())


def notification(*alerts: dict[str, Any], status: str = "firing") -> dict[str, Any]:
    return {
        "version": "4",
        "groupKey": '{}:{alertname="x"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "faultline",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }


def am_alert(
    alertname: str,
    node: str | None,
    *,
    severity: str = "critical",
    status: str = "firing",
    starts_at: datetime | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    fingerprint: str | None = None,
    generator_url: str = "http://prometheus:9090/graph?g0.expr=up",
) -> dict[str, Any]:
    starts = starts_at or datetime.now(UTC).replace(microsecond=0)
    return {
        "status": status,
        "labels": {
            "alertname": alertname,
            "severity": severity,
            **({"Hostname": node} if node else {}),
            "job": "dcgm-exporter",
            **(labels or {}),
        },
        "annotations": annotations or {"summary": f"{alertname} on {node}"},
        "startsAt": starts.isoformat().replace("+00:00", "Z"),
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": generator_url,
        "fingerprint": fingerprint or uuid.uuid4().hex[:16],
    }


def xid79_alert(node: str, **kwargs: Any) -> dict[str, Any]:
    """What a rule on dcgm-exporter's DCGM_FI_DEV_XID_ERRORS sends for an Xid 79."""
    return am_alert(
        "GpuXidError",
        node,
        labels={
            "gpu": "1",
            "UUID": "GPU-b9f9e81b-bee7-34bc-af17-132ef6592740",
            "pci_bus_id": "00000000:3B:00.0",
            "modelName": "NVIDIA H100 80GB HBM3",
            "err_code": "79",
            "err_msg": "GPU has fallen off the bus.",
        },
        annotations={"summary": f"Xid 79 on {node}", "value": "79"},
        generator_url="http://prometheus:9090/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS+%3E+0",
        **kwargs,
    )


class RecordingTrigger:
    """Stands in for the diagnosis trigger: records the jobs it was asked to diagnose."""

    def __init__(self) -> None:
        self.fired: list[set[str]] = []

    def fire(self, jobs: set[str]) -> None:
        self.fired.append(set(jobs))


@pytest.fixture
def trigger(app: Any) -> RecordingTrigger:
    recorder = RecordingTrigger()
    app.state.diagnosis_trigger = recorder
    return recorder


def running_job(client: Any, token: str) -> str:
    """A job on node-0..node-3 as its agents report it: ranks placed, each node's current job set."""
    job = f"job-{uuid.uuid4().hex[:6]}"
    now = datetime.now(UTC).isoformat()
    for n in range(NODES):
        batch = {
            "batch_id": str(uuid.uuid4()),
            "node": f"node-{n}",
            "sent_at": now,
            "job_id": job,
            "processes": [
                {"ts": now, "pid": 1000 + r, "job_id": job, "rank": r, "local_rank": r % GPUS, "world_size": 8}
                for r in range(n * GPUS, (n + 1) * GPUS)
            ],
        }
        response = client.post("/api/v1/ingest", json=batch, headers=bearer(token))
        assert response.status_code == 200, response.text
    return job


def alert_rows(session: Any) -> list[LogEvent]:
    return list(session.scalars(select(LogEvent).where(LogEvent.source == "alertmanager").order_by(LogEvent.id)))


# -- storing ------------------------------------------------------------------------------------------------------


def test_the_real_sample_is_stored_once_and_its_resolution_updates_it(client, session, make_token, trigger) -> None:
    token = make_token("operator")
    response = client.post(URL, json=sample(), headers=bearer(token))
    assert response.status_code == 200, response.text
    assert response.json() == {
        "received": 1,
        "stored": 1,
        "duplicates": 0,
        "resolved": 0,
        "ignored": 0,
        "ignored_alerts": [],
        "diagnosing": [],
    }
    (row,) = alert_rows(session)
    node = session.get(Node, row.node_id)
    assert node is not None and node.name == "server.example.org"  # the probe's instance URL, host only
    assert (row.kind, row.severity, row.job_id) == ("alert", "critical", None)
    assert row.ts == datetime(2023, 2, 6, 13, 8, 45, 828000, tzinfo=UTC)
    assert row.batch_id == uuid.uuid5(
        uuid.uuid5(uuid.NAMESPACE_URL, "faultline:alertmanager"), f"1a30ba71cca2921f|{row.ts.isoformat()}"
    )
    fields = row.fields or {}
    assert fields["fingerprint"] == "1a30ba71cca2921f" and fields["alertname"] == "ProbeFailure"
    assert (fields["status"], fields["ends_at"]) == ("firing", None)
    assert fields["labels"]["job"] == "http_checks" and fields["annotations"]["summary"].startswith("BlackBox")
    assert fields["generator_url"].startswith("http://prometheus.example.org:9090/graph")
    assert "ProbeFailure" in row.line and "BlackBox Probe Failure" in row.line

    # Alertmanager repeats itself every group interval: nothing new.
    again = client.post(URL, json=sample(), headers=bearer(token)).json()
    assert (again["stored"], again["duplicates"]) == (0, 1)
    assert len(alert_rows(session)) == 1

    resolved = sample()
    resolved["status"] = resolved["alerts"][0]["status"] = "resolved"
    resolved["alerts"][0]["endsAt"] = "2023-02-06T13:20:45.828Z"
    done = client.post(URL, json=resolved, headers=bearer(token)).json()
    assert (done["stored"], done["resolved"], done["duplicates"]) == (0, 1, 0)
    (row,) = alert_rows(session)
    session.refresh(row)
    assert row.fields["status"] == "resolved"
    assert datetime.fromisoformat(row.fields["ends_at"]) == datetime(2023, 2, 6, 13, 20, 45, 828000, tzinfo=UTC)
    assert row.fields["fingerprint"] == "1a30ba71cca2921f"  # the rest of the fields kept
    # The resolution repeated, or a late firing copy: nothing changes.
    assert client.post(URL, json=resolved, headers=bearer(token)).json()["duplicates"] == 1
    assert client.post(URL, json=sample(), headers=bearer(token)).json()["duplicates"] == 1
    session.refresh(row)
    assert row.fields["status"] == "resolved"
    assert trigger.fired == []  # no job on that node


def test_unknown_fields_are_ignored(client, session, make_token, trigger) -> None:
    payload = sample()
    payload["somethingNew"] = {"nested": [1, 2]}
    payload["alerts"][0]["silencedBy"] = ["abc"]
    payload["alerts"][0]["fingerprint"] = "0000feedbeef0000"
    response = client.post(URL, json=payload, headers=bearer(make_token("admin")))
    assert response.status_code == 200, response.text
    assert response.json()["stored"] == 1
    assert [r.fields["fingerprint"] for r in alert_rows(session)] == ["0000feedbeef0000"]


def test_node_labels_in_order_and_nodeless_alerts_are_ignored(client, session, make_token, trigger) -> None:
    token = make_token("operator")
    alerts = [
        am_alert("A", None, labels={"instance": "10.0.0.7:9100", "kubernetes_node": "k8s-node-3"}),
        am_alert("B", None, labels={"instance": "gpu-node-9.cluster.local:9400"}),
        am_alert("C", None, labels={"hostname": "Host-A", "node": "other"}),
        am_alert("D", None, labels={"instance": "[fe80::1]:9100"}),
        am_alert("E", None, labels={}),
    ]
    result = client.post(URL, json=notification(*alerts), headers=bearer(token)).json()
    assert (result["received"], result["stored"], result["ignored"]) == (5, 3, 2)
    reasons = {i["fingerprint"]: i["reason"] for i in result["ignored_alerts"]}
    assert "not a valid node name" in reasons[alerts[3]["fingerprint"]]
    assert reasons[alerts[4]["fingerprint"]].startswith("no node label")
    by_alert = {
        r.fields["alertname"]: name
        for r, name in session.execute(
            select(LogEvent, Node.name).join(Node, Node.id == LogEvent.node_id).where(LogEvent.source == "alertmanager")
        )
    }
    assert by_alert == {"A": "k8s-node-3", "B": "gpu-node-9.cluster.local", "C": "Host-A"}


def test_xid_alerts_are_stored_like_kernel_xid_events(client, session, make_token, trigger) -> None:
    token = make_token("operator")
    value_only = am_alert(
        "DcgmXid",
        "node-x",
        severity="warning",
        labels={"gpu": "0"},
        annotations={"value": "48"},
        generator_url="http://prometheus:9090/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS+%3E+0",
    )
    count_metric = am_alert("XidCount", "node-x", labels={"xid": "13", "gpu": "2"})
    zero = am_alert(
        "DcgmXid", "node-x", annotations={"value": "0"}, generator_url="http://p/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS"
    )
    payload = notification(xid79_alert("node-x"), value_only, count_metric, zero)
    assert client.post(URL, json=payload, headers=bearer(token)).json()["stored"] == 4
    rows = {r.fields["fingerprint"]: r for r in alert_rows(session)}
    xid79 = rows[payload["alerts"][0]["fingerprint"]]
    assert (xid79.kind, xid79.severity) == ("xid", "critical")
    assert {k: xid79.fields[k] for k in ("xid", "pci", "pid", "process", "message", "mnemonic", "action")} == {
        "xid": 79,
        "pci": "0000:3b:00",
        "pid": None,
        "process": None,
        "message": "GPU has fallen off the bus.",
        "mnemonic": "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "action": "RESTART_BM",
    }
    assert xid79.fields["gpu"] == "1" and "Xid 79" in xid79.line and "node-x GPU 1" in xid79.line
    assert (rows[value_only["fingerprint"]].kind, rows[value_only["fingerprint"]].fields["xid"]) == ("xid", 48)
    assert rows[value_only["fingerprint"]].severity == "warning"  # the rule's own severity label
    assert (rows[count_metric["fingerprint"]].kind, rows[count_metric["fingerprint"]].fields["xid"]) == ("xid", 13)
    assert rows[zero["fingerprint"]].kind == "alert"  # the gauge at 0 reports no Xid


# -- bad input, auth, outage ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda p: p.update(version="3"), "version"),
        (lambda p: p.pop("version"), "version"),
        (lambda p: p.pop("alerts"), "alerts"),
        (lambda p: p["alerts"][0].pop("fingerprint"), "fingerprint"),
        (lambda p: p["alerts"][0].pop("startsAt"), "startsAt"),
        (lambda p: p["alerts"][0].update(startsAt="2023-02-06T13:08:45"), "startsAt"),
        (lambda p: p["alerts"][0].update(startsAt="yesterday"), "startsAt"),
        (lambda p: p["alerts"][0].update(status="pending"), "status"),
        (lambda p: p["alerts"][0].update(labels=["not", "a", "map"]), "labels"),
        (lambda p: p["alerts"][0].update(fingerprint=""), "fingerprint"),
    ],
)
def test_bad_payloads_are_422_and_change_nothing(client, session, make_token, trigger, mutate, field) -> None:
    payload = sample()
    payload["alerts"].append(am_alert("Fine", "node-fine"))  # a good alert next to the bad one: not stored either
    mutate(payload)
    before = count(session, "log_events"), count(session, "nodes")
    response = client.post(URL, json=payload, headers=bearer(make_token("operator")))
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "invalid" and field in body["message"], body
    assert (count(session, "log_events"), count(session, "nodes")) == before


def test_not_json_is_422(client, session, make_token, trigger) -> None:
    headers = {**bearer(make_token("operator")), "Content-Type": "application/json"}
    response = client.post(URL, content=b"{not json", headers=headers)
    assert response.status_code == 422 and response.json()["error"] == "invalid"
    assert count(session, "log_events") == 0


def test_version_message_says_what_is_supported(client, make_token, trigger) -> None:
    payload = sample()
    payload["version"] = "5"
    message = client.post(URL, json=payload, headers=bearer(make_token("operator"))).json()["message"]
    assert 'version "4"' in message and "'5'" in message


def test_scopes_and_node_binding(client, session, make_token, trigger) -> None:
    payload = notification(am_alert("GpuTemperatureHigh", "node-a"), am_alert("GpuTemperatureHigh", "node-b"))
    assert client.post(URL, json=payload).status_code == 401
    assert client.post(URL, json=payload, headers=bearer("nonsense")).status_code == 401
    assert client.post(URL, json=payload, headers=bearer(make_token("scheduler"))).status_code == 403

    bound = make_token("agent", node="node-a")
    response = client.post(URL, json=payload, headers=bearer(bound))
    assert response.status_code == 403 and "node-b" in response.json()["message"]
    assert count(session, "log_events") == 0
    assert session.scalar(select(Node).where(Node.name.in_(["node-a", "node-b"]))) is None  # not even created

    own = notification(am_alert("GpuTemperatureHigh", "node-a"))
    assert client.post(URL, json=own, headers=bearer(bound)).json()["stored"] == 1
    for scope in ("agent", "operator", "admin"):
        one = notification(am_alert("GpuTemperatureHigh", "node-b"))
        assert client.post(URL, json=one, headers=bearer(make_token(scope))).json()["stored"] == 1, scope


def test_database_down_is_503(session, make_token) -> None:
    """The database refuses connections: 503 with Retry-After, so Alertmanager retries."""
    from service.app import create_app

    settings = get_settings()
    refused = create_engine("postgresql+psycopg://postgres@127.0.0.1:1/faultline", connect_args={"connect_timeout": 2})
    app = create_app(settings, factory=sessionmaker(bind=refused))
    principal = Principal(token_id=1, scope="operator", node_name=None, name="test", expires_at=None)

    async def known() -> tuple[Principal | None, str]:
        return principal, ""

    # The token is known already (cached), so the request reaches the alert store and its database.
    asyncio.run(app.state.token_cache.resolve("cached-token", known))
    with TestClient(app) as down:
        response = down.post(URL, json=sample(), headers=bearer("cached-token"))
    refused.dispose()
    assert response.status_code == 503, response.text
    assert response.json()["error"] == "unavailable" and response.headers["retry-after"]


# -- diagnosis ------------------------------------------------------------------------------------------------------


def test_xid79_alert_evicts_its_node_like_a_kernel_xid_line(client, session, make_token, trigger) -> None:
    job = running_job(client, make_token("agent"))
    result = client.post(URL, json=notification(xid79_alert("node-2")), headers=bearer(make_token("operator"))).json()
    assert (result["stored"], result["diagnosing"]) == (1, [job])
    assert trigger.fired == [{job}]  # after the commit, as ingest does for a fatal Xid
    (row,) = alert_rows(session)
    assert row.job_id == session.scalar(select(Job.id).where(Job.external_id == job))

    # The Xid rules read it exactly as they read the kernel's line for the same Xid on the same GPU.
    job_row = jobs.get_by_external_id(session, job_id=job)
    _, events = signals.log_records(
        session,
        job=job_row,
        node_ids=jobs.node_ids(session, job=job_row),
        since=datetime.now(UTC) - timedelta(minutes=5),
    )
    (from_alert,) = signatures.detect(signals.job_info(session, job=job_row), events)
    kernel_line = fmt.kern(datetime.now(UTC), fmt.xid(0x3B, 79, "GPU has fallen off the bus.", 4242, "python")) + "\n"
    (event,) = parse_text(KernelLogParser(), kernel_line, now=datetime.now(UTC))
    record = LogRecord(
        id=999, ts=event.ts, node="node-2", kind=event.kind, line=event.line, source=event.source, fields=event.fields
    )
    (from_kernel,) = signatures.detect(signals.job_info(session, job=job_row), [record])
    same = ("category", "subject_kind", "subject", "confidence", "action", "blame", "role")
    assert [getattr(from_alert, a) for a in same] == [getattr(from_kernel, a) for a in same]

    diagnosis = diagnose_job(session, job_id=job, settings=get_settings())
    (decision,) = session.scalars(select(Decision).where(Decision.id.in_(diagnosis.decisions))).all()
    assert (decision.kind, decision.state) == ("evict", "pending")
    assert session.get(Node, decision.node_id).name == "node-2"
    signal_ids = [s["id"] for f in decision.evidence["findings"] for s in f["signals"]]
    assert row.id in signal_ids
    # The alerts detector leaves Xid alerts to the Xid rules: no second finding about it.
    detectors = set(session.scalars(select(Finding.detector).where(Finding.job_id == row.job_id)))
    assert detectors == {"signatures"}


def test_generic_critical_alert_asks_for_diagnostics_at_most(client, session, make_token, trigger) -> None:
    job = running_job(client, make_token("agent"))
    token = make_token("operator")
    alerts = [
        am_alert("GpuTemperatureHigh", "node-1", labels={"gpu": "0"}, annotations={"summary": "GPU 0 at 95 C"}),
        am_alert("NodeFilesystemAlmostFull", "node-3", severity="warning"),
        am_alert("SomethingInformational", "node-0", severity="info"),
    ]
    result = client.post(URL, json=notification(*alerts), headers=bearer(token)).json()
    assert (result["stored"], result["diagnosing"]) == (3, [job])  # only the critical one is urgent
    assert trigger.fired == [{job}]

    diagnose_job(session, job_id=job, settings=get_settings())
    findings = {
        name: f
        for f, name in session.execute(
            select(Finding, Node.name).join(Node, Node.id == Finding.node_id).where(Finding.detector == "alerts")
        )
    }
    assert set(findings) == {"node-1", "node-3"}  # info alerts make no finding
    hot = findings["node-1"]
    assert (hot.category, hot.subject_kind, hot.subject, hot.confidence, hot.action) == (
        "gpu_hardware",
        "gpu",
        "node-1/0",
        0.7,
        "diagnose",
    )
    assert (findings["node-3"].category, findings["node-3"].confidence) == ("storage", 0.5)
    kinds = {
        d.kind
        for d in session.scalars(select(Decision).join(Job, Job.id == Decision.job_id).where(Job.external_id == job))
    }
    assert kinds == {"diagnose"}  # an alert rule alone never evicts


def test_a_resolved_alert_adds_nothing_new(client, session, make_token, trigger) -> None:
    job = running_job(client, make_token("agent"))
    token = make_token("operator")
    firing = am_alert("GpuTemperatureHigh", "node-1")
    client.post(URL, json=notification(firing), headers=bearer(token))
    resolved = copy.deepcopy(firing)
    resolved.update(status="resolved", endsAt=datetime.now(UTC).isoformat())
    assert (
        client.post(URL, json=notification(resolved, status="resolved"), headers=bearer(token)).json()["resolved"] == 1
    )
    assert trigger.fired == [{job}]  # the resolution triggers nothing
    diagnose_job(session, job_id=job, settings=get_settings())
    assert session.scalars(select(Finding).where(Finding.detector == "alerts")).all() == []


def test_an_alert_firing_since_before_the_window_is_still_diagnosed(client, session, make_token, trigger) -> None:
    job = running_job(client, make_token("agent"))
    long_ago = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=get_settings().diagnosis_window_s + 600)
    alert = am_alert("InfinibandLinkFlapping", "node-2", starts_at=long_ago)
    assert client.post(URL, json=notification(alert), headers=bearer(make_token("operator"))).json()["stored"] == 1
    diagnose_job(session, job_id=job, settings=get_settings())
    found = session.execute(
        select(Finding.category, Node.name).join(Node, Node.id == Finding.node_id).where(Finding.detector == "alerts")
    ).all()
    assert found == [("network", "node-2")]


def test_a_node_bound_token_cannot_resolve_another_nodes_alert_by_its_fingerprint(client, session, make_token) -> None:
    firing = am_alert("GpuXidError", "node-b", fingerprint="f00d")
    assert (
        client.post(URL, json=notification(firing), headers=bearer(make_token("agent", node="node-b"))).status_code
        == 200
    )
    forged = {**firing, "status": "resolved", "labels": {**firing["labels"], "Hostname": "node-a"}}
    forged["endsAt"] = firing["startsAt"]
    answer = client.post(
        URL, json=notification(forged, status="resolved"), headers=bearer(make_token("agent", node="node-a"))
    )
    assert answer.status_code == 200 and answer.json()["resolved"] == 0
    (stored,) = [row for row in alert_rows(session) if row.fields["fingerprint"] == "f00d"]
    assert stored.fields["status"] == "firing"  # node-b's alert is untouched
