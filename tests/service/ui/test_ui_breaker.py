"""The fleet circuit breaker in the web UI: a banner on every page while it is tripped, with an operator's reset."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import unquote

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import BreakerEvent, FleetBreaker
from tests import rows

PAGES = ("/", "/incidents", "/nodes", "/jobs", "/decisions", "/fleet", "/silences", "/channels", "/whatif")
REASON = "taking node-x out would make 5 of 40 nodes (12%) out by automatic decisions"


def _trip(session: Session) -> FleetBreaker:
    row = session.get(FleetBreaker, 1) or FleetBreaker(id=1)
    row.state, row.tripped_at, row.tripped_reason = "tripped", datetime.now(UTC), REASON
    session.add(row)
    _, _, incident, _ = rows.eviction(session, state="awaiting_approval")
    held = rows.decision(session, incident=incident, node=rows.node(session), state="awaiting_approval")
    held.evidence = {"guard_rails": {"fleet_breaker": "held for a person: the fleet breaker tripped"}}
    session.flush()
    return row


@pytest.mark.parametrize("path", PAGES)
def test_every_page_shows_the_tripped_breaker_with_a_reset_form(ui, session, path) -> None:
    _trip(session)
    html = ui.get(path).text
    assert 'id="breaker-banner"' in html, path
    banner = html.split('id="breaker-banner"')[1].split("</div>")[0]
    assert "Fleet breaker tripped" in banner and REASON[1:] in banner
    assert "1 decision held" in banner and 'href="/decisions?state=awaiting_approval"' in banner
    assert 'action="/breaker/reset"' in banner and 'name="reason"' in banner


def test_a_held_decision_says_the_breaker_holds_it(ui, session) -> None:
    _trip(session)
    html = ui.get("/decisions?state=awaiting_approval").text
    assert html.count("Held by the fleet breaker: the fleet breaker tripped") == 1, "only the decision it held"


def test_no_banner_while_the_breaker_is_closed(ui, session) -> None:
    for path in PAGES[:3]:
        assert "breaker-banner" not in ui.get(path).text


def test_an_operator_resets_it_from_the_banner_with_a_reason_in_the_audit_trail(ui, session) -> None:
    _trip(session)
    refused = ui.post("/breaker/reset", {"reason": "  ", "return_to": "/nodes"})
    assert refused.status_code == 303 and refused.headers["location"] == "/nodes"
    assert "Breaker not reset" in unquote(refused.cookies.get("faultline_flash") or "")
    assert session.get_one(FleetBreaker, 1).state == "tripped"
    assert ui.client.post("/breaker/reset", data={"csrf_token": "forged", "reason": "x"}).status_code == 403

    done = ui.post("/breaker/reset", {"reason": "rule reverted", "return_to": "/nodes"})
    assert done.status_code == 303 and done.headers["location"] == "/nodes"
    session.expire_all()
    row = session.get_one(FleetBreaker, 1)
    assert (row.state, row.reset_by, row.reset_reason) == ("closed", "operator:oncall-op", "rule reverted")
    (event,) = session.scalars(select(BreakerEvent).where(BreakerEvent.kind == "reset")).all()
    assert (event.actor, event.reason, event.details["held_decisions"]) == ("operator:oncall-op", "rule reverted", 1)
    page = ui.get("/nodes").text
    assert "breaker-banner" not in page and "Fleet breaker reset" in page
