"""`faultline breaker status|reset` as an on-call engineer runs it, against the real database."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from service.models import BreakerEvent, FleetBreaker
from tests.service.test_cli import faultline


def _trip(engine: Any) -> None:
    with sessionmaker(bind=engine)() as session:
        row = session.get(FleetBreaker, 1) or FleetBreaker(id=1)
        row.state, row.tripped_at, row.tripped_reason = "tripped", datetime.now(UTC), "5 of 40 nodes out"
        session.add(row)
        session.commit()


def test_status_and_a_reset_with_a_reason_in_the_audit_trail(committed: Any) -> None:
    _trip(committed)
    status = faultline("breaker", "status")
    assert status.returncode == 0, status.stderr
    assert "state: tripped" in status.stdout and "why: 5 of 40 nodes out" in status.stdout
    as_json = json.loads(faultline("breaker", "status", "--json").stdout)
    assert as_json["state"] == "tripped" and as_json["tripped_reason"] == "5 of 40 nodes out"

    blank = faultline("breaker", "reset", "--reason", "  ")
    assert blank.returncode == 2 and "--reason must say why" in blank.stderr
    missing = faultline("breaker", "reset")
    assert missing.returncode == 2 and "--reason" in missing.stderr

    reset = faultline("breaker", "reset", "--reason", "rule reverted", "--by", "operator:cli:bob")
    assert reset.returncode == 0, reset.stderr
    assert "automatic take-outs resume" in reset.stderr and "state: closed" in reset.stdout
    with sessionmaker(bind=committed)() as session:
        (event,) = session.scalars(select(BreakerEvent)).all()
        assert (event.kind, event.actor, event.reason) == ("reset", "operator:cli:bob", "rule reverted")
    again = faultline("breaker", "reset", "--reason", "again")
    assert again.returncode == 2 and "not tripped" in again.stderr
