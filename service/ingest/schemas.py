"""The agent wire protocol: one JSON batch per POST /api/v1/ingest.

Unknown fields are ignored so that a newer agent can talk to an older service.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from pydantic_core import InitErrorDetails

from ml.node_metrics import SUBJECT_PATTERN
from service.checks.schemas import CheckResultIn
from service.types import INT32_MAX, JobId, NodeName, implausible, time_window

Severity = Literal["debug", "info", "warning", "error", "critical"]
MAX_ITEMS = 100_000
# A time the batch's own check holds to the server's clock (IngestBatch._plausible_times), once per batch: a
# validator per item (service/types.py PlausibleTime) called back into Python for every sample, and was the
# largest single cost of validating a batch.
ItemTime = AwareDatetime


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore")


class GpuFabric(_In):
    """The GPU's NVLink fabric, from NVML's fabric info (GB200 NVL72 and other multi-node NVLink systems)."""

    cluster_uuid: str | None = Field(
        default=None, max_length=64, description="The fabric cluster: the NVLink domain (one per NVL72 rack)."
    )
    clique_id: Annotated[int, Field(ge=0, le=2**32 - 1)] | None = Field(
        default=None, description="The clique: the GPUs of the domain this GPU reaches over NVLink."
    )
    state: str | None = Field(
        default=None, max_length=32, description="Its registration: not_started, in_progress or completed."
    )
    status: int | None = Field(default=None, description="The registration's NVML return code (0: success).")
    health: str | None = Field(
        default=None, max_length=32, description="The driver's health summary: healthy, unhealthy, limited_capacity."
    )
    degraded_bw: bool | None = Field(default=None, description="Whether the fabric runs with degraded bandwidth.")
    gfm: str | None = Field(
        default=None, max_length=32, description="The global fabric manager's link: connected or disconnected."
    )


class GpuInfo(_In):
    index: Annotated[int, Field(ge=0, le=1023)]
    uuid: str | None = None
    pci_bus_id: str | None = None
    model: str | None = None
    fabric: GpuFabric | None = Field(default=None, description="Its NVLink fabric, on multi-node NVLink GPUs only.")


class HostFacts(_In):
    """Text facts about the machine, sent with the GPU inventory."""

    driver_version: str | None = Field(default=None, max_length=100)
    kernel: str | None = Field(default=None, max_length=200)
    rdma: bool | None = Field(default=None, description="Whether the node has any RDMA (InfiniBand/RoCE) device.")
    fabric_manager: str | None = Field(
        default=None, max_length=32, description="The fabric manager on an NVSwitch host: running or stopped."
    )
    ports: Annotated[list[Annotated[str, Field(max_length=128)]], Field(max_length=256)] = Field(default_factory=list)
    firmware_version: str | None = Field(
        default=None, max_length=100, description="The GPUs' video BIOS version (the most common one on the node)."
    )
    rack: str | None = Field(default=None, max_length=128, description="The rack, as the operator labels the node.")
    switch: str | None = Field(default=None, max_length=128, description="The leaf switch the node's NICs reach.")
    power_domain: str | None = Field(default=None, max_length=128, description="The power feed or PDU it hangs on.")
    storage_mounts: Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=32)] = Field(
        default_factory=list, description="The shared storage mounts the node's jobs read."
    )


class Heartbeat(_In):
    agent_version: str | None = Field(default=None, max_length=100)
    uptime_s: float | None = None
    spool_depth: int | None = Field(default=None, ge=0, description="Batches waiting in the agent's disk spool.")
    dropped: dict[str, int] = Field(
        default_factory=dict, description="Items the agent had to drop (full spool), by kind, since it started."
    )
    gpus: list[GpuInfo] = Field(default_factory=list, description="GPU inventory of the node.")
    jobs: Annotated[list[JobId], Field(max_length=64)] = Field(
        default_factory=list, description="Jobs with training processes on the node now: directives follow them."
    )
    host: HostFacts | None = None


_Label = Annotated[str, Field(max_length=253)]


class Workload(_In):
    """What dcgm-exporter says holds the GPU: Kubernetes pod labels, or the HPC job id (--hpc-job-mapping-dir)."""

    pod: _Label | None = None
    namespace: _Label | None = None
    container: _Label | None = None
    hpc_job: _Label | None = None


class MetricSample(_In):
    """One GPU at one instant: DCGM field name -> value (null when the exporter reports blank)."""

    ts: ItemTime
    gpu: Annotated[int, Field(ge=0, le=1023)]
    job_id: JobId | None = None
    workload: Workload | None = Field(
        default=None, description="The exporter's labels for the GPU's workload: the job when no process names it."
    )
    fields: Annotated[dict[str, float | None], Field(max_length=512)]


class NodeMetricSample(_In):
    """One machine-level subject at one instant: a network port, the host or a volume (ml/node_metrics.py)."""

    ts: ItemTime
    subject: Annotated[
        str, Field(max_length=128, pattern=SUBJECT_PATTERN, examples=["host", "ib:mlx5_0/1", "eth:eth0", "vol:/ckpt"])
    ]
    job_id: JobId | None = None
    fields: Annotated[dict[str, float | None], Field(max_length=128)]


CHECKPOINT_SAVED = "checkpoint_saved"
CHECKPOINT_LOADED = "checkpoint_loaded"
MAX_STEP = 2**62


class LogEventIn(_In):
    """A parsed log line or event. Kind `step` (fields.step: the training step), kind `checkpoint_saved`
    (fields.step: the step a checkpoint was saved at, when known) and kind `checkpoint_loaded` (fields.step: the
    step of the checkpoint a restarted job resumed from) feed the job's ETTR: a job may send them as explicit events
    too, e.g. `{"ts": ..., "source": "trainer", "kind": "checkpoint_saved", "line": "saved /ckpt/step-2000",
    "job_id": "llm-42", "fields": {"step": 2000}}`."""

    ts: ItemTime
    source: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_.-]{0,31}$", examples=["kmsg", "training"])]
    kind: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_.-]{0,63}$", examples=["xid", "nccl_warn", "step"])]
    line: Annotated[str, Field(max_length=65_536)]
    severity: Severity | None = None
    path: str | None = Field(default=None, max_length=4096)
    job_id: JobId | None = None
    rank: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    fields: dict[str, Any] | None = None
    signature: str | None = Field(default=None, max_length=1024)

    @model_validator(mode="after")
    def _checkpoint_step(self) -> LogEventIn:
        if self.kind in (CHECKPOINT_SAVED, CHECKPOINT_LOADED) and self.fields and "step" in self.fields:
            step = self.fields["step"]
            if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
                raise ValueError(f"a {self.kind} event's fields.step must be an integer >= 0, got {step!r}")
        return self


class StackDumpIn(_In):
    ts: ItemTime
    pid: Annotated[int, Field(ge=1, le=INT32_MAX)]
    job_id: JobId | None = None
    rank: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    directive_id: str | None = Field(default=None, max_length=200)
    threads: list[dict[str, Any]] | None = Field(default=None, description="`py-spy dump --json` output.")
    error: str | None = Field(default=None, max_length=65_536, description="Why the dump failed, if it did.")


class ChildProcess(_In):
    pid: Annotated[int, Field(ge=1, le=INT32_MAX)]
    name: str | None = None
    cpu_pct: float | None = None
    rss_bytes: int | None = None


class ProcessSnapshotIn(_In):
    """A training process found on the node (a torchrun worker), from its environment and /proc."""

    ts: ItemTime
    pid: Annotated[int, Field(ge=1, le=INT32_MAX)]
    job_id: JobId | None = None
    rank: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    local_rank: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    group_rank: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    world_size: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    gpu: Annotated[int, Field(ge=0, le=1023)] | None = None
    cpu_pct: float | None = None
    rss_bytes: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    state: str | None = Field(default=None, max_length=32)
    children: list[ChildProcess] = Field(default_factory=list)


class IngestBatch(_In):
    batch_id: uuid.UUID = Field(description="Unique per batch; a batch sent twice is stored once.")
    node: NodeName
    sent_at: ItemTime
    job_id: JobId | None = Field(default=None, description="Default job for items that do not name one.")
    heartbeat: Heartbeat | None = None
    metrics: Annotated[list[MetricSample], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    node_metrics: Annotated[list[NodeMetricSample], Field(max_length=MAX_ITEMS)] = Field(
        default_factory=list, description="Network ports, host and volumes, every node interval (5 s by default)."
    )
    logs: Annotated[list[LogEventIn], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    stacks: Annotated[list[StackDumpIn], Field(max_length=10_000)] = Field(default_factory=list)
    checks: Annotated[list[CheckResultIn], Field(max_length=10_000)] = Field(
        default_factory=list, description="Stop-time check results, for the run_checks directive named in each."
    )
    processes: Annotated[list[ProcessSnapshotIn], Field(max_length=10_000)] = Field(
        default_factory=list,
        description="Training processes on the node. They change slowly: sending them every few seconds "
        "rather than in every batch halves the rows a 1-second agent makes the service write.",
    )

    @model_validator(mode="after")
    def _plausible_times(self, info: ValidationInfo) -> IngestBatch:
        """Every time the batch carries lies within the configured window around the server's clock (the context's
        "time_window"): a broken clock or hostile input is refused, naming each offending field."""
        window = time_window(info.context)
        now = datetime.now(UTC)
        low, high = now - window[0], now + window[1]
        errors: list[InitErrorDetails] = []
        if not low <= self.sent_at <= high:
            errors.append(_implausible(("sent_at",), self.sent_at, window))
        for section in _TIMED_SECTIONS:
            items = getattr(self, section)
            if not items:
                continue
            # A section's earliest and latest time first: min and max compare times of one tzinfo (the parser's),
            # several times cheaper than comparing each against bounds of another; a section out of bounds is then
            # read item by item to name each offender.
            times = [item.ts for item in items]
            if low <= min(times) and max(times) <= high:
                continue
            for i, ts in enumerate(times):
                if not low <= ts <= high:
                    errors.append(_implausible((section, i, "ts"), ts, window))
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self


_TIMED_SECTIONS = ("metrics", "node_metrics", "logs", "stacks", "processes")


def _implausible(loc: tuple[str | int, ...], value: datetime, window: tuple[timedelta, timedelta]) -> InitErrorDetails:
    # The same error pydantic makes of a ValueError in a field validator: "Value error, <why>".
    return InitErrorDetails(
        type="value_error", loc=loc, input=value.isoformat(), ctx={"error": ValueError(implausible(value, window))}
    )


class Directive(BaseModel):
    """Something the service asks the agent to do now."""

    id: str
    kind: Literal["dump_stacks", "run_checks", "bundle", "checkpoint"]
    job_id: str | None = None
    level: int | None = Field(default=None, description="run_checks: 1 seconds, 2 minutes, 3 long.")
    force: bool | None = Field(default=None, description="run_checks: run even while a job's ranks run.")
    peer: dict[str, Any] | None = Field(
        default=None, description="run_checks level 3: {addr, port, node_rank} of the cross-node all-reduce."
    )
    only: list[str] | None = Field(default=None, description="run_checks: just these checks (a peer's all-reduce).")
    decision_id: int | None = Field(
        default=None, description="run_checks: the diagnose decision it answers; bundle: the decision that asked."
    )
    max_bytes: int | None = Field(
        default=None, description="bundle: the largest tar.gz the service takes (PUT /api/v1/nodes/{node}/bundles/{id})"
    )
    timeout_s: float | None = Field(default=None, description="bundle: seconds the collection may take in all.")
    reason: str | None = Field(default=None, description="checkpoint: why (the planned maintenance window).")
    deadline: str | None = Field(
        default=None, description="checkpoint: save before this time (ISO 8601), when the node goes down."
    )


class IngestResult(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "batch_id": "6f1c2d4e-8a7b-4c3d-9e2f-1a2b3c4d5e6f",
                    "status": "accepted",
                    "stored": {"metrics": 8, "logs": 1, "stacks": 0, "processes": 8},
                    "directives": [],
                }
            ]
        }
    )

    batch_id: uuid.UUID
    status: Literal["accepted", "duplicate"]
    stored: dict[str, int]
    directives: list[Directive] = Field(default_factory=list)
