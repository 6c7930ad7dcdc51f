"""Repeat failures (service/nodes/history.py): a node's earlier incidents of the same root cause within a window,
and whether they hit the same GPU, on the incident and the node page (issue 40: the same GPU of node-004 fell off
the bus twice in 9 minutes; the second incident did not mention the first and the node was not flagged)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.models import Finding, Gpu, Incident, Job, Node
from service.nodes import history
from tests import rows

DAY = 86400.0
PCI = "0000:d1:00"


def _on_gpu(session, incident: Incident, node: Node, subject_gpu: str, key: str) -> None:  # type: ignore[no-untyped-def]
    session.add(
        Finding(
            dedup_key=key, job_id=incident.job_id, incident_id=incident.id, node_id=node.id, detector="signatures",
            category=incident.root_cause, subject_kind="gpu", subject=f"{node.name}/{subject_gpu}", confidence=0.95,
            summary=f"Xid 79 (GPU has fallen off the bus) on {node.name} GPU {PCI}", evidence={"xid": 79},
            observed_at=incident.opened_at,
        )
    )  # fmt: skip


@pytest.fixture
def fell_twice(session) -> dict[str, Incident | Node | Job]:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    job = rows.job(session, "repeat-job")
    node = rows.node(session, "node-004")
    other = rows.node(session, "node-007")
    session.add(Gpu(node_id=node.id, index=6, pci_bus_id="00000000:D1:00.0"))

    def incident(minutes_ago: float, **values):  # type: ignore[no-untyped-def]
        opened = now - timedelta(minutes=minutes_ago)
        values.setdefault("anchor", node.name)
        return rows.incident(session, job=job, suspects=[values["anchor"]], opened_at=opened, **values)

    first = incident(
        20, state="resolved", resolved_at=now - timedelta(minutes=19), resolution="mitigated: reset_gpu done"
    )
    second = incident(11, state="open")
    _on_gpu(session, first, node, PCI, "xid-1")  # the kernel line's PCI address
    _on_gpu(session, second, node, "6", "xid-2")  # a counter finding's index: the same GPU, by the inventory
    network = incident(15, root_cause="network", state="resolved", resolved_at=now)
    elsewhere = incident(14, anchor=other.name, state="resolved", resolved_at=now)
    long_ago = incident(3 * 24 * 60, state="resolved", resolved_at=now - timedelta(days=3))
    merged = incident(12, state="resolved", resolved_at=now, resolution="merged: its findings belong to another")
    session.flush()
    return {"first": first, "second": second, "network": network, "elsewhere": elsewhere, "long_ago": long_ago,
            "merged": merged, "node": node, "job": job}  # fmt: skip


def test_the_second_incident_finds_the_first_on_the_same_gpu_and_nothing_else(session, fell_twice) -> None:  # type: ignore[no-untyped-def]
    second = fell_twice["second"]
    (repeat,) = history.repeats_of(
        session, incident_id=second.id, root_cause=second.root_cause, opened_at=second.opened_at,
        anchor=second.anchor, suspects=["node-004"], window_s=DAY,
    )  # fmt: skip
    assert repeat.earlier.id == fell_twice["first"].id and repeat.same_gpu == "6"
    assert repeat.before_s == pytest.approx(9 * 60) and repeat.earlier.node == "node-004"
    # The window bounds it: a three-day-old failure is no repeat within a day, and is within a week.
    week = history.repeats_of(
        session, incident_id=second.id, root_cause=second.root_cause, opened_at=second.opened_at,
        anchor=second.anchor, suspects=["node-004"], window_s=7 * DAY,
    )  # fmt: skip
    assert [r.earlier.id for r in week] == [fell_twice["first"].id, fell_twice["long_ago"].id]
    assert week[1].same_gpu is None  # no GPU finding: not claimed to be the same GPU


def test_the_node_s_repeat_failures_group_by_root_cause_with_the_gpu_named_twice(session, fell_twice) -> None:  # type: ignore[no-untyped-def]
    (group,) = history.repeat_failures(session, name="node-004", now=datetime.now(UTC), window_s=DAY)
    assert group.root_cause == "gpu_hardware" and group.gpus == ["6"]
    assert [p.id for p in group.incidents] == [fell_twice["second"].id, fell_twice["first"].id]
    # The escalation's read: every incident of the node in the window, the merged one left out.
    past = history.earlier_incidents(
        session, names=["node-004"], since=datetime.now(UTC) - timedelta(days=1), until=datetime.now(UTC)
    )
    assert {p.id for p in past} == {fell_twice[k].id for k in ("first", "second", "network")}


def test_an_incident_naming_a_node_only_as_a_lesser_suspect_is_not_its_failure(session, fell_twice) -> None:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    hang = rows.incident(session, job=fell_twice["job"], suspects=["node-007", "node-004"], root_cause="gpu_hardware",
                         opened_at=now - timedelta(minutes=5))  # fmt: skip
    assert hang.id not in {
        p.id for p in history.earlier_incidents(session, names=["node-004"], since=now - timedelta(hours=1), until=now)
    }


def test_the_incident_and_the_node_page_say_so(ui, fell_twice) -> None:  # type: ignore[no-untyped-def]
    first, second = fell_twice["first"], fell_twice["second"]
    html = ui.get(f"/incidents/{second.id}").text
    note = html.split('id="repeats"', 1)[1].split("</div>", 1)[0]
    assert "the same GPU (GPU 6) of" in note and "node-004" in note and "9.0 min before this one" in note
    assert f'href="/incidents/{first.id}"' in note
    assert 'id="repeats"' not in ui.get(f"/incidents/{first.id}").text  # the first repeats nothing
    page = ui.get("/nodes/node-004").text
    assert 'class="pill repeat"' in page and "gpu hardware \u00d72" in page
    card = page.split('<section class="card" id="repeats">', 1)[1].split("</section>", 1)[0]
    assert "the same GPU: GPU 6" in card and f'href="/incidents/{second.id}"' in card
