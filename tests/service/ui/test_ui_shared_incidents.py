"""The Shared causes pages: the list with its filters, one incident with its members and cordons, a link from the
incidents list, and a clear refusal of what they cannot read."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import Session

from service.config import Settings
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


def test_the_list_and_one_incident(ui, session) -> None:
    switch, driver = _seed(session)
    html = ui.get("/shared-incidents").text
    assert f'href="/shared-incidents/{switch}"' in html and f'href="/shared-incidents/{driver}"' in html
    assert "leaf-7" in html and "560.28.03" in html
    only_open = ui.get("/shared-incidents?state=open").text
    assert "leaf-7" in only_open and "560.28.03" not in only_open
    assert "560.28.03" in ui.get("/shared-incidents?component_kind=driver").text
    assert "leaf-7" not in ui.get("/shared-incidents?node=drv-").text
    one = ui.get(f"/shared-incidents/{switch}")
    assert one.status_code == 200
    assert 'href="/nodes/leaf7-0"' in one.text and "cordon (pending)" in one.text
    assert "network" in one.text
    assert 'href="/shared-incidents"' in ui.get("/incidents").text


def test_refusals(ui, session) -> None:
    assert ui.get("/shared-incidents/999999").status_code == 404
    assert ui.get("/shared-incidents?component_kind=moon").status_code == 422
    assert ui.get("/shared-incidents?cursor=zzz").status_code == 422
