"""Repair times and spare-capacity advice as the API shows them."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from ml import repair_times, spares


class StageOut(BaseModel):
    count: int = Field(description="Samples: incidents for detect, decide and act; node outages for return.")
    p50_s: float | None
    p90_s: float | None
    max_s: float | None

    @classmethod
    def of(cls, s: repair_times.StageSummary) -> StageOut:
        return cls(count=s.count, p50_s=s.p50, p90_s=s.p90, max_s=s.max)


class GroupOut(BaseModel):
    key: str = Field(description="`fleet`, a root cause or a node name")
    incidents: int
    stages: dict[str, StageOut] = Field(description="detect, decide, act, return")

    @classmethod
    def of(cls, g: repair_times.Group) -> GroupOut:
        return cls(key=g.key, incidents=g.incidents, stages={k: StageOut.of(v) for k, v in g.stages.items()})


_STAGE = {"count": 12, "p50_s": 30.0, "p90_s": 95.0, "max_s": 140.0}


class RepairTimesOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "window_s": 604800.0,
                    "since": "2026-11-19T06:00:00Z",
                    "by": "root_cause",
                    "incidents": 12,
                    "groups": [
                        {
                            "key": "gpu_hardware",
                            "incidents": 12,
                            "stages": {
                                "detect": {**_STAGE, "p50_s": 4.0, "p90_s": 9.0},
                                "decide": {**_STAGE, "p50_s": 2.0, "p90_s": 6.0},
                                "act": _STAGE,
                                "return": {**_STAGE, "count": 9, "p50_s": 14400.0, "p90_s": 86400.0},
                            },
                        }
                    ],
                }
            ]
        }
    )

    window_s: float
    since: datetime
    by: str
    incidents: int = Field(description="Incidents opened in the window (merged-away ones excluded)")
    groups: list[GroupOut] = Field(description="Node groups come slowest first (p90 out of service, then to act)")


class OutageOut(BaseModel):
    node: str
    out_at: datetime
    back_at: datetime | None = Field(description="null while the node is still out of service")
    seconds: float | None


class IncidentRepairTimesOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "incident_id": 42,
                    "root_cause": "gpu_hardware",
                    "opened_at": "2026-11-23T06:00:12Z",
                    "detect_s": 12.0,
                    "decide_s": 8.0,
                    "act_s": 60.0,
                    "return_s": None,
                    "outages": [
                        {"node": "gpu-node-017", "out_at": "2026-11-23T06:01:20Z", "back_at": None, "seconds": None}
                    ],
                }
            ]
        }
    )

    incident_id: int
    root_cause: str
    opened_at: datetime
    detect_s: float | None = Field(description="First finding's evidence to the incident's opening")
    decide_s: float | None = Field(description="Opening to the first decision")
    act_s: float | None = Field(description="The first decision a scheduler acknowledged (done or failed) to its ack")
    return_s: float | None = Field(description="Eviction or cordon to return, of the last node back")
    outages: list[OutageOut]

    @classmethod
    def of(cls, t: repair_times.IncidentTimes) -> IncidentRepairTimesOut:
        return cls(
            incident_id=t.incident_id,
            root_cause=t.root_cause,
            opened_at=t.opened_at,
            detect_s=t.detect_s,
            decide_s=t.decide_s,
            act_s=t.act_s,
            return_s=t.return_s,
            outages=[OutageOut(node=o.node, out_at=o.out_at, back_at=o.back_at, seconds=o.seconds) for o in t.outages],
        )


class SparesOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "job_id": "llm-pretrain-42",
                    "nodes": 128,
                    "horizon_s": 86400.0,
                    "quantile": 0.99,
                    "window_s": 2592000.0,
                    "failures": 37,
                    "node_hours": 46250.0,
                    "rate_per_1000_node_hours": 0.8,
                    "p_node": 0.0190,
                    "standbys": 7,
                    "reason": None,
                    "by_root_cause_per_1000_node_hours": {"gpu_hardware": 0.6, "network": 0.2},
                }
            ]
        }
    )

    job_id: str | None
    nodes: int
    horizon_s: float
    quantile: float
    window_s: float = Field(description="The failure history read")
    failures: int = Field(description="Nodes evicted or cordoned for an incident within the window")
    node_hours: float
    rate_per_1000_node_hours: float | None
    p_node: float | None = Field(description="Probability that one node fails within the horizon")
    standbys: int | None = Field(description="null when there is no history to estimate from: `reason` says why")
    reason: str | None
    by_root_cause_per_1000_node_hours: dict[str, float]

    @classmethod
    def of(cls, a: spares.Advice, *, job_id: str | None, window_s: float) -> SparesOut:
        return cls(
            job_id=job_id,
            nodes=a.nodes,
            horizon_s=a.horizon_h * 3600,
            quantile=a.quantile,
            window_s=window_s,
            failures=a.failures,
            node_hours=a.node_hours,
            rate_per_1000_node_hours=a.rate_per_1000_node_hours,
            p_node=a.p_node,
            standbys=a.standbys,
            reason=a.reason,
            by_root_cause_per_1000_node_hours={k: v * 1000 for k, v in a.by_root_cause.items()},
        )
