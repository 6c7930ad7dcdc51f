"""Typed evidence: each detector's stored evidence reads back typed; a malformed or older row reads as None."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ml.findings import (
    evidence_of,
    failslow_evidence,
    peer_evidence,
    signal_refs,
    stack_evidence,
    stack_tree_of,
)

T = "2026-11-22T21:32:14.054000+00:00"
LOG = [{"type": "log", "id": 7}]


def tree(depth: int) -> dict[str, Any]:
    """A merged stack tree that is one chain `depth` frames deep."""
    node: dict[str, Any] = {"name": f"f{depth}", "count": 1, "children": []}
    for i in reversed(range(depth)):
        node = {"name": f"f{i}", "count": 1, "children": [node]}
    return node


STACK_ANALYSIS: dict[str, Any] = {
    "signals": [{"type": "stack", "id": 3}],
    "signals_omitted": 7,
    "method": "named",
    "why": "rank 1 in data loading",
    "dominant": "40d2026a72a7",
    "dominant_state": "collective",
    "groups": [
        {
            "signature": "40d2026a72a7",
            "state": "collective",
            "op": "wait",
            "ranks": "0,2-7",
            "count": 7,
            "node_count": 4,
            "nodes": ["n0", "n1"],
            "frames": ["wait"],
        }
    ],
    "culprit_ranks": "1",
    "culprit_state": "data",
    "culprit_frames": ["_get_data"],
    "covering_group": None,
    "ranks_reporting": 8,
    "unreported": "",
    "tree": tree(3),
    "stack_request": "req-1",
}
STACK_ROUNDS: dict[str, Any] = {
    "signals": [{"type": "stack", "id": 4}],
    "method": "group_fallback",
    "rounds": 5,
    "informative_rounds": 4,
    "stragglers": "26,58",
    "out_counts": {"26": 4, "58": 4},
    "dominant_states": ["collective", None],
    "straggler_frames": ["matmul"],
    "covering_group": {"dim": "pp", "ranks": "26,58"},
    "stack_request": "req-2",
}
PEERS: dict[str, Any] = {
    "signals": [{"type": "metric", "node": "n1", "gpu": 1, "metric": "power_usage", "from": T, "to": T}],
    "unit": "n1/1",
    "job_id": "j1",
    "window_s": 30,  # a whole float may come back from the database as an int
    "continuity_s": 120.0,
    "metrics": [
        {
            "metric": "power_usage",
            "direction": "low",
            "score": 4.85,
            "windows_flagged": 4,
            "windows_analyzed": 8,
            "windows": [
                {
                    "start": T,
                    "end": T,
                    "value": 365.5,
                    "z": -4.9,
                    "score": 5.1,
                    "peer_median": 486.0,
                    "peer_p10": 472.5,
                    "peer_p90": 494.4,
                    "n_units": 32,
                }
            ],
        }
    ],
    "supporting": [{"metric": "sm_clock", "weight": 0.27, "direction": "low", "z": [-4.2, -3.1]}],
}
FAILSLOW: dict[str, Any] = {
    "signals": LOG,
    "rank": 5,
    "ratio": 1.4,
    "rounds": [
        {
            "start": T,
            "end": T,
            "rank_ms": 1400.0,
            "ratio": 1.4,
            "z": 6.0,
            "peer_median": 1000.0,
            "peer_p10": 990.0,
            "peer_p90": 1010.0,
            "n_peers": 7,
        }
    ],
}

# One row of each kind, as the detectors write it.
WELL_FORMED: list[tuple[str, dict[str, Any]]] = [
    (
        "signatures",
        {
            "signals": LOG,
            "signature": "e52034e146b368a4",
            "lines": ["NVRM: Xid (PCI:0000:43:00): 79"],
            "count": 1,
            "nodes": ["n1"],
            "xid": 79,
            "xid_severity": "fatal",
            "pci": ["0000:43:00"],
            "messages": ["GPU has fallen off the bus."],
        },
    ),
    ("signatures", {"signals": LOG, "count": 1, "nodes": ["n1"], "pci": "0000:43:00", "sxid": 12028}),
    # The data-loader rule's signal names replace the references.
    ("signatures", {"signals": ["SIGKILL"], "count": 2, "nodes": ["n1"], "ranks": [0, 1]}),
    (
        "alerts",
        {
            "signals": LOG,
            "signature": "abc",
            "lines": ["alert"],
            "count": 1,
            "nodes": ["n1"],
            "alertname": "DCGMGpuTemperatureHigh",
            "severity": "critical",
            "fingerprints": ["f00"],
            "category_from": "rules",
            "gpus": ["3"],
            "summary": "GPU 3 at 92 C",
        },
    ),
    (
        "counters",
        {
            "signals": [
                {"type": "metric", "node": "n1", "gpu": 1, "metric": "ecc_dbe_volatile", "ts": T, "from": 0, "to": 2.0}
            ],
            "signature": "uncorrectable",
            "count": 1,
            "gpus": [1],
            "counters": {"ecc_dbe_volatile": 2},
        },
    ),
    ("peers", PEERS),
    (
        "progress",
        {
            "signals": LOG,
            "last_step": 1200,
            "last_step_at": T,
            "seconds_without_progress": 640.2,
            "timeout_s": 600.0,
            "hang_timeout_s": 600,
            "ranks_alive": 8,
            "ranks_expected": 8,
            "ranks_missing": [],
            "gpus_computing": True,
        },
    ),
    (
        "progress",
        {
            "signals": [{"type": "metric", "metric": "tensor_active", "from": T, "to": T}],
            "metric": "tensor_active",
            "level_before": 0.41,
            "level_now": 0.0,
            "collapsed_since": T,
            "seconds_without_activity": 700.0,
            "hang_timeout_s": 600.0,
            "gpus_holding_memory": 8,
            "gpus_seen": 8,
        },
    ),
    ("failslow", FAILSLOW),
    (
        "failslow",
        {
            "signals": [{"type": "process", "rank": 6, "node": None, "from": T}],
            "rank": 6,
            "direction": "high",
            "job_progressing": True,
            "rounds": [{"start": T, "end": T, "rank_cpu_pct": 100.0, "z": 9.5, "peer_median": 12.0, "n_peers": 7}],
        },
    ),
    ("stacks", STACK_ANALYSIS),
    ("stacks", STACK_ROUNDS),
    ("stacks", {"stack_request": "req-3"}),  # a stack request that found nothing
    (
        "training_metrics",
        {
            "signals": LOG,
            "signature": "nan:loss",
            "lines": ["loss nan"],
            "count": 2,
            "nodes": ["n1"],
            "ranks": [0],
            "steps": [100, 101],
            "first_step": 100,
            "last_step": None,
            "metric": "loss",
            "anomaly": "nan",
            "persistent": True,
            "factors": [5, 6.5],
        },
    ),
    ("some_future_detector", {"signals": LOG, "anything": {"at": "all"}}),
]


@pytest.mark.parametrize(("detector", "raw"), WELL_FORMED)
def test_well_formed_evidence_reads_back_as_the_same_row(detector: str, raw: dict[str, Any]) -> None:
    stored = json.loads(json.dumps(raw))
    assert evidence_of(detector, stored) is stored  # a TypedDict is the dict itself: nothing copied or dropped


def test_the_per_kind_readers_accept_their_kind_and_keep_unknown_keys() -> None:
    assert stack_evidence(STACK_ANALYSIS) is STACK_ANALYSIS
    assert peer_evidence(PEERS) is PEERS and failslow_evidence(FAILSLOW) is FAILSLOW
    newer = {**PEERS, "a_key_from_a_later_version": [1, 2]}
    assert peer_evidence(newer) is newer
    # Fail-slow rounds of stacks and an empty request are no hang analysis.
    assert stack_evidence(STACK_ROUNDS) is None and stack_evidence({"stack_request": "r"}) is None


def _with(base: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A deep copy of `base` with the value at `path` replaced (or, for value ..., removed)."""
    out = json.loads(json.dumps(base))
    target = out
    for step in path[:-1]:
        target = target[step]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


MALFORMED: list[tuple[str, Any]] = [
    ("signatures", None),
    ("signatures", ["not", "a", "mapping"]),
    ("signatures", "text"),
    ("signatures", {"count": "3"}),
    ("signatures", {"count": True}),  # a bool is no count
    ("signatures", {"signals": [{"id": 1}]}),  # a reference without its type
    ("signatures", {"signals": "log 1"}),
    ("signatures", {"pci": [1]}),
    ("alerts", {"gpus": [3]}),
    ("counters", {"counters": {"ecc_dbe_volatile": "2"}}),
    ("peers", _with(PEERS, ("metrics",), {"power_usage": {}})),
    ("peers", _with(PEERS, ("metrics", 0, "windows", 0, "value"), "high")),
    ("peers", _with(PEERS, ("supporting", 0, "z"), -4.2)),
    ("progress", {"ranks_missing": [None]}),
    ("failslow", _with(FAILSLOW, ("rounds",), [1, 2])),
    ("failslow", _with(FAILSLOW, ("rounds", 0, "start"), 17)),
    ("stacks", _with(STACK_ANALYSIS, ("tree",), ...)),  # an older analysis without its tree
    ("stacks", _with(STACK_ANALYSIS, ("groups", 0, "nodes"), "n0")),
    ("stacks", _with(STACK_ANALYSIS, ("tree", "children", 0, "children"), "x")),
    ("stacks", _with(STACK_ANALYSIS, ("covering_group",), "pp")),
    ("stacks", _with(STACK_ROUNDS, ("rounds",), [{"start": "t"}])),
    ("stacks", _with(STACK_ROUNDS, ("out_counts",), [4, 4])),
    ("stacks", {"stack_request": 5}),
    ("training_metrics", {"first_step": "100"}),
    ("some_future_detector", {"signals": [{"type": "log", "id": "7"}]}),
]


@pytest.mark.parametrize(("detector", "raw"), MALFORMED)
def test_malformed_or_older_evidence_reads_as_none(detector: str, raw: Any) -> None:
    assert evidence_of(detector, raw) is None


def test_malformed_rows_give_the_kind_readers_none_without_raising() -> None:
    assert stack_evidence(_with(STACK_ANALYSIS, ("dominant",), 3)) is None
    assert peer_evidence(_with(PEERS, ("unit",), ["n1", 1])) is None
    assert failslow_evidence([FAILSLOW]) is None
    assert stack_tree_of("nope") is None and stack_tree_of({"name": "root", "count": "1"}) is None


def test_a_very_deep_stack_tree_is_read_without_hitting_the_recursion_limit() -> None:
    deep = tree(20_000)
    assert stack_tree_of(deep) is deep
    assert stack_evidence({**STACK_ANALYSIS, "tree": deep}) is not None
    leaf = deep
    while leaf["children"]:
        leaf = leaf["children"][0]
    leaf["count"] = "1"
    assert stack_tree_of(deep) is None


def test_signal_references_are_read_one_by_one() -> None:
    good = [{"type": "log", "id": 1}, {"type": "metric", "node": "n1", "gpu": 0, "metric": "pcie_replay", "ts": T}]
    bad = [{"type": "log", "id": True}, {"id": 2}, "SIGKILL", {"type": 5}, {"type": "metric", "node": 3}]
    assert signal_refs({"signals": [bad[0], good[0], *bad[1:], good[1]]}) == good
    assert signal_refs({"signals": "log 1"}) == [] and signal_refs({}) == [] and signal_refs(None) == []
