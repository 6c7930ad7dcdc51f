"""Done means: an injected fault reaches Slack and Lark as one message per channel, with the incident link,
even when the Slack receiver fails twice first. Real API and worker processes; local receivers stand in for
the chat services."""

from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from service.tokens import service as tokens
from tests.factories import batch
from tests.procs import api_server, running, wait_for
from tests.receiver import receiver

pytestmark = pytest.mark.slow

PUBLIC_URL = "https://faultline.example.com"


def test_an_injected_fault_posts_one_message_per_channel_with_the_incident_link(committed, tmp_path) -> None:
    factory = sessionmaker(bind=committed)
    with factory() as session:
        agent = tokens.create(session, scope="agent").token
        operator = tokens.create(session, scope="operator", name="oncall").token
        session.commit()
    env = {"FAULTLINE_PUBLIC_URL": PUBLIC_URL, "FAULTLINE_WEBHOOK_RETRY_BASE_S": "0.5"}

    with (
        receiver() as slack,
        receiver() as lark,
        api_server(env=env, log=tmp_path / "api.log") as url,
        running(["faultline", "work", "--beat", "--concurrency", "2"], env=env, log=tmp_path / "worker.log"),
    ):
        slack.script = [(500, {"error": "boom"}, {}), (503, {"error": "busy"}, {})]
        slack.default = (200, {}, {})
        lark.default = (200, {"code": 0, "msg": "success"}, {})
        api = httpx.Client(base_url=url, timeout=30)
        for kind, target in (("slack", slack), ("lark", lark)):
            created = api.post(
                "/api/v1/channels",
                json={"name": f"oncall-{kind}", "kind": kind, "url": f"{target.url}/hook/secret-{kind}"},
                headers={"Authorization": f"Bearer {operator}"},
            )
            assert created.status_code == 201, created.text
            assert "secret" not in created.text

        fault = batch("gpu-node-017", gpus=2, job_id="llm-pretrain-42")
        ingested = api.post("/api/v1/ingest", json=fault, headers={"Authorization": f"Bearer {agent}"})
        assert ingested.status_code == 200, ingested.text

        wait_for(lambda: len(slack.requests) >= 3 and len(lark.requests) >= 1, timeout=60, what="the chat messages")
        time.sleep(8)  # longer than a group window and several retry intervals: nothing else may arrive

        with committed.connect() as conn:
            incident_id = conn.execute(text("SELECT id FROM incidents")).scalar_one()
            rows = conn.execute(
                text(
                    "SELECT c.kind, d.event, d.state, d.attempts FROM notification_deliveries d "
                    "JOIN notification_channels c ON c.id = d.channel_id ORDER BY c.kind, d.event"
                )
            ).all()
        link = f"{PUBLIC_URL}/incidents/{incident_id}"
        # Slack: two failures, then the one message, never re-posted once accepted.
        assert len(slack.requests) == 3
        bodies = slack.bodies()
        assert bodies[0] == bodies[1] == bodies[2]
        assert "gpu-node-017" in str(bodies[2])
        assert any(link in b.get("url", "") for b in bodies[2]["blocks"][-1]["elements"]), "the button's link"
        assert [r["path"] for r in slack.requests] == ["/hook/secret-slack"] * 3
        # Lark: one interactive card.
        assert len(lark.requests) == 1
        card = lark.bodies()[0]
        assert card["msg_type"] == "interactive" and link in str(card["card"]["elements"])
        # The incident opened and was decided in one pass: both events went out in the one message.
        assert rows == [
            ("lark", "decided", "sent", 1),
            ("lark", "opened", "sent", 1),
            ("slack", "decided", "sent", 3),
            ("slack", "opened", "sent", 3),
        ]
