"""What a person reads from the preflight, on every node: each round's groups with their figures and verdicts, the
named nodes and why, and what it means for this node."""

from __future__ import annotations

from typing import Any

SHAPES = {
    "local": "failed its own checks (a GPU)",
    "slow": "slow with every node (its network)",
    "pair": "the link to its pair",
}


def figures_text(figures: dict[str, Any]) -> str:
    parts = []
    for key, unit in (("busbw_gbps", "GB/s"), ("latency_us", "us"), ("gemm_tflops", "TFLOPS")):
        if key in figures:
            parts.append(f"{key.split('_')[0]} {figures[key]:.4g} {unit}")
    if "allreduce_node_gbps" in figures:
        parts.append(f"local all-reduce {figures['allreduce_node_gbps']:.4g} GB/s")
    return ", ".join(parts)


def _members(group: dict[str, Any], width: int = 6) -> str:
    nodes = [n for n in group["nodes"] if n != group.get("ref")]
    text = ",".join(nodes[:width]) + (f",... ({len(nodes)} nodes)" if len(nodes) > width else "")
    return text + (f" + {group['ref']} (known good)" if group.get("ref") else "")


def render(outcome: dict[str, Any], *, node: str | None = None, max_groups: int = 40) -> list[str]:
    lines = []
    for r in outcome["rounds"]:
        groups = r["groups"]
        failed = [g for g in groups if g["verdict"] != "pass"]
        took = f", {r['seconds']:g} s" if r.get("seconds") is not None else ""
        lines.append(f"round {r['index']} ({r['phase']}): {len(groups)} groups, {len(failed)} failed{took}")
        shown = groups if len(groups) <= max_groups else failed
        for g in shown:
            figures = figures_text(g.get("figures") or {})
            why = "" if g["verdict"] == "pass" else g["why"]
            detail = "  ".join(part for part in (figures, why) if part)
            lines.append(f"  {g['verdict'].upper():<7} {_members(g)}  {detail}".rstrip())
        if len(shown) < len(groups):
            lines.append(f"  ({len(groups) - len(shown)} passing groups not shown)")
    for n in outcome["named"]:
        peer = f" with {n['peer']}" if n.get("peer") else ""
        lines.append(f"NAMED {n['node']}: {SHAPES.get(n['shape'], n['shape'])}{peer}: {n['why']}")
    for n in outcome["unresolved"]:
        lines.append(f"unresolved: {n['node']}: {n['why']} (not named)")
    rounds = len(outcome["rounds"])
    lines.append(
        f"{len(outcome['nodes'])} nodes, {rounds} rounds, {outcome['measurements']} group measurements"
        + ("" if outcome["complete"] else "; stopped at the deadline, the search is incomplete")
    )
    named = sorted({n["node"] for n in outcome["named"]})
    lines.append("named: " + (", ".join(named) if named else "none"))
    if node is not None:
        if node in named:
            lines.append(f"this node ({node}) is named bad: the job should not start on it")
        elif named:
            lines.append(f"this node ({node}) passed; another node of this allocation is named bad")
        else:
            lines.append(f"this node ({node}) passed")
    return lines


def render_answer(answer: dict[str, Any]) -> list[str]:
    """The service's answer: the decisions it made for the named nodes."""
    decisions = answer.get("decisions") or []
    if not decisions:
        return [f"faultline: recorded preflight {answer.get('id', '')}; no decision".rstrip()]
    return [f"faultline: recorded preflight {answer.get('id', '')}; decisions:"] + [
        f"  {d['kind']} {d.get('node') or ''} ({d['state']}) #{d['id']}: {d.get('reason', '')}"[:300] for d in decisions
    ]
