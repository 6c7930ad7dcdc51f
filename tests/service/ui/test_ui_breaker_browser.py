"""The fleet circuit breaker in real Chromium against a real API process: the banner on every page while it is
tripped, and an operator's reset from it, which takes the banner away."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from service.models import BreakerEvent, FleetBreaker
from service.tokens import service as tokens
from tests import rows
from tests.procs import api_server
from tests.service.ui.test_ui_browser import CHROMIUM, SCREENSHOTS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"Chromium not at {CHROMIUM}"),
]

REASON = "taking gpu-node-117 out would make 5 of 40 nodes (12%) out by automatic decisions"


def _seed(engine: Any) -> str:
    factory = sessionmaker(bind=engine)
    with factory() as session:
        rows.node(session, "gpu-node-117")
        row = session.get(FleetBreaker, 1) or FleetBreaker(id=1)
        row.state, row.tripped_at, row.tripped_reason = "tripped", datetime.now(UTC), REASON
        session.add(row)
        token = tokens.create(session, scope="operator", name="night-shift").token
        session.commit()
    return token


def test_the_banner_shows_on_every_page_until_an_operator_resets_the_breaker(committed, tmp_path) -> None:
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    token = _seed(committed)
    with api_server(env={"FAULTLINE_LOG_LEVEL": "WARNING"}, log=tmp_path / "api.log") as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/login")
        page.fill("input[name=token]", token)
        page.click("button[type=submit]")
        for path in ("/", "/nodes", "/incidents", "/decisions", "/nodes/gpu-node-117"):
            page.goto(f"{url}{path}")
            banner = page.locator("#breaker-banner")
            expect(banner).to_be_visible()
            expect(banner).to_contain_text("Fleet breaker tripped")
            expect(banner).to_contain_text(REASON[1:])
        page.screenshot(path=str(SCREENSHOTS / "breaker-tripped.png"), full_page=False)

        page.fill("#breaker-banner input[name=reason]", "bad Xid rule reverted (PR 812)")
        page.click("#breaker-banner button")
        expect(page.locator(".flash")).to_contain_text("Fleet breaker reset")
        expect(page.locator("#breaker-banner")).to_have_count(0)
        assert page.url.endswith("/nodes/gpu-node-117")
        page.goto(f"{url}/")
        expect(page.locator("#breaker-banner")).to_have_count(0)
        browser.close()
        assert errors == []
    with sessionmaker(bind=committed)() as session:
        (event,) = session.scalars(select(BreakerEvent)).all()
        assert (event.kind, event.actor, event.reason) == (
            "reset",
            "operator:night-shift",
            "bad Xid rule reverted (PR 812)",
        )
