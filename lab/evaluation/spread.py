"""What the eval reports beyond evictions: false accusations (diagnose decisions on healthy machines) and,
over several seeds (`--repeat`), each scenario's outcome with its spread."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lab.evaluation.records import Decision, Fault, ScenarioScore

# Decisions that accuse a machine without taking it away; on a healthy machine each is a false accusation.
ACCUSING_KINDS = frozenset({"diagnose", "reset_gpu"})
TARGET_FALSE_ACCUSATIONS_PER_FAULT = 0.2


def false_accusations(decisions: Iterable[Decision], faulty: frozenset[str]) -> list[str]:
    """Healthy machines named by a diagnose decision a person did not reject, each once."""
    return sorted(
        {
            d.node
            for d in decisions
            if d.kind in ACCUSING_KINDS and d.node is not None and d.state != "rejected" and d.node not in faulty
        }
    )


# Actions a fault's ground truth may expect other than an eviction, each a decision kind naming the node.
ANSWER_ACTIONS = ("diagnose", "reset_gpu")


def unanswered(faults: Iterable[Fault], decisions: Sequence[Decision]) -> list[str]:
    """`no ACTION decision for NODE` for each fault whose ground truth expects a diagnose (or reset_gpu) decision
    on its node and got none (in any state but rejected)."""
    made = {(d.kind, d.node) for d in decisions if d.state != "rejected"}
    wanted = {(f.expect_action, n) for f in faults if f.expect_action in ANSWER_ACTIONS for n in f.nodes}
    missing: dict[str, list[str]] = {}
    for action, node in sorted(wanted - made):
        missing.setdefault(action, []).append(node)
    return [f"no {action} decision for {', '.join(nodes)}" for action, nodes in missing.items()]


@dataclass(frozen=True)
class ScenarioSpread:
    """One scenario over its seeds."""

    scenario: str
    runs: int
    correct: int
    tp: int
    fp: int
    fn: int
    false_accusations: int
    decided: int
    median_s: float | None
    p95_s: float | None
    min_s: float | None
    max_s: float | None
    stdev_s: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between closest ranks; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * min(max(q, 0.0), 100.0) / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def by_scenario(scores: Sequence[ScenarioScore]) -> list[ScenarioSpread]:
    """Per scenario, in the order first run: runs, correct runs, machine counts, false accusations and the time
    to decision over its seeds (median, p95, min, max, standard deviation)."""
    order: dict[str, list[ScenarioScore]] = {}
    for score in scores:
        order.setdefault(score.scenario, []).append(score)
    out = []
    for name, runs in order.items():
        times = [r.time_to_decision_s for r in runs if r.time_to_decision_s is not None]
        out.append(
            ScenarioSpread(
                scenario=name,
                runs=len(runs),
                correct=sum(r.correct for r in runs),
                tp=sum(r.tp for r in runs),
                fp=sum(r.fp for r in runs),
                fn=sum(r.fn for r in runs),
                false_accusations=sum(len(r.false_accusations) for r in runs),
                decided=len(times),
                median_s=statistics.median(times) if times else None,
                p95_s=percentile(times, 95),
                min_s=min(times) if times else None,
                max_s=max(times) if times else None,
                stdev_s=statistics.stdev(times) if len(times) >= 2 else None,
            )
        )
    return out


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_spread(rows: Sequence[ScenarioSpread]) -> str:
    """A plain-text table of by_scenario's rows."""
    header = ("scenario", "runs", "correct", "TP/FP/FN", "false acc.", "median s", "p95 s", "min-max s", "stdev s")
    table = [header]
    for r in rows:
        table.append(
            (
                r.scenario,
                str(r.runs),
                f"{r.correct}/{r.runs}",
                f"{r.tp}/{r.fp}/{r.fn}",
                str(r.false_accusations),
                _s(r.median_s),
                _s(r.p95_s),
                f"{_s(r.min_s)}-{_s(r.max_s)}" if r.min_s is not None else "-",
                _s(r.stdev_s),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
