"""What a replay printed: the files read, then what faultline decided and why, with the evidence lines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents.replay.client import Outcome
from agents.replay.timeline import NodeReplay

MAX_EVIDENCE_LINES = 4
MAX_LINE = 160


def _clip(text: str, limit: int = MAX_LINE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_inputs(nodes: Sequence[NodeReplay], files: dict[str, list[str]], span_s: float) -> list[str]:
    """One line per node: its files and what the agent's parsers made of them."""
    rows = [f"replayed {sum(len(n.events) for n in nodes)} events on {len(nodes)} nodes, spanning {span_s:.1f} s"]
    for node in nodes:
        kinds: dict[str, int] = {}
        for event in node.events:
            kinds[event.kind] = kinds.get(event.kind, 0) + 1
        top = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))[:8])
        gpus = f"; {len(node.readings)} GPU readings" if node.readings else ""
        rows.append(f"  {node.node}: {', '.join(files.get(node.node, []))}{gpus}")
        rows.append(f"    events: {top or 'none'}")
    return rows


def _evidence_lines(incident: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for finding in incident.get("findings") or []:
        evidence = finding.get("evidence") or {}
        for line in evidence.get("lines") or []:
            text = _clip(line)
            if text and text not in lines:
                lines.append(text)
    return lines[:MAX_EVIDENCE_LINES]


def format_outcome(outcome: Outcome) -> list[str]:
    """Incidents (root cause, blame, suspects, evidence) and decisions, as a person reads them."""
    rows: list[str] = []
    if not outcome.incidents:
        rows.append("incidents: none")
    for incident in outcome.incidents:
        rows.append(
            f"incident #{incident.get('id')}: {incident.get('root_cause')}, blame {incident.get('blame')}, "
            f"{incident.get('severity')}, confidence {float(incident.get('confidence') or 0):.2f} "
            f"({incident.get('state')})"
        )
        rows.append(f"  {_clip(incident.get('summary') or '')}")
        for suspect in incident.get("suspects") or []:
            rows.append(
                f"  suspect {suspect.get('node')}: {suspect.get('action')} "
                f"({float(suspect.get('confidence') or 0):.2f}) {_clip(suspect.get('reason') or '', 120)}"
            )
        for finding in incident.get("findings") or []:
            rows.append(
                f"  finding {finding.get('detector')}/{finding.get('category')} ({finding.get('role')}, "
                f"{finding.get('action')}): {_clip(finding.get('summary') or '', 120)}"
            )
        evidence = _evidence_lines(incident)
        if evidence:
            rows.append("  evidence:")
            rows += [f"    | {line}" for line in evidence]
    if not outcome.decisions:
        rows.append("decisions: none")
    for decision in outcome.decisions:
        target = decision.get("node") or "the job"
        gpu = f" GPU {decision['gpu']}" if decision.get("gpu") is not None else ""
        rows.append(
            f"decision {decision.get('kind')} {target}{gpu} ({decision.get('state')}, "
            f"{float(decision.get('confidence') or 0):.2f}): {_clip(decision.get('reason') or '', 140)}"
        )
    if not outcome.settled:
        rows.append(
            f"(not settled after {outcome.waited_s:.0f} s: still changing, or not yet read by a whole diagnosis pass; "
            "what is above may not be final)"
        )
    return rows
