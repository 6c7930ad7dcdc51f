"""The stacks detector's analyses as the page shows them: stack groups and the merged stack tree."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from service.incidents.schemas import FindingOut

TREE_DEPTH = 48  # deeper stack trees are cut (the detector keeps 40 frames)


@dataclass
class TreeNode:
    name: str
    count: int
    children: list[TreeNode]
    outlier: bool = False  # on the culprit's path
    shared: bool = False  # ... where every rank still is (the culprit has not parted from the rest yet)
    open: bool = False
    cut: bool = False  # deeper frames not shown


@dataclass
class StackGroupRow:
    signature: str
    state: str
    op: str
    ranks: str
    count: int
    node_count: int
    nodes: list[str]
    frames: list[str]
    outlier: bool


@dataclass
class StackView:
    findings: list[FindingOut]  # one analysis names one finding per machine: shown once
    method: str
    why: str
    dominant: str | None
    dominant_state: str | None
    culprit_ranks: str
    culprit_state: str | None
    covering_group: str | None
    unreported: str
    ranks_reporting: int | None
    signals_omitted: int
    groups: list[StackGroupRow]
    tree: TreeNode | None


def _tree(raw: Any, depth: int = 0) -> TreeNode | None:
    if not isinstance(raw, Mapping):
        return None
    children = raw.get("children") if isinstance(raw.get("children"), list) else []
    node = TreeNode(name=str(raw.get("name", "?")), count=int(raw.get("count") or 0), children=[])
    if depth >= TREE_DEPTH:
        node.cut = bool(children)
        return node
    node.children = [c for c in (_tree(c, depth + 1) for c in children) if c is not None]
    return node


def _paths(node: TreeNode, trail: list[TreeNode]) -> Iterable[list[TreeNode]]:
    if not node.children:
        yield trail
    for child in node.children:
        yield from _paths(child, [*trail, child])


def _matched(path: list[TreeNode], frames: list[str]) -> int:
    """How many of the culprit's frames (innermost first) this root-to-leaf path ends with; a '... N frames ...'
    gap the detector put in a deep stack counts as the rest matching."""
    n = 0
    for node, frame in zip(reversed(path), frames, strict=False):
        if node.name.startswith("... ") and node.name.endswith(" frames ..."):
            return len(frames)
        if node.name != frame:
            break
        n += 1
    return n


def stack_tree(raw: Any, culprit_frames: Any) -> TreeNode | None:
    """The merged stack tree, depth-limited, with the culprit's path marked and the busy branches open."""
    root = _tree(raw)
    if root is None:
        return None
    frames = [str(f) for f in culprit_frames] if isinstance(culprit_frames, list) else []
    if frames:
        best, best_n = None, 0
        for path in _paths(root, []):
            n = _matched(path, frames)
            if n > best_n and (n == len(frames) or n == len(path)):
                best, best_n = path, n
        for node in best or []:
            node.outlier = True
    _open(root, root.count)
    return root


def _open(node: TreeNode, total: int) -> None:
    node.open = node.outlier or node.count * 2 >= total
    node.shared = node.outlier and node.count >= total
    for child in node.children:
        _open(child, total)


def _groups(raw: Any, dominant: Any) -> list[StackGroupRow]:
    rows = []
    for g in raw if isinstance(raw, list) else []:
        if not isinstance(g, Mapping):
            continue
        nodes = [str(n) for n in g.get("nodes") or []]
        rows.append(
            StackGroupRow(
                signature=str(g.get("signature", "")),
                state=str(g.get("state", "")),
                op=str(g.get("op", "")),
                ranks=str(g.get("ranks", "")),
                count=int(g.get("count") or 0),
                node_count=int(g.get("node_count") or len(nodes)),
                nodes=nodes,
                frames=[str(f) for f in g.get("frames") or []],
                outlier=dominant is not None and g.get("signature") != dominant,
            )
        )
    return rows


def stack_views(findings: Iterable[FindingOut]) -> list[StackView]:
    """The stack analyses behind the stacks detector's findings, each once (it names one finding per machine)."""
    views: dict[str, StackView] = {}
    for f in findings:
        ev = f.evidence
        if f.detector != "stacks" or not (ev.get("groups") or ev.get("tree")):
            continue
        key = str(ev.get("stack_request") or json.dumps(ev.get("groups"), sort_keys=True, default=str))
        if key in views:
            views[key].findings.append(f)
            continue
        covering = ev.get("covering_group")
        views[key] = StackView(
            findings=[f],
            method=str(ev.get("method") or ""),
            why=str(ev.get("why") or ""),
            dominant=ev.get("dominant"),
            dominant_state=ev.get("dominant_state"),
            culprit_ranks=str(ev.get("culprit_ranks") or ""),
            culprit_state=ev.get("culprit_state"),
            covering_group=(
                f"{covering.get('dim', '?')} group of ranks {covering.get('ranks', '?')}"
                if isinstance(covering, Mapping)
                else None
            ),
            unreported=str(ev.get("unreported") or ""),
            ranks_reporting=ev.get("ranks_reporting") if isinstance(ev.get("ranks_reporting"), int) else None,
            signals_omitted=int(ev.get("signals_omitted") or 0),
            groups=_groups(ev.get("groups"), ev.get("dominant")),
            tree=stack_tree(ev.get("tree"), ev.get("culprit_frames")),
        )
    return list(views.values())
