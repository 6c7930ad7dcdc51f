"""Alertmanager's webhook payload (version 4) and what faultline answers.

Only what faultline reads is declared; unknown fields are ignored, so a newer Alertmanager still gets through.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from service.types import INT32_MAX, StartTime

MAX_ALERTS = 10_000

_EXAMPLE_ALERT = {
    "status": "firing",
    "labels": {
        "alertname": "GpuXidError",
        "severity": "critical",
        "Hostname": "gpu-node-007",
        "gpu": "3",
        "err_code": "79",
        "err_msg": "GPU has fallen off the bus",
        "pci_bus_id": "00000000:3B:00.0",
        "instance": "10.0.4.17:9400",
        "job": "dcgm-exporter",
    },
    "annotations": {"summary": "Xid 79 on gpu-node-007 GPU 3", "value": "79"},
    "startsAt": "2026-11-22T10:00:00.000Z",
    "endsAt": "0001-01-01T00:00:00Z",
    "generatorURL": "http://prometheus:9090/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS+%3E+0",
    "fingerprint": "5f1b3c0a9e2d4c71",
}


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Alert(_In):
    """One alert of a notification."""

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: StartTime = Field(alias="startsAt")
    ends_at: AwareDatetime | None = Field(default=None, alias="endsAt")
    generator_url: str = Field(default="", alias="generatorURL", max_length=8192)
    fingerprint: Annotated[str, Field(min_length=1, max_length=200)]

    @property
    def ended_at(self) -> datetime | None:
        """When it ended; Alertmanager writes the zero time (year 1) for "not yet"."""
        return self.ends_at if self.ends_at is not None and self.ends_at.year > 1 else None


class AlertmanagerPayload(_In):
    """Alertmanager's webhook notification, version 4 (its only version to date)."""

    model_config = ConfigDict(
        extra="ignore",
        populate_by_name=True,
        json_schema_extra={
            "examples": [
                {
                    "version": "4",
                    "groupKey": '{}/{severity="critical"}:{alertname="GpuXidError"}',
                    "truncatedAlerts": 0,
                    "status": "firing",
                    "receiver": "faultline",
                    "groupLabels": {"alertname": "GpuXidError"},
                    "commonLabels": {"alertname": "GpuXidError", "severity": "critical"},
                    "commonAnnotations": {},
                    "externalURL": "http://alertmanager:9093",
                    "alerts": [_EXAMPLE_ALERT],
                }
            ]
        },
    )

    version: str = Field(description='Must be "4".', json_schema_extra={"enum": ["4"]})
    group_key: str = Field(default="", alias="groupKey", max_length=8192)
    truncated_alerts: Annotated[int, Field(ge=0, le=INT32_MAX)] = Field(default=0, alias="truncatedAlerts")
    status: Literal["firing", "resolved"] | None = None
    receiver: str = Field(default="", max_length=1024)
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, str] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, str] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field(default="", alias="externalURL", max_length=8192)
    alerts: Annotated[list[Alert], Field(max_length=MAX_ALERTS)]

    @field_validator("version")
    @classmethod
    def _version_4(cls, value: str) -> str:
        if value != "4":
            raise ValueError(f'only Alertmanager webhook version "4" is supported, got {value!r}')
        return value


class IgnoredAlert(BaseModel):
    fingerprint: str
    reason: str = Field(examples=["no node label (Hostname, hostname, node, nodename, kubernetes_node, instance)"])


class AlertsResult(BaseModel):
    """What became of a notification's alerts."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "received": 2,
                    "stored": 1,
                    "duplicates": 0,
                    "resolved": 1,
                    "ignored": 0,
                    "ignored_alerts": [],
                    "diagnosing": ["llm-pretrain-42"],
                }
            ]
        }
    )

    received: int = Field(description="Alerts in the notification.")
    stored: int = Field(description="New alerts stored (an alert is one fingerprint and start time).")
    duplicates: int = Field(description="Alerts stored earlier with nothing new (Alertmanager repeats itself).")
    resolved: int = Field(description="Alerts stored earlier as firing, now marked resolved.")
    ignored: int = Field(description="Alerts not stored: see `ignored_alerts` for why.")
    ignored_alerts: list[IgnoredAlert] = Field(default_factory=list)
    diagnosing: list[str] = Field(
        default_factory=list, description="Jobs whose diagnosis this notification started at once."
    )
