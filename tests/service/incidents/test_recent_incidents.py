"""What just happened (service/incidents/recent.py): incidents stay on the overview, with their outcome, for the
configured hours after they resolved (issue 40: they opened and resolved within seconds, and the overview read
"0 open incidents" before and after every fault)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.incidents import recent
from tests import rows


def test_a_resolved_incident_stays_listed_with_its_outcome_for_the_window(session) -> None:
    now = datetime.now(UTC)
    job = rows.job(session, "recent-job")
    node = rows.node(session, "recent-node-5")
    # Opened and resolved within seconds, 61 minutes ago: its eviction done, the scheduler's words kept.
    fixed = rows.incident(
        session, job=job, suspects=[node.name], state="resolved", opened_at=now - timedelta(minutes=61, seconds=3),
        resolved_at=now - timedelta(minutes=61), resolution=f"mitigated: evict {node.name} done",
    )  # fmt: skip
    done = rows.decision(session, incident=fixed, node=node, state="done")
    done.outcome, done.outcome_message = (
        "done",
        "recent-node-5 out of the job (repair); node rank 3: waiting for a spare",
    )
    done.acked_at = now - timedelta(minutes=61)
    old_open = rows.incident(session, job=job, state="open", root_cause="hang", opened_at=now - timedelta(days=2))
    long_gone = rows.incident(
        session, job=job, state="resolved", opened_at=now - timedelta(hours=8), resolved_at=now - timedelta(hours=7)
    )
    merged = rows.incident(
        session, job=job, state="resolved", opened_at=now - timedelta(minutes=5),
        resolved_at=now - timedelta(minutes=4), resolution="merged: its findings belong to another incident",
    )  # fmt: skip
    session.flush()

    items, more = recent.recent(session, since=now - timedelta(hours=6))
    ids = [i.id for i in items]
    assert ids.index(old_open.id) < ids.index(fixed.id)  # open first
    assert long_gone.id not in ids and merged.id not in ids and more == 0
    item = items[ids.index(fixed.id)]
    (outcome,) = item.outcomes
    assert (outcome.action, outcome.result) == ("evict recent-node-5", "done")
    assert "waiting for a spare" in (outcome.message or "")
    assert item.open_for_s == 3 and item.resolution == "mitigated: evict recent-node-5 done"
    # An hour is not the limit: with a one-hour window it has gone.
    assert fixed.id not in [i.id for i in recent.recent(session, since=now - timedelta(hours=1))[0]]


def test_the_overview_shows_it_an_hour_after_it_resolved(ui, session) -> None:
    now = datetime.now(UTC)
    _job, _node, incident, decision = rows.eviction(session, node_name="recent-node-9", state="done")
    incident.state, incident.opened_at = "resolved", now - timedelta(minutes=70)
    incident.resolved_at, incident.resolution = now - timedelta(minutes=65), "mitigated: evict recent-node-9 done"
    session.flush()
    section = ui.get("/").text.split('id="recent-incidents"', 1)[1].split("</section>", 1)[0]
    row = section.split(f'data-incident="{incident.id}"', 1)[1].split("</tr>", 1)[0]
    assert "evict recent-node-9" in row and "dstate-done" in row and "resolved" in row
    assert "mitigated: evict recent-node-9 done" in row and f'data-decision="{decision.id}"' in row
