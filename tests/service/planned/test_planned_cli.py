"""`faultline maintenance announce|list|cancel` as an operator runs it (a real process on the test database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from tests.service.test_cli import faultline


def test_announce_list_cancel_from_the_command_line(committed) -> None:
    with committed.begin() as conn:
        conn.execute(text("INSERT INTO nodes (name) VALUES ('cli-node-1')"))
    announced = faultline(
        "maintenance", "announce", "cli-node-1", "--start", "+2h", "--duration", "90m", "--reason", "BMC"
    )
    assert announced.returncode == 0, announced.stderr
    assert "announced window" in announced.stdout and "cli-node-1" in announced.stdout
    with committed.connect() as conn:
        row = conn.execute(text("SELECT id, starts_at, ends_at, source, author FROM maintenance_windows")).one()
    assert row.ends_at - row.starts_at == timedelta(minutes=90) and row.source == "operator"
    assert abs(row.starts_at - (datetime.now(UTC) + timedelta(hours=2))) < timedelta(minutes=1)
    assert row.author.startswith("operator:cli:")

    listing = faultline("maintenance", "list", "--current")
    assert listing.returncode == 0
    [line] = listing.stdout.splitlines()
    assert line.split("\t")[:3] == [str(row.id), "cli-node-1", "announced"] and line.endswith("\tBMC")

    cancelled = faultline("maintenance", "cancel", "cli-node-1", str(row.id))
    assert cancelled.returncode == 0 and "is cancelled" in cancelled.stdout
    assert faultline("maintenance", "list", "--current").stdout == ""


def test_bad_input_is_a_clear_error_and_changes_nothing(committed) -> None:
    with committed.begin() as conn:
        conn.execute(text("INSERT INTO nodes (name) VALUES ('cli-node-2')"))
    past = (datetime.now(UTC) - timedelta(hours=3)).isoformat()
    cases = [
        (("cli-node-2", "--start", past, "--duration", "1h", "--reason", "x"), "ended already"),
        (("cli-node-2", "--start", "+1h", "--end", past, "--reason", "x"), "must be after starts_at"),
        (("cli-node-2", "--start", "tomorrow", "--duration", "1h", "--reason", "x"), "not an ISO 8601 time"),
        (("cli-node-2", "--start", "+1h", "--duration", "soon", "--reason", "x"), "not a duration"),
        (("cli-node-2", "--start", "+1h", "--duration", "1h", "--reason", ""), "reason"),
        (("no-such-node", "--start", "+1h", "--duration", "1h", "--reason", "x"), "no node named 'no-such-node'"),
    ]
    for args, says in cases:
        result = faultline("maintenance", "announce", *args)
        assert result.returncode == 2 and says in result.stderr, (args, result.stderr)
    missing = faultline("maintenance", "cancel", "cli-node-2", "999")
    assert missing.returncode == 2 and "no maintenance window 999" in missing.stderr
    both = faultline("maintenance", "announce", "cli-node-2", "--start", "+1h", "--reason", "x")
    assert both.returncode == 2 and "one of the arguments --end --duration is required" in both.stderr
    with committed.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM maintenance_windows")).scalar_one() == 0
