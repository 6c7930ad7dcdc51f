"""Compact GPU sample storage: what ingest stored reads back identical through gpu_samples() once its hour is
compacted into metric_chunks; late samples, replayed batches, the 10 s rollup and retention across the change."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, select, text
from sqlalchemy.orm import Session

from ml.metrics import METRIC_COLUMNS
from service.diagnosis import windows
from service.maintenance import compaction, partitions
from service.models import gpu_samples
from tests.conftest import bearer

ROWS = partitions.REGISTRY["metric_samples"]
CHUNKS = partitions.REGISTRY["metric_chunks"]
# An hour well inside retention, hours before the partitions the migration made from its own clock.
HOUR = partitions.HOURLY.floor(datetime.now(UTC) - timedelta(hours=5))
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"


@pytest.fixture
def agent(make_token) -> dict[str, str]:
    return bearer(make_token("agent"))


def _sample(ts: datetime, gpu: int, fields: dict[str, Any]) -> dict[str, Any]:
    return {"ts": ts.isoformat(), "gpu": gpu, "fields": fields}


def _batch(metrics: list[dict[str, Any]], *, node: str = "gpu-node-001") -> dict[str, Any]:
    return {
        "batch_id": str(uuid.uuid4()),
        "node": node,
        "sent_at": HOUR.isoformat(),
        "job_id": "job-1",
        "heartbeat": None,
        "metrics": metrics,
        "logs": [],
        "stacks": [],
        "processes": [],
    }


def _batches() -> list[dict[str, Any]]:
    """Three series of one node: GPU 0 sampled every second exactly, with a rising energy counter; GPU 1 with
    jittered times, an energy counter that resets, a non-integral counter, an unknown field and a blank; GPU 2
    with one sample. Shipped in batches of 5 s, as agents do."""
    out = []
    for first in range(0, 30, 5):
        metrics = []
        for k in range(first, first + 5):
            metrics.append(
                _sample(
                    HOUR + timedelta(minutes=10, seconds=k),
                    0,
                    {
                        "DCGM_FI_DEV_GPU_UTIL": 90 + k % 7,
                        ENERGY: 1_000_000 + 650 * k,
                        "DCGM_FI_DEV_POWER_USAGE": 650.125,
                    },
                )
            )
            fields: dict[str, Any] = {
                "DCGM_FI_DEV_GPU_UTIL": 50.5,
                ENERGY: 5_000 * k if k < 17 else 3 * k,  # reset at 17 s
                "DCGM_FI_PROF_PCIE_TX_BYTES": 1.25 * k,
                "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 0,
            }
            if k % 3 == 0:
                fields["DCGM_FI_DEV_SOMETHING_NEW"] = k
            if k == 4:
                fields["DCGM_FI_DEV_MEMORY_TEMP"] = 9223372036854775794  # dcgm-exporter's blank
            metrics.append(_sample(HOUR + timedelta(minutes=10, seconds=k, microseconds=137 * k * k), 1, fields))
        out.append(_batch(metrics))
    out.append(_batch([_sample(HOUR + timedelta(minutes=40), 2, {"DCGM_FI_DEV_GPU_TEMP": 61})]))
    return out


def _stored(session: Session, lo: datetime = HOUR, hi: datetime | None = None) -> list[tuple[Any, ...]]:
    """Every sample in [lo, hi) as gpu_samples returns it, sorted: the interface every reader uses."""
    samples = gpu_samples(lo, hi if hi is not None else lo + timedelta(hours=1))
    rows = session.execute(select(samples)).all()
    return sorted((tuple(r) for r in rows), key=lambda r: (r[1], r[2], r[0]))


def _post_all(client, agent: dict[str, str], batches: list[dict[str, Any]]) -> None:
    for payload in batches:
        response = client.post("/api/v1/ingest", json=payload, headers=agent)
        assert response.status_code == 200, response.text


def _compact_hour(session: Session) -> tuple[int, int]:
    return compaction.compact_partition(session.connection(), ROWS.partition_name(HOUR))


def _chunks(session: Session) -> list[Any]:
    return session.execute(
        text("SELECT gpu, n, step_us, ts_off, deltas, total_energy FROM metric_chunks ORDER BY gpu, ts_start")
    ).all()


@pytest.fixture
def hour_partition(session: Session) -> str:
    partitions.ensure_partitions(session, now=HOUR, ahead=timedelta(0), tables=[ROWS])
    return ROWS.partition_name(HOUR)


def test_compacted_hour_reads_back_identical(client, session, agent, hour_partition):
    _post_all(client, agent, _batches())
    before = _stored(session)
    assert len(before) == 61
    assert session.execute(text(f"SELECT count(*) FROM {hour_partition}")).scalar_one() == 61

    assert _compact_hour(session) == (61, 3)

    assert not partitions.table_exists(session.connection(), hour_partition)
    assert _stored(session) == before
    regular, jittered, single = _chunks(session)
    # A scrape every second: times as start and step only; the rising counter as deltas.
    assert (regular.n, regular.step_us, regular.ts_off) == (30, 1_000_000, None)
    assert regular.deltas == ["total_energy"] and regular.total_energy[:3] == [1_000_000, 650, 650]
    # Jittered times keep their microseconds; a counter that reset is stored as it came.
    assert jittered.step_us is None and len(jittered.ts_off) == 30
    assert "total_energy" not in (jittered.deltas or []) and jittered.total_energy[17] == 51
    assert (single.n, single.step_us) == (1, 0)
    extra = [r for r in before if r[1] and r[2] == 1 and r[-1]]
    assert [r[-1] for r in extra][:2] == [{"DCGM_FI_DEV_SOMETHING_NEW": 0}, {"DCGM_FI_DEV_SOMETHING_NEW": 3}]


def test_late_samples_and_replays_after_compaction(client, session, agent, hour_partition):
    batches = _batches()
    _post_all(client, agent, batches)
    _compact_hour(session)
    compacted = _stored(session)

    # A replayed batch is a duplicate (its id), before or after its hour was compacted: stored once.
    replay = client.post("/api/v1/ingest", json=batches[0], headers=agent)
    assert replay.json()["status"] == "duplicate"
    # A sample of the compacted hour arriving now (a spool replayed late) lands in the default partition...
    late = _batch([_sample(HOUR + timedelta(minutes=50), 0, {"DCGM_FI_DEV_GPU_UTIL": 12})])
    _post_all(client, agent, [late])
    where = session.execute(text("SELECT tableoid::regclass::text FROM metric_samples WHERE gpu = 0")).scalars()
    assert list(where) == [ROWS.default]
    with_late = _stored(session)
    assert len(with_late) == len(compacted) + 1

    # ... and is read with the others, before and after the next run compacts it into a chunk of its own.
    result = compaction.compact_samples(session, now=HOUR + timedelta(hours=2), max_partitions=0)
    assert (result.default_rows, result.chunks) == (1, 1)
    assert session.execute(text(f"SELECT count(*) FROM {ROWS.default} WHERE ts < :h"), {"h": HOUR}).scalar() == 0
    assert _stored(session) == with_late
    # Compacting again finds nothing: no sample twice.
    again = compaction.compact_samples(session, now=HOUR + timedelta(hours=2), max_partitions=0)
    assert (again.default_rows, again.chunks) == (0, 0)
    assert _stored(session) == with_late


def test_beat_compacts_only_closed_hours(session, hour_partition):
    conn: Connection = session.connection()
    conn.execute(
        text("INSERT INTO metric_samples (ts, node_id, gpu, gpu_util) VALUES (:ts, 7, 0, 1), (:ts2, 7, 0, 2)"),
        {"ts": HOUR + timedelta(minutes=1), "ts2": HOUR + timedelta(minutes=2)},
    )
    due_at = HOUR + timedelta(hours=1) + compaction.COMPACT_AFTER
    assert hour_partition not in compaction.due_partitions(conn, now=due_at - timedelta(seconds=1))
    assert hour_partition in compaction.due_partitions(conn, now=due_at)
    done = compaction.compact_samples(session, now=due_at, max_partitions=100)
    assert hour_partition in done.partitions
    assert [r[4] for r in _stored(session) if r[1] == 7] == [1, 2]  # gpu_util


def test_byte_rates_read_back_within_float4_precision(session, hour_partition):
    """The PCIe/NVLink byte rates are kept as float4 in chunks: a large noisy rate reads back as float8 within
    float4's relative precision, far below the 5% the peer comparison reads; a counter stays exact."""
    conn: Connection = session.connection()
    rates = [123_456_789_012.0 + 7_919.0 * k * k for k in range(10)]
    for k, rate in enumerate(rates):
        conn.execute(
            text(
                "INSERT INTO metric_samples (ts, node_id, gpu, nvlink_tx_bytes, total_energy) "
                "VALUES (:ts, 9, 0, :r, :e)"
            ),
            {"ts": HOUR + timedelta(minutes=3, seconds=k), "r": rate, "e": 2**40 + 1_000 * k},
        )
    _compact_hour(session)
    stored = session.execute(
        text("SELECT nvlink_tx_bytes, total_energy FROM gpu_samples(:lo, :hi) WHERE node_id = 9 ORDER BY ts"),
        {"lo": HOUR, "hi": HOUR + timedelta(hours=1)},
    ).all()
    assert [e for _, e in stored] == [2**40 + 1_000 * k for k in range(10)]
    assert all(abs(got - want) <= want * 6e-8 for (got, _), want in zip(stored, rates, strict=True))
    assert any(got != want for (got, _), want in zip(stored, rates, strict=True))  # float4 did round them


def test_rollup_from_chunks_equals_rollup_from_rows(client, session, agent, hour_partition):
    _post_all(client, agent, _batches())
    job_id = session.execute(text("SELECT id FROM jobs WHERE external_id = 'job-1'")).scalar_one()
    partitions.ensure_partitions(session, now=HOUR, ahead=timedelta(0), tables=[partitions.REGISTRY["metric_windows"]])
    statement = windows._statement("gpu", frozenset())
    params = {"job": job_id, "lo": HOUR, "hi": HOUR + timedelta(hours=1), "origin": windows._ORIGIN}
    read = text("SELECT * FROM metric_windows WHERE job_id = :job ORDER BY window_start, node_id, gpu")

    session.execute(statement, params)
    from_rows = [tuple(r) for r in session.execute(read, {"job": job_id})]
    session.execute(text("DELETE FROM metric_windows WHERE job_id = :job"), {"job": job_id})
    _compact_hour(session)
    session.execute(statement, params)
    from_chunks = [tuple(r) for r in session.execute(read, {"job": job_id})]

    assert len(from_rows) == 7  # GPU 0 and 1: three windows each; GPU 2: one
    assert from_chunks == from_rows


def test_readers_prune_chunk_partitions_by_their_bounds(session, hour_partition):
    conn = session.connection()
    conn.execute(
        text("INSERT INTO metric_samples (ts, node_id, gpu, gpu_util) VALUES (:ts, 7, 0, 1)"),
        {"ts": HOUR + timedelta(minutes=1)},
    )
    _compact_hour(session)
    other = HOUR - timedelta(hours=3)
    partitions.ensure_table_partitions(conn, CHUNKS, start=other, end=other)
    plan = "\n".join(
        conn.execute(
            text("EXPLAIN (ANALYZE, COSTS OFF) SELECT * FROM gpu_samples(:lo, :hi) WHERE node_id = 7"),
            {"lo": HOUR + timedelta(minutes=1), "hi": HOUR + timedelta(minutes=2)},
        ).scalars()
    )
    assert CHUNKS.partition_name(HOUR) in plan
    assert CHUNKS.partition_name(other) not in plan  # the chunk bounds pruned it
    assert "ix_metric_chunks_node_id" in plan or "node_id_ts_start_idx" in plan


def test_retention_drops_expired_chunk_partitions(session, hour_partition):
    session.execute(
        text("INSERT INTO metric_samples (ts, node_id, gpu, gpu_util) VALUES (:ts, 7, 0, 1)"),
        {"ts": HOUR + timedelta(minutes=1)},
    )
    _compact_hour(session)
    name = CHUNKS.partition_name(HOUR)
    kept = partitions.drop_expired_partitions(
        session, now=HOUR + timedelta(hours=2), retention={"metric_chunks": timedelta(hours=1)}, tables=[CHUNKS]
    )
    assert name in kept["metric_chunks"].partitions
    assert _stored(session) == []
    # Chunks inside retention stay.
    assert CHUNKS.partition_name(datetime.now(UTC)) in partitions.list_partitions(session.connection(), CHUNKS)


def test_chunk_columns_follow_the_metric_columns(session):
    """Every metric column has its array in metric_chunks, of its type (the migration mirrored the rows)."""
    types = dict(
        session.execute(
            text(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = 'metric_chunks'::regclass AND attnum > 0 AND NOT attisdropped"
            )
        ).all()
    )
    for name, (_, counter) in METRIC_COLUMNS.items():
        wide = counter and name not in compaction.RATES_AS_REAL
        assert types[name] == ("double precision[]" if wide else "real[]")
