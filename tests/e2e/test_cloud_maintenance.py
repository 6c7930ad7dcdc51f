"""A real agent reading a metadata service that answers as AWS's IMDSv2 does, reporting to the real API: the scheduled
event becomes the node's maintenance window (source cloud:aws); withdrawn by the cloud, the window is cancelled."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.orm import Session

from service.embedded import free_port
from service.tokens import service as tokens
from tests.agents.test_cloud_events import FakeMetadata
from tests.procs import running, wait_api, wait_for
from tests.receiver import receiver

NODE = "cloud-node-1"


def _aws_events(start: datetime) -> str:
    """AWS's documented answer (tests/fixtures/cloud_events/aws_scheduled.txt), dated two hours ahead."""
    form = "%d %b %Y %H:%M:%S GMT"
    event = {
        "NotBefore": start.strftime(form),
        "Code": "system-reboot",
        "Description": "scheduled reboot",
        "EventId": "instance-event-0d59937288b749b32",
        "NotAfter": (start + timedelta(minutes=17)).strftime(form),
        "State": "active",
    }
    return json.dumps([event])


def _windows(engine) -> list[tuple[str, str, bool]]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT source, external_id, cancelled_at IS NOT NULL FROM maintenance_windows"))
        return [tuple(r) for r in rows]


def test_an_agent_reports_its_cloud_s_scheduled_event_as_a_window(committed, tmp_path: Path) -> None:
    with Session(committed) as session:
        session.execute(text("INSERT INTO nodes (name) VALUES (:n)"), {"n": NODE})
        token = tokens.create(session, scope="agent", node_name=NODE).token
        session.commit()
    handler = type("Handler", (FakeMetadata,), {"provider": "aws", "bodies": {}, "requests": []})
    handler.bodies["aws"] = _aws_events(datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2))
    imds = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=imds.serve_forever, daemon=True).start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    agent_log = tmp_path / "agent.log"
    try:
        with receiver() as dcgm, running(["faultline", "serve", "--port", str(port)], log=tmp_path / "api.log"):
            dcgm.page = lambda n: b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0"} 90\n'
            wait_api(url)
            agent = [
                "faultline", "agent", "--server", url, "--node-name", NODE, "--kmsg", "none", "--no-processes",
                "--dcgm-url", f"{dcgm.url}/metrics", "--spool-dir", str(tmp_path / "spool"),
                "--cloud-events", "auto", "--cloud-metadata-url", f"http://127.0.0.1:{imds.server_address[1]}",
                "--cloud-events-interval", "0.5",
            ]  # fmt: skip
            with running(agent, env={"FAULTLINE_AGENT_TOKEN": token}, log=agent_log):
                wait_for(lambda: _windows(committed) != [], timeout=30, what="the window")
                assert _windows(committed) == [("cloud:aws", "instance-event-0d59937288b749b32", False)]
                handler.bodies["aws"] = "[]"  # the cloud withdrew it
                wait_for(lambda: _windows(committed)[0][2], timeout=30, what="the window cancelled")
    finally:
        imds.shutdown()
        imds.server_close()
    log = agent_log.read_text()
    assert "cloud scheduled events: polling aws" in log, log[-2000:]
    tokened = [h for method, path, h in handler.requests if method == "GET" and "/events/" in path]
    assert tokened and all(h.get("X-aws-ec2-metadata-token") for h in tokened)
