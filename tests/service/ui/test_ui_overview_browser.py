"""Issue 40's overview for 3 a.m. and the job's cost table, in real Chromium against a real API process: what just
happened (a resolved incident still there with what was done), the jobs not getting anywhere and why, the nodes
waiting on a person with counts that are the node list's own, and a cost table sorted by cost whose total is the
ETTR's lost time."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.jobs import progress
from service.models import Job, LogEvent, Node
from service.tokens import service as tokens
from tests import rows
from tests.procs import api_server
from tests.service.ui.test_ui_browser import CHROMIUM, SCREENSHOTS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"Chromium not at {CHROMIUM}"),
]


def _steps(session: Session, job: Job, node: Node, run: list[tuple[datetime, int]]) -> None:
    for ts, step in run:
        session.add(LogEvent(batch_id=uuid.uuid4(), node_id=node.id, job_id=job.id, ts=ts, source="training",
                             kind="step", line=f"step {step}", rank=0, fields={"step": step}))  # fmt: skip


def _seed(engine: Any) -> dict[str, Any]:
    now = datetime.now(UTC).replace(microsecond=0)
    factory = sessionmaker(bind=engine)
    with factory() as session:
        job = rows.job(session, "night-job")
        job.created_at = job.updated_at = now - timedelta(hours=1)
        job.last_seen_at = now
        nodes = [rows.node(session, f"night-node-{i}", current_job_id=job.id) for i in range(6)]
        # Trained to step 300 until 20 minutes ago; then three restarts from the checkpoint of step 250, the last one
        # still going (its latest step 2 s ago), none past 300.
        start = now - timedelta(minutes=50)
        run = [(start + timedelta(seconds=6 * k), k) for k in range(1, 301)]  # step 300 at 20 min ago
        for began, last in ((now - timedelta(minutes=17), 270), (now - timedelta(minutes=10), 290)):
            run += [(began + timedelta(seconds=6 * i), 251 + i) for i in range(last - 250)]
        run += [(now - timedelta(seconds=2 + 6 * i), 280 - i) for i in range(30)]
        _steps(session, job, nodes[0], run)
        # A GPU fell off the bus 50 minutes ago: evicted within seconds, resolved; still the first thing listed.
        fixed = rows.incident(session, job=job, suspects=[nodes[5].name], state="resolved",
                              opened_at=now - timedelta(minutes=50), resolved_at=now - timedelta(seconds=2995),
                              resolution=f"mitigated: evict {nodes[5].name} done")  # fmt: skip
        done = rows.decision(session, incident=fixed, node=nodes[5], state="done")
        done.acked_at, done.outcome = now - timedelta(minutes=49, seconds=56), "done"
        done.outcome_message = f"{nodes[5].name} out of the job (repair); node rank 5: waiting for a spare"
        nodes[5].state, nodes[5].state_reason = "evicted", "evicted in incident: Xid 79"
        nodes[4].state, nodes[4].state_reason = "in_repair", "GPU 3 RMA, ticket HW-4412"
        # The stall's own incidents: the first opened 5 s into it, a second one during it.
        in_stall = [
            rows.incident(session, job=job, root_cause=("job_failure", "hang")[k], state="resolved",
                          opened_at=now - timedelta(minutes=minutes), resolved_at=now - timedelta(minutes=minutes - 1))
            for k, minutes in enumerate((20 - 5 / 60, 12))
        ]  # fmt: skip
        session.execute(update(Job).where(Job.id == job.id).values(state="running"))
        session.flush()
        progress.track(session, now=now)
        made = {
            "admin": tokens.create(session, scope="admin", name="night-shift").token,
            "fixed": fixed.id,
            "hang": in_stall[1].id,
        }
        session.commit()
    return made


def test_the_overview_for_3am_and_the_job_cost_table(committed, tmp_path) -> None:
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    made = _seed(committed)
    with api_server(env={"FAULTLINE_LOG_LEVEL": "WARNING"}, log=tmp_path / "api.log") as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/login")
        page.fill("input[name=token]", made["admin"])
        page.click("button[type=submit]")
        page.goto(f"{url}/")

        # 1. What just happened: resolved 50 minutes ago, with what was decided and done.
        row = page.locator(f"#recent-incidents tr[data-incident='{made['fixed']}']")
        expect(row).to_contain_text("evict night-node-5")
        expect(row).to_contain_text("done")
        expect(row).to_contain_text("waiting for a spare")
        expect(row).to_contain_text("mitigated: evict night-node-5 done")

        # 2. The job not getting anywhere, since when and why.
        stalled = page.locator("#stalled-jobs .stalled[data-job='night-job']")
        expect(stalled).to_have_attribute("data-reason", "restart_loop")
        expect(stalled).to_contain_text(re.compile(r"no net progress for 2\d\.\d min"))
        expect(stalled).to_contain_text("restarted 3 times")
        expect(stalled).to_contain_text("never past step 300")

        # 3. Nodes waiting on a person; each count is the node list's own.
        needs = page.locator("#nodes-attention")
        expect(needs.locator("tr[data-node='night-node-5']")).to_contain_text("send it to repair")
        expect(needs.locator("tr[data-node='night-node-4']")).to_contain_text("return it to service once repaired")
        counts = {
            a.get_attribute("data-state"): int(a.inner_text().split()[0]) for a in needs.locator(".node-counts a").all()
        }
        assert counts == {"evicted": 1, "in_repair": 1, "healthy": 4}, counts

        # The live part refreshes every 5 s: the sections are still there after a refresh.
        page.wait_for_timeout(6_000)
        expect(page.locator("#stalled-jobs .stalled[data-job='night-job']")).to_be_visible()
        page.screenshot(path=str(SCREENSHOTS / "overview-3am.png"), full_page=True)
        for state, n in counts.items():
            needs.locator(f".node-counts a[data-state='{state}']").click()
            expect(page).to_have_url(f"{url}/nodes?state={state}")
            expect(page.locator("table.nodes tbody tr")).to_have_count(n)
            page.go_back()
            needs = page.locator("#nodes-attention")

        # The job's cost table: sorted by cost, each stall charged once, a total that is the ETTR's.
        page.goto(f"{url}/jobs/night-job")
        table = page.locator("#job-incidents table.costs")
        lost = [c.inner_text() for c in table.locator("tbody td.lost").all()]
        seconds = [_seconds(t) for t in lost]
        # The 20-minute stall (ongoing) to the incident that opened 5 s into it, not to the hang opened within it; the
        # 10 minutes before the first step line to the GPU that fell off the bus then.
        assert seconds == sorted(seconds, reverse=True) and len(seconds) == 2, lost
        expect(table.locator("tbody tr").first).to_contain_text("job failure")
        expect(table.locator("tbody tr").first).to_contain_text("ongoing")
        expect(table.locator("tbody tr").first).to_contain_text(f"#{made['hang']}")  # also open, not charged
        total = table.locator("#cost-total").inner_text()
        head = page.locator("#job-ettr").inner_text()
        ratio = float(re.search(r"since the start\s*([\d.]+)%", head).group(1)) / 100  # type: ignore[union-attr]
        wall = _seconds(re.search(r"productive of ([\d.]+ (?:s|min|h))", head).group(1))  # type: ignore[union-attr]
        assert _seconds(total) == pytest.approx(wall * (1 - ratio), rel=0.02, abs=6), (total, wall, ratio)
        page.locator("#job-incidents").screenshot(path=str(SCREENSHOTS / "job-costs.png"))
        assert errors == []
        browser.close()


def _seconds(text: str) -> float:
    value, unit = text.split()[:2]
    return float(value) * {"s": 1, "min": 60, "h": 3600}[unit]
