"""The scale-eval benchmark's outcomes and report (lab/bench/scale_eval.py): each scenario's result, the
table printed and the JSON written."""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from lab.bench.cpu import format_cores


@dataclass
class Outcome:
    """One scenario's result, as the table and the JSON show it."""

    scenario: str
    description: str
    job_id: str
    nodes: int
    node_injected: str
    target_s: float
    injected_at: str | None = None
    # Seen by the scheduler's long poll, and as the database stamped it (the pass's transaction start).
    time_to_decision_s: float | None = None
    decision_stamped_after_s: float | None = None
    answer: str | None = None  # the kind of the first right decision
    decided: dict[str, list[str]] = field(default_factory=dict)  # node -> decision kinds
    accused: list[str] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    incidents: list[dict[str, Any]] = field(default_factory=list)
    passes: dict[str, Any] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return (
            self.error is None
            and self.time_to_decision_s is not None
            and self.time_to_decision_s <= self.target_s
            and not self.accused
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.passed}


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} s"


def _decided(outcome: Outcome) -> str:
    if not outcome.decided:
        return "none"
    return "; ".join(f"{node} {', '.join(kinds)}" for node, kinds in outcome.decided.items())


def _verdict_line(outcome: Outcome) -> str:
    verdict = "PASS" if outcome.passed else "FAIL"
    detail = f"error: {outcome.error}" if outcome.error else f"decided {_decided(outcome)}"
    return (
        f"{outcome.scenario}: {verdict}, time to decision {_seconds(outcome.time_to_decision_s)} "
        f"(target {outcome.target_s:g} s), healthy nodes accused {len(outcome.accused)}; {detail}"
    )


def format_table(outcomes: list[Outcome], args: argparse.Namespace) -> str:
    gpus = args.nodes * args.gpus_per_node
    header = ("scenario", "node injected", "node(s) decided", "time to decision", "healthy accused", "target", "result")
    rows = [
        (
            o.scenario,
            o.node_injected,
            _decided(o) if not o.error else f"error: {o.error}",
            _seconds(o.time_to_decision_s) + (f" ({o.answer})" if o.answer else ""),
            str(len(o.accused)),
            f"<= {o.target_s:g} s",
            "PASS" if o.passed else "FAIL",
        )
        for o in outcomes
    ]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "",
        f"faultline bench scale-eval: {args.nodes:,} nodes x {args.gpus_per_node} GPUs = {gpus:,} GPUs sampled every "
        f"{args.sample_interval:g} s, shipped every {args.ship_interval:g} s; {os.cpu_count()} CPUs",
        "",
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
    ]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.append("")
    lines += [line for o in outcomes for line in _details(o)]
    return "\n".join(lines)


def _details(o: Outcome) -> list[str]:
    lines = [f"{o.scenario}: {o.description}, job {o.job_id}"]
    if o.accused:
        lines.append(f"  healthy nodes accused: {', '.join(o.accused[:10])}" + (" ..." if len(o.accused) > 10 else ""))
    if o.decision_stamped_after_s is not None:
        lines.append(f"  decision stamped {o.decision_stamped_after_s:.1f} s after the injection (its pass's start)")
    load = o.load
    if load:
        latency = load.get("latency_ms") or {}
        lines.append(
            f"  ingest: {load['sustained_ratio']:.3f} of offered samples stored in time, latency p50 "
            f"{latency.get('p50')} ms p99 {latency.get('p99')} ms, non-2xx {load.get('non_2xx')}, errors "
            f"{load.get('errors')}"
        )
        cores = load.get("cpu_cores") or {}
        if cores:
            lines.append(f"  CPU cores: {format_cores(cores)}")
    p = o.passes
    if p:
        lines.append(
            f"  diagnosis passes of this job: {p['count']}, p50 {_seconds(p['p50_s'])}, max {_seconds(p['max_s'])}, "
            f"{p['busy_s']:.0f} s in all; of other jobs: {p['other_jobs_count']} ({p['other_jobs_busy_s']:.0f} s)"
        )
    return lines


def _report(outcomes: list[Outcome], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "at": datetime.now().astimezone().isoformat(),
        "config": {
            key: (str(value) if isinstance(value, Path) else value)
            for key, value in vars(args).items()
            if not callable(value)
        },
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "scenarios": [o.to_json() for o in outcomes],
        "passed": bool(outcomes) and all(o.passed for o in outcomes),
    }
