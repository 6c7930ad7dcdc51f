"""Which Xids a GPU reset clears (the catalog's reading), their bursts, and the one GPU a suspect's reset names."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ml import signatures
from ml.demarcation import demarcate
from ml.findings import JobInfo, LogRecord
from ml.xid import catalog, lookup

START = datetime(2026, 11, 26, 3, 0, tzinfo=UTC)


def _xid(i: int, code: int, pci: str, at: float, node: str = "node-a") -> LogRecord:
    line = f"NVRM: Xid (PCI:{pci}): {code}, pid=42, name=python, details"
    return LogRecord(
        id=i, ts=START + timedelta(seconds=at), node=node, kind="xid", line=line, severity="critical",
        source="kmsg", fields={"xid": code, "pci": pci, "message": "details"},
    )  # fmt: skip


def test_the_catalog_says_which_xids_a_gpu_reset_clears() -> None:
    resettable = sorted(code for code, entry in catalog().items() if entry.gpu_reset_enough)
    # The catalog's RESET_GPU codes, less 64 (no spare rows left) and the NVLink ones (136, 155), plus the
    # row-remap (63) and contained-ECC (94) events whose remap a reset activates.
    assert resettable == [46, 62, 63, 94, 95, 109, 110, 119, 120, 140, 143, 156, 158]
    assert lookup(119).immediate_action == "RESET_GPU" and lookup(119).action == "evict"
    assert not lookup(79).gpu_reset_enough  # RESTART_BM: the machine must reboot
    assert not lookup(48).gpu_reset_enough and not lookup(74).gpu_reset_enough


def _findings(records: list[LogRecord]) -> list:
    return signatures.detect(JobInfo(job_id="job-1", rank_nodes={0: "node-a", 1: "node-b"}), records)


def test_a_resettable_xid_after_a_quiet_spell_is_a_new_finding_and_a_burst_is_one() -> None:
    records = [_xid(1, 119, "0000:3b:00", 0), _xid(2, 119, "0000:3b:00", 60), _xid(3, 119, "0000:3b:00", 200)]
    found = sorted((f for f in _findings(records) if f.evidence.get("xid") == 119), key=lambda f: f.observed_at)
    assert [(f.observed_at - START).total_seconds() for f in found] == [0.0, 200.0]
    assert [f.evidence["count"] for f in found] == [2, 1]
    assert found[0].key != found[1].key
    # A fatal Xid that needs the node stays one finding, however spread out.
    fatal = [_xid(4, 79, "0000:3b:00", 0), _xid(5, 79, "0000:3b:00", 200)]
    assert len([f for f in _findings(fatal) if f.evidence.get("xid") == 79]) == 1


def test_a_suspect_names_the_gpu_to_reset_only_when_all_its_evidence_is_on_it() -> None:
    one = demarcate(list(enumerate(_findings([_xid(1, 94, "0000:3b:00", 0), _xid(2, 119, "0000:3b:00", 5)]))))
    assert [(s.node, s.reset_gpu) for s in one[0].suspects] == [("node-a", "0000:3b:00")]
    two_gpus = demarcate(list(enumerate(_findings([_xid(1, 119, "0000:3b:00", 0), _xid(2, 119, "0000:5d:00", 5)]))))
    assert [(s.node, s.reset_gpu) for s in two_gpus[0].suspects] == [("node-a", None)]
    # A Xid 48 (needs the node) beside a resettable one on the same GPU: the node goes.
    mixed = demarcate(list(enumerate(_findings([_xid(1, 48, "0000:3b:00", 0), _xid(2, 63, "0000:3b:00", 1)]))))
    assert [(s.node, s.reset_gpu, s.action) for s in mixed[0].suspects] == [("node-a", None, "evict")]
