"""Cloud scheduled events: the instance metadata service's announced maintenance of this machine, read by the agent
and reported to the service, which drains the node ahead of it and does not count it as a fault.

The three forms, as each provider documents them (recorded answers in tests/fixtures/cloud_events/):
- AWS (IMDSv2): PUT /latest/api/token for a session token, then GET /latest/meta-data/events/maintenance/scheduled:
  a JSON list of {Code, Description, EventId, NotBefore, NotAfter, NotBeforeDeadline?, State}, times as
  "21 Jan 2019 09:00:43 GMT"; completed and canceled events move to .../history (a "[Completed]" or "[Canceled]"
  description, or a State other than "active", is skipped).
- GCP: GET /computeMetadata/v1/instance/upcoming-maintenance?alt=json (header Metadata-Flavor: Google): `{}` or
  {type, maintenance_status, window_start_time, window_end_time, latest_window_start_time, can_reschedule, ...}, RFC
  3339 times; and GET /computeMetadata/v1/instance/maintenance-event: NONE, MIGRATE_ON_HOST_MAINTENANCE or
  TERMINATE_ON_HOST_MAINTENANCE, which changes 60 s before the maintenance.
- Azure: GET /metadata/scheduledevents?api-version=2020-07-01 (header Metadata: true): {DocumentIncarnation, Events:
  [{EventId, EventType, ResourceType, Resources, EventStatus, NotBefore, Description, EventSource,
  DurationInSeconds}]}, NotBefore as "Mon, 19 Sep 2016 18:29:47 GMT" (empty once Started), DurationInSeconds -1 when
  unknown. Events are delivered to every VM of an availability set: only those listing this VM in Resources count.

Off by default: most GPU clusters are on premises, where 169.254.169.254 answers nothing (or something else). `auto`
probes the three once, each with a short timeout, in the poller's own thread, so the agent's loop never waits on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import orjson

log = logging.getLogger("faultline.agent.cloud")

PROVIDERS = ("aws", "gcp", "azure")
MODES = ("off", "auto", *PROVIDERS)
AWS_URL = "http://169.254.169.254"
AZURE_URL = "http://169.254.169.254"
GCP_URL = "http://metadata.google.internal"
AWS_EVENTS = "/latest/meta-data/events/maintenance/scheduled"
AWS_TOKEN = "/latest/api/token"
AWS_TOKEN_TTL_S = 21600
GCP_UPCOMING = "/computeMetadata/v1/instance/upcoming-maintenance"
GCP_EVENT = "/computeMetadata/v1/instance/maintenance-event"
AZURE_EVENTS = "/metadata/scheduledevents"
AZURE_VM_NAME = "/metadata/instance/compute/name"
AZURE_API = "2020-07-01"
# An event whose cloud gives no end: this long (an AWS or Azure reboot, a redeploy, takes minutes; an hour is safe).
DEFAULT_DURATION = timedelta(hours=1)
# GCP's maintenance-event changes this long before the maintenance starts.
GCP_NOTICE = timedelta(seconds=60)
# An Azure Freeze of a known few seconds pauses the VM without taking it down: not worth draining an 8-GPU node.
AZURE_FREEZE_MAX_S = 60


@dataclass(frozen=True, slots=True)
class ScheduledEvent:
    event_id: str
    starts_at: datetime
    ends_at: datetime
    description: str

    def to_wire(self) -> dict[str, str]:
        return {
            "event_id": self.event_id,
            "starts_at": self.starts_at.isoformat(),
            "ends_at": self.ends_at.isoformat(),
            "description": self.description[:1000],
        }


def _json(body: str | bytes) -> Any:
    return orjson.loads(body) if body and body.strip() else None


def parse_aws(body: str | bytes) -> list[ScheduledEvent]:
    """AWS's scheduled list: the active events."""
    events = []
    for item in _json(body) or []:
        if not isinstance(item, dict) or not item.get("EventId") or not item.get("NotBefore"):
            continue
        description = str(item.get("Description") or "")
        if str(item.get("State") or "active").lower() != "active" or description.startswith(
            ("[Completed]", "[Canceled]")
        ):
            continue
        starts_at = _aws_time(item["NotBefore"])
        ends_at = _aws_time(item["NotAfter"]) if item.get("NotAfter") else starts_at + DEFAULT_DURATION
        code = str(item.get("Code") or "maintenance")
        events.append(ScheduledEvent(str(item["EventId"]), starts_at, ends_at, f"{code}: {description}".strip(": ")))
    return events


def _aws_time(text: str) -> datetime:
    return datetime.strptime(text.strip(), "%d %b %Y %H:%M:%S %Z").replace(tzinfo=UTC)


def parse_azure(body: str | bytes, *, vm_name: str | None, now: datetime) -> list[ScheduledEvent]:
    """Azure's scheduled events for this VM (all of them when its name is unknown)."""
    document = _json(body) or {}
    events = []
    for item in document.get("Events") or []:
        if not isinstance(item, dict) or not item.get("EventId"):
            continue
        resources = item.get("Resources") or []
        if vm_name is not None and resources and vm_name not in resources:
            continue
        kind = str(item.get("EventType") or "maintenance")
        duration = item.get("DurationInSeconds")
        known = isinstance(duration, int | float) and duration > 0
        if kind == "Freeze" and known and duration <= AZURE_FREEZE_MAX_S:
            continue
        not_before = str(item.get("NotBefore") or "").strip()
        starts_at = parsedate_to_datetime(not_before).astimezone(UTC) if not_before else now  # Started: now
        ends_at = starts_at + (timedelta(seconds=float(duration)) if known else DEFAULT_DURATION)
        description = " ".join(
            part for part in (kind, str(item.get("EventSource") or ""), str(item.get("Description") or "")) if part
        )
        events.append(ScheduledEvent(str(item["EventId"]), starts_at, ends_at, description))
    return events


def parse_gcp(upcoming: str | bytes, maintenance_event: str, *, first_seen: datetime | None) -> list[ScheduledEvent]:
    """GCP's upcoming maintenance window, else (it changes only 60 s ahead) the maintenance-event value, dated from
    when the agent first saw it."""
    window = _json(upcoming) or {}
    if isinstance(window, dict) and window.get("window_start_time"):
        starts_at = _rfc3339(window["window_start_time"])
        end = window.get("window_end_time")
        ends_at = _rfc3339(end) if end else starts_at + DEFAULT_DURATION
        reasons = ", ".join(str(r) for r in window.get("maintenance_reasons") or [])
        description = " ".join(
            p for p in (str(window.get("type") or ""), str(window.get("maintenance_status") or ""), reasons) if p
        )
        return [ScheduledEvent(f"upcoming:{window['window_start_time']}", starts_at, ends_at, description)]
    value = maintenance_event.strip()
    if value and value != "NONE" and first_seen is not None:
        starts_at = first_seen + GCP_NOTICE
        return [ScheduledEvent(f"maintenance-event:{value}", starts_at, starts_at + DEFAULT_DURATION, value)]
    return []


def _rfc3339(text: str) -> datetime:
    return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).astimezone(UTC)


class MetadataService:
    """Reads one provider's scheduled events; `detect` finds which provider answers."""

    def __init__(self, *, timeout: float, base_url: str | None = None) -> None:
        self.timeout = timeout
        self.base_url = base_url  # one URL for whichever provider (tests; a metadata proxy)
        self.provider: str | None = None
        self._client = httpx.Client(timeout=timeout, trust_env=False)  # never through an HTTP proxy
        self._azure_vm: str | None = None
        self._gcp_first_seen: dict[str, datetime] = {}

    def close(self) -> None:
        self._client.close()

    def _url(self, provider: str, path: str) -> str:
        default = {"aws": AWS_URL, "gcp": GCP_URL, "azure": AZURE_URL}[provider]
        return (self.base_url or default).rstrip("/") + path

    def detect(self, mode: str) -> str | None:
        """The provider whose metadata service answers (mode `auto`), or the one named; None when none answers."""
        candidates = PROVIDERS if mode == "auto" else (mode,)
        for provider in candidates:
            try:
                if self._probe(provider):
                    self.provider = provider
                    return provider
            except (httpx.HTTPError, OSError):
                continue
        return None

    def _probe(self, provider: str) -> bool:
        if provider == "aws":
            return self._aws_token() is not None
        if provider == "gcp":
            response = self._client.get(self._url("gcp", GCP_EVENT), headers={"Metadata-Flavor": "Google"})
            return response.status_code == 200 and response.headers.get("Metadata-Flavor") == "Google"
        response = self._client.get(
            self._url("azure", AZURE_EVENTS), params={"api-version": AZURE_API}, headers={"Metadata": "true"}
        )
        return response.status_code == 200 and "Events" in (_json(response.content) or {})

    def _aws_token(self) -> str | None:
        response = self._client.put(
            self._url("aws", AWS_TOKEN), headers={"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)}
        )
        return response.text.strip() if response.status_code == 200 and response.text.strip() else None

    def events(self, *, now: datetime) -> list[ScheduledEvent]:
        """The provider's scheduled events now; raises httpx.HTTPError when it does not answer."""
        if self.provider == "aws":
            token = self._aws_token()
            headers = {"X-aws-ec2-metadata-token": token} if token else {}
            response = self._client.get(self._url("aws", AWS_EVENTS), headers=headers)
            if response.status_code == 404:  # no events: IMDS has no such key then
                return []
            response.raise_for_status()
            return parse_aws(response.content)
        if self.provider == "gcp":
            headers = {"Metadata-Flavor": "Google"}
            upcoming = self._client.get(self._url("gcp", GCP_UPCOMING), params={"alt": "json"}, headers=headers)
            event = self._client.get(self._url("gcp", GCP_EVENT), headers=headers)
            event.raise_for_status()
            value = event.text.strip()
            if value and value != "NONE":
                self._gcp_first_seen.setdefault(value, now)
            else:
                self._gcp_first_seen.clear()
            body = upcoming.content if upcoming.status_code == 200 else b""
            return parse_gcp(body, value, first_seen=self._gcp_first_seen.get(value))
        if self.provider == "azure":
            if self._azure_vm is None:
                name = self._client.get(
                    self._url("azure", AZURE_VM_NAME),
                    params={"api-version": "2021-02-01", "format": "text"},
                    headers={"Metadata": "true"},
                )
                self._azure_vm = name.text.strip() if name.status_code == 200 and name.text.strip() else ""
            response = self._client.get(
                self._url("azure", AZURE_EVENTS), params={"api-version": AZURE_API}, headers={"Metadata": "true"}
            )
            response.raise_for_status()
            return parse_azure(response.content, vm_name=self._azure_vm or None, now=now)
        return []


Report = Callable[[str, list[ScheduledEvent]], bool]


class CloudEventPoller:
    """Polls the metadata service every `interval` s in its own thread and reports the events whenever they change
    (and again every `refresh` s, so a service that missed one hears it); stops at once when nothing answers."""

    def __init__(
        self,
        *,
        mode: str,
        interval: float,
        timeout: float,
        report: Report,
        base_url: str | None = None,
        refresh: float = 600.0,
    ) -> None:
        self.mode = mode
        self.interval = interval
        self.refresh = refresh
        self.report = report
        self.service = MetadataService(timeout=timeout, base_url=base_url)
        self.stopping = threading.Event()
        self.provider: str | None = None
        self.last: list[dict[str, str]] | None = None
        self._reported_at = float("-inf")
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="cloud-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.service.close()

    def run(self) -> None:
        self.provider = self.service.detect(self.mode)
        if self.provider is None:
            log.info("cloud scheduled events: no metadata service answers (%s); not polling", self.mode)
            return
        log.info("cloud scheduled events: polling %s every %gs", self.provider, self.interval)
        while not self.stopping.is_set():
            self.poll_once()
            self.stopping.wait(self.interval)

    def poll_once(self) -> bool:
        """One poll; reports when the events changed or the refresh is due. True when it reported."""
        assert self.provider is not None
        try:
            events = self.service.events(now=datetime.now(UTC))
        except (httpx.HTTPError, OSError, ValueError) as exc:
            log.warning("cloud scheduled events: %s metadata service: %s", self.provider, exc)
            return False
        wire = [e.to_wire() for e in events]
        now = time.monotonic()
        if wire == self.last and now - self._reported_at < self.refresh:
            return False
        if not self.report(self.provider, events):
            return False  # tried again on the next poll
        self.last, self._reported_at = wire, now
        return True


def reporter(*, server: str, node: str, token: str, timeout: float = 10.0) -> Report:
    """PUT the events to the service (PUT /api/v1/nodes/{node}/maintenance/cloud); False when it did not take them."""

    def report(provider: str, events: list[ScheduledEvent]) -> bool:
        try:
            response = httpx.put(
                f"{server.rstrip('/')}/api/v1/nodes/{node}/maintenance/cloud",
                json={"provider": provider, "events": [e.to_wire() for e in events]},
                headers={"Authorization": f"Bearer {token}"},
                timeout=timeout,
            )
        except httpx.HTTPError as exc:
            log.warning("cloud scheduled events: reporting to %s failed: %s", server, exc)
            return False
        if response.status_code >= 400:
            log.warning(
                "cloud scheduled events: the service answered %d: %s", response.status_code, response.text[:300]
            )
            return False
        if events:
            log.info("cloud scheduled events reported: %s", ", ".join(f"{e.event_id} at {e.starts_at}" for e in events))
        return True

    return report
