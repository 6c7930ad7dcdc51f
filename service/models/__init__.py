"""ORM models, one module per table family; importing this package registers them all."""

from service.models.auth import AgentEnrolment, ApiToken, UiSession
from service.models.base import Base
from service.models.breaker import BreakerEvent, FleetBreaker
from service.models.bundles import EvidenceBundle
from service.models.checks import CheckResult
from service.models.diagnosis import Decision, Finding, Incident
from service.models.directives import Directive
from service.models.jobs import Job, Rank
from service.models.nodes import Gpu, Node, NodeEvent
from service.models.notify import NotificationChannel, NotificationDelivery
from service.models.planned import MaintenanceWindow
from service.models.shared_causes import SharedIncident
from service.models.signals import (
    METRIC_COPY_TYPES,
    METRIC_SAMPLE_COLUMNS,
    NODE_COPY_TYPES,
    NODE_SAMPLE_COLUMNS,
    AgentBatch,
    LogEvent,
    ProcessSnapshot,
    StackDump,
    gpu_samples,
    metric_chunks,
    metric_samples,
    node_samples,
)
from service.models.silences import Silence
from service.models.unknown_lines import UnknownLineCount, UnknownLineForm
from service.models.windows import FULL_PASS, DetectorState, job_columns, metric_windows, node_windows

__all__ = [
    "FULL_PASS",
    "METRIC_COPY_TYPES",
    "METRIC_SAMPLE_COLUMNS",
    "NODE_COPY_TYPES",
    "NODE_SAMPLE_COLUMNS",
    "AgentBatch",
    "AgentEnrolment",
    "ApiToken",
    "Base",
    "BreakerEvent",
    "CheckResult",
    "Decision",
    "DetectorState",
    "Directive",
    "EvidenceBundle",
    "Finding",
    "FleetBreaker",
    "Gpu",
    "Incident",
    "Job",
    "LogEvent",
    "MaintenanceWindow",
    "Node",
    "NodeEvent",
    "NotificationChannel",
    "NotificationDelivery",
    "ProcessSnapshot",
    "Rank",
    "SharedIncident",
    "Silence",
    "StackDump",
    "UiSession",
    "UnknownLineCount",
    "UnknownLineForm",
    "gpu_samples",
    "job_columns",
    "metric_chunks",
    "metric_samples",
    "metric_windows",
    "node_samples",
    "node_windows",
]
