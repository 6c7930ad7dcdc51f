"""Stop-time checks in real Chromium against a real API process: a node's page shows the checks in progress and
the latest results with the service's verdict on each; an incident's page shows the check results that settled
its diagnose decision and what the service concluded from them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from service.checks import loop as checks_loop
from service.checks.schemas import CheckResultIn
from service.checks.service import request_checks
from service.config import get_settings
from service.decisions.lifecycle import acknowledge
from service.models import Directive, Gpu
from service.tokens import service as tokens
from tests import rows
from tests.procs import api_server
from tests.service.ui.test_ui_browser import CHROMIUM, SCREENSHOTS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"Chromium not at {CHROMIUM}"),
]
PORT = 19150  # this worktree's range
MODEL = "NVIDIA H100 80GB HBM3"


def _seed(engine: Any) -> dict[str, Any]:
    """A straggler's diagnose decision settled by its checks (GEMM 30% below the fleet), and a spare mid-check."""
    settings = get_settings()
    now = datetime.now(UTC)
    factory = sessionmaker(bind=engine)
    with factory() as session:
        fleet = rows.node(session, "chk-fleet")
        for i in range(40):  # the fleet's history: passing GEMM figures around 775 TFLOPS
            item = {"ts": now - timedelta(hours=1), "check": "gemm_bf16", "subject": f"gpu:{i % 8}", "status": "pass"}
            item |= {"measured": 770.0 + (i % 10), "unit": "TFLOPS", "evidence": {"model": MODEL}}
            checks_loop.accept(session, node_id=fleet.id, node=fleet.name, batch_id=uuid.uuid4(),
                               items=[CheckResultIn(**item)], now=now, settings=settings)  # fmt: skip
        node = rows.node(session, "chk-suspect", state="suspect")
        session.add(Gpu(node_id=node.id, index=3, model=MODEL, pci_bus_id="00000000:9D:00.0"))
        job = rows.job(session, "chk-job")
        incident = rows.incident(session, job=job, suspects=[node.name], root_cause="straggler", state="open",
                                 summary="GPU 3 slower than its peers")  # fmt: skip
        diagnose = rows.decision(session, incident=incident, node=node, kind="diagnose", reason="GPU 3 slow")
        acknowledge(session, decision_id=diagnose.id, outcome="done", message="drained", actor="slurm", now=now,
                    settings=settings)  # fmt: skip
        directive = session.scalar(select(Directive).where(Directive.node_id == node.id))
        results = [
            {"check": "nvml_state", "subject": "gpu:3", "status": "pass", "measured": 0.0, "unit": "problems"},
            {"check": "gemm_bf16", "subject": "gpu:3", "status": "pass", "measured": 541.0, "unit": "TFLOPS",
             "evidence": {"model": MODEL}},
            {"check": "dcgm", "subject": "node", "status": "not_available", "evidence": {"reason": "no dcgmi"}},
        ]  # fmt: skip
        items = [CheckResultIn(ts=now, directive_id=str(directive.id), **r) for r in results]
        checks_loop.accept(session, node_id=node.id, node=node.name, batch_id=uuid.uuid4(), items=items, now=now,
                           settings=settings)  # fmt: skip
        spare = rows.node(session, "chk-spare")
        request_checks(session, node=spare, level=1, force=False, peer=None, requested_by="faultline spare checks",
                       reason="idle spare", ttl_s=600)  # fmt: skip
        made = {"admin": tokens.create(session, scope="admin", name="chk").token, "incident": incident.id}
        session.commit()
    return made


def test_checks_on_the_node_and_incident_pages_in_a_real_browser(committed, tmp_path) -> None:
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    made = _seed(committed)
    env = {"FAULTLINE_LOG_LEVEL": "WARNING"}
    with (
        api_server(env=env, log=tmp_path / "api.log", port=PORT) as url,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/login")
        page.fill("input[name=token]", made["admin"])
        page.click("button[type=submit]")

        # The spare: its level-1 checks sent, nothing back yet.
        page.goto(f"{url}/nodes/chk-spare")
        checks = page.locator("#node-checks")
        expect(checks).to_contain_text("checks running")
        expect(checks).to_contain_text("level 1")
        expect(checks).to_contain_text("Waiting for the node's agent")

        # The suspect: the latest suite failed on the fleet's cut-off, the eviction the service made named.
        page.goto(f"{url}/nodes/chk-suspect")
        checks = page.locator("#node-checks")
        expect(checks.locator(".pill.check-fail")).to_have_text("failed")
        gemm = checks.locator("tr.check-row-fail")
        expect(gemm).to_have_count(1)
        expect(gemm).to_contain_text("gemm_bf16")
        expect(gemm).to_contain_text("541 TFLOPS")
        expect(gemm).to_contain_text("fleet")
        expect(gemm).to_contain_text("% below the fleet median")
        expect(checks).to_contain_text("The service concluded: checks failed: evict decision")
        page.screenshot(path=str(SCREENSHOTS / "node-checks.png"), full_page=True)

        # The incident: the checks that settled its diagnose decision.
        page.goto(f"{url}/incidents/{made['incident']}")
        section = page.locator("#checks")
        expect(section).to_contain_text("level 2 on chk-suspect")
        expect(section.locator(".pill.check-fail")).to_have_text("failed")
        expect(section).to_contain_text("checks failed: evict decision")
        expect(section.locator("tr.check-row-pass")).to_have_count(1)  # nvml_state
        expect(page.locator("#decisions")).to_contain_text("evict")
        page.screenshot(path=str(SCREENSHOTS / "incident-checks.png"), full_page=True)
        browser.close()
    assert errors == []
