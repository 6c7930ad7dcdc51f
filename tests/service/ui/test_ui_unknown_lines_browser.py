"""Unknown lines end to end in real Chromium against a real API process: agents' batches with error-looking lines
no rule knows are counted per form, and the page, its navigation link, the overview's count and /metrics show them;
the page (a 500-character line without a space included) fits the window at 1,440 and 1,024 px."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import sessionmaker

from service.tokens import service as tokens
from tests.factories import batch
from tests.procs import api_server
from tests.service.ui.test_ui_browser import CHROMIUM, SCREENSHOTS
from tests.service.ui.test_ui_oncall_browser import _no_wider_than_viewport

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"Chromium not at {CHROMIUM}"),
]


def _tokens(engine: Any) -> dict[str, str]:
    with sessionmaker(bind=engine)() as session:
        made = {
            scope: tokens.create(session, scope=scope, name=f"unknown-{scope}").token for scope in ("agent", "admin")
        }
        session.commit()
    return made


def _unknown(line: str, ts: datetime, source: str = "training") -> dict[str, Any]:
    return {"ts": ts.isoformat(), "source": source, "kind": "unmatched_error", "severity": "warning", "line": line}


def test_unknown_lines_from_agents_to_the_page(committed, tmp_path) -> None:
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    made = _tokens(committed)
    now = datetime.now(UTC) - timedelta(minutes=3)
    env = {"FAULTLINE_LOG_LEVEL": "WARNING"}
    with api_server(env=env, log=tmp_path / "api.log") as url, sync_playwright() as playwright:
        agent = {"Authorization": f"Bearer {made['agent']}"}
        for n in range(4):
            node = f"gpu-node-{n:03d}"
            logs = [_unknown(f"[rank{n * 8 + i}]: FooComm error: shard {i} stalled on {node} after {i + n} retries",
                             now + timedelta(seconds=i)) for i in range(3)]  # fmt: skip
            if n == 0:
                logs.append(_unknown(f"qux_core 0000:3b:00.0: blob {uuid.uuid4().hex * 16}", now, source="kmsg"))
            payload = batch(node, gpus=1, job_id="unknown-job")
            payload["logs"] = logs
            assert httpx.post(f"{url}/api/v1/ingest", json=payload, headers=agent).status_code == 200
        metrics = httpx.get(f"{url}/metrics").text
        assert 'faultline_unknown_log_lines_total{source="training"} 12.0' in metrics
        assert 'faultline_unknown_log_forms{source="kmsg"} 1.0' in metrics

        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(f"{url}/login")
        page.fill("input[name=token]", made["admin"])
        page.click("button[type=submit]")
        page.goto(f"{url}/")
        count = page.locator("#unknown-lines-count")
        expect(count.locator("b")).to_have_text("2")
        expect(count).to_contain_text("forms, 13 lines in 24 h")
        page.get_by_role("link", name="Unknown lines", exact=True).click()
        expect(page).to_have_url(f"{url}/unknown-lines")
        rows = page.locator("table.unknown-lines tbody tr")
        expect(rows).to_have_count(2)
        expect(rows.first).to_contain_text("FooComm error: shard <num> stalled on <host> after <num> retries")
        expect(rows.first.locator("td.num")).to_have_text("12")
        expect(rows.first).to_contain_text("gpu-node-003")
        expect(rows.nth(1)).to_contain_text("kmsg")
        for width in (1440, 1024):
            page.set_viewport_size({"width": width, "height": 900})
            for path in ("/unknown-lines", "/"):
                page.goto(f"{url}{path}")
                _no_wider_than_viewport(page, f"{path} at {width} px")
        page.goto(f"{url}/unknown-lines")
        page.screenshot(path=str(SCREENSHOTS / "unknown-lines.png"), full_page=True)
        browser.close()
