"""The schema comes only from the migrations, and the models agree with them."""

from __future__ import annotations

import subprocess
import sys
import uuid

import psycopg
import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import IntegrityError

from service import migrate
from service.config import to_sqlalchemy_url
from service.models import Base
from tests.conftest import _state, _to_url


@pytest.fixture
def empty_database() -> str:
    name = f"faultline_mig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_state["server_url"], autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield _to_url(_state["server_url"], name)
    with psycopg.connect(_state["server_url"], autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_upgrade_from_empty_builds_every_table_and_downgrade_removes_them(empty_database):
    url = to_sqlalchemy_url(empty_database)
    migrate.upgrade(url)
    engine = create_engine(url)
    assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    assert migrate.current_and_head(url)[0] == migrate.current_and_head(url)[1]
    migrate.downgrade(url, revision="base")
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    migrate.upgrade(url)
    engine.dispose()


def test_alembic_check_finds_models_and_migrations_in_agreement(database_url):
    """The same `alembic check` a developer runs from the repository root."""
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "check"],
        capture_output=True,
        text=True,
        env={"FAULTLINE_DATABASE_URL": database_url, "FAULTLINE_REDIS_URL": "redis://unused", "PATH": ""},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No new upgrade operations detected" in result.stdout + result.stderr


_SIGNALS = ("metric_samples", "log_events", "process_snapshots", "stack_dumps")


def _fingerprint(conn, table: str) -> tuple[int, str]:
    """Row count and a digest of every row's every column."""
    return conn.execute(text(f"SELECT count(*), md5(string_agg(t::text, '|' ORDER BY t::text)) FROM {table} t")).one()


def _seed_signals(conn) -> None:
    """Rows across 40 days back (beyond a retention's worth) to a week ahead (beyond the partitions made)."""
    conn.execute(
        text(
            "INSERT INTO metric_samples (ts, node_id, gpu, job_id, gpu_util, total_energy, extra) "
            "SELECT now() - i * interval '7 minutes', i % 5, (i % 8)::smallint, 1, i, i * 1000.5, "
            "CASE WHEN i % 3 = 0 THEN jsonb_build_object('DCGM_FI_X', i) END FROM generate_series(-1440, 8000) i"
        )
    )
    conn.execute(
        text(
            "INSERT INTO log_events (batch_id, node_id, job_id, ts, source, kind, severity, line, fields) "
            "SELECT gen_random_uuid(), i % 5, 1, now() - i * interval '3 hours', "
            "CASE WHEN i % 4 = 0 THEN 'alertmanager' ELSE 'kmsg' END, 'xid', 'critical', 'NVRM: Xid ' || i, "
            "jsonb_build_object('fingerprint', 'f' || i) FROM generate_series(-50, 320) i"
        )
    )
    conn.execute(
        text(
            "INSERT INTO process_snapshots (batch_id, node_id, job_id, ts, pid, rank, cpu_pct) "
            "SELECT gen_random_uuid(), i % 5, 1, now() - i * interval '1 hour', 1000 + i, i, 99.5 "
            "FROM generate_series(-60, 900) i"
        )
    )
    conn.execute(
        text(
            "INSERT INTO stack_dumps (batch_id, node_id, job_id, ts, rank, pid, directive_id, threads) "
            "SELECT gen_random_uuid(), i % 5, 1, now() - i * interval '5 hours', i, 1000 + i, 'd' || (i % 7), "
            "'[{\"frames\": []}]'::jsonb FROM generate_series(-10, 200) i"
        )
    )
    # Ids not from 1 up: the identity must carry on after the highest one, not restart.
    conn.execute(text("DELETE FROM log_events WHERE id % 10 = 3"))


def _relkind(conn, table: str) -> str:
    return conn.execute(
        text("SELECT relkind FROM pg_class WHERE oid = CAST(:t AS regclass)"), {"t": table}
    ).scalar_one()


def test_partitioning_converts_tables_with_rows_and_keeps_every_row(empty_database):
    url = to_sqlalchemy_url(empty_database)
    migrate.upgrade(url, revision="0005")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            _seed_signals(conn)
            before = {t: _fingerprint(conn, t) for t in _SIGNALS}
            last_id = {t: conn.execute(text(f"SELECT max(id) FROM {t}")).scalar_one() for t in _SIGNALS[1:]}

        migrate.upgrade(url, revision="0006")
        with engine.begin() as conn:
            for table in _SIGNALS:
                assert _relkind(conn, table) == "p"
                assert _fingerprint(conn, table) == before[table], table
                # Rows beyond the next hours wait in the default partition; older than a retention's worth, in
                # one catch-all partition; the rest in one partition per period.
                homes = set(conn.execute(text(f"SELECT DISTINCT tableoid::regclass::text FROM {table}")).scalars())
                assert f"{table}_default" in homes
                assert sum(h.startswith(f"{table}_before_") for h in homes) == 1
                assert sum(h.startswith(f"{table}_p") for h in homes) > 20
            assert conn.execute(text("SELECT to_regclass('metric_samples_unpartitioned')")).scalar() is None
            for table in _SIGNALS[1:]:
                new_id = conn.execute(
                    text(
                        f"INSERT INTO {table} (batch_id, node_id, ts, "
                        + ("source, kind, line" if table == "log_events" else "pid")
                        + ") VALUES (gen_random_uuid(), 1, now(), "
                        + ("'kmsg', 'xid', 'x'" if table == "log_events" else "1")
                        + ") RETURNING id"
                    )
                ).scalar_one()
                assert new_id > last_id[table], table
                pk = conn.execute(
                    text(
                        "SELECT array_agg(a.attname ORDER BY k.ord) FROM pg_constraint c "
                        "CROSS JOIN unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord) "
                        "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum "
                        "WHERE c.conrelid = CAST(:t AS regclass) AND c.contype = 'p'"
                    ),
                    {"t": table},
                ).scalar_one()
                assert pk == ["id", "ts"]
                conn.execute(text(f"DELETE FROM {table} WHERE id > :id"), {"id": last_id[table]})

        migrate.downgrade(url, revision="0005")
        with engine.begin() as conn:
            for table in _SIGNALS:
                assert _relkind(conn, table) == "r"
                assert _fingerprint(conn, table) == before[table], table
            assert conn.execute(text("SELECT count(*) FROM pg_class WHERE relispartition")).scalar_one() == 0
        migrate.upgrade(url)
    finally:
        engine.dispose()


def _decision(conn, kind: str, gpu: int | None = None, gpu_pci: str | None = None) -> int:
    columns = "kind, state, confidence, reason, evidence" + (", gpu" if gpu is not None else "")
    columns += ", gpu_pci" if gpu_pci is not None else ""
    values = f"'{kind}', 'pending', 0.9, 'test', '{{}}'::jsonb" + (f", {gpu}" if gpu is not None else "")
    values += f", '{gpu_pci}'" if gpu_pci is not None else ""
    return conn.execute(text(f"INSERT INTO decisions ({columns}) VALUES ({values}) RETURNING id")).scalar_one()


def test_reset_gpu_by_pci_bus_id_up_and_down(empty_database):
    url = to_sqlalchemy_url(empty_database)
    migrate.upgrade(url, revision="0022")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            by_index = _decision(conn, "reset_gpu", gpu=3)
        migrate.upgrade(url, revision="0023")
        with engine.begin() as conn:
            by_pci = _decision(conn, "reset_gpu", gpu_pci="0000:3b:00.0")
            both = _decision(conn, "reset_gpu", gpu=2, gpu_pci="0000:5d:00.0")
        # A reset names a GPU; nothing else names one; a bus id only in the form the policy writes.
        for kind, gpu, pci in [
            ("reset_gpu", None, None),
            ("evict", None, "0000:3b:00.0"),
            ("evict", 3, None),
            ("reset_gpu", None, "0000:3B:00"),
            ("reset_gpu", None, "00000000:3b:00.0"),
        ]:
            with pytest.raises(IntegrityError), engine.begin() as conn:
                _decision(conn, kind, gpu=gpu, gpu_pci=pci)

        migrate.downgrade(url, revision="0022")
        with engine.begin() as conn:
            # A reset by bus id alone cannot be written without an index: it goes; the others stay.
            kept = set(conn.execute(text("SELECT id FROM decisions")).scalars())
            assert kept == {by_index, both} and by_pci not in kept
            assert "gpu_pci" not in {c["name"] for c in inspect(conn).get_columns("decisions")}
        migrate.upgrade(url)
        with engine.begin() as conn:
            assert conn.execute(text("SELECT count(*) FROM decisions WHERE gpu_pci IS NOT NULL")).scalar_one() == 0
    finally:
        engine.dispose()
