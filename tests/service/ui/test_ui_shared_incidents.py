"""The Shared causes pages: the list with its filters, one incident with its members and cordons, a link from the
incidents list, and a clear refusal of what they cannot read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Node, Silence
from service.shared_causes import service as shared
from tests import rows

NOW = datetime.now(UTC)


def _seed(session: Session) -> tuple[int, int]:
    ids = [rows.node(session, f"leaf7-{i}").id for i in range(3)]
    switch = shared.open_or_update(
        session, component_kind="switch", component="leaf-7", node_ids=ids,
        summary="network findings on 3 of the 4 nodes with switch leaf-7", evidence={"categories": ["network"]},
        now=NOW,
    )  # fmt: skip
    shared.decide_for_component(session, incident=switch, now=NOW, settings=Settings())
    more = [rows.node(session, f"drv-{i}").id for i in range(3)]
    driver = shared.open_or_update(
        session, component_kind="driver", component="560.28.03", node_ids=more,
        summary="gpu_hardware findings on the nodes with driver 560.28.03", evidence={"categories": ["gpu_hardware"]},
        now=NOW,
    )  # fmt: skip
    driver.state = "resolved"
    session.flush()
    return switch.id, driver.id


def _table(html: str) -> str:
    """The list's table, without the banner every page shows while shared causes are open."""
    return html.split('<table class="shared-incidents">')[1]


def test_the_list_and_one_incident(ui, session) -> None:
    switch, driver = _seed(session)
    html = ui.get("/shared-incidents").text
    assert f'href="/shared-incidents/{switch}"' in html and f'href="/shared-incidents/{driver}"' in html
    assert "leaf-7" in html and "560.28.03" in html
    only_open = _table(ui.get("/shared-incidents?state=open").text)
    assert "leaf-7" in only_open and "560.28.03" not in only_open
    assert "560.28.03" in ui.get("/shared-incidents?component_kind=driver").text
    assert "leaf-7" not in _table(ui.get("/shared-incidents?node=drv-").text)
    one = ui.get(f"/shared-incidents/{switch}")
    assert one.status_code == 200
    assert 'href="/nodes/leaf7-0"' in one.text and "cordon (pending)" in one.text
    assert "network" in one.text
    assert 'href="/shared-incidents"' in ui.get("/incidents").text


def test_refusals(ui, session) -> None:
    assert ui.get("/shared-incidents/999999").status_code == 404
    assert ui.get("/shared-incidents?component_kind=moon").status_code == 422
    assert ui.get("/shared-incidents?cursor=zzz").status_code == 422


PAGES = ("/", "/incidents", "/nodes", "/jobs", "/decisions", "/fleet", "/silences", "/whatif", "/nodes/leaf7-0")


@pytest.mark.parametrize("path", PAGES)
def test_every_page_says_when_shared_causes_are_open_and_links_to_them(ui, session, path) -> None:
    switch, driver = _seed(session)
    html = ui.get(path).text
    assert 'id="shared-banner"' in html, path
    banner = html.split('id="shared-banner"')[1].split("</div>")[0]
    assert 'href="/shared-incidents?state=open">1 shared cause open</a>' in banner
    assert f'href="/shared-incidents/{switch}"' in banner and "leaf-7" in banner and "(3 nodes)" in banner
    assert f"/shared-incidents/{driver}" not in banner, "a resolved one is no longer news"


def test_no_banner_without_an_open_shared_cause(ui, session) -> None:
    switch, _ = _seed(session)
    shared.resolve_by_hand(session, incident_id=switch, reason="leaf-7 replaced", actor="ops", now=NOW)
    for path in PAGES[:3]:
        assert "shared-banner" not in ui.get(path).text, path


def test_the_banner_counts_beyond_the_few_it_names(ui, session) -> None:
    for k in range(5):
        ids = [rows.node(session, f"pdu{k}-{i}").id for i in range(3)]
        shared.open_or_update(
            session, component_kind="power_domain", component=f"pdu-{k}", node_ids=ids, summary="power lost",
            evidence={"categories": ["node_down"]}, now=NOW,
        )  # fmt: skip
    banner = ui.get("/").text.split('id="shared-banner"')[1].split("</div>")[0]
    assert "5 shared causes open" in banner and "pdu-4" in banner and "and 2 more" in banner
    assert "pdu-0" not in banner


def test_the_node_page_lists_its_shared_incidents_open_and_recent(ui, session) -> None:
    switch, driver = _seed(session)
    # drv-0 was also behind an older, resolved switch incident: both show, the open one first.
    ids = [session.scalar(select(Node.id).where(Node.name == f"drv-{i}")) for i in range(3)]
    rack = shared.open_or_update(
        session, component_kind="rack", component="r12", node_ids=ids, summary="rack r12 power",
        evidence={"categories": ["node_down"]}, now=NOW,
    )  # fmt: skip
    html = ui.get("/nodes/drv-0").text
    section = html.split('id="node-shared"')[1].split("</section>")[0]
    assert section.index(f'href="/shared-incidents/{rack.id}"') < section.index(f'href="/shared-incidents/{driver}"')
    assert "r12" in section and "560.28.03" in section and "resolved" in section
    assert f"/shared-incidents/{switch}" not in section, "not a member of leaf-7's"
    assert 'href="#node-shared"' in html and "shared cause: rack r12" in html
    member = ui.get("/nodes/leaf7-1").text.split('id="node-shared"')[1].split("</section>")[0]
    assert f'href="/shared-incidents/{switch}"' in member and "cordon #" in member and "pending" in member
    assert 'id="node-shared"' not in ui.get(f"/nodes/{rows.node(session, 'lonely').name}").text


def test_held_and_spared_members_say_so(ui, session) -> None:
    ids = [rows.node(session, f"held-{i}").id for i in range(6)]
    session.add(Silence(node_pattern="held-5", starts_at=NOW, ends_at=NOW + timedelta(hours=1), author="ops",
                        comment="reseating"))  # fmt: skip
    session.flush()
    incident = shared.open_or_update(
        session, component_kind="switch", component="leaf-9", node_ids=ids, summary="IB errors behind leaf-9",
        evidence={"categories": ["network"]}, now=NOW,
    )  # fmt: skip
    # A fleet of these six: 3 may be out, the next two wait for a person, and held-5 is silenced (no cordon).
    shared.decide_for_component(session, incident=incident, now=NOW, settings=Settings(breaker_min_nodes=3))
    page = ui.get(f"/shared-incidents/{incident.id}").text
    assert page.count("held by the fleet breaker: a person decides") == 2
    assert "none: silenced (silence" in page
    node = ui.get("/nodes/held-4").text.split('id="node-shared"')[1].split("</section>")[0]
    assert "awaiting approval" in node and "held by the fleet breaker" in node
    assert "none: silenced" in ui.get("/nodes/held-5").text
