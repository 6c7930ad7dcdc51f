"""Shared causes: findings on several nodes explained by one component they share (a leaf switch, a rack, a power
domain, a driver, firmware or kernel version, a storage mount).

Pure: node findings (node, category, when) and the fleet's node labels in, groups out. A group is a label value
(switch `leaf-7`) whose nodes show findings of one category that started within a short window, when those nodes
are concentrated in it compared with the fleet:

- at least `min_nodes` nodes, and at least `min_share` of the nodes with that label value (a switch with 16 nodes
  behind it and 3 of them erring is three faults, not the switch);
- most of the nodes with that finding carry the value (`min_concentration`), and far more than the value's share of
  the fleet would give by chance (`min_lift`);
- the chance of so many of the faulty nodes landing on the value by accident, drawn from the fleet at random (the
  hypergeometric tail), is below `max_chance`.

So a label the whole fleet shares (one driver version everywhere) never groups unrelated faults: its lift is 1 and
the chance 1. A single faulty node (the normal case) never groups either.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

# The node label a component is read from -> the component's kind (service/models/shared_causes.py COMPONENT_KINDS).
LABEL_KINDS: dict[str, str] = {
    "switch": "switch",
    "rack": "rack",
    "power_domain": "power_domain",
    "driver_version": "driver",
    "firmware_version": "firmware",
    "kernel_version": "kernel",
    "storage_mounts": "storage",
    "nvlink_domain": "nvlink_domain",
}
# Most likely first, per category: when one set of nodes is explained by several labels (every node behind the switch
# is also in one rack; the job's machines got the new driver and sit in one power domain), the group names the first
# kind here. IB errors point at the switch before the rack; GPU errors at a version only those nodes run before where
# they sit (a power domain that fails takes its nodes dark rather than making their GPUs err).
_PRECEDENCE = ("switch", "power_domain", "rack", "storage", "driver", "firmware", "kernel", "nvlink_domain")
_PRECEDENCE_BY_CATEGORY: dict[str, tuple[str, ...]] = {
    "gpu_hardware": ("driver", "firmware", "nvlink_domain", "power_domain", "rack", "kernel"),
    "nvlink": ("nvlink_domain", "driver", "firmware", "power_domain", "rack"),
    "pcie": ("driver", "firmware", "kernel", "power_domain", "rack"),
    "storage": ("storage", "kernel"),
    "host": ("power_domain", "rack", "kernel", "storage"),
}
# Categories a component can explain; user code, NaN loss and victims' symptoms are no component's fault.
SHARED_CATEGORIES = frozenset({"gpu_hardware", "nvlink", "pcie", "network", "host", "storage", "straggler"})
# Which kinds of component can cause which categories: a driver throws Xids, a switch drops IB links.
_EXPLAINS: dict[str, frozenset[str]] = {
    "switch": frozenset({"network", "straggler"}),
    "rack": frozenset({"network", "host", "gpu_hardware", "straggler", "pcie", "nvlink"}),
    "power_domain": frozenset({"network", "host", "gpu_hardware", "straggler", "pcie", "nvlink"}),
    "driver": frozenset({"gpu_hardware", "nvlink", "pcie", "straggler"}),
    "firmware": frozenset({"gpu_hardware", "nvlink", "pcie", "straggler"}),
    "kernel": frozenset({"host", "network", "storage", "pcie", "gpu_hardware"}),
    "storage": frozenset({"storage", "host", "straggler"}),
    "nvlink_domain": frozenset({"nvlink", "gpu_hardware", "straggler"}),
}


@dataclass(frozen=True, slots=True)
class NodeFinding:
    """A finding about one node, as grouping reads it."""

    node: str
    category: str
    observed_at: datetime
    finding_id: int | None = None


@dataclass(frozen=True, slots=True)
class Params:
    window_s: float = 300.0  # the findings start within this of each other
    min_nodes: int = 3
    min_share: float = 0.5  # of the nodes with the label value
    min_concentration: float = 0.8  # of the nodes with the finding, on the label value
    min_lift: float = 2.0  # concentration over the value's share of the fleet
    max_chance: float = 0.05  # hypergeometric tail: so many on the value by accident


@dataclass(frozen=True, slots=True)
class SharedGroup:
    component_kind: str  # switch, rack, driver, ...
    component: str  # the label's value: the switch's name, the driver version, the mount
    label: str  # the node label it was read from
    category: str  # the findings' category
    nodes: tuple[str, ...]  # the members, sorted
    finding_ids: tuple[int, ...]
    first_at: datetime
    last_at: datetime
    value_nodes: int  # fleet nodes with this label value
    labelled_nodes: int  # fleet nodes with any value of this label
    faulty_nodes: int  # nodes with a finding of this category in the window
    lift: float
    chance: float
    also: tuple[str, ...] = field(default=())  # other labels naming the same nodes ("rack r12")

    @property
    def confidence(self) -> float:
        """How sure: 1 - the chance of an accident, capped so a person's view is never "certain"."""
        return round(min(0.99, max(0.5, 1.0 - self.chance)), 4)

    @property
    def summary(self) -> str:
        share = f"{len(self.nodes)} of the {self.value_nodes} nodes"
        return (
            f"{self.category} findings on {share} with {self.label} {self.component} within "
            f"{(self.last_at - self.first_at).total_seconds():.0f} s ({self.faulty_nodes} nodes with such findings in "
            f"all; {self.value_nodes} of {self.labelled_nodes} labelled nodes have this {self.label}): "
            f"the {self.component_kind} is the likely cause"
        )

    def evidence(self) -> dict[str, Any]:
        """JSON for the shared incident's evidence."""
        return {
            "categories": [self.category],
            "label": self.label,
            "confidence": self.confidence,
            "value_nodes": self.value_nodes,
            "labelled_nodes": self.labelled_nodes,
            "faulty_nodes": self.faulty_nodes,
            "lift": round(self.lift, 3),
            "chance": self.chance,
            "first_at": self.first_at.isoformat(),
            "last_at": self.last_at.isoformat(),
            "finding_ids": list(self.finding_ids[:200]),
            "also": list(self.also),
        }


def label_values(labels: Mapping[str, Any], key: str) -> list[str]:
    """The values of one label on a node: a list label (storage mounts) has several, a scalar one; none when absent."""
    value = labels.get(key)
    if value is None or value == "":
        return []
    if isinstance(value, list | tuple):
        return [str(v) for v in value if v not in (None, "")]
    return [str(value)]


def chance_at_least(k: int, n: int, value_nodes: int, fleet: int) -> float:
    """P(X >= k) for X ~ Hypergeometric(fleet, value_nodes, n): of `n` faulty nodes drawn at random from `fleet`,
    at least `k` carry a value `value_nodes` of the fleet carry."""
    if fleet <= 0 or n <= 0 or k <= 0:
        return 1.0
    n = min(n, fleet)
    value_nodes = min(value_nodes, fleet)
    total = math.comb(fleet, n)
    hits = sum(
        math.comb(value_nodes, i) * math.comb(fleet - value_nodes, n - i) for i in range(k, min(n, value_nodes) + 1)
    )
    return min(1.0, hits / total)


def _earliest_window(starts: Sequence[tuple[datetime, str]], window_s: float) -> list[str]:
    """The most nodes whose first findings lie within `window_s` of each other (earliest such run on a tie)."""
    best: list[str] = []
    j = 0
    for i in range(len(starts)):
        while (starts[i][0] - starts[j][0]).total_seconds() > window_s:
            j += 1
        if i - j + 1 > len(best):
            best = [node for _, node in starts[j : i + 1]]
    return best


def detect(
    findings: Iterable[NodeFinding], labels: Mapping[str, Mapping[str, Any]], params: Params | None = None
) -> list[SharedGroup]:
    """Groups of nodes whose findings one shared component explains; one group per (component, category), the most
    specific component kind when several label the same nodes. `labels`: every node of the fleet (name -> its
    labels), the faulty ones and the others, so a value's share of the fleet is known."""
    p = params or Params()
    by_category: dict[str, dict[str, list[NodeFinding]]] = defaultdict(lambda: defaultdict(list))
    for f in findings:
        if f.node and f.category in SHARED_CATEGORIES:
            by_category[f.category][f.node].append(f)
    groups: list[SharedGroup] = []
    for category, per_node in sorted(by_category.items()):
        if len(per_node) < max(2, p.min_nodes):
            continue
        found = [g for label in LABEL_KINDS for g in _groups_of(category, per_node, labels, label, p)]
        groups += _most_specific(found, _PRECEDENCE_BY_CATEGORY.get(category, _PRECEDENCE))
    return groups


def _groups_of(
    category: str, per_node: Mapping[str, list[NodeFinding]], labels: Mapping[str, Mapping[str, Any]], label: str,
    p: Params,
) -> list[SharedGroup]:  # fmt: skip
    kind = LABEL_KINDS[label]
    if category not in _EXPLAINS[kind]:
        return []
    fleet_values: dict[str, int] = defaultdict(int)
    labelled = 0
    for node_labels in labels.values():
        values = label_values(node_labels, label)
        labelled += bool(values)
        for v in set(values):
            fleet_values[v] += 1
    if not labelled:
        return []
    first = {n: min(f.observed_at for f in fs) for n, fs in per_node.items() if label_values(labels.get(n, {}), label)}
    out: list[SharedGroup] = []
    for value in sorted({v for n in first for v in label_values(labels[n], label)}):
        starts = sorted((t, n) for n, t in first.items() if value in label_values(labels[n], label))
        members = _earliest_window(starts, p.window_s)
        opened = min(first[m] for m in members)
        # The nodes with such a finding that started in the same window, on the value or not.
        n = sum(1 for t in first.values() if 0 <= (t - opened).total_seconds() <= p.window_s)
        k, size = len(members), fleet_values[value]
        if k < max(2, p.min_nodes, math.ceil(p.min_share * size)):
            continue
        concentration = k / n
        lift = concentration / (size / labelled)
        chance = chance_at_least(k, n, size, labelled)
        if concentration < p.min_concentration or lift < p.min_lift or chance > p.max_chance:
            continue
        chosen = [f for m in members for f in per_node[m]]
        times = [first[m] for m in members]
        out.append(
            SharedGroup(
                component_kind=kind,
                component=value,
                label=label,
                category=category,
                nodes=tuple(sorted(members)),
                finding_ids=tuple(sorted(f.finding_id for f in chosen if f.finding_id is not None)),
                first_at=min(times),
                last_at=max(times),
                value_nodes=size,
                labelled_nodes=labelled,
                faulty_nodes=n,
                lift=lift,
                chance=chance,
            )
        )
    return out


def _most_specific(found: list[SharedGroup], precedence: Sequence[str]) -> list[SharedGroup]:
    """Of groups naming mostly the same nodes (a switch's nodes are also its rack's; the job's machines got the new
    driver and most of them sit in one power domain), the kind first in `precedence`: they are rival explanations of
    the same failures, and one is kept, the others as `also` on it. Groups of other nodes stand on their own."""
    order = {kind: i for i, kind in enumerate(precedence)}
    kept: list[SharedGroup] = []
    for g in sorted(found, key=lambda g: (order.get(g.component_kind, len(order)), -len(g.nodes), g.component)):
        same = next((k for k in kept if 2 * len(set(g.nodes) & set(k.nodes)) > len(g.nodes)), None)
        if same is None:
            kept.append(g)
        else:
            kept[kept.index(same)] = _with_also(same, f"{g.label} {g.component}")
    return sorted(kept, key=lambda g: (g.category, g.component_kind, g.component))


def _with_also(group: SharedGroup, also: str) -> SharedGroup:
    return replace(group, also=(*group.also, also))


@dataclass(frozen=True, slots=True)
class Rival:
    """An open shared incident as a new group is weighed against it: the findings it already explains."""

    incident_id: int
    component_kind: str
    component: str
    finding_ids: frozenset[int]
    members: int


def against_rivals(
    group: SharedGroup, rivals: Iterable[Rival], node_of: Mapping[int, Collection[str]], min_nodes: int
) -> tuple[SharedGroup | None, list[int]]:
    """A new group weighed against the open incidents of other components that already claim some of its findings
    (a pass that saw a driver rollout's first Xids before its nodes reported the new version blamed their power
    domain; the next names the driver). The explanation covering more nodes wins, and of two over as many the kind
    first in the category's precedence (a driver before a power domain for GPU errors): the rival is superseded
    (its id returned); the findings a rival with as many or more members claims are taken out of the
    group, which stands only if it keeps `min_nodes` nodes (a member's later fault of its own does not join the
    rival's findings into a second component's group). Returns (the group as it stands or None, superseded ids)."""
    ids = set(group.finding_ids)
    superseded: list[int] = []
    for rival in rivals:
        if (rival.component_kind, rival.component) == (group.component_kind, group.component):
            continue
        claimed = ids & rival.finding_ids
        if not claimed:
            continue
        if len(group.nodes) > rival.members or (
            len(group.nodes) == rival.members
            and _ranks_before(group.component_kind, rival.component_kind, group.category)
        ):
            superseded.append(rival.incident_id)
        else:
            ids -= claimed
    if len(ids) == len(group.finding_ids):
        return group, superseded
    nodes = sorted({n for i in ids for n in node_of.get(i, ())} & set(group.nodes))
    if len(nodes) < min_nodes:
        return None, []
    return replace(group, nodes=tuple(nodes), finding_ids=tuple(sorted(ids))), superseded


def _ranks_before(kind: str, other: str, category: str) -> bool:
    """Whether `kind` is a likelier explanation than `other` of findings of `category` (see _PRECEDENCE)."""
    order = _PRECEDENCE_BY_CATEGORY.get(category, _PRECEDENCE)
    rank = {k: i for i, k in enumerate(order)}
    return rank.get(kind, len(order)) < rank.get(other, len(order))
