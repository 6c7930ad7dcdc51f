"""The calibration report of `faultline eval`: for each detector, the confidence its findings gave against how
often they were right, over every run of the eval; and what that says about the policy's thresholds.

A finding that names a machine is right when that machine is one of the run's faulty ones; a job-level finding
is right when the run had a fault at all (on a healthy run, any finding is wrong). A finding behind a decision
a person rejected is wrong whatever the ground truth says: the person's verdict is the live calibration's only
truth, and the eval counts it the same way. Symptoms (a victim's watchdog timeout) are left out: they
corroborate a cause and never decide on their own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lab.evaluation.records import GroundTruth

PERSON_SCOPES = ("operator:", "admin:")  # the actors of a person's reject (scheduler tokens act for machines)
BINS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0001)  # [0, 0.5) below the diagnose threshold, then tenths


@dataclass(frozen=True)
class Judged:
    detector: str
    confidence: float
    names_node: bool
    right: bool


@dataclass(frozen=True)
class Bin:
    detector: str
    low: float
    high: float
    findings: int
    right: int
    mean_confidence: float

    @property
    def accuracy(self) -> float:
        return self.right / self.findings if self.findings else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "accuracy": round(self.accuracy, 4)}


def judge(truth: GroundTruth, incidents: Iterable[Mapping[str, Any]]) -> list[Judged]:
    """Each cause finding of the run's incidents (each once), right or wrong against the ground truth."""
    faulty, seen, out = truth.faulty_nodes, set(), []
    incidents = list(incidents)
    overruled = rejected_findings(incidents)
    for incident in incidents:
        for f in incident.get("findings") or ():
            if not isinstance(f, Mapping) or f.get("role", "cause") != "cause" or f.get("id") in seen:
                continue
            seen.add(f.get("id"))
            try:
                confidence = float(f.get("confidence") or 0.0)
            except (TypeError, ValueError):
                continue
            node = f.get("node")
            right = (node in faulty if node else not truth.healthy) and f.get("id") not in overruled
            out.append(Judged(str(f.get("detector") or "?"), confidence, bool(node), right))
    return out


def rejected_findings(incidents: Iterable[Mapping[str, Any]]) -> set[Any]:
    """The ids of the findings behind the incidents' decisions that a person (an operator or admin) rejected."""
    out = set()
    for incident in incidents:
        for d in incident.get("decisions") or ():
            if not isinstance(d, Mapping) or d.get("state") != "rejected":
                continue
            if not str(d.get("actor") or "").startswith(PERSON_SCOPES):
                continue  # a scheduler's refusal to act says nothing about the evidence
            for f in (d.get("evidence") or {}).get("findings") or ():
                if isinstance(f, Mapping) and f.get("id") is not None:
                    out.add(f["id"])
    return out


def reliability(judged: Sequence[Judged]) -> list[Bin]:
    """Per detector (and `all`), findings by confidence bin with the share that was right."""
    out = []
    for detector in [*sorted({j.detector for j in judged}), "all"]:
        mine = [j for j in judged if detector in ("all", j.detector)]
        for low, high in itertools.pairwise(BINS):
            inside = [j for j in mine if low <= j.confidence < high]
            if inside:
                mean = sum(j.confidence for j in inside) / len(inside)
                out.append(Bin(detector, low, min(high, 1.0), len(inside), sum(j.right for j in inside), mean))
    return out


def thresholds(judged: Sequence[Judged], levels: Mapping[str, float]) -> list[tuple[str, float, int, float | None]]:
    """For each policy threshold (name -> confidence), the machine-naming findings at or above it and the share
    that named a faulty machine: what acting on that threshold would have got right over this eval."""
    named = [j for j in judged if j.names_node]
    out = []
    for name, level in levels.items():
        above = [j for j in named if j.confidence >= level]
        out.append((name, level, len(above), sum(j.right for j in above) / len(above) if above else None))
    return out


def format_report(bins: Sequence[Bin], levels: Sequence[tuple[str, float, int, float | None]]) -> str:
    lines = [f"{'detector':<18} {'confidence':<11} {'findings':>8} {'mean conf':>9} {'right':>6}"]
    for b in bins:
        span = f"{b.low:.1f}-{b.high:.1f}"
        lines.append(f"{b.detector:<18} {span:<11} {b.findings:>8} {b.mean_confidence:>9.2f} {b.accuracy:>6.0%}")
    lines.append("")
    for name, level, count, share in levels:
        right = "-" if share is None else f"{share:.0%}"
        lines.append(
            f"policy {name} threshold {level:.2f}: {count} machine-naming findings at or above it, {right} right"
        )
    return "\n".join(lines)
