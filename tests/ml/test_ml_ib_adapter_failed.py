"""Issue 41: a fatal async event of the network adapter (IBV_EVENT_DEVICE_FATAL) is the adapter's failure, not a
link flap: its finding says so (`adapter_failed`), and the policy then does not wait for a second occurrence
(tests/service/decisions/test_policy.py).

Real lines: tests/fixtures/logs/nccl_ib_async_catastrophic_mpirun_nccl_230.txt."""

from __future__ import annotations

from datetime import UTC, datetime

from agents.parsers import parse_text
from agents.parsers.training import TrainingLogParser
from lab.evaluation.parser_corpus import read_fixture
from ml import signatures
from ml.findings import JobInfo, LogRecord
from tests import paths

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def _records(name: str) -> list[LogRecord]:
    text = read_fixture(paths.FIXTURES / "logs" / name).text
    events = parse_text(TrainingLogParser(), text, now=NOW)
    return [
        LogRecord(id=i, ts=NOW, node="n1", kind=e.kind, line=e.line, severity=e.severity, rank=e.rank,
                  source=e.source, fields=e.fields)
        for i, e in enumerate(events, 1)
    ]  # fmt: skip


def test_the_catastrophic_adapter_error_is_not_a_flap() -> None:
    job = JobInfo("j", world_size=2, rank_nodes={0: "n1", 1: "n2"})
    found = signatures.detect(job, _records("nccl_ib_async_catastrophic_mpirun_nccl_230.txt"))
    verbs = [f for f in found if f.key.startswith("ib_verbs:n1")]
    assert verbs, [f.key for f in found]
    assert verbs[0].evidence.get("adapter_failed") is True
    assert (verbs[0].category, verbs[0].action, verbs[0].node) == ("network", "evict", "n1")


def test_a_port_error_is_still_a_flap() -> None:
    job = JobInfo("j", world_size=2, rank_nodes={0: "n1", 1: "n2"})
    found = signatures.detect(job, _records("nccl_ib_async_port_error_litllama_380.txt"))
    verbs = [f for f in found if f.key.startswith("ib_verbs:n1")]
    assert verbs and not verbs[0].evidence.get("adapter_failed")
