"""Unknown lines as the API shows them: one item per form, counted over a window."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from service.pagination import page_config


class UnknownLineOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "form_id": "5a5f74c344857c76",
                    "form": "[rank<rank>]: FooComm error: shard <num> of <num> stalled on <host> after <num> retries",
                    "example": "[rank12]: FooComm error: shard 3 of 64 stalled on gpu-node-017 after 5 retries",
                    "sources": ["training"],
                    "count": 1412,
                    "nodes": 2,
                    "top_nodes": ["gpu-node-017", "gpu-node-031"],
                    "jobs": ["llm-pretrain-42"],
                    "job_count": 1,
                    "first_seen_at": "2026-11-22T09:12:40Z",
                    "last_seen_at": "2026-11-22T10:00:03Z",
                }
            ]
        }
    )

    form_id: str = Field(description="A stable short id of the form: equal on every node, job and day.")
    form: str = Field(description="The line with its variable parts masked: `<num>`, `<hex>`, `<host>`, `<pci>`, ...")
    example: str = Field(description="The first line seen of this form, as logged (its first 500 characters).")
    sources: list[str] = Field(description="Where the lines came from: `training` (logs), `kmsg` (kernel), ...")
    count: int = Field(description="Lines of this form in the window (of the matching nodes and jobs, if filtered).")
    nodes: int = Field(description="Distinct nodes that logged it.")
    top_nodes: list[str] = Field(description="Up to 5 of those nodes, the most lines first.")
    jobs: list[str] = Field(description="Up to 20 of the jobs it was logged in (newest first); lines of no job: none.")
    job_count: int = Field(description="Distinct jobs it was logged in.")
    first_seen_at: datetime = Field(
        description="The earliest line counted: counts are kept per hour, so it may precede `since` within its hour."
    )
    last_seen_at: datetime


class UnknownLinePage(BaseModel):
    model_config = page_config(UnknownLineOut)

    items: list[UnknownLineOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (fewer lines) page; null at the end.")
