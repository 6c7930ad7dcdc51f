"""The Alertmanager detector on plain records: categories, confidence by severity, never an eviction."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ml import alerts
from ml.findings import ACTIONS, CATEGORIES, SUBJECT_KINDS, JobInfo, LogRecord
from tests.stored import check_evidence

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
JOB = JobInfo(job_id="job-1", world_size=16, rank_nodes={r: f"node-{r // 8}" for r in range(16)})


def alert(
    alertname: str,
    *,
    node: str = "node-1",
    severity: str | None = "critical",
    status: str = "firing",
    id: int = 1,
    ts: datetime = T0,
    gpu: str | None = None,
    summary: str = "",
    description: str = "",
    labels: dict[str, str] | None = None,
    kind: str = "alert",
    source: str = "alertmanager",
) -> LogRecord:
    all_labels = {"alertname": alertname, **({"severity": severity} if severity else {}), **(labels or {})}
    annotations = {k: v for k, v in (("summary", summary), ("description", description)) if v}
    fields: dict[str, Any] = {
        "fingerprint": f"fp{id:04d}",
        "alertname": alertname,
        "status": status,
        "starts_at": ts.isoformat(),
        "ends_at": None,
        "labels": all_labels,
        "annotations": annotations,
        "generator_url": "http://prometheus:9090/graph",
    }
    if gpu is not None:
        fields["gpu"] = gpu
    return LogRecord(
        id=id,
        ts=ts,
        node=node,
        kind=kind,
        line=f"Alertmanager {alertname} {status} on {node}: {summary}",
        severity=severity,
        source=source,
        fields=fields,
    )


def only(findings: list) -> Any:
    assert len(findings) == 1, findings
    check_evidence(findings)
    return findings[0]


def test_critical_gpu_alert_is_a_diagnose_cause_on_its_gpu() -> None:
    f = only(alerts.detect(JOB, [alert("DCGMGpuTemperatureHigh", gpu="3", summary="GPU 3 at 92 C")]))
    assert (f.category, f.subject_kind, f.subject, f.node) == ("gpu_hardware", "gpu", "node-1/3", "node-1")
    assert (f.confidence, f.action, f.role, f.blame) == (0.7, "diagnose", "cause", "infrastructure")
    assert f.detector == "alerts"
    assert f.evidence["signals"] == [{"type": "log", "id": 1}]
    assert f.evidence["summary"] == "GPU 3 at 92 C" and f.evidence["category_from"] == "rules"
    assert f.observed_at == T0
    assert f.category in CATEGORIES and f.subject_kind in SUBJECT_KINDS and f.action in ACTIONS


def test_confidence_follows_severity_and_info_makes_nothing() -> None:
    warning = only(alerts.detect(JOB, [alert("GpuEccErrors", severity="warning")]))
    assert warning.confidence == 0.5
    unlabeled = only(alerts.detect(JOB, [alert("GpuEccErrors", severity=None)]))
    assert unlabeled.confidence == 0.5
    assert alerts.detect(JOB, [alert("GpuEccErrors", severity="info")]) == []
    assert alerts.detect(JOB, [alert("GpuEccErrors", severity="none")]) == []


def test_resolved_alerts_xid_events_and_other_sources_make_nothing() -> None:
    records = [
        alert("GpuEccErrors", status="resolved"),
        alert("GpuXidError", kind="xid", id=2),  # judged by the Xid rules in ml/signatures/hardware.py
        alert("GpuEccErrors", source="kmsg", id=3),
    ]
    assert alerts.detect(JOB, records) == []


def test_categories_by_rules_on_name_and_annotations() -> None:
    cases = {
        "NVLinkDown": "nvlink",
        "GpuXidError": "gpu_hardware",
        "DCGMRowRemapFailure": "gpu_hardware",
        "InfinibandPortDown": "network",
        "IBLinkFlapping": "network",
        "RoCEPfcStorm": "network",
        "NodeNetworkReceiveErrs": "network",
        "NodeFilesystemAlmostOutOfSpace": "storage",
        "LustreClientEvicted": "storage",
        "NFSMountStale": "storage",
        "PcieAerUncorrectable": "pcie",
        "DCGMGpuFellOffTheBus": "gpu_hardware",
        "GPUNodeDown": "unknown",
        "GpuOutOfMemory": "oom",
        "KubePodOOMKilled": "oom",
    }
    for i, (name, category) in enumerate(cases.items()):
        f = only(alerts.detect(JOB, [alert(name, id=i)]))
        assert f.category == category, (name, f.category)
        assert f.action == "diagnose"
    # The words of the annotations count too.
    by_text = only(alerts.detect(JOB, [alert("HostTrouble", description="mlx5_0 port 1 link down")]))
    assert by_text.category == "network"
    io = only(alerts.detect(JOB, [alert("HostTrouble", description="I/O error on /dev/sda")]))
    assert io.category == "storage"
    # A job slowing down is not a node down.
    slow = only(alerts.detect(JOB, [alert("TrainingThroughputSlowDown")]))
    assert "alert_class" not in slow.evidence


def test_node_down_is_an_infrastructure_cause_of_unknown_category() -> None:
    for name, description in (("KubeNodeNotReady", ""), ("ProbeFailure", "Instance has been down for over 5m")):
        f = only(alerts.detect(JOB, [alert(name, description=description)]))
        assert (f.category, f.blame, f.action) == ("unknown", "infrastructure", "diagnose"), name
        assert f.evidence["alert_class"] == "node_down"


def test_faultline_category_label_wins_over_the_rules() -> None:
    f = only(alerts.detect(JOB, [alert("GpuTemperatureHigh", labels={"faultline_category": "storage"})]))
    assert (f.category, f.blame, f.evidence["category_from"]) == ("storage", "unknown", "label")
    # A label naming no category is ignored.
    g = only(alerts.detect(JOB, [alert("GpuTemperatureHigh", labels={"faultline_category": "bananas"})]))
    assert g.category == "gpu_hardware"


def test_classifier_reads_what_no_rule_knows() -> None:
    seen: list[list[str]] = []

    def classify(texts: list[str]) -> list[tuple[str, float]]:
        seen.append(texts)
        return [("storage", 0.9) if "quota" in t else ("network", 0.3) for t in texts]

    records = [
        alert("ProjectQuotaExceeded", summary="quota exceeded on /projects", id=1),
        alert("SomethingOdd", summary="weird thing happened", id=2, node="node-2"),
    ]
    found = {f.node: f for f in alerts.detect(JOB, records, classify=classify)}
    assert seen and len(seen[0]) == 2
    assert (found["node-1"].category, found["node-1"].evidence["category_from"]) == ("storage", "classifier")
    assert found["node-1"].confidence == 0.7  # min(severity's 0.7, p 0.9)
    # Below the classifier's bar: unknown, blame unknown, still only diagnose.
    other = found["node-2"]
    assert (other.category, other.blame, other.action) == ("unknown", "unknown", "diagnose")


def test_a_broken_classifier_leaves_the_alerts_unknown() -> None:
    def broken(texts: list[str]) -> list[tuple[str, float]]:
        raise RuntimeError("model file corrupt")

    f = only(alerts.detect(JOB, [alert("SomethingOdd")], classify=broken))
    assert f.category == "unknown"


def test_one_finding_per_node_and_rule_and_a_stable_key() -> None:
    records = [
        alert("GpuEccErrors", gpu="0", id=1),
        alert("GpuEccErrors", gpu="5", id=2, ts=T0 + timedelta(seconds=30)),
        alert("GpuEccErrors", gpu="1", id=3, node="node-0"),
    ]
    found = sorted(alerts.detect(JOB, records), key=lambda f: f.node)
    assert [(f.node, f.subject_kind, f.subject) for f in found] == [
        ("node-0", "gpu", "node-0/1"),
        ("node-1", "node", "node-1"),
    ]
    assert found[1].evidence["gpus"] == ["0", "5"] and found[1].evidence["count"] == 2
    assert found[1].observed_at == T0
    again = sorted(alerts.detect(JOB, list(reversed(records))), key=lambda f: f.node)
    assert [f.key for f in again] == [f.key for f in found]
    # The rule firing again later (a new start time) is a new episode: a new key.
    later = only(alerts.detect(JOB, [alert("GpuEccErrors", gpu="0", id=9, ts=T0 + timedelta(hours=2))]))
    assert later.key != found[1].key


def test_odd_records_are_skipped() -> None:
    odd = [
        "not a record",
        LogRecord(id=5, ts=T0, node="node-1", kind="alert", line="x", source="alertmanager", fields=None),  # type: ignore[arg-type]
        alert("GpuEccErrors", id=6),
    ]
    assert [f.evidence["signals"] for f in alerts.detect(JOB, odd)] == [[{"type": "log", "id": 6}]]


def test_severity_spellings() -> None:
    assert [alerts.severity_of(s) for s in ("CRITICAL", "page", "warn", "Info", "bogus", None)] == [
        "critical",
        "critical",
        "warning",
        "info",
        None,
        None,
    ]
    assert alerts.words("DCGMGpuXidError") == "dcgm gpu xid error"
