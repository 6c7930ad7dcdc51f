"""The on-call UI's points of issue 27, in real Chromium against a real API process: typing survives the
overview's refresh, an action answers at once and the answer outlives the refresh, the incident header follows a
reject, no page is wider than the viewport at 1,440 and 1,024 px, no value reads in scientific notation, GPUs are
named by index, repeated findings fold into one group, and /docs and /redoc render with nothing from the internet."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import sessionmaker

from lab.bench import uidata
from service.models import Finding, Gpu
from service.tokens import service as tokens
from tests import rows
from tests.procs import api_server
from tests.service.ui.test_ui_browser import CHROMIUM, SCREENSHOTS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"Chromium not at {CHROMIUM}"),
]

# A number in scientific notation as Python or JavaScript would print it: 7.036e+10, 1e-05, 3.2E9.
SCIENTIFIC = re.compile(r"\b\d+(?:\.\d+)?[eE][+-]?\d+\b")
PCI = "0000:df:00"


def _seed(engine: Any) -> dict[str, Any]:
    factory = sessionmaker(bind=engine)
    now = datetime.now(UTC)
    with factory() as session:
        uidata.seed(session, nodes=64, nodes_per_job=16, incidents=40, open_incidents=6, prefix="seed")
        job = rows.job(session, "oncall-job")
        node = rows.node(session, "oncall-node-7", state="suspect")
        session.add(Gpu(node_id=node.id, index=7, model="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:DF:00.0"))
        incident = rows.incident(session, job=job, suspects=[node.name])
        # One fault seen 17 times by the counters detector, with counters large and small enough to tempt a
        # formatter into scientific notation, and an Xid finding naming the GPU by its PCI address.
        on_gpu = {"job_id": job.id, "incident_id": incident.id, "node_id": node.id, "subject_kind": "gpu"}
        on_gpu |= {"role": "cause", "action": "evict"}
        for i in range(17):
            session.add(
                Finding(
                    **on_gpu, dedup_key=f"oncall-counter-{i}", detector="counters", category="nvlink",
                    subject=f"{node.name}/7", confidence=0.5 + i * 0.02,
                    summary=f"NVLink errors rising on {node.name} GPU 7",
                    evidence={"nvlink_tx_bytes": 7.036e10 + i, "error_rate": 1.2e-7, "window_s": 30.0},
                    observed_at=now - timedelta(minutes=30 - i),
                )
            )  # fmt: skip
        session.add(
            Finding(
                **on_gpu, dedup_key="oncall-xid", detector="signatures", category="gpu_hardware",
                subject=f"{node.name}/{PCI}", confidence=0.95,
                summary=f"Xid 79 (GPU has fallen off the bus) on {node.name} GPU {PCI}",
                evidence={"xid": 79}, observed_at=now - timedelta(minutes=5),
            )
        )  # fmt: skip
        # A stored reason quoting the kernel line, as decisions made before GPUs were named by index read.
        reason = f"evict {node.name}: Xid 79 (GPU has fallen off the bus) on {node.name} GPU {PCI}"
        decision = rows.decision(session, incident=incident, node=node, state="awaiting_approval", reason=reason)
        made = {
            "admin": tokens.create(session, scope="admin", name="night-shift").token,
            "incident": incident.id,
            "decision": decision.id,
            "node": node.name,
        }
        session.commit()
    return made


def _no_wider_than_viewport(page: Any, what: str) -> None:
    sizes = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert sizes[0] <= sizes[1], f"{what} is {sizes[0]} px wide in a {sizes[1]} px window"


def test_the_on_call_points_in_a_real_browser(committed, tmp_path) -> None:
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    made = _seed(committed)
    env = {"FAULTLINE_LOG_LEVEL": "WARNING"}
    with api_server(env=env, log=tmp_path / "api.log") as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        page = context.new_page()
        foreign: list[str] = []
        errors: list[str] = []
        # blob: URLs are the page's own (ReDoc's worker).
        page.on("request", lambda r: None if r.url.startswith((url, "blob:")) else foreign.append(r.url))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))

        page.goto(f"{url}/login")
        page.fill("input[name=token]", made["admin"])
        page.click("button[type=submit]")
        page.goto(f"{url}/")

        # A decision's stored reason names the GPU by index, its PCI address on hover.
        card = page.locator(f"#decision-{made['decision']}")
        expect(card.locator(f"span.gpu[title='PCI {PCI}']")).to_have_text("GPU 7")
        assert f"GPU {PCI}" not in card.inner_text()

        # 1. A reject reason being typed survives the 5 s refresh, focus included (two refresh periods).
        card = page.locator(f"#decision-{made['decision']}")
        reason = card.locator("input[name=message]")
        reason.click()
        reason.type("ECC errors are on node-9, not here")
        page.wait_for_timeout(11_000)
        expect(reason).to_have_value("ECC errors are on node-9, not here")
        expect(reason).to_be_focused()
        page.screenshot(path=str(SCREENSHOTS / "overview-typing.png"), full_page=True)

        # 2. Reject answers at once, and the answer is still there after the next refresh has run.
        card.get_by_role("button", name="Reject").click()
        result = page.locator("#action-results")
        expect(result).to_contain_text(f"Decision {made['decision']} rejected", timeout=5_000)
        # The waiting list and its counts re-read at once: no card left with a Reject button, no orphaned
        # "incident #n" line where the card was.
        waiting = page.locator("#pending-decisions")
        expect(waiting).not_to_contain_text(f"incident #{made['incident']}", timeout=3_000)
        expect(waiting.locator(f"#decision-{made['decision']} button")).to_have_count(0)
        page.wait_for_timeout(6_500)
        expect(result).to_contain_text(f"Decision {made['decision']} rejected")
        counts = page.locator(".counts").inner_text()
        assert "await" in counts and "scheduler" in counts, counts

        # The incident page: GPUs by index, findings folded into groups, one plot per signal at most.
        page.goto(f"{url}/incidents/{made['incident']}")
        findings = page.locator("#findings")
        expect(findings.locator(f"span.gpu[title='PCI {PCI}']").first).to_have_text("GPU 7")
        assert f"GPU {PCI}" not in page.locator("main").inner_text()
        expect(page.locator("#findings tbody.finding-group[data-count='17']")).to_have_count(1)
        group = page.locator("#findings tbody.finding-group[data-count='17']")
        expect(group.locator("tr[id^=finding-]:visible")).to_have_count(2)  # the first and the latest
        expect(group.locator("svg.spark polyline")).to_have_count(1)
        expect(findings).to_contain_text("65.5 GiB/s")
        page.screenshot(path=str(SCREENSHOTS / "incident-grouped.png"), full_page=True)
        group.locator("summary").click()
        expect(group.locator("tr[id^=finding-]:visible")).to_have_count(17)
        assert "wait" not in page.locator("#headline").inner_text()  # the rejected decision waits on nobody

        # 3 and 4. Every page fits the viewport at 1,440 and 1,024 px and prints no number in scientific notation.
        pages = [
            "/",
            "/incidents",
            f"/incidents/{made['incident']}",
            "/nodes",
            f"/nodes/{made['node']}",
            "/jobs",
            "/jobs/oncall-job",
            "/jobs/seed-job-001",
            "/decisions",
            "/fleet",
            "/silences",
            "/channels",
            "/whatif",
            "/tokens",
        ]
        for width in (1440, 1024):
            page.set_viewport_size({"width": width, "height": 900})
            for path in pages:
                response = page.goto(f"{url}{path}")
                assert response is not None and response.status == 200, (path, response and response.status)
                _no_wider_than_viewport(page, f"{path} at {width} px")
                text = page.locator("body").inner_text()
                assert not SCIENTIFIC.findall(text), (path, SCIENTIFIC.findall(text)[:5])
        page.set_viewport_size({"width": 1440, "height": 1000})

        # The what-if page: human labels, the setting's name as help, a checkbox for a boolean.
        page.goto(f"{url}/whatif")
        expect(page.locator("form[action='/whatif']")).to_contain_text("Evict at confidence of at least")
        expect(page.locator("form[action='/whatif']")).to_contain_text("policy_evict_min_confidence")
        expect(page.locator("input[type=checkbox][name=policy_reset_gpu_enabled]")).to_be_checked()
        expect(page.locator("input[type=number][name=policy_evict_min_confidence]")).to_have_attribute("max", "100")
        page.screenshot(path=str(SCREENSHOTS / "whatif.png"), full_page=True)
        # A cleared checkbox posts `false` through its hidden twin, and the backtest says it changed.
        page.locator("input[type=checkbox][name=policy_reset_gpu_enabled]").uncheck()
        page.get_by_role("button", name="Backtest").click()
        expect(page.locator("main")).to_contain_text("policy_reset_gpu_enabled")
        expect(page.locator("input[type=checkbox][name=policy_reset_gpu_enabled]")).not_to_be_checked()
        _no_wider_than_viewport(page, "the backtest's result")
        page.screenshot(path=str(SCREENSHOTS / "whatif-result.png"), full_page=True)

        browser.close()
    assert not foreign, f"the UI fetched from elsewhere: {foreign}"
    assert not errors, f"the browser reported errors: {errors}"


def test_api_docs_render_with_every_request_local(committed, tmp_path) -> None:
    """/docs and /redoc in a browser that may reach nothing but the service: every request elsewhere is
    blocked (and recorded), and both pages list the operations with no failed request and no console error."""
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with api_server(log=tmp_path / "api.log") as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        blocked: list[str] = []
        failed: list[str] = []
        errors: list[str] = []

        def local_only(route: Any) -> None:
            if route.request.url.startswith((url, "blob:", "data:")):
                route.continue_()
            else:
                blocked.append(route.request.url)
                route.abort("internetdisconnected")

        context.route("**/*", local_only)
        page = context.new_page()
        page.on("requestfailed", lambda r: failed.append(f"{r.url}: {r.failure}"))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))

        page.goto(f"{url}/docs")
        expect(page.locator(".swagger-ui")).to_contain_text("/api/v1/decisions", timeout=15_000)
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(SCREENSHOTS / "docs.png"))
        page.goto(f"{url}/redoc")
        expect(page.locator("body")).to_contain_text("/api/v1/decisions", timeout=15_000)
        # The sidebar's badge is there, its logo inline rather than from ReDoc's CDN.
        badge = page.locator("a[href='https://redocly.com/redoc/'] img")
        expect(badge).to_have_count(1)
        assert badge.get_attribute("src").startswith("data:image/svg+xml")
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(SCREENSHOTS / "redoc.png"))
        browser.close()
    assert not blocked, f"/docs or /redoc asked for something elsewhere: {blocked}"
    assert not failed, f"requests failed: {failed}"
    assert not errors, f"the browser reported errors: {errors}"


def test_the_cluster_map_at_2048_nodes_fits_and_shows_who_needs_a_look(committed, tmp_path) -> None:
    from playwright.sync_api import expect, sync_playwright

    factory = sessionmaker(bind=committed)
    with factory() as session:
        uidata.seed(session, nodes=2048, nodes_per_job=256, incidents=60, open_incidents=10, prefix="big")
        admin = tokens.create(session, scope="admin", name="night-shift").token
        session.commit()
    with api_server(log=tmp_path / "api.log") as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1024, "height": 900})
        page.goto(f"{url}/login")
        page.fill("input[name=token]", admin)
        page.click("button[type=submit]")
        for width in (1024, 1440):
            page.set_viewport_size({"width": width, "height": 900})
            page.goto(f"{url}/")
            expect(page.locator("#cluster-map .tile")).to_have_count(2048)
            _no_wider_than_viewport(page, f"the overview of 2,048 nodes at {width} px")
        # The suspect and evicted nodes are listed by name above the tiles, each a link to its page.
        attention = page.locator("#map-attention a.chip")
        assert attention.count() > 0
        first = attention.first.inner_text()
        assert page.locator(f"#map-attention a.chip[href='/nodes/{first}']").count() == 1
        page.screenshot(path=str(SCREENSHOTS / "overview-2048.png"), full_page=True)
        browser.close()
