"""Issue 40's smaller on-call points, in real Chromium against a real API process: incident numbers that explain a
gap, GPUs named by index on the job and node pages, a straggler headed by the signal that tells, "I'm on it", one
filter behaviour, a return refusal in the page's own terms, correctable row remaps not in red, the checkpoint a
restart resumed from, and the what-if page in percentages."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import sessionmaker

from ml import peers
from ml.demarcation import demarcate
from service.models import Finding, Gpu, LogEvent
from service.models.signals import metric_samples
from service.tokens import service as tokens
from tests import rows
from tests.procs import api_server
from tests.service.ui.test_ui_browser import CHROMIUM, SCREENSHOTS
from tests.simdata import SimRun

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"Chromium not at {CHROMIUM}"),
]

PCI = "0000:d1:00"


def _straggler(session: Any, job: Any) -> int:
    """A thermally throttled GPU as the peer comparison finds it on the simulator's samples, in its incident."""
    run = SimRun("straggler", seed=1, nodes=2, gpus=4).run(300.0)
    (found,) = peers.detect(run.job, run.metrics(until=300, lookback=300), now=run.at(300))
    (proposal,) = demarcate([(1, found)])
    node = rows.node(session, found.node)
    incident = rows.incident(
        session, job=job, root_cause="straggler", anchor=node.name, suspects=[node.name], summary=proposal.summary
    )
    session.add(
        Finding(
            job_id=job.id, incident_id=incident.id, node_id=node.id, detector=found.detector,
            category=found.category, subject_kind=found.subject_kind, subject=found.subject,
            confidence=found.confidence, blame=found.blame, role=found.role, action=found.action,
            summary=found.summary, evidence=found.evidence, observed_at=found.observed_at, dedup_key=found.key,
        )
    )  # fmt: skip
    return incident.id


def _seed(engine: Any) -> dict[str, Any]:
    factory = sessionmaker(bind=engine)
    now = datetime.now(UTC)
    with factory() as session:
        demo, other = rows.job(session, "demo-job"), rows.job(session, "other-run")
        demo.created_at = now - timedelta(hours=1)
        # node-005: evicted for a double-bit ECC error on GPU 6 (the kernel's PCI address), quarantined 12 min more;
        # no longer among demo-job's ranks.
        evicted = rows.node(
            session, "node-005", state="evicted", state_reason=f"Xid 48 on GPU {PCI}",
            quarantined_until=now + timedelta(minutes=12, seconds=20),
        )  # fmt: skip
        for i, bus in enumerate(("1b", "43", "52", "61", "9d", "c3", "d1", "df")):
            session.add(
                Gpu(node_id=evicted.id, index=i, model="NVIDIA H100 80GB HBM3", pci_bus_id=f"00000000:{bus}:00.0")
            )
        ecc = rows.incident(
            session, job=demo, anchor="node-005", suspects=["node-005"], state="resolved",
            summary=f"gpu hardware: Xid 48 (Double Bit ECC Error) on node-005 GPU {PCI}",
            opened_at=now - timedelta(minutes=20), resolved_at=now - timedelta(minutes=14),
            resolution="mitigated: evict node-005 done",
        )  # fmt: skip
        # Its GPU 0 remapped rows for correctable errors (normal upkeep), GPU 1 one for an uncorrectable one.
        session.execute(
            metric_samples.insert(),
            [
                {"ts": now - timedelta(seconds=5), "node_id": evicted.id, "gpu": 0, "remapped_rows_correctable": 3.0,
                 "remapped_rows_uncorrectable": 0.0, "row_remap_failure": 0.0},
                {"ts": now - timedelta(seconds=5), "node_id": evicted.id, "gpu": 1, "remapped_rows_correctable": 0.0,
                 "remapped_rows_uncorrectable": 1.0, "row_remap_failure": 0.0},
            ],
        )  # fmt: skip
        n1 = rows.node(session, "node-011")  # the simulator's straggler is on node-001
        open_one = rows.incident(session, job=demo, anchor="node-011", suspects=["node-011"], root_cause="nvlink")
        rows.decision(session, incident=open_one, node=n1)
        n15 = rows.node(session, "node-015")
        elsewhere = rows.incident(session, job=other, anchor="node-015", suspects=["node-015"], root_cause="host")
        rows.decision(session, incident=elsewhere, node=n15)
        straggler = _straggler(session, demo)
        # A job whose log has loads but no save lines: it failed at step 10 and resumed from step 5's checkpoint.
        loads = rows.job(session, "load-job")
        t0 = now - timedelta(minutes=30)

        def log(at: float, kind: str, step: int, line: str) -> None:
            at_ = t0 + timedelta(seconds=at)
            session.add(
                LogEvent(batch_id=uuid.uuid4(), node_id=n1.id, job_id=loads.id, ts=at_, kind=kind, source="training",
                         line=line, rank=0, fields={"step": step})
            )  # fmt: skip

        for k, at in [*((k, 10 * k) for k in range(1, 11)), *((6 + i, 200 + 10 * i) for i in range(6))]:
            log(at, "step", k, f"step {k}")
        log(195, "checkpoint_loaded", 5, "  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 5")
        made = {
            "admin": tokens.create(session, scope="admin", name="night-shift").token,
            "ecc": ecc.id,
            "open": open_one.id,
            "elsewhere": elsewhere.id,
            "straggler": straggler,
        }
        session.commit()
    return made


def test_the_smaller_points_in_a_real_browser(committed, tmp_path) -> None:
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    made = _seed(committed)
    with api_server(env={"FAULTLINE_LOG_LEVEL": "WARNING"}, log=tmp_path / "api.log") as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/login")
        page.fill("input[name=token]", made["admin"])
        page.click("button[type=submit]")

        # A number with no incident explains itself and links the nearest ones.
        gap = made["straggler"] + 7
        response = page.goto(f"{url}/incidents/{gap}")
        assert response is not None and response.status == 404
        expect(page.locator("main")).to_contain_text(f"There is no incident #{gap} yet")
        expect(page.locator(f"main a[href='/incidents/{made['straggler']}']")).to_be_visible()

        # The job page and the node page name the evicted node's GPU by index, its PCI address on hover.
        for path in ("/jobs/demo-job", "/nodes/node-005"):
            page.goto(f"{url}{path}")
            row = page.locator(f"a[href='/incidents/{made['ecc']}']").last.locator("xpath=ancestor::tr[1]")
            expect(row.locator(f"span.gpu[title='PCI {PCI}']")).to_have_text("GPU 6")
            assert f"GPU {PCI}" not in row.inner_text(), path

        # Rows remapped for correctable errors are neutral; an uncorrectable one is red.
        page.goto(f"{url}/nodes/node-005")
        cells = page.locator("#node-gpus tbody tr")
        column = 2 + [h.strip() for h in page.locator("#node-gpus thead th").all_text_contents()][2:].index(
            "remapped rows (correctable / uncorrectable / failed)"
        )
        correctable, uncorrectable = (cells.nth(i).locator("td").nth(column) for i in (0, 1))
        expect(correctable).to_have_text("3 / 0 / 0")
        expect(correctable).not_to_have_class(re.compile(r"c-(bad|warn)"))
        expect(uncorrectable).to_have_text("0 / 1 / 0")
        expect(uncorrectable).to_have_class(re.compile(r"c-bad"))

        # A return inside the quarantine is refused in the page's own terms.
        form = page.locator("form[action='/nodes/node-005/return']")
        form.locator("input[name=reason]").fill("GPU 6 replaced")
        form.get_by_role("button", name="Return to service").click()
        flash = page.locator("p.flash.refused")
        expect(flash).to_contain_text("node-005 is quarantined until")
        # 12 min from the seed, less however long a loaded machine took to get here.
        expect(flash).to_contain_text(re.compile(r"\(in 1[0-2] min\)\. Tick “force” to return it now"))
        assert "force=true" not in flash.inner_text() and not re.search(r"\d{4}-\d\d-\d\dT", flash.inner_text())
        page.screenshot(path=str(SCREENSHOTS / "node-return-refused.png"), full_page=True)

        # A straggler headed by its clock, the telling signal, in the summary and the first plot.
        page.goto(f"{url}/incidents/{made['straggler']}")
        expect(page.locator(".incident-summary")).to_contain_text("low sm_clock")
        expect(page.locator("#plots figure.chart").first).to_have_attribute("data-metric", "sm_clock")

        # "I'm on it": on the incident page, in its timeline and in the list; its state and decisions unchanged.
        page.goto(f"{url}/incidents/{made['open']}")
        expect(page.locator(".incident-ack")).to_contain_text("Nobody has said they are on it yet")
        form = page.locator("form.incident-acknowledge")
        form.locator("input[name=note]").fill("checking the NVLink cables")
        form.get_by_role("button", name="I'm on it").click()
        expect(page.locator(".incident-ack")).to_contain_text("admin:night-shift is on it")
        expect(page.locator(".incident-ack")).to_contain_text("checking the NVLink cables")
        expect(page.locator("form.incident-acknowledge")).to_have_count(0)
        expect(page.locator("#headline .pill.istate-mitigating")).to_be_visible()
        expect(page.locator("main")).to_contain_text("acknowledged by admin:night-shift")
        page.screenshot(path=str(SCREENSHOTS / "incident-acknowledged.png"), full_page=True)

        # One filter behaviour: a part of a job's or a node's name, on the Incidents and Decisions pages alike.
        page.goto(f"{url}/incidents")
        page.locator("form.filters input[name=job]").fill("demo")
        page.locator("form.filters").get_by_role("button", name="Filter").click()
        listed = page.locator("table.incident-list tbody")
        expect(listed.locator(f"a[href='/incidents/{made['open']}']").first).to_be_visible()
        expect(listed.locator(f"a[href='/incidents/{made['elsewhere']}']")).to_have_count(0)
        ack = listed.locator(f"tr:has(a[href='/incidents/{made['open']}']) .pill.ack")
        expect(ack).to_have_text("admin:night-shift")
        page.goto(f"{url}/decisions")
        page.locator("form.filters input[name=node]").fill("011")
        page.locator("form.filters").get_by_role("button", name="Filter").click()
        expect(page.locator("main")).to_contain_text("node-011")
        expect(page.locator("main")).not_to_contain_text("node-015")
        response = page.goto(f"{url}/decisions?state=waiting")
        assert response is not None and response.status == 422
        expect(page.locator("main")).to_contain_text("state: 'waiting' is not one of")

        # The checkpoint a restart resumed from, where "last checkpoint —" stood.
        page.goto(f"{url}/jobs/load-job")
        expect(page.locator("#job-progress")).to_contain_text("last checkpoint 5")

        # The what-if page in percentages, as every other page.
        page.goto(f"{url}/whatif")
        box = page.locator("input[type=number][name=policy_evict_min_confidence]")
        expect(box).to_have_value("80")
        expect(box.locator("xpath=following-sibling::span[1]")).to_have_text("%")
        box.fill("95")
        page.get_by_role("button", name="Backtest").click()
        expect(page.locator("main")).to_contain_text("policy_evict_min_confidence 80% → 95%")
        expect(box).to_have_value("95")
        page.screenshot(path=str(SCREENSHOTS / "whatif-percent.png"), full_page=True)
        browser.close()
    assert not errors, errors
