"""Evidence shaped for reading: a finding's short scalar fields, and plots of the windows it cites."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ml.findings import FailslowEvidence, PeerEvidence, failslow_evidence, peer_evidence, signal_refs
from service.incidents.schemas import FindingOut
from service.ui import formatting, plots

# Evidence fields that are plumbing, not something an engineer weighs.
_NOT_NUMBERS = {"signature", "stack_request", "job_id", "unit", "dominant", "covering_group", "tree"}


@dataclass
class Chart:
    finding: FindingOut
    subject: str  # whose line is red: "node-3 GPU 1", "rank 5", "the job"
    metric: str
    direction: str | None
    plot: plots.Plot
    reference: str  # what the dashed line is: the peers' median, the job's usual pace


def numbers(evidence: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The evidence's short scalar fields (counts, rates, ratios, codes) as label/value pairs, with their units."""
    return formatting.evidence_numbers(evidence, skip=(*_NOT_NUMBERS, "signals", "lines", "messages", "why"))


def _gpu_subject(finding: FindingOut, evidence: PeerEvidence) -> str:
    unit = evidence.get("unit") or finding.subject
    node, _, gpu = unit.rpartition("/")
    return f"{node} GPU {gpu}" if node else unit


def charts(finding: FindingOut) -> list[Chart]:
    """Plots for a finding with window series: peers (every metric), fail-slow rounds (step time, CPU)."""
    if finding.detector == "peers":
        peers = peer_evidence(finding.evidence)
        return _peer_charts(finding, peers) if peers is not None else []
    if finding.detector == "failslow":
        slow = failslow_evidence(finding.evidence)
        return _failslow_charts(finding, slow) if slow is not None else []
    return []


def _peer_charts(finding: FindingOut, ev: PeerEvidence) -> list[Chart]:
    out = []
    for m in ev.get("metrics", []):
        metric = m.get("metric", "?")
        plot = plots.window_plot(plots.windows_from(m.get("windows", [])), title=metric, unit=plots.unit_of(metric))
        if plot:
            out.append(Chart(finding, _gpu_subject(finding, ev), metric, m.get("direction"), plot, "peers' median"))
    return out


def _failslow_charts(finding: FindingOut, ev: FailslowEvidence) -> list[Chart]:
    rounds = ev.get("rounds", [])
    if not rounds:
        return []
    first = rounds[0]
    who = finding.subject if finding.subject_kind == "rank" else "the job"
    if "rank_ms" in first:
        windows, metric, unit, ref = plots.windows_from(rounds, value="rank_ms"), "step time", "ms", "peers'"
    elif "rank_cpu_pct" in first:
        windows, metric, unit, ref = plots.windows_from(rounds, value="rank_cpu_pct"), "CPU", "%", "peers'"
    elif "step_s" in first:
        windows = plots.windows_from(rounds, value="step_s", baseline=ev.get("baseline_step_s"))
        metric, unit, ref = "seconds per step", "s", "the job's usual pace"
    else:
        return []
    plot = plots.window_plot(windows, title=metric, unit=unit)
    if not plot:
        return []
    reference = f"{ref} median" if ref == "peers'" else ref
    return [Chart(finding, who, metric, ev.get("direction"), plot, reference)]


# (node, subject, metric) -> windows of that node's subject against its peers' (service.nodes.subject_against_peers)
NodeWindows = Callable[[str, str, str], list[dict[str, Any]]]


def node_charts(finding: FindingOut, windows: NodeWindows) -> list[Chart]:
    """Plots for a machine-level finding: each port or host metric it cites, the machine against its peers."""
    if finding.detector != "node_signals":
        return []
    out = []
    seen = set()
    for ref in signal_refs(finding.evidence):
        node, subject, metric = ref.get("node"), ref.get("subject"), ref.get("metric")
        if ref["type"] != "node_metric" or not (node and subject and metric) or (subject, metric) in seen:
            continue
        seen.add((subject, metric))
        plot = plots.window_plot(
            plots.windows_from(windows(node, subject, metric)), title=metric, unit=plots.unit_of(metric)
        )
        if plot:
            out.append(Chart(finding, f"{node} {subject}", metric, None, plot, "peers' median"))
    return out


def distinct_charts(found: Iterable[Chart]) -> list[Chart]:
    """One chart per (subject, metric): the one from the latest finding, which covers the most recent windows."""
    latest: dict[tuple[str, str], Chart] = {}
    for chart in found:
        key = (chart.subject, chart.metric)
        if key not in latest or chart.finding.observed_at >= latest[key].finding.observed_at:
            latest[key] = chart
    return sorted(latest.values(), key=lambda c: (c.finding.role != "cause", -c.finding.confidence, c.subject))
