"""Partitioned signal tables: rows land in their period's partition (or the default one), partitions are made
ahead idempotently and concurrently, and retention drops whole partitions."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, text
from sqlalchemy.orm import Session, sessionmaker

from service.maintenance import partitions, tasks
from service.maintenance.partitions import REGISTRY
from service.worker import celery_app

METRICS = REGISTRY["metric_samples"]
LOGS = REGISTRY["log_events"]
# Far from the clock, so the partitions the migration made for "now" are never in the way.
FUTURE = datetime(2031, 3, 4, 10, 20, tzinfo=UTC)
PAST = datetime(2020, 1, 1, tzinfo=UTC)


def _insert_sample(conn: Connection | Session, ts: datetime, node_id: int = 1) -> None:
    conn.execute(text("INSERT INTO metric_samples (ts, node_id, gpu) VALUES (:ts, :n, 0)"), {"ts": ts, "n": node_id})


def _insert_log(conn: Connection | Session, ts: datetime) -> int:
    return conn.execute(
        text(
            "INSERT INTO log_events (batch_id, node_id, ts, source, kind, line) "
            "VALUES (:b, 1, :ts, 'kmsg', 'xid', 'NVRM: Xid 79') RETURNING id"
        ),
        {"b": uuid.uuid4(), "ts": ts},
    ).scalar_one()


def _where(conn: Connection | Session, table: str, ts: datetime) -> list[str]:
    """The partitions holding the table's rows at `ts`."""
    rows = conn.execute(text(f"SELECT tableoid::regclass::text FROM {table} WHERE ts = :ts"), {"ts": ts})
    return list(rows.scalars())


def _partitions(conn: Connection | Session, table: str) -> set[str]:
    return set(partitions.list_partitions(conn.connection() if isinstance(conn, Session) else conn, REGISTRY[table]))


def test_the_migration_leaves_partitions_for_now_and_the_hours_ahead(session: Session) -> None:
    now = datetime.now(UTC)
    names = _partitions(session, "metric_samples")
    assert {
        "metric_samples_default",
        METRICS.partition_name(now),
        METRICS.partition_name(now + timedelta(hours=6)),
    } <= names
    for table in ("log_events", "process_snapshots", "stack_dumps"):
        assert {f"{table}_default", REGISTRY[table].partition_name(now)} <= _partitions(session, table)


def test_rows_land_in_their_period_partition(session: Session) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    _insert_sample(session, now)
    assert _where(session, "metric_samples", now) == [METRICS.partition_name(now)]
    event_id = _insert_log(session, now)
    assert _where(session, "log_events", now) == [LOGS.partition_name(now)]
    assert LOGS.partition_name(now) == f"log_events_p{now:%Y%m%d}"
    assert METRICS.partition_name(now) == f"metric_samples_p{now:%Y%m%d%H}"
    # The identity still numbers rows; the primary key is (id, ts).
    assert _insert_log(session, now) > event_id


def test_ensure_partitions_is_idempotent(session: Session) -> None:
    created = partitions.ensure_partitions(session, now=FUTURE, ahead=timedelta(hours=2))
    assert created["metric_samples"] == [
        "metric_samples_p2031030410",
        "metric_samples_p2031030411",
        "metric_samples_p2031030412",
    ]
    assert created["log_events"] == ["log_events_p20310304"]
    windowed = {"metric_samples", "metric_chunks", "metric_windows", "node_samples", "node_windows"}
    assert set(created) == windowed | {"log_events", "process_snapshots", "stack_dumps"}
    assert partitions.ensure_partitions(session, now=FUTURE, ahead=timedelta(hours=2)) == {}
    # A partition covers exactly its period.
    _insert_sample(session, FUTURE.replace(minute=0, second=0))
    _insert_sample(session, FUTURE.replace(minute=59, second=59))
    assert set(_where(session, "metric_samples", FUTURE.replace(minute=0, second=0))) == {"metric_samples_p2031030410"}
    assert set(_where(session, "metric_samples", FUTURE.replace(minute=59, second=59))) == {
        "metric_samples_p2031030410"
    }


def test_a_row_without_partition_lands_in_default_and_moves_when_its_partition_is_made(session: Session) -> None:
    at = FUTURE + timedelta(days=40)
    _insert_sample(session, at)
    _insert_sample(session, at + timedelta(hours=1))  # the next hour: stays behind
    event_id = _insert_log(session, at)
    assert _where(session, "metric_samples", at) == ["metric_samples_default"]
    assert _where(session, "log_events", at) == ["log_events_default"]

    created = partitions.ensure_partitions(session, now=at, ahead=timedelta(0))
    assert created == {
        "metric_samples": [METRICS.partition_name(at)],
        "metric_chunks": [REGISTRY["metric_chunks"].partition_name(at)],
        "log_events": [LOGS.partition_name(at)],
        "process_snapshots": [REGISTRY["process_snapshots"].partition_name(at)],
        "stack_dumps": [REGISTRY["stack_dumps"].partition_name(at)],
        "metric_windows": [REGISTRY["metric_windows"].partition_name(at)],
        "node_samples": [REGISTRY["node_samples"].partition_name(at)],
        "node_windows": [REGISTRY["node_windows"].partition_name(at)],
    }
    assert _where(session, "metric_samples", at) == [METRICS.partition_name(at)]
    assert _where(session, "metric_samples", at + timedelta(hours=1)) == ["metric_samples_default"]
    moved = session.execute(
        text("SELECT id, tableoid::regclass::text FROM log_events WHERE ts = :ts"), {"ts": at}
    ).one()
    assert tuple(moved) == (event_id, LOGS.partition_name(at))
    # The default partition is attached again: a row of another day still has a home.
    _insert_sample(session, at + timedelta(days=3))
    assert _where(session, "metric_samples", at + timedelta(days=3)) == ["metric_samples_default"]


def test_drop_expired_partitions_removes_exactly_the_expired_ones(session: Session) -> None:
    # Hourly partitions 00:00 .. 05:00 with a row each; retention 3 h at 05:30 -> cutoff 02:30.
    partitions.ensure_partitions(session, now=PAST, ahead=timedelta(hours=5), tables=[METRICS])
    hours = [PAST + timedelta(hours=h, minutes=10) for h in range(6)]
    for at in hours:
        _insert_sample(session, at)
    stale_default = PAST - timedelta(days=1)  # no partition: default, and past retention
    fresh_default = PAST + timedelta(days=1)  # no partition: default, within retention
    _insert_sample(session, stale_default)
    _insert_sample(session, fresh_default)
    before = _partitions(session, "metric_samples")

    dropped = partitions.drop_expired_partitions(
        session,
        now=PAST + timedelta(hours=5, minutes=30),
        retention={"metric_samples": timedelta(hours=3)},
        tables=[METRICS],
    )

    assert dropped["metric_samples"].partitions == ["metric_samples_p2020010100", "metric_samples_p2020010101"]
    assert dropped["metric_samples"].default_rows == 1
    assert _partitions(session, "metric_samples") == before - {
        "metric_samples_p2020010100",
        "metric_samples_p2020010101",
    }
    remaining = session.execute(
        text("SELECT ts FROM metric_samples WHERE ts < :end ORDER BY ts"), {"end": PAST + timedelta(days=2)}
    ).scalars()
    assert list(remaining) == [*hours[2:], fresh_default]
    # Nothing else expired: the partitions of today and the log tables are untouched.
    now = datetime.now(UTC)
    assert METRICS.partition_name(now) in _partitions(session, "metric_samples")


def test_ensure_partitions_from_two_sessions_at_once_makes_each_partition_once(committed) -> None:
    at = datetime(2032, 6, 1, 0, 30, tzinfo=UTC)
    factory = sessionmaker(bind=committed)
    results: list[dict[str, list[str]]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run() -> None:
        try:
            with factory() as session:
                barrier.wait()
                results.append(
                    partitions.ensure_partitions(session, now=at, ahead=timedelta(hours=3), tables=[METRICS])
                )
                session.commit()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors
        made = sorted(name for r in results for name in r.get("metric_samples", []))
        assert made == [f"metric_samples_p20320601{h:02d}" for h in range(4)]
    finally:
        with committed.begin() as conn:
            for h in range(4):
                conn.execute(text(f"DROP TABLE IF EXISTS metric_samples_p20320601{h:02d}"))


@pytest.fixture
def old_rows(committed):
    """Committed rows past every retention, for the Celery task (which commits on its own)."""
    old = datetime.now(UTC) - timedelta(days=400)
    with committed.begin() as conn:
        _insert_sample(conn, old)
        _insert_log(conn, old)
        node_id = conn.execute(text("INSERT INTO nodes (name) VALUES ('prune-node') RETURNING id")).scalar_one()
        conn.execute(
            text(
                "INSERT INTO agent_batches (batch_id, node_id, sent_at, received_at, n_metrics, n_logs, n_stacks, "
                "n_processes) VALUES (:b, :n, :old, :old, 0, 0, 0, 0)"
            ),
            {"b": uuid.uuid4(), "n": node_id, "old": old},
        )
        conn.execute(
            text(
                "INSERT INTO unknown_line_counts (hour, form_id, source, node_id, lines, first_seen_at, last_seen_at) "
                "VALUES (date_trunc('hour', :old), '00000000000000aa', 'kmsg', :n, 3, :old, :old)"
            ),
            {"n": node_id, "old": old},
        )
        conn.execute(
            text(
                "INSERT INTO ui_sessions (key_hash, user_name, scope, csrf_token, expires_at) VALUES "
                "('expired', 'alice', 'operator', 'c1', now() - interval '1 hour'), "
                "('live', 'bob', 'operator', 'c2', now() + interval '1 hour')"
            )
        )
    return old


def test_prune_task_drops_old_signals_and_expired_ui_sessions(committed, old_rows) -> None:
    # As a starting worker does: its modules include the web UI's, which registers its session pruning.
    celery_app.loader.import_default_modules()
    pruned = tasks.prune_old_signals()

    assert pruned["ui_sessions"] == 1
    assert pruned["unknown_line_counts"] == 1  # registered by service/unknown_lines/retention.py, as ui_sessions
    assert pruned["agent_batches"] == 1
    assert pruned["metric_samples"]["default_rows"] == 1
    assert pruned["log_events"]["default_rows"] == 1
    with committed.connect() as conn:
        assert list(conn.execute(text("SELECT key_hash FROM ui_sessions")).scalars()) == ["live"]
        for table in ("metric_samples", "log_events", "agent_batches"):
            assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() == 0
        # The partitions of the current hour and day are within retention and stay.
        assert METRICS.partition_name(datetime.now(UTC)) in _partitions(conn, "metric_samples")
    assert tasks.prune_old_signals() == {
        "agent_batches": 0,
        "ui_sessions": 0,
        "unknown_line_counts": 0,
        "evidence_bundles": 0,  # registered by service/bundles/retention.py
    }


def test_ensure_task_is_a_no_op_once_partitions_exist(committed) -> None:
    tasks.ensure_partitions()
    assert tasks.ensure_partitions() == {}


def test_retention_skips_a_partition_in_use_without_holding_the_parent_and_drops_it_next_run(committed) -> None:
    # An expired hour that a long transaction is still reading (as autovacuum or a slow query may).
    at = PAST - timedelta(days=30)  # older than every other partition: nothing else expires with it
    busy = METRICS.partition_name(at)
    factory = sessionmaker(bind=committed)
    with factory.begin() as session:
        partitions.ensure_partitions(session, now=at, ahead=timedelta(0), tables=[METRICS])
    retention = {"metric_samples": timedelta(hours=1)}
    later = at + timedelta(hours=3)
    try:
        with committed.connect() as reader:
            reader.execute(text(f"SELECT count(*) FROM {busy}"))  # holds its lock until the transaction ends
            with factory.begin() as session:
                first = partitions.drop_expired_partitions(session, now=later, retention=retention, tables=[METRICS])
                # Still inside the retention's transaction: the attempt let go of the parent, so a writer
                # through it is not blocked.
                with committed.connect() as writer:
                    writer.execute(text("SET lock_timeout = '1s'"))
                    _insert_sample(writer, datetime.now(UTC))
                    writer.rollback()
            reader.rollback()
        assert first["metric_samples"].partitions == []
        with committed.connect() as conn:
            assert busy in _partitions(conn, "metric_samples")
        with factory.begin() as session:
            second = partitions.drop_expired_partitions(session, now=later, retention=retention, tables=[METRICS])
        assert second["metric_samples"].partitions == [busy]
    finally:
        with committed.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {busy}"))
