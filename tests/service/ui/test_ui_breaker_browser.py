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


def test_open_shared_causes_show_beside_the_tripped_breaker_and_lead_to_the_members(committed, tmp_path) -> None:
    """Both banners on every page; the shared one links to the open shared causes, whose member's page lists it."""
    from playwright.sync_api import expect, sync_playwright

    from service.config import Settings
    from service.models import SharedIncident
    from service.shared_causes import service as shared

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    token = _seed(committed)
    factory = sessionmaker(bind=committed)
    with factory() as session:
        ids = [rows.node(session, f"leaf-3-{i}").id for i in range(3)]
        incident = shared.open_or_update(
            session, component_kind="switch", component="leaf-3", node_ids=ids, summary="IB errors behind leaf-3",
            evidence={"categories": ["network"]}, now=datetime.now(UTC),
        )  # fmt: skip
        shared.decide_for_component(session, incident=incident, now=datetime.now(UTC), settings=Settings())
        incident_id = incident.id
        session.commit()
    try:
        with (
            api_server(env={"FAULTLINE_LOG_LEVEL": "WARNING"}, log=tmp_path / "api.log") as url,
            sync_playwright() as pw,
        ):
            browser = pw.chromium.launch(executable_path=CHROMIUM)
            page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{url}/login")
            page.fill("input[name=token]", token)
            page.click("button[type=submit]")
            for path in ("/", "/incidents", "/decisions", "/nodes/gpu-node-117"):
                page.goto(f"{url}{path}")
                expect(page.locator("#breaker-banner")).to_be_visible()
                expect(page.locator("#shared-banner")).to_be_visible()
                expect(page.locator("#shared-banner")).to_contain_text("1 shared cause open")
                expect(page.locator("#shared-banner")).to_contain_text("leaf-3")
            page.screenshot(path=str(SCREENSHOTS / "shared-cause-banner.png"), full_page=False)
            page.click("#shared-banner >> text=1 shared cause open")
            assert page.url.endswith("/shared-incidents?state=open")
            page.click(f'table.shared-incidents a[href="/shared-incidents/{incident_id}"]')
            page.click('table.shared-members a[href="/nodes/leaf-3-0"]')
            section = page.locator("#node-shared")
            expect(section).to_be_visible()
            expect(section).to_contain_text("leaf-3")
            expect(section.locator(f'a[href="/shared-incidents/{incident_id}"]')).to_have_count(1)
            expect(page.locator("a.pill.shared-cause")).to_contain_text("shared cause: switch leaf-3")
            section.screenshot(path=str(SCREENSHOTS / "node-shared-causes.png"))
            browser.close()
            assert errors == []
    finally:
        with factory() as session:  # shared incidents are not among the tables `committed` empties
            session.query(SharedIncident).filter(SharedIncident.id == incident_id).delete()
            session.commit()
