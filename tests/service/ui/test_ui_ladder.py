"""The node page's escalation ladder: each remedy with its rung, when, and whether it held; the current rung; the
RMA mark; no section for a node that was never remedied."""

from __future__ import annotations

import re
from datetime import timedelta

from ml.ladder import RUNGS
from tests.service.decisions.test_ladder import NODE, T0, _carry_out, _fault, _job, _settings


def _section(html: str) -> str:
    match = re.search(r'<section class="card" id="node-ladder">(.*?)</section>', html, re.S)
    assert match, "no ladder section"
    return match.group(1)


def test_the_node_page_shows_its_remedies_as_a_ladder(ui, session) -> None:
    settings = _settings()
    job = _job(session)
    made = []
    for k in range(4):
        at = T0 + timedelta(hours=2 * k)
        (decision,) = _fault(session, job, at, f"xid-{k}", settings)
        made.append(decision)
        _carry_out(session, decision, at + timedelta(minutes=2), settings)

    page = ui.get(f"/nodes/{NODE}")
    assert page.status_code == 200, page.text
    section = _section(page.text)
    rows = re.findall(r'<tr data-rung="([a-z_]+)" data-held="([a-z]+)">', section)
    # Oldest first: each did not hold but the last, carried out two days ago (held: a day passed without a fault).
    assert rows == [("reset_gpu", "no"), ("reboot", "no"), ("repair", "no"), ("rma", "yes")]
    assert f"did not hold: faulted again at {T0 + timedelta(hours=2):%Y-%m-%d %H:%M}" in section
    assert f"#{made[1].id} done" in section
    assert "evict ld-1 to reboot it, rung 3 of 5 (reboot)" in section
    # Its last remedy held: no current rung; the vendor replacement is marked.
    assert re.search(r'<b id="ladder-rung">none \(its last remedy held\)</b>', section)
    assert "Vendor replacement (RMA)" in section and "evict ld-1 for a vendor replacement (RMA)" in section
    # The five rungs, in order.
    assert re.findall(r'data-rung="([a-z_]+)">\d', section) == list(RUNGS)


def test_a_node_never_remedied_has_no_ladder_section(ui, session) -> None:
    _job(session)
    page = ui.get(f"/nodes/{NODE}")
    assert page.status_code == 200, page.text
    assert 'id="node-ladder"' not in page.text
