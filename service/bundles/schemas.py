"""Evidence bundles as the API shows them: what was asked, what came back (the agent's manifest), or why nothing did."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# stored: downloadable; collecting: asked, the agent still has time; unreachable: the time is up and nothing came.
BundleState = Literal["stored", "collecting", "unreachable"]

_MANIFEST_EXAMPLE = {
    "format": 1,
    "bundle_id": "0b7e7c1e-3f2a-4c55-9a51-2f0d6c1b9e11",
    "node": "gpu-node-017",
    "decision_id": 42,
    "started_at": "2026-11-29T01:02:03.100000+00:00",
    "seconds": 4.2,
    "max_bytes": 20971520,
    "parts": [
        {
            "name": "kernel_log",
            "file": "kernel.log",
            "status": "ok",
            "bytes": 81920,
            "seconds": 0.01,
            "truncated": True,
        },
        {"name": "nvidia_smi", "file": "nvidia-smi-q.txt", "status": "ok", "bytes": 30211, "seconds": 0.8},
        {"name": "dcgmi_diag", "status": "missing", "bytes": 0, "seconds": 0.0, "error": "dcgmi is not installed"},
    ],
}


class BundleOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "0b7e7c1e-3f2a-4c55-9a51-2f0d6c1b9e11",
                    "decision_id": 42,
                    "decision_kind": "evict",
                    "incident_id": 7,
                    "node": "gpu-node-017",
                    "state": "stored",
                    "status": "stored 12.3 s after the decision, 96.1 KiB",
                    "requested_at": "2026-11-29T01:02:00Z",
                    "deadline_at": "2026-11-29T01:03:30Z",
                    "stored_at": "2026-11-29T01:02:12Z",
                    "seconds_after_decision": 12.3,
                    "size_bytes": 98412,
                    "sha256": "9f2c...",
                    "download": "/api/v1/bundles/0b7e7c1e-3f2a-4c55-9a51-2f0d6c1b9e11",
                    "manifest": _MANIFEST_EXAMPLE,
                }
            ]
        }
    )

    id: uuid.UUID
    decision_id: int
    decision_kind: str
    incident_id: int | None
    node: str
    state: BundleState
    status: str = Field(description='What a person reads: "stored ...", "collecting", "no bundle: agent unreachable".')
    requested_at: datetime
    deadline_at: datetime = Field(description="Nothing stored by then: the node's agent is unreachable.")
    stored_at: datetime | None
    seconds_after_decision: float | None = Field(description="From the decision to the bundle stored.")
    size_bytes: int | None
    sha256: str | None
    download: str | None = Field(description="The API path of the tar.gz, when stored.")
    manifest: dict[str, Any] | None = Field(
        description="The agent's manifest.json: each part's file, status (ok, missing, error, timeout), bytes, "
        "seconds, whether it was truncated, and its error."
    )
