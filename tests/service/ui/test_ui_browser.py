"""Done means, in a real browser: Chromium (Debian's, driven by Playwright) signs in, opens every page against a
seeded cluster and an incident the simulator causes while the overview is open, approves a decision and sees its
state change, and saves a screenshot of each page. Real API, worker and beat processes; the simulator's agents
ship real batches."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from lab.bench import uidata
from service.models import NotificationChannel, Silence
from service.tokens import service as tokens
from tests import paths
from tests.procs import api_server, running, wait_for
from tests.receiver import receiver

CHROMIUM = os.environ.get("FAULTLINE_CHROMIUM", "/usr/bin/chromium")
BROWSER_MISSING = "Chromium not installed"
SCREENSHOTS = Path(os.environ.get("FAULTLINE_SCREENSHOT_DIR", paths.REPO / ".faultline/screenshots"))
JOB = "ui-sim-job"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{BROWSER_MISSING} at {CHROMIUM}"),
]


def _seed(engine: Any, hook: str) -> dict[str, str]:
    from datetime import UTC, datetime, timedelta

    factory = sessionmaker(bind=engine)
    with factory() as session:
        uidata.seed(session, nodes=256, nodes_per_job=64, incidents=300, open_incidents=12, prefix="seed")
        now = datetime.now(UTC)
        session.add(
            Silence(
                node_pattern="seed-node-001*",
                starts_at=now,
                ends_at=now + timedelta(hours=2),
                author="operator:maintenance",
                comment="firmware upgrade on rack 1",
            )
        )
        session.add(NotificationChannel(name="oncall", kind="json", url=hook, enabled=True))
        made = {
            "agent": tokens.create(session, scope="agent", name="sim").token,
            "admin": tokens.create(session, scope="admin", name="night-shift").token,
        }
        session.commit()
    return made


def _decision_waiting(engine: Any) -> tuple[int, int] | None:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT d.id, d.incident_id FROM decisions d JOIN jobs j ON j.id = d.job_id "
                "WHERE j.external_id = :job AND d.state = 'awaiting_approval' ORDER BY d.id LIMIT 1"
            ),
            {"job": JOB},
        ).first()
    return (row[0], row[1]) if row else None


def test_every_page_in_a_real_browser_with_a_simulated_fault_arriving(committed, tmp_path) -> None:
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    env = {"FAULTLINE_POLICY_APPROVAL_REQUIRED_FOR": '["evict"]', "FAULTLINE_LOG_LEVEL": "WARNING"}
    with receiver() as hook:
        hook.default = (200, {}, {})
        made = _seed(committed, f"{hook.url}/hook")
        with (
            api_server(env=env, log=tmp_path / "api.log") as url,
            running(["faultline", "work", "--beat", "--concurrency", "2"], env=env, log=tmp_path / "worker.log"),
            sync_playwright() as playwright,
        ):
            browser = playwright.chromium.launch(executable_path=CHROMIUM)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            foreign: list[str] = []
            errors: list[str] = []
            page.on("request", lambda r: None if r.url.startswith(url) else foreign.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))

            def shot(name: str) -> None:
                page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)

            # Sign in with the admin token through the form; the overview comes back.
            page.goto(f"{url}/incidents")
            expect(page).to_have_url(re.compile(r"/login\?next=/incidents"))
            shot("login")
            page.fill("input[name=token]", made["admin"])
            page.click("button[type=submit]")
            expect(page).to_have_url(f"{url}/incidents")
            page.goto(f"{url}/")
            expect(page.locator("#cluster-map .tile")).to_have_count(256)

            # The simulator's agents start shipping; a GPU falls off the bus on one of its nodes. The open
            # overview shows the new incident and its decision without a reload (htmx polls it).
            sim = [
                "faultline", "sim", "--scenario", "gpu_lost", "--nodes", "4", "--gpus-per-node", "2",
                "--fault-after", "8", "--duration", "120", "--server", url, "--token", made["agent"],
                "--job-id", JOB, "--node-prefix", "ui-node-", "--dir", str(tmp_path / "sim"),
            ]  # fmt: skip
            with running(sim, log=tmp_path / "sim.log"):
                expect(page.locator("#recent-incidents")).to_contain_text(JOB, timeout=90_000)
                wait_for(lambda: _decision_waiting(committed) is not None, timeout=180, what="an eviction to approve")
                decision_id, incident_id = _decision_waiting(committed)  # type: ignore[misc]
                expect(page.locator(f"#decision-{decision_id}")).to_be_visible(timeout=15_000)
                shot("overview")

                # The incident page (the link chat messages carry): approve the eviction, see it change.
                page.goto(f"{url}/incidents/{incident_id}")
                card = page.locator(f"#decision-{decision_id}")
                expect(card).to_contain_text("awaiting approval")
                expect(page.locator("body")).to_contain_text("ui-node-")
                shot("incident")
                card.get_by_role("button", name="Approve").click()
                expect(page.locator(f"#decision-{decision_id}")).to_contain_text("pending")
                expect(page.locator("body")).to_contain_text(f"Decision {decision_id} approved")
                api = httpx.get(
                    f"{url}/api/v1/decisions/{decision_id}", headers={"Authorization": f"Bearer {made['admin']}"}
                ).json()
                assert (api["state"], api["actor"]) == ("pending", "admin:night-shift")
                shot("incident-approved")
                suspect = api["node"]

            # Every other page, with something recognizable on each.
            for name, path, expected in (
                ("incidents", "/incidents", JOB),
                ("node", f"/nodes/{suspect}", suspect),
                ("nodes", "/nodes?state=suspect", "suspect"),
                ("job", f"/jobs/{JOB}", suspect),
                ("jobs", "/jobs", "seed-job-000"),
                ("seeded-job", "/jobs/seed-job-001", "seed-node-00064"),
                ("decisions", "/decisions?state=pending", f"#{decision_id}"),
                ("silences", "/silences", "firmware upgrade on rack 1"),
                ("channels", "/channels", "oncall"),
                ("tokens", "/tokens", "night-shift"),
            ):
                response = page.goto(f"{url}{path}")
                assert response is not None and response.status == 200, (path, response and response.status)
                expect(page.locator("main")).to_contain_text(expected)
                shot(name)

            browser.close()
    assert not foreign, f"the UI fetched from elsewhere (it must serve all its assets itself): {foreign}"
    assert not errors, f"the browser reported errors: {errors}"
