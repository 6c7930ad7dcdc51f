"""Cloud scheduled events: each provider's parser on its documented answers (tests/fixtures/cloud_events/), and the
poller against a local HTTP server that answers as that provider's metadata service does (headers, token, paths)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agents import cloud_events
from agents.cloud_events import CloudEventPoller, MetadataService, ScheduledEvent, parse_aws, parse_azure, parse_gcp
from agents.config import ConfigError, load
from tests.paths import TESTS

FIXTURES = TESTS / "fixtures" / "cloud_events"


def recorded(name: str) -> str:
    """A fixture's answer: its body after the `#` header (the source)."""
    lines = (FIXTURES / name).read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith("#")).strip()


def test_every_fixture_names_its_source() -> None:
    for path in FIXTURES.glob("*.txt"):
        assert path.read_text().startswith("# source: "), path.name


def test_aws_documented_answer() -> None:
    [event] = parse_aws(recorded("aws_scheduled.txt"))
    assert event == ScheduledEvent(
        "instance-event-0d59937288b749b32",
        datetime(2019, 1, 21, 9, 0, 43, tzinfo=UTC),
        datetime(2019, 1, 21, 9, 17, 23, tzinfo=UTC),
        "system-reboot: scheduled reboot",
    )


def test_aws_skips_completed_events_and_gives_an_open_event_an_hour() -> None:
    events = parse_aws(recorded("aws_scheduled_mixed.txt"))
    assert [e.event_id for e in events] == ["instance-event-0d59937288b749b32", "instance-event-0e439355b779n26"]
    retirement = events[1]
    assert retirement.starts_at == datetime(2019, 2, 3, 18, 0, tzinfo=UTC)
    assert retirement.ends_at - retirement.starts_at == cloud_events.DEFAULT_DURATION
    assert retirement.description.startswith("instance-retirement: ")
    assert parse_aws("[]") == [] and parse_aws("") == []


def test_gcp_upcoming_window_and_none() -> None:
    [event] = parse_gcp(recorded("gcp_upcoming_maintenance.txt"), "NONE", first_seen=None)
    assert event.event_id == "upcoming:2024-12-01T19:00:01Z"
    assert (event.starts_at, event.ends_at) == (
        datetime(2024, 12, 1, 19, 0, 1, tzinfo=UTC),
        datetime(2024, 12, 1, 21, 0, 1, tzinfo=UTC),
    )
    assert event.description == "SCHEDULED PENDING PLANNED_UPDATE, PLANNED_NETWORK_UPDATE"
    assert parse_gcp(recorded("gcp_upcoming_none.txt"), "NONE", first_seen=None) == []


def test_gcp_maintenance_event_alone_starts_60_s_after_it_was_first_seen() -> None:
    seen = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)
    [event] = parse_gcp(recorded("gcp_upcoming_none.txt"), recorded("gcp_maintenance_event.txt"), first_seen=seen)
    assert event.event_id == "maintenance-event:TERMINATE_ON_HOST_MAINTENANCE"
    assert event.starts_at == seen + timedelta(seconds=60)


def test_azure_this_vm_s_events_only_and_no_short_freeze() -> None:
    now = datetime(2016, 9, 19, 18, 0, tzinfo=UTC)
    events = parse_azure(recorded("azure_scheduledevents.txt"), vm_name="FrontEnd_IN_0", now=now)
    assert [e.event_id for e in events] == [
        "602d9444-d2cd-49c7-8624-8643e7171297",
        "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b",
    ]
    reboot, started = events
    assert reboot.starts_at == datetime(2016, 9, 19, 18, 29, 47, tzinfo=UTC)
    assert reboot.ends_at - reboot.starts_at == cloud_events.DEFAULT_DURATION  # DurationInSeconds -1: unknown
    assert reboot.description.startswith("Reboot Platform Virtual machine is going to be restarted")
    assert (started.starts_at, started.ends_at) == (now, now + timedelta(seconds=600))  # Started: NotBefore empty
    # A VM whose name is unknown takes every event of the set (the Freeze of 9 s still is no downtime).
    everyone = parse_azure(recorded("azure_scheduledevents.txt"), vm_name=None, now=now)
    assert len(everyone) == 3


class FakeMetadata(BaseHTTPRequestHandler):
    """Answers as one provider's metadata service: its paths, required headers and documented bodies."""

    provider = "aws"
    bodies: dict[str, str] = {}
    requests: list[tuple[str, str, dict[str, str]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: str, headers: dict[str, str] | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        self.requests.append(("PUT", self.path, dict(self.headers)))
        if (
            self.provider == "aws"
            and self.path == "/latest/api/token"
            and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        ):
            self._send(200, "AQAEAtoken==")
        else:
            self._send(404, "")

    def do_GET(self) -> None:
        self.requests.append(("GET", self.path, dict(self.headers)))
        path = self.path.split("?")[0]
        if self.provider == "aws":
            if self.headers.get("X-aws-ec2-metadata-token") != "AQAEAtoken==":
                return self._send(401, "")
            if path == "/latest/meta-data/events/maintenance/scheduled" and "aws" in self.bodies:
                return self._send(200, self.bodies["aws"])
        elif self.provider == "gcp":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._send(403, "Missing Metadata-Flavor:Google header.")
            google = {"Metadata-Flavor": "Google"}
            if path == "/computeMetadata/v1/instance/maintenance-event":
                return self._send(200, self.bodies.get("gcp_event", "NONE"), google)
            if path == "/computeMetadata/v1/instance/upcoming-maintenance":
                return self._send(200, self.bodies.get("gcp_upcoming", "{ }"), google)
        elif self.provider == "azure":
            if self.headers.get("Metadata") != "true":
                return self._send(400, '{"error": "Bad request. Required metadata header not specified"}')
            if path == "/metadata/scheduledevents" and "api-version=2020-07-01" in self.path:
                return self._send(200, self.bodies.get("azure", '{"DocumentIncarnation": 0, "Events": []}'))
            if path == "/metadata/instance/compute/name":
                return self._send(200, "FrontEnd_IN_0")
        self._send(404, "")


@pytest.fixture
def metadata() -> Iterator[tuple[str, type[FakeMetadata]]]:
    handler = type("Handler", (FakeMetadata,), {"bodies": {}, "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_auto_detects_the_provider_that_answers(metadata, provider) -> None:
    url, handler = metadata
    handler.provider = provider
    service = MetadataService(timeout=1.0, base_url=url)
    try:
        assert service.detect("auto") == provider
    finally:
        service.close()


def _poller(url: str, reports: list[tuple[str, list[ScheduledEvent]]], mode: str = "auto") -> CloudEventPoller:
    def report(provider: str, events: list[ScheduledEvent]) -> bool:
        reports.append((provider, events))
        return True

    return CloudEventPoller(mode=mode, interval=0.05, timeout=1.0, report=report, base_url=url)


def test_aws_poll_uses_an_imdsv2_token_and_reports_on_change_only(metadata) -> None:
    url, handler = metadata
    handler.provider = "aws"
    handler.bodies["aws"] = recorded("aws_scheduled.txt")
    reports: list[tuple[str, list[ScheduledEvent]]] = []
    poller = _poller(url, reports)
    poller.provider = poller.service.detect("auto")
    assert poller.poll_once() is True and poller.poll_once() is False  # the same events: not again
    [(provider, [event])] = reports
    assert provider == "aws" and event.event_id == "instance-event-0d59937288b749b32"
    gets = [(path, headers) for method, path, headers in handler.requests if method == "GET"]
    assert gets and all(h.get("X-aws-ec2-metadata-token") == "AQAEAtoken==" for _, h in gets)
    handler.bodies["aws"] = "[]"  # the event was withdrawn: the empty list is reported too
    assert poller.poll_once() is True and reports[-1] == ("aws", [])
    poller.service.close()


def test_gcp_poll_in_its_thread(metadata) -> None:
    url, handler = metadata
    handler.provider = "gcp"
    handler.bodies["gcp_upcoming"] = recorded("gcp_upcoming_maintenance.txt")
    reports: list[tuple[str, list[ScheduledEvent]]] = []
    poller = _poller(url, reports, mode="gcp")
    poller.start()
    deadline = time.monotonic() + 5
    while not reports and time.monotonic() < deadline:
        time.sleep(0.02)
    poller.stop()
    [(provider, [event])] = reports[:1]
    assert provider == "gcp" and event.starts_at == datetime(2024, 12, 1, 19, 0, 1, tzinfo=UTC)
    assert all(h.get("Metadata-Flavor") == "Google" for _, _, h in handler.requests)


def test_azure_poll_filters_by_this_vm_s_name(metadata) -> None:
    url, handler = metadata
    handler.provider = "azure"
    handler.bodies["azure"] = recorded("azure_scheduledevents.txt")
    reports: list[tuple[str, list[ScheduledEvent]]] = []
    poller = _poller(url, reports)
    poller.provider = poller.service.detect("auto")
    assert poller.provider == "azure" and poller.poll_once() is True
    [(_, events)] = reports
    assert [e.event_id[:8] for e in events] == ["602d9444", "9e8d7c6b"]
    azure = [h for _, path, h in handler.requests if path.startswith("/metadata/")]  # auto probed AWS and GCP first
    assert azure and all(h.get("Metadata") == "true" for h in azure)
    poller.service.close()


def test_a_failed_report_is_tried_again(metadata) -> None:
    url, handler = metadata
    handler.provider = "aws"
    handler.bodies["aws"] = recorded("aws_scheduled.txt")
    answers = iter([False, True])
    calls: list[int] = []

    def report(provider: str, events: list[ScheduledEvent]) -> bool:
        calls.append(len(events))
        return next(answers)

    poller = CloudEventPoller(mode="aws", interval=1, timeout=1.0, report=report, base_url=url)
    poller.provider = poller.service.detect("aws")
    assert poller.poll_once() is False and poller.poll_once() is True and calls == [1, 1]
    poller.service.close()


def test_a_node_without_a_metadata_service_gives_up_at_once() -> None:
    # A port nothing listens on: connection refused, as on a machine without a metadata service.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    reports: list[tuple[str, list[ScheduledEvent]]] = []
    poller = _poller(f"http://127.0.0.1:{port}", reports)
    started = time.monotonic()
    poller.run()  # returns: nothing answers, so it does not poll
    assert time.monotonic() - started < 3.5 and poller.provider is None and reports == []
    poller.service.close()


def test_unroutable_metadata_address_is_bounded_by_the_timeout() -> None:
    # TEST-NET-1 (RFC 5737) is never routed: a connect there hangs, as 169.254.169.254 may off the cloud.
    service = MetadataService(timeout=0.3, base_url="http://192.0.2.1")
    started = time.monotonic()
    assert service.detect("auto") is None
    assert time.monotonic() - started < 3 * 0.3 + 1.0
    service.close()


def test_config_names_the_modes_and_a_signal(tmp_path: Path) -> None:
    base = {"dry_run": True, "node_name": "n1"}
    assert load(base, config_file=None, environ={}).cloud_events == "off"
    config = load(
        {**base, "cloud_events": "auto", "checkpoint_signal": "SIGUSR1"},
        config_file=None,
        environ={"FAULTLINE_AGENT_CLOUD_EVENTS_INTERVAL": "30"},
    )
    assert (config.cloud_events, config.cloud_events_interval, config.checkpoint_signal) == ("auto", 30.0, "SIGUSR1")
    with pytest.raises(ConfigError, match="--cloud-events must be one of"):
        load({**base, "cloud_events": "oracle"}, config_file=None, environ={})
    with pytest.raises(ConfigError, match="--checkpoint-signal"):
        load({**base, "checkpoint_signal": "SIGNOPE"}, config_file=None, environ={})
    assert config.checkpoint_path.name == "n1.checkpoint.json"


def test_reporter_sends_the_wire_form(metadata) -> None:
    """The reporter's PUT, caught by a local server standing in for the service."""
    received: list[dict[str, Any]] = []

    class Service(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_PUT(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append({"path": self.path, "auth": self.headers["Authorization"], "body": body})
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        report = cloud_events.reporter(server=f"http://127.0.0.1:{server.server_address[1]}", node="n1", token="t0k")
        [event] = parse_aws(recorded("aws_scheduled.txt"))
        assert report("aws", [event]) is True
    finally:
        server.shutdown()
        server.server_close()
    [put] = received
    assert put["path"] == "/api/v1/nodes/n1/maintenance/cloud" and put["auth"] == "Bearer t0k"
    assert put["body"] == {"provider": "aws", "events": [event.to_wire()]}
