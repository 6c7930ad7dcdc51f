"""Training metrics: NaN and 5x jumps of loss and grad norm, from corpus logs and the simulated cluster through the
agent's parser, and synthetic step events for the cross-node and recovery rules."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agents.events import Event
from agents.parsers import parse_text
from agents.parsers.training import TrainingLogParser
from lab.sim.config import SimConfig
from lab.sim.model import Cluster
from ml import training_metrics
from ml.demarcation import demarcate
from ml.findings import Finding, JobInfo, LogRecord
from tests import paths
from tests.stored import check_evidence

FIXTURES = paths.FIXTURES
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
START = datetime(2025, 11, 22, 10, 0, tzinfo=UTC)
JOB = JobInfo(job_id="job-1", world_size=16, rank_nodes={r: f"node-{r // 8:03d}" for r in range(16)})


def corpus(name: str) -> str:
    return (FIXTURES / "logs" / name).read_text().split("\n---\n", 1)[1]


def to_records(events: Sequence[tuple[str, Event]]) -> list[LogRecord]:
    return [
        LogRecord(id=i + 1, ts=e.ts, node=n, kind=e.kind, line=e.line, rank=e.rank, fields=e.fields)
        for i, (n, e) in enumerate(events)
    ]


def detect(records: list[LogRecord], job: JobInfo = JOB) -> list[Finding]:
    findings = training_metrics.detect(job, records)
    for f in findings:
        assert f.detector == "training_metrics" and f.category == "nan" and f.role == "cause"
        assert f.action in ("rollback", "diagnose", "none") and f.key
        assert f.evidence["signals"] and all(s["type"] == "log" for s in f.evidence["signals"])
    assert len({f.key for f in findings}) == len(findings)
    check_evidence(findings)
    return findings


def sim_records(scenario: str, seed: int, until: float = 60.0) -> list[LogRecord]:
    cluster = Cluster(SimConfig(nodes=2, gpus_per_node=8, scenario=scenario, seed=seed, fault_after=10.0, start=START))
    parsers: dict[str, TrainingLogParser] = {}
    events: list[tuple[str, Event]] = []
    t = 0.0
    while t < until:
        t += 0.5
        for line in cluster.advance(t):
            if line.stream == "train":
                parser = parsers.setdefault(line.node, TrainingLogParser())
                for raw in line.text.split("\n"):
                    events += [(line.node, e) for e in parser.feed(raw, now=START + timedelta(seconds=t))]
    return to_records(events)


_ids = iter(range(1, 10**9))


def step(node: str, rank: int, n: int, **values: Any) -> LogRecord:
    wire = {k: (v if math.isfinite(v) else "nan") for k, v in values.items()}
    line = f"[rank{rank}]: step={n} " + " ".join(f"{k}={v}" for k, v in values.items())
    return LogRecord(
        id=next(_ids),
        ts=START + timedelta(seconds=n),
        node=node,
        kind="step",
        line=line,
        rank=rank,
        fields={"step": n, **wire},
    )


def event(kind: str, node: str, rank: int, n: int, **fields: Any) -> LogRecord:
    return LogRecord(
        id=next(_ids),
        ts=START + timedelta(seconds=n),
        node=node,
        kind=kind,
        line=f"{kind} {n}",
        rank=rank,
        fields={"step": n, **fields},
    )


def run(node_values: dict[tuple[str, int], list[float]], metric: str = "loss", first: int = 100) -> list[LogRecord]:
    """Step records (and the NaN events the parser adds) for each (node, rank) over consecutive steps."""
    out: list[LogRecord] = []
    for (node, rank), values in node_values.items():
        for i, value in enumerate(values):
            out.append(step(node, rank, first + i, **{metric: value}))
            if not math.isfinite(value):
                kind = "nan_loss" if metric == "loss" else "grad_norm_nan"
                out.append(event(kind, node, rank, first + i, **{metric: "nan"}))
    return out


# -- corpus and the simulator ---------------------------------------------------------------------------------------


def test_nan_grad_norm_in_megatron_iterations_is_a_job_nan():
    records = to_records(
        [
            ("node-a", e)
            for e in parse_text(TrainingLogParser(), corpus("nan_gradnorm_megatron_deepspeed_396.txt"), now=NOW)
        ]
    )
    [f] = detect(records)
    assert (f.category, f.blame, f.node, f.action) == ("nan", "user_code", None, "rollback")
    assert f.evidence["metric"] == "grad_norm" and f.evidence["steps"] == [5426, 5427, 5428] and f.confidence >= 0.8
    assert f.observed_at == records[0].ts


def test_nan_in_local_grad_norm_assertion_is_a_nan():
    records = to_records(
        [
            ("node-b", e)
            for e in parse_text(TrainingLogParser(), corpus("nan_gradnorm_assert_paimegatron_366.txt"), now=NOW)
        ]
    )
    [f] = detect(records)
    assert f.evidence["metric"] == "grad_norm" and f.evidence["ranks"] == [11]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sim_nan_loss_is_job_level_and_healthy_is_silent(seed: int):
    findings = detect(sim_records("nan_loss", seed))
    assert {f.evidence["metric"] for f in findings} == {"loss", "grad_norm"}
    assert all(f.node is None and f.blame == "user_code" and f.action == "rollback" for f in findings)
    assert all(f.evidence["nodes"] == ["node-000", "node-001"] for f in findings)
    assert detect(sim_records("healthy", seed)) == []


# -- cross-node and recovery rules ------------------------------------------------------------------------------------


def test_nan_on_one_node_while_others_are_finite_names_that_node():
    records = run({("node-000", 0): [2.1, 2.0, 1.9, 1.9], ("node-001", 8): [2.1, math.nan, math.nan, math.nan]})
    [f] = detect(records)
    assert (f.node, f.blame, f.action, f.subject_kind) == ("node-001", "unknown", "diagnose", "node")
    assert f.evidence["steps"] == [101, 102, 103] and f.evidence["ranks"] == [8]


def test_nan_everywhere_or_reported_by_one_logger_is_the_jobs():
    everywhere = run({("node-000", 0): [2.0, math.nan, math.nan], ("node-001", 8): [2.0, math.nan, math.nan]})
    [f] = detect(everywhere)
    assert f.node is None and f.blame == "user_code"
    one_logger = run({("node-001", 15): [2.0, math.nan, math.nan]})  # Megatron logs from the last rank only
    [f] = detect(one_logger)
    assert f.node is None and f.action == "rollback"


def test_isolated_nan_that_recovers_is_less_certain_than_persistent_nan():
    recovered = detect(run({("node-000", 0): [2.0, math.nan, 1.9, 1.9, 1.8]}))[0]
    persistent = detect(run({("node-000", 0): [2.0, math.nan, math.nan, math.nan, math.nan]}))[0]
    assert recovered.confidence < persistent.confidence
    assert recovered.action == "none" and persistent.action == "rollback"
    assert recovered.evidence["persistent"] is False and persistent.evidence["persistent"] is True


def test_spikes_single_and_persistent():
    values = [2.0] * 6 + [14.0] + [2.0] * 3
    records = run({("node-000", 0): values}, metric="grad_norm")
    records.append(event("grad_norm_spike", "node-000", 0, 106, grad_norm=14.0, median=2.0, factor=7.0))
    [spike] = detect(records)
    assert spike.evidence["anomaly"] == "spike" and spike.action == "none" and spike.node is None
    assert spike.evidence["factors"] == [7.0] and spike.evidence["max_value"] == 14.0
    nan = detect(run({("node-000", 0): [2.0, math.nan, math.nan, math.nan]}))[0]
    assert spike.confidence < nan.confidence
    persistent = run({("node-000", 0): [2.0] * 6 + [14.0, 15.0, 16.0]}, metric="grad_norm")
    persistent += [
        event("grad_norm_spike", "node-000", 0, n, grad_norm=14.0, median=2.0, factor=7.0) for n in (106, 107, 108)
    ]
    [lasting] = detect(persistent)
    assert lasting.confidence > spike.confidence


def test_spike_on_one_node_vouched_by_others_names_it():
    records = run({("node-000", 0): [2.0] * 8, ("node-001", 8): [2.0] * 6 + [20.0, 2.0]})
    records.append(event("loss_spike", "node-001", 8, 106, loss=20.0, median=2.0, factor=10.0))
    [f] = detect(records)
    assert f.node == "node-001" and f.action == "diagnose" and f.evidence["metric"] == "loss"


def test_ordinary_training_and_odd_input_give_nothing():
    assert detect(run({("node-000", 0): [3.0, 2.5, 2.2, 2.0, 1.9]})) == []
    odd: list[Any] = [
        LogRecord(id=1, ts=START, node="n", kind="step", line="x", fields={"step": "seven", "loss": "abc"}),
        LogRecord(id=2, ts=START, node="n", kind="step", line="x", fields=None),  # type: ignore[arg-type]
        LogRecord(id=3, ts=START, node="n", kind="nan_loss", line="x", fields={"step": True}),
        "junk",
        None,
    ]
    [f] = detect(odd)
    assert f.evidence["count"] == 1 and f.evidence["steps"] == []
    assert detect([]) == []


def test_a_job_wide_jump_that_asks_for_nothing_opens_no_incident_unless_a_nan_comes_with_it():
    """Healthy training has loss and grad-norm jumps: the 200-fault campaign opened an incident (a notification)
    for each of four on healthy stretches. They stay findings; a NaN's incident takes them along."""
    values = [2.0] * 6 + [14.0] + [2.0] * 3
    records = run({("node-000", 0): values, ("node-001", 8): values}, metric="grad_norm")
    # The norm is the whole model's: every rank logs the jump.
    records += [
        event("grad_norm_spike", node, rank, 106, grad_norm=14.0, median=2.0, factor=7.0)
        for node, rank in (("node-000", 0), ("node-001", 8))
    ]
    [spike] = detect(records)
    assert spike.node is None and spike.action == "none"
    assert demarcate([(1, spike)]) == []
    [nan] = detect(run({("node-000", 0): [2.0, math.nan, math.nan, math.nan]}))
    [proposal] = demarcate([(1, spike), (2, nan)])
    assert proposal.root_cause == "nan" and sorted(proposal.finding_ids) == [1, 2]
    # A jump on one machine alone, which its peers' ordinary values vouch for, is that machine's (diagnose).
    one = run({("node-000", 0): [2.0] * 8, ("node-001", 8): [2.0] * 6 + [20.0, 2.0]})
    one.append(event("loss_spike", "node-001", 8, 106, loss=20.0, median=2.0, factor=10.0))
    [localized] = detect(one)
    [own] = demarcate([(3, localized)])
    assert [s.node for s in own.suspects] == ["node-001"]
