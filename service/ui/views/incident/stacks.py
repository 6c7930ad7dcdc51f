"""The stacks detector's analyses as the page shows them: stack groups and the merged stack tree."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ml.findings import StackGroupEvidence, StackTreeNode, stack_evidence, stack_tree_of
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


def _tree(raw: StackTreeNode, depth: int = 0) -> TreeNode:
    children = raw.get("children", [])
    node = TreeNode(name=raw.get("name", "?"), count=raw.get("count") or 0, children=[])
    if depth >= TREE_DEPTH:
        node.cut = bool(children)
        return node
    node.children = [_tree(c, depth + 1) for c in children]
    return node


def _paths(node: TreeNode, trail: list[TreeNode]) -> Iterable[list[TreeNode]]:
    if not node.children:
        yield trail
    for child in node.children:
        yield from _paths(child, [*trail, child])


def _matched(path: list[TreeNode], frames: Sequence[str]) -> int:
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


def stack_tree(raw: object, culprit_frames: Sequence[str]) -> TreeNode | None:
    """The merged stack tree, depth-limited, with the culprit's path marked and the busy branches open."""
    tree = stack_tree_of(raw)
    return _marked_tree(tree, culprit_frames) if tree is not None else None


def _marked_tree(tree: StackTreeNode, frames: Sequence[str]) -> TreeNode:
    """`stack_tree` of a tree already read."""
    root = _tree(tree)
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


def _groups(groups: list[StackGroupEvidence], dominant: str | None) -> list[StackGroupRow]:
    rows = []
    for g in groups:
        nodes = g.get("nodes", [])
        rows.append(
            StackGroupRow(
                signature=g.get("signature", ""),
                state=g.get("state", ""),
                op=g.get("op", ""),
                ranks=g.get("ranks", ""),
                count=g.get("count") or 0,
                node_count=g.get("node_count") or len(nodes),
                nodes=nodes,
                frames=g.get("frames", []),
                outlier=dominant is not None and g.get("signature") != dominant,
            )
        )
    return rows


def stack_views(findings: Iterable[FindingOut]) -> list[StackView]:
    """The stack analyses behind the stacks detector's findings, each once (it names one finding per machine)."""
    views: dict[str, StackView] = {}
    for f in findings:
        ev = stack_evidence(f.evidence) if f.detector == "stacks" else None
        if ev is None or not (ev["groups"] or ev["tree"]):
            continue  # not a hang analysis (fail-slow rounds, a request that found nothing), or unreadable
        key = ev.get("stack_request") or json.dumps(ev["groups"], sort_keys=True, default=str)
        if key in views:
            views[key].findings.append(f)
            continue
        covering = ev.get("covering_group")
        group = (
            f"{covering.get('dim', '?')} group of ranks {covering.get('ranks', '?')}" if covering is not None else None
        )
        views[key] = StackView(
            findings=[f],
            method=ev.get("method") or "",
            why=ev.get("why") or "",
            dominant=ev.get("dominant"),
            dominant_state=ev.get("dominant_state"),
            culprit_ranks=ev.get("culprit_ranks") or "",
            culprit_state=ev.get("culprit_state"),
            covering_group=group,
            unreported=ev.get("unreported") or "",
            ranks_reporting=ev.get("ranks_reporting"),
            signals_omitted=ev.get("signals_omitted") or 0,
            groups=_groups(ev["groups"], ev.get("dominant")),
            tree=_marked_tree(ev["tree"], ev.get("culprit_frames", [])),
        )
    return list(views.values())
