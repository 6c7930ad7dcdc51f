"""The job page's cost table (service/jobs/costs.py): issue 40's 14-minute stall that was charged to five incidents
(one opened 63 s before its end), unsorted and without a total. Now: charged once, most costly first, and the total is
the job's lost time, wall x (1 - ETTR)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import update

from service.models import Job, LogEvent
from tests import rows

T0 = (datetime.now(UTC) - timedelta(hours=1)).replace(microsecond=0)


def _t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_one_long_stall_is_charged_once_and_the_total_is_the_ettr_s(ui, session) -> None:  # type: ignore[no-untyped-def]
    job = rows.job(session, "cost-job")
    node = rows.node(session, "cost-node-1")
    # Steps every 10 s from 10 s to 600 s (step 60); a 14-minute stall with three restarts back to the checkpoint of
    # step 50, none past 60; past 60 at 1450 s; on to 1800 s, where the job ended.
    steps = [(10 * k, k) for k in range(1, 61)]
    steps += [(700 + 10 * i, 51 + i) for i in range(5)] + [(900 + 10 * i, 51 + i) for i in range(8)]
    steps += [(1350 + 10 * i, 51 + i) for i in range(46)]  # 51..96, past 60 at 1450 s
    for at, step in steps:
        session.add(LogEvent(batch_id=uuid.uuid4(), node_id=node.id, job_id=job.id, ts=_t(at), source="training",
                             kind="step", line=f"step {step}", rank=0, fields={"step": step}))  # fmt: skip
    session.add(LogEvent(batch_id=uuid.uuid4(), node_id=node.id, job_id=job.id, ts=_t(505), source="trainer",
                         kind="checkpoint_saved", line="saved", rank=0, fields={"step": 50}))  # fmt: skip
    session.execute(update(Job).where(Job.id == job.id).values(created_at=T0, state="finished", last_seen_at=_t(1800)))
    # Five incidents overlap the stall: the Xid that began it (5 s in), three symptoms, one opened 63 s before its end.
    opened = [605, 640, 900, 1100, 1387]
    incidents = [
        rows.incident(
            session, job=job, root_cause=f"cause-{k}", state="resolved", opened_at=_t(at), resolved_at=_t(at + 30)
        )
        for k, at in enumerate(opened)
    ]
    session.flush()
    page = ui.get("/jobs/cost-job").text
    costly = page.split('id="job-incidents"', 1)[1].split("</section>", 1)[0]
    charged = re.findall(r'<tr data-incident="(\d+)">(.*?)</tr>', costly, flags=re.S)
    # One row: the stall from step 60 (600 s) to step 60 again (1440 s), from which the job trained on at its pace, is
    # the first incident's: 840 s.
    assert [int(i) for i, _ in charged] == [incidents[0].id]
    row = charged[0][1]
    assert "14.0 min" in row and "3 restarts" in row
    for other in incidents[1:]:
        assert f'href="/incidents/{other.id}"' in row  # listed as also open, not charged
    totals = dict(re.findall(r'id="(cost-\w+)">([^<]+)<', costly))
    # Lost: 10 s start-up + the 840 s stall = 850 s of 1800 s; productive 950 s, ETTR 52.8%.
    assert totals == {"cost-charged": "14.0 min", "cost-free": "10 s", "cost-total": "14.2 min"}
    assert "ETTR 52.8%" in costly and "wall time 30.0 min" in costly
    assert "4 other incidents cost no time" in costly
