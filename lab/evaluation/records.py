"""The eval's records, plain data read from JSON: a run's ground truth (the sim's ground_truth.json, or the torch
harness's) and its faults, the service's decisions and incidents as its API returns them, and how the service did
on one scenario run (scored by lab/evaluation/scoring.py, spread over seeds by lab/evaluation/spread.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

# Decisions that do not take a machine away: a person said no.
NOT_EVICTING_STATES = frozenset({"rejected"})


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 timestamp (a trailing Z allowed) as an aware datetime; None when unreadable."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.astimezone()


@dataclass(frozen=True)
class Fault:
    """One injected fault, as the ground truth describes it."""

    kind: str
    nodes: tuple[str, ...]
    injected_at: datetime | None
    blame: str  # infrastructure | user_code | unknown
    expect_eviction: bool
    # Evicting these nodes is acceptable but not required (e.g. one rank crashing with no hardware evidence).
    eviction_optional: bool = False
    # What should be decided about its nodes when that is not an eviction: "diagnose" (a node slow for a software
    # reason) is checked; "" when the ground truth does not say (older ones), or "evict"/"none"; "cordon" for a
    # shared component's fault (an NVLink domain's switch tray): its `members` cordoned by one shared incident.
    expect_action: str = ""
    # The machines a failed shared component takes with it (an NVL72 rack's trays; a switch's machines), when it
    # names them apart from `nodes`; the healthy machines of such a fault are these less `nodes`.
    members: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fault:
        return cls(
            kind=str(data.get("kind", "unknown")),
            nodes=tuple(str(n) for n in data.get("nodes") or ()),
            injected_at=parse_time(data.get("injected_at")),
            blame=str(data.get("blame", "unknown")),
            expect_eviction=bool(data.get("expect_eviction", False)),
            eviction_optional=bool(data.get("eviction_optional", False)),
            expect_action=str(data.get("expect_action") or ""),
            members=tuple(str(n) for n in data.get("trays") or ()),
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "nodes": list(self.nodes),
            "injected_at": self.injected_at.isoformat() if self.injected_at else None,
            "blame": self.blame,
            "expect_eviction": self.expect_eviction,
            "eviction_optional": self.eviction_optional,
            "expect_action": self.expect_action,
        }
        if self.members:
            out["trays"] = list(self.members)
        return out

    @property
    def covered(self) -> frozenset[str]:
        """The machines a shared component's cordon must cover: its members, or its own nodes (a switch's)."""
        return frozenset(self.members or self.nodes) if self.expect_action == "cordon" else frozenset()


@dataclass(frozen=True)
class GroundTruth:
    """What really happened in one scenario run (the sim's ground_truth.json, or the torch harness's)."""

    scenario: str
    job_id: str
    nodes: tuple[str, ...]
    faults: tuple[Fault, ...] = ()
    # Healthy things that happened on the way (a restart, a transient): nothing to find, kept for the report.
    noise: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroundTruth:
        return cls(
            scenario=str(data.get("scenario", "unknown")),
            job_id=str(data.get("job_id", "")),
            nodes=tuple(str(n) for n in data.get("nodes") or ()),
            faults=tuple(Fault.from_json(f) for f in data.get("faults") or () if isinstance(f, Mapping)),
            noise=tuple(n for n in data.get("noise") or () if isinstance(n, Mapping)),
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            "scenario": self.scenario,
            "job_id": self.job_id,
            "nodes": list(self.nodes),
            "faults": [f.to_json() for f in self.faults],
        }
        if self.noise:
            out["noise"] = [dict(n) for n in self.noise]
        return out

    @property
    def expected_evictions(self) -> frozenset[str]:
        return frozenset(n for f in self.faults if f.expect_eviction for n in f.nodes)

    @property
    def tolerated_evictions(self) -> frozenset[str]:
        return frozenset(n for f in self.faults if f.eviction_optional for n in f.nodes) - self.expected_evictions

    @property
    def faulty_nodes(self) -> frozenset[str]:
        return frozenset(n for f in self.faults for n in f.nodes)

    @property
    def injected_at(self) -> datetime | None:
        times = [f.injected_at for f in self.faults if f.injected_at is not None]
        return min(times) if times else None

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(f.kind for f in self.faults)

    @property
    def blame(self) -> str:
        """The expected blame: `none` for a healthy run."""
        return self.faults[0].blame if self.faults else "none"

    @property
    def healthy(self) -> bool:
        return not self.faults

    @property
    def user_code(self) -> bool:
        return any(f.blame == "user_code" for f in self.faults)


@dataclass(frozen=True)
class Decision:
    """The fields of a DecisionOut that scoring reads."""

    id: int
    kind: str
    state: str
    node: str | None
    incident_id: int | None
    confidence: float
    created_at: datetime | None
    reason: str = ""
    # A cordon decided for a shared component (an NVLink domain's incident): that shared incident, and no incident.
    shared_incident_id: int | None = None

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> Decision | None:
        """None for an entry that is not a decision (scoring skips it rather than fail)."""
        try:
            return cls(
                id=int(data["id"]),
                kind=str(data["kind"]),
                state=str(data.get("state", "pending")),
                node=str(data["node"]) if data.get("node") else None,
                incident_id=int(data["incident_id"]) if data.get("incident_id") is not None else None,
                confidence=float(data.get("confidence") or 0.0),
                created_at=parse_time(data.get("created_at")),
                reason=str(data.get("reason") or ""),
                shared_incident_id=(
                    int(data["shared_incident_id"]) if data.get("shared_incident_id") is not None else None
                ),
            )
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def shared_cordon(self) -> bool:
        """A cordon of a shared incident (a whole NVLink domain's, a switch's) that a person did not reject."""
        return (
            self.kind == "cordon"
            and self.shared_incident_id is not None
            and self.node is not None
            and self.state not in NOT_EVICTING_STATES
        )

    @property
    def evicts(self) -> bool:
        return self.kind == "evict" and self.node is not None and self.state not in NOT_EVICTING_STATES


@dataclass(frozen=True)
class Incident:
    """The fields of an incident that scoring reads."""

    id: int
    blame: str
    confidence: float
    root_cause: str
    suspects: tuple[tuple[str, float], ...]  # (node, confidence), most suspect first
    opened_at: datetime | None

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> Incident | None:
        try:
            suspects = [
                (str(s["node"]), float(s.get("confidence") or 0.0))
                for s in data.get("suspects") or ()
                if isinstance(s, Mapping) and s.get("node")
            ]
            return cls(
                id=int(data["id"]),
                blame=str(data.get("blame") or "unknown"),
                confidence=float(data.get("confidence") or 0.0),
                root_cause=str(data.get("root_cause") or ""),
                suspects=tuple(sorted(suspects, key=lambda s: -s[1])),
                opened_at=parse_time(data.get("opened_at")),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass
class ScenarioScore:
    """How the service did on one scenario run."""

    scenario: str
    seed: int | None
    job_id: str
    kinds: list[str]
    detected: bool
    suspects: list[str]
    evicted: list[str]
    expected: list[str]
    tolerated: list[str]
    tp: int
    fp: int
    fn: int
    correct: bool
    blame_expected: str
    blame_decided: str | None
    blame_ok: bool | None
    time_to_decision_s: float | None
    first_decision: dict[str, Any] | None
    decisions: int
    incidents: int
    early_decisions: int
    healthy: bool
    user_code: bool
    hang_timeout_s: float | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    # Healthy machines a diagnose decision named (issue: no accusation spray), and the healthy members of a shared
    # component's fault evicted one by one (an NVL72 tray taken out for its switch tray's failure).
    false_accusations: list[str] = field(default_factory=list)
    # Machines cordoned by a shared incident (a whole NVLink domain drained): a decision at the domain's level.
    domain_cordoned: list[str] = field(default_factory=list)
    shared_incidents: int = 0  # the shared incidents behind those cordons (one expected per failed domain)
    faults: int = 0
    # Set by the runner: the prefix of this run's node names, left out when printing them.
    node_prefix: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_decisions(items: Iterable[Mapping[str, Any]]) -> list[Decision]:
    """Readable decisions, oldest first (undated ones last)."""
    parsed = [d for d in (Decision.from_api(i) for i in items) if d is not None]
    return sorted(parsed, key=lambda d: (d.created_at is None, d.created_at or datetime.min, d.id))


def parse_incidents(items: Iterable[Mapping[str, Any]]) -> list[Incident]:
    return [i for i in (Incident.from_api(x) for x in items) if i is not None]
