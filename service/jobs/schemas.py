"""Job registration: world size, parallelism and where each rank runs."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from service.types import INT32_MAX, JobId, NodeName

DIMENSIONS = ("tp", "pp", "dp")


class Parallelism(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tp: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1
    pp: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1
    dp: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1
    order: str = Field(
        default="tp-dp-pp",
        description="Dimensions from fastest- to slowest-varying along the global rank (Megatron: tp-dp-pp).",
        json_schema_extra={"enum": ["-".join(p) for p in itertools.permutations(("tp", "dp", "pp"))]},
    )

    @model_validator(mode="after")
    def _order_is_permutation(self) -> Parallelism:
        if sorted(self.order.split("-")) != sorted(DIMENSIONS):
            raise ValueError(f"order must name tp, pp and dp once each, separated by '-', got {self.order!r}")
        return self


class RankPlacement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: Annotated[int, Field(ge=0, le=INT32_MAX)]
    node: NodeName
    local_rank: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    gpu: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None


_LABEL_VALUE = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class PodSelector(BaseModel):
    """The job's Kubernetes pods, as dcgm-exporter labels the GPUs they hold (`namespace`, `pod`)."""

    model_config = ConfigDict(extra="forbid")

    namespace: _LABEL_VALUE
    prefix: _LABEL_VALUE = Field(
        description="Every pod of the job is named with this prefix (e.g. the PyTorchJob's name)."
    )


class JobIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "job_id": "llm-pretrain-42",
                    "world_size": 16,
                    "parallelism": {"tp": 4, "pp": 2, "dp": 2, "order": "tp-dp-pp"},
                    "hang_timeout_s": 300,
                    "ranks": [{"rank": 0, "node": "gpu-node-001", "local_rank": 0}],
                }
            ]
        },
    )

    job_id: JobId
    world_size: Annotated[int, Field(ge=1, le=1_000_000)]
    parallelism: Parallelism | None = None
    hang_timeout_s: Annotated[int, Field(ge=5, le=86_400)] = 600
    ranks: list[RankPlacement] | None = Field(
        default=None,
        description="Optional rank-to-node map; agents report it too. A node named here belongs to the job (its GPU "
        "samples are the job's even when no agent sees its training processes) until the job ends, the node is "
        "evicted, or a newer registration names it.",
    )
    pods: PodSelector | None = Field(
        default=None, description="The job's pods: GPUs dcgm-exporter labels with such a pod are the job's."
    )
    scheduler_job_id: _LABEL_VALUE | None = Field(
        default=None,
        description="The scheduler's job id, as dcgm-exporter's `hpc_job` label carries it (--hpc-job-mapping-dir); "
        "the job_id itself matches too.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> JobIn:
        p = self.parallelism
        if p is not None and p.tp * p.pp * p.dp != self.world_size:
            raise ValueError(
                f"tp*pp*dp = {p.tp}*{p.pp}*{p.dp} = {p.tp * p.pp * p.dp} must equal world_size {self.world_size}"
            )
        if self.ranks:
            seen: set[int] = set()
            for placement in self.ranks:
                if placement.rank >= self.world_size:
                    raise ValueError(f"rank {placement.rank} is outside world_size {self.world_size}")
                if placement.rank in seen:
                    raise ValueError(f"rank {placement.rank} is placed twice")
                seen.add(placement.rank)
        return self


class JobEndIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"state": "finished"}]})

    state: Literal["finished", "failed"] = Field(description="How the job ended, as its scheduler saw it.")


class RankOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    # Read from a row of (Rank.rank, Node.name, Rank.local_rank, Rank.gpu_index, Rank.pid); the field's own name
    # comes first so a dict (FastAPI re-validates its answers) still reads by it.
    rank: int
    node: str = Field(validation_alias=AliasChoices("node", "name"))
    local_rank: int | None
    gpu: int | None = Field(validation_alias=AliasChoices("gpu", "gpu_index"))
    pid: int | None


class JobOut(BaseModel):
    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "job_id": "llm-pretrain-42",
                    "world_size": 16,
                    "parallelism": {"tp": 4, "pp": 2, "dp": 2, "order": "tp-dp-pp"},
                    "hang_timeout_s": 300,
                    "state": "running",
                    "source": "registered",
                    "created_at": "2026-11-22T09:00:00Z",
                    "updated_at": "2026-11-22T09:00:00Z",
                    "last_seen_at": "2026-11-22T10:00:01Z",
                    "nodes": ["gpu-node-001", "gpu-node-002"],
                    "ranks": [{"rank": 0, "node": "gpu-node-001", "local_rank": 0, "gpu": 0, "pid": 4242}],
                }
            ]
        },
    )

    # A Job row holds it as external_id; "job_id" first, as for RankOut.
    job_id: str = Field(validation_alias=AliasChoices("job_id", "external_id"))
    world_size: int | None
    parallelism: Parallelism | None
    hang_timeout_s: int
    state: str
    source: str = Field(description="`registered` through this API, or `agent` when first seen in agent data.")
    created_at: datetime
    updated_at: datetime
    last_seen_at: datetime | None
    pods: PodSelector | None = None
    scheduler_job_id: str | None = None
    nodes: list[str]
    ranks: list[RankOut]
    nvlink_domains: dict[str, list[str]] = Field(
        default_factory=dict,
        description="NVLink domain (fabric cluster UUID) -> the job's nodes in it, for nodes in one (GB200 NVL72); "
        "GET /api/v1/nvlink-domains/{uuid} says whether it is healthy.",
    )
    diagnosed_at: datetime | None = Field(
        default=None,
        description="When the job's last full diagnosis pass ran (the service's clock); null before its first. A "
        "job's full passes run one at a time: the second new value after a client sent data is a pass that read it.",
    )


# --- ETTR (ml/ettr.py has the definitions) -------------------------------------------------------------------


class EttrSpanOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    start: datetime
    end: datetime
    productive_s: float
    wall_s: float
    ratio: float | None = Field(description="productive_s / wall_s; null when the job logged no step line")


class EttrPointOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    ts: datetime
    cumulative: float | None = Field(description="ETTR from the job's start to ts")
    window: float | None = Field(description="ETTR over the window ending at ts")


class RestartOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    ts: datetime = Field(description="The first step line after the restart")
    from_step: int = Field(description="The highest step reached before it")
    to_step: int = Field(description="The first step logged after it")
    checkpoint_step: int | None = Field(description="The last checkpoint saved at or before from_step")


class IncidentLossOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    incident_id: int = Field(validation_alias=AliasChoices("incident_id", "id"))
    opened_at: datetime
    last_productive_at: datetime | None = Field(description="The last productive step line before it opened")
    resumed_at: datetime | None = Field(description="The first step line after it opened")
    productive_again_at: datetime | None = Field(description="The first step line past the step reached before it")
    ongoing: bool = Field(description="Not yet past the step reached before it: lost_s runs to the window's end")
    step_reached: int | None
    resumed_step: int | None
    checkpoint_step: int | None = Field(description="The last checkpoint saved before it opened")
    steps_redone: int
    lost_s: float = Field(description="last_productive_at -> productive_again_at (or the end): down_s + redone_s")
    down_s: float = Field(description="last_productive_at -> resumed_at")
    redone_s: float = Field(description="resumed_at -> productive_again_at: getting back to step_reached")


class StallOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    start: datetime = Field(description="The last productive step line (the job's start for the start-up)")
    end: datetime = Field(description="The step line the job trains at its pace from again (the end, while ongoing)")
    lost_s: float = Field(description="Wall minus productive time within it")
    incident_id: int | None = Field(description="The incident charged: the first to open in it, else the one open")
    also: list[int] = Field(description="The other incidents open during it: not charged")
    startup: bool = Field(description="Before the first step line")
    step_reached: int | None
    resumed_step: int | None
    checkpoint_step: int | None
    restarts: int
    steps_redone: int
    down_s: float
    redone_s: float
    ongoing: bool


class LostOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    total_s: float = Field(description="cumulative.wall_s - cumulative.productive_s = wall x (1 - ETTR)")
    charged_s: float = Field(description="Stalls charged to incidents (by_incident sums to it)")
    startup_s: float = Field(description="Before the first step line, no incident explaining it")
    unexplained_s: float = Field(description="Stalls and pauses (checkpoint saves) no incident explains")
    pending_s: float = Field(description="Since the last step line, the next one not yet due")
    by_incident: dict[int, float] = Field(description="Incident id -> the stalls charged to it, each stall once")


class EttrOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "job_id": "llm-pretrain-42",
                    "window": "1h",
                    "window_s": 3600,
                    "cumulative": {
                        "start": "2026-11-22T09:00:00Z",
                        "end": "2026-11-22T11:00:00Z",
                        "productive_s": 6480.0,
                        "wall_s": 7200.0,
                        "ratio": 0.9,
                    },
                    "sliding": {
                        "start": "2026-11-22T10:00:00Z",
                        "end": "2026-11-22T11:00:00Z",
                        "productive_s": 3420.0,
                        "wall_s": 3600.0,
                        "ratio": 0.95,
                    },
                    "median_step_s": 1.2,
                    "pause_factor": 5.0,
                    "highest_step": 5600,
                    "steps_seen": 5712,
                    "checkpoints": 11,
                    "last_checkpoint_step": 5500,
                    "restarts": [
                        {"ts": "2026-11-22T10:05:10Z", "from_step": 2380, "to_step": 2001, "checkpoint_step": 2000}
                    ],
                    "incidents": [
                        {
                            "incident_id": 17,
                            "opened_at": "2026-11-22T09:58:02Z",
                            "last_productive_at": "2026-11-22T09:58:00Z",
                            "resumed_at": "2026-11-22T10:05:10Z",
                            "productive_again_at": "2026-11-22T10:12:46Z",
                            "ongoing": False,
                            "step_reached": 2380,
                            "resumed_step": 2001,
                            "checkpoint_step": 2000,
                            "steps_redone": 380,
                            "lost_s": 886.0,
                            "down_s": 430.0,
                            "redone_s": 456.0,
                        }
                    ],
                    "series": [{"ts": "2026-11-22T11:00:00Z", "cumulative": 0.9, "window": 0.95}],
                    "stalls": [
                        {
                            "start": "2026-11-22T09:58:00Z",
                            "end": "2026-11-22T10:12:46Z",
                            "lost_s": 886.0,
                            "incident_id": 17,
                            "also": [18],
                            "startup": False,
                            "step_reached": 2380,
                            "resumed_step": 2001,
                            "checkpoint_step": 2000,
                            "restarts": 1,
                            "steps_redone": 380,
                            "down_s": 430.0,
                            "redone_s": 456.0,
                            "ongoing": False,
                        }
                    ],
                    "lost": {
                        "total_s": 720.0,
                        "charged_s": 686.0,
                        "startup_s": 20.0,
                        "unexplained_s": 12.0,
                        "pending_s": 2.0,
                        "by_incident": {"17": 686.0},
                    },
                }
            ]
        }
    )

    job_id: str
    window: str = Field(examples=["1h"])
    window_s: float
    cumulative: EttrSpanOut = Field(description="Since the job began")
    sliding: EttrSpanOut = Field(description="Over the last `window`")
    median_step_s: float | None
    pause_factor: float = Field(description="An interval slower than this x the median step time is a pause")
    highest_step: int | None
    steps_seen: int
    checkpoints: int = Field(description="Distinct checkpoint steps saved")
    last_checkpoint_step: int | None
    restarts: list[RestartOut]
    incidents: list[IncidentLossOut] = Field(
        description="Each incident's own view of the time lost around it: overlapping incidents share it, so these "
        "need not add up; `stalls` and `lost` charge each stretch once"
    )
    series: list[EttrPointOut]
    stalls: list[StallOut] = Field(default_factory=list, description="The lost time cut into stalls, oldest first")
    lost: LostOut | None = Field(default=None, description="The lost time split by what it went to; the parts add up")


# --- jobs not getting anywhere (service/jobs/progress.py, ml/stalls.py) -----------------------------------------


class StalledIncidentOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    root_cause: str
    severity: str
    state: str


class StalledJobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    job_id: str
    step_reached: int = Field(description="The highest step the job logged")
    since: datetime = Field(description="When step_reached was first logged: no net progress since")
    stalled_s: float = Field(description="Seconds since `since`")
    threshold_s: float = Field(
        description="Listed past this: FAULTLINE_JOB_NO_PROGRESS_S, or 3x the job's time between step lines"
    )
    reason: Literal[
        "waiting_for_action", "waiting_for_spare", "hung", "down", "restart_loop", "catching_up", "no_progress"
    ] = Field(
        description="What the job is in now: a remedy waiting for a scheduler or a person; a machine taken out and no "
        "step since; no step with processes alive (hung) or none (down); restarted twice or more without getting past "
        "step_reached; restarted once and redoing steps; logging steps, none past step_reached"
    )
    summary: str = Field(description="The reason in a line")
    details: list[str] = Field(description="The facts behind it")
    restarts: int = Field(description="Restarts (a step lower than the one before) since `since`, in one stream")
    restart_steps: list[int] = Field(description="The first step logged after each restart")
    checkpoint_step: int | None = Field(description="The last checkpoint saved at or below step_reached")
    last_step: int | None
    last_step_at: datetime | None
    decision_id: int | None = Field(description="The decision the reason is about (waiting_for_*)")
    processes_alive: int | None = Field(description="Live training processes in the latest snapshots; null: unknown")
    world_size: int | None
    last_seen_at: datetime | None
    incidents: list[StalledIncidentOut] = Field(description="The job's open incidents, and those opened since `since`")


class StalledJobsOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "after_s": 600.0,
                    "checked_at": "2026-11-22T03:14:00Z",
                    "items": [
                        {
                            "job_id": "llm-pretrain-42",
                            "step_reached": 33400,
                            "since": "2026-11-22T02:59:31Z",
                            "stalled_s": 869.0,
                            "threshold_s": 600.0,
                            "reason": "restart_loop",
                            "summary": "restarting again and again: restarted 3 times since 02:59:31 UTC, each back "
                            "to step 33217, never past step 33400",
                            "details": ["last checkpoint saved: step 33216"],
                            "restarts": 3,
                            "restart_steps": [33217, 33217, 33217],
                            "checkpoint_step": 33216,
                            "last_step": 33290,
                            "last_step_at": "2026-11-22T03:13:58Z",
                            "decision_id": None,
                            "processes_alive": 64,
                            "world_size": 64,
                            "last_seen_at": "2026-11-22T03:13:59Z",
                            "incidents": [
                                {"id": 69, "root_cause": "gpu_hardware", "severity": "critical", "state": "resolved"}
                            ],
                        }
                    ],
                }
            ]
        }
    )

    after_s: float = Field(description="The threshold asked for (or FAULTLINE_JOB_NO_PROGRESS_S)")
    checked_at: datetime
    items: list[StalledJobOut] = Field(description="Longest without progress first")
