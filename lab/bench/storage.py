"""`faultline bench storage`: what a GPU sample costs on disk, and what retention costs, partitioned or not.

Generates `--hours` of a `--gpus` cluster at one sample per GPU per second (the 24 DCGM fields of the ingest
benchmark's synthetic job, with its kind of values unless `--values random`) inside PostgreSQL, into hourly
partitions of metric_samples for a synthetic day far in the future (2090), so the real rows of a live database
are never in the way. Measures bytes per GPU-sample (heap with TOAST and indexes, pg_total_relation_size over
the partitions) three ways: as ingest's rows, compacted into metric_chunks as beat does it (timed), and as the
10 s windows the diagnosis rollup builds of them; projects them to 16,384 GPUs a day and for the retention; then times
retention as beat runs it (DETACH and DROP of whole partitions) for those rows and for a whole day of 10 GPUs,
while another connection inserts through metric_samples as ingest does (how long a writer waits on it), and
the old retention (50,000-row DELETEs, then VACUUM) on `--delete-minutes` of the same cluster in an
unpartitioned copy with the old indexes, projected linearly to the same rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, text

from lab.bench.backend import say, start_backend
from lab.bench.busy import note, watch_other_load
from lab.bench.storage_measurements import (
    BIG_DAY,
    OLD_CHUNK,
    OLD_RUN_S,
    PROBE_EVERY_S,
    SMALL_DAY,
    VALUE_KINDS,
    _bench_partitions,
    _cleanup,
    _compact,
    _drop_partitions,
    _generate,
    _make_partitions,
    _old_retention,
    _settle,
    _sizes,
    _wal_lsn,
    _wal_since,
    _windows,
)
from lab.bench.synthetic import COUNTERS, GAUGES
from service.config import to_libpq_url

TARGET_GPUS = 16_384
SMALL_GPUS = 10
RETENTION_H = 72  # FAULTLINE_METRIC_RETENTION_HOURS' default
# Hours kept as rows, at most (rounded up): the current one, and the last one until beat compacts it
# (compaction.COMPACT_AFTER past its end, then the run's own minutes).
HOT_HOURS = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faultline bench storage", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=2048, help="GPUs sampled every second (default %(default)s)")
    parser.add_argument(
        "--hours",
        type=int,
        default=2,
        help="hours of samples (default %(default)s: about 15 M rows at 2,048 GPUs, 1.5 minutes on 2 cores; 24 is a "
        "full day, 177 M rows)",
    )
    parser.add_argument(
        "--delete-minutes",
        type=int,
        default=10,
        help="minutes of the same cluster deleted row by row for the comparison (default %(default)s)",
    )
    parser.add_argument(
        "--values",
        choices=VALUE_KINDS,
        default="agent",
        help="the samples' values: 'agent' as the benchmarks' synthetic job reports them (whole utilizations, clocks "
        "and temperatures, rising counters), 'random' uniform float gauges, the worst case for compression "
        "(default %(default)s)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="use the embedded PostgreSQL of this folder instead of FAULTLINE_DATABASE_URL (default, when neither "
        "is given: a throwaway embedded one)",
    )
    return parser


def _conditions(conn: Connection, kind: str) -> dict[str, Any]:
    settings = {
        name: conn.execute(text(f"SHOW {name}")).scalar()
        for name in ("server_version", "shared_buffers", "synchronous_commit", "max_wal_size")
    }
    return {"database": kind, "cpu_cores": os.cpu_count(), **settings}


@contextlib.contextmanager
def _database(args: argparse.Namespace) -> Iterator[tuple[Engine, str]]:
    from service import migrate

    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="faultline-bench-storage-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)  # last: after the embedded server stops
        backend = start_backend(args.data_dir, workdir, stack)
        say(f"database: {backend.kind}; applying migrations ...")
        migrate.upgrade(backend.database_url)
        engine = create_engine(backend.database_url)
        stack.callback(engine.dispose)
        yield engine, backend.kind


def _measure(args: argparse.Namespace, engine: Engine, kind: str) -> dict[str, Any]:
    seconds = args.hours * 3600
    rows = seconds * args.gpus
    with engine.connect() as conn:
        conditions = _conditions(conn, kind)
    _cleanup(engine)
    try:
        names = _make_partitions(engine, BIG_DAY, args.hours)
        say(f"generating {args.gpus:,} GPUs x {args.hours} h at 1 s: {rows:,} rows into {len(names)} partitions ...")
        gen_s = _generate(
            engine,
            "metric_samples",
            start=BIG_DAY,
            seconds=seconds,
            gpus=args.gpus,
            what="generated",
            values=args.values,
        )
        with engine.begin() as conn:
            stored = conn.execute(
                text("SELECT count(*) FROM metric_samples WHERE ts >= :a AND ts < :b"),
                {"a": BIG_DAY, "b": BIG_DAY + timedelta(seconds=seconds)},
            ).scalar()
            sizes = _sizes(conn, names)
        say("10 s windows of those samples (the diagnosis rollup) ...")
        windows = _windows(engine, start=BIG_DAY, seconds=seconds)
        say(f"compacting the {len(names)} hours into metric_chunks ...")
        chunks = _compact(engine, names, start=BIG_DAY)
        if chunks["samples"] != stored:
            raise RuntimeError(f"compaction wrote {chunks['samples']:,} samples of {stored:,}")
        checkpoint_s = _settle(engine, names)
        say(f"dropping the {len(names)} partitions (retention) ...")
        lsn = _wal_lsn(engine)
        drop_each = _drop_partitions(engine, names)
        drop_wal = _wal_since(engine, lsn)
        with engine.begin() as conn:
            left = _bench_partitions(conn, BIG_DAY)

        small_names = _make_partitions(engine, SMALL_DAY, 24)
        small_rows = 24 * 3600 * SMALL_GPUS
        say(f"a day of {SMALL_GPUS} GPUs: {small_rows:,} rows into {len(small_names)} partitions ...")
        _generate(
            engine, "metric_samples", start=SMALL_DAY, seconds=24 * 3600, gpus=SMALL_GPUS, what="", progress=False
        )
        with engine.begin() as conn:
            small_sizes = _sizes(conn, small_names)
        _settle(engine, small_names)
        small_each = _drop_partitions(engine, small_names)

        say(f"old retention on {args.delete_minutes} min of {args.gpus:,} GPUs in an unpartitioned copy ...")
        old = _old_retention(engine, gpus=args.gpus, minutes=args.delete_minutes)
    finally:
        _cleanup(engine)

    per_sample = sizes["total"] / stored
    day_16k = TARGET_GPUS * 86_400
    per_chunked = chunks["bytes"]["total"] / stored
    per_window = windows["bytes"]["total"] / stored
    drop_s = sum(drop_each["statements"]) + sum(drop_each["commit"])
    delete_same_s = stored / old["rows_per_s"] if old["rows_per_s"] else None
    return {
        "conditions": conditions,
        "gpus": args.gpus,
        "hours": args.hours,
        "fields_per_sample": len(GAUGES) + len(COUNTERS),
        "rows": stored,
        "generate_s": round(gen_s, 1),
        "rows_per_s_generated": round(stored / gen_s),
        "partitions": len(names),
        "values": args.values,
        "bytes": sizes,
        "bytes_per_sample": round(per_sample, 1),
        "compact": {
            "bytes": chunks["bytes"],
            "bytes_per_sample": round(per_chunked, 1),
            "chunks": chunks["chunks"],
            "compaction_s": chunks["seconds"],
            "compaction_rows_per_s": round(stored / chunks["seconds"]) if chunks["seconds"] else None,
        },
        "windows": {
            "rows": windows["rows"],
            "bytes": windows["bytes"],
            "bytes_per_sample": round(per_window, 1),
            "bytes_per_window": round(windows["bytes"]["total"] / max(windows["rows"], 1), 1),
            "rollup_s": windows["rollup_s"],
        },
        "projected_16k": {
            "samples_per_day": day_16k,
            "bytes_per_day": round(per_sample * day_16k),
            "bytes_per_hourly_partition": round(per_sample * TARGET_GPUS * 3600),
            "compact_bytes_per_day": round(per_chunked * day_16k),
            "windows_bytes_per_day": round(per_window * day_16k),
            # Rows stay rows for at most HOT_HOURS (the current hour, the last one until it is compacted).
            "retention_bytes_before": round(per_sample * TARGET_GPUS * 3600 * RETENTION_H),
            "retention_bytes_after": round(
                (per_sample * HOT_HOURS + per_chunked * (RETENTION_H - HOT_HOURS)) * TARGET_GPUS * 3600
            ),
            "windows_retention_bytes": round(per_window * TARGET_GPUS * 3600 * RETENTION_H),
            # Cores busy compacting, on average, to keep up with 16,384 samples a second.
            "compaction_cores": round(TARGET_GPUS * chunks["seconds"] / stored, 3),
        },
        "drop": {
            "checkpoint_before_s": round(checkpoint_s, 2),
            "partitions": len(names),
            "rows": stored,
            "bytes": sizes["total"],
            "seconds": round(drop_s, 4),
            **_per_partition_ms(drop_each),
            "partitions_left": len(left),
            "wal_bytes": drop_wal,
        },
        "drop_small_day": {
            "gpus": SMALL_GPUS,
            "partitions": len(small_names),
            "rows": small_rows,
            "bytes": small_sizes["total"],
            "seconds": round(sum(small_each["statements"]) + sum(small_each["commit"]), 4),
            **_per_partition_ms(small_each),
        },
        "old_delete": {
            **old,
            "minutes": args.delete_minutes,
            "projected_s_for_same_rows": round(delete_same_s, 1) if delete_same_s else None,
            "projected_h_for_a_day_at_16k": round(day_16k / old["rows_per_s"] / 3600, 2) if old["rows_per_s"] else None,
            "old_task_rows_per_day": OLD_CHUNK * 86_400 // OLD_RUN_S,
        },
    }


def _per_partition_ms(each: dict[str, list[float]]) -> dict[str, list[float]]:
    """Per partition: the whole drop, the statements (the parent locked), the commit (files freed after the
    locks went), and the longest wait of an insert through the parent meanwhile; in ms."""
    totals = [a + b for a, b in zip(each["statements"], each["commit"], strict=True)]
    return {
        "per_partition_ms": [round(s * 1000, 2) for s in totals],
        **{f"{k}_ms": [round(s * 1000, 2) for s in v] for k, v in each.items()},
    }


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _drop_line(label: str, d: dict[str, Any]) -> str:
    return label.ljust(19) + (
        f"{_plural(d['partitions'], 'partition')}, {_mib(d['bytes'])}: {d['seconds'] * 1000:,.0f} ms in all; an insert "
        f"waited at most {max(d['insert_wait_ms'], default=0.0):,.1f} ms"
    )


def format_report(f: dict[str, Any]) -> str:
    c = f["conditions"]
    b = f["bytes"]
    old = f["old_delete"]
    drop, small = f["drop"], f["drop_small_day"]
    p = f["projected_16k"]
    rows = f["rows"]
    parts = ", ".join(f"{name} {size / rows:.1f}" for name, size in b.items() if name not in ("total", "heap"))
    k, w = f["compact"], f["windows"]
    chunk_parts = ", ".join(
        f"{name} {size / rows:.2f}" for name, size in k["bytes"].items() if name not in ("total", "heap")
    )
    drop_ms = drop["seconds"] * 1000
    lines = [
        f"storage bench: metric_samples, {f['gpus']:,} GPUs x {f['hours']} h at 1 s = {rows:,} rows "
        f"({f['fields_per_sample']} DCGM fields each), {_plural(f['partitions'], 'hourly partition')}",
        f"conditions: {c['database']}, PostgreSQL {c['server_version']}, shared_buffers {c['shared_buffers']}, "
        f"synchronous_commit {c['synchronous_commit']}, {c['cpu_cores']} CPU cores; rows made by INSERT ... "
        f"generate_series in {f['generate_s']:.0f} s ({f['rows_per_s_generated']:,} rows/s, indexes maintained)",
        "",
        f"size (bytes per GPU-sample on disk: heap with TOAST, and indexes; values: {f['values']})",
        f"  raw, rows        {_mib(b['total'])} = {f['bytes_per_sample']:.1f} bytes per GPU-sample: heap "
        f"{b['heap'] / rows:.1f}, {parts} (ingest's layout, kept for the hot hours)",
        f"  raw, compacted   {_mib(k['bytes']['total'])} = {k['bytes_per_sample']:.1f} bytes per GPU-sample: heap "
        f"{k['bytes']['heap'] / rows:.1f}, {chunk_parts} ({k['chunks']:,} chunks; "
        f"{b['total'] / k['bytes']['total']:.1f}x smaller)",
        f"  compaction       {k['compaction_s']:.0f} s for {rows:,} rows = {k['compaction_rows_per_s']:,} rows/s: "
        f"{p['compaction_cores']:.2f} of a core on average at {TARGET_GPUS:,} GPUs",
        f"  10 s windows     {_mib(w['bytes']['total'])} = {w['bytes_per_sample']:.1f} bytes per GPU-sample "
        f"({w['rows']:,} windows, {w['bytes_per_window']:.0f} bytes each; rolled up in {w['rollup_s']:.0f} s)",
        f"  at {TARGET_GPUS:,} GPUs   {p['samples_per_day'] / 1e9:.2f} B samples/day: raw "
        f"{_mib(p['bytes_per_day'])}/day "
        f"as rows (before), {_mib(p['compact_bytes_per_day'])}/day compacted (after); windows "
        f"{_mib(p['windows_bytes_per_day'])}/day",
        f"  {RETENTION_H} h retention  raw {_mib(p['retention_bytes_before'])} before, "
        f"{_mib(p['retention_bytes_after'])} "
        f"after ({HOT_HOURS} h as rows, the rest compacted); windows {_mib(p['windows_retention_bytes'])}",
        "",
        "retention by partition drop (DETACH, DROP, commit, one partition a transaction; after VACUUM and "
        "CHECKPOINT, as a partition past retention is long vacuumed and written out; an insert through "
        f"metric_samples every {PROBE_EVERY_S * 1000:g} ms meanwhile, as ingest writes)",
        _drop_line(f"  {f['gpus']:,} GPUs x {f['hours']} h", drop),
        _drop_line(f"  {small['gpus']} GPUs x 24 h", small),
        f"  parent locked    median {_median_ms(drop['statements_ms']):,.1f} ms a partition ({f['gpus']:,} GPUs) vs "
        f"{_median_ms(small['statements_ms']):,.1f} ms ({small['gpus']} GPUs): the catalog change only, whatever the "
        "partition holds",
        f"  files freed      at commit, after the locks are released: median {_median_ms(drop['commit_ms']):,.0f} ms "
        f"vs {_median_ms(small['commit_ms']):,.1f} ms ({drop_ms / max(drop['bytes'] / 2**30, 1e-9):,.0f} ms per GiB "
        "here); no writer waits for it",
        f"  WAL              {drop['wal_bytes'] / 1024:,.0f} KiB for {_mib(drop['bytes'])}; left: no partition, no "
        "dead row, nothing for VACUUM",
        "",
        f"retention by DELETE (as before partitioning: {OLD_CHUNK:,}-row DELETEs on a plain table with its two btree "
        "indexes, then VACUUM)",
        f"  sample           the older {old['minutes']} min of a {2 * old['minutes']}-min copy: {old['rows']:,} rows "
        f"in {old['statements']} DELETEs, {old['delete_s']:.1f} s + VACUUM {old['vacuum_s']:.1f} s = "
        f"{old['rows_per_s']:,} rows/s; WAL {_mib(old['wal_bytes'])} ({old['wal_bytes'] / max(old['rows'], 1):.0f} "
        "bytes a row)",
        f"  size             {_mib(old['bytes_before'])} before, {_mib(old['bytes_after_delete'])} after the DELETEs, "
        f"{_mib(old['bytes_after_vacuum'])} after VACUUM (the space stays allocated, for reuse)",
    ]
    if old["projected_s_for_same_rows"]:
        lines.append(
            f"  same rows        {rows:,}: about {old['projected_s_for_same_rows']:,.0f} s by DELETE (linear from the "
            f"sample; optimistic, the sample stays in memory) vs {drop['seconds']:.2f} s by drop: "
            f"{old['projected_s_for_same_rows'] / drop['seconds']:,.0f}x"
        )
    if old["projected_h_for_a_day_at_16k"] is not None:
        wal_day = old["wal_bytes"] / max(old["rows"], 1) * p["samples_per_day"]
        lines.append(
            f"  at {TARGET_GPUS:,} GPUs   about {old['projected_h_for_a_day_at_16k']:.1f} h of DELETE and VACUUM and "
            f"{_mib(wal_day)} of WAL per day of data; the old beat task (one {OLD_CHUNK:,}-row DELETE per table every "
            f"{OLD_RUN_S // 60} min) deleted {old['old_task_rows_per_day'] / 1e6:.1f} M rows/day of the "
            f"{p['samples_per_day'] / 1e9:.2f} B arriving"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if min(args.gpus, args.hours, args.delete_minutes) < 1 or args.hours > 24 * 7:
        say("--gpus, --hours and --delete-minutes must be at least 1, --hours at most a week")
        return 2
    try:
        with _database(args) as (engine, kind):
            dsn = to_libpq_url(engine.url.render_as_string(hide_password=False))
            with watch_other_load(dsn) as watched:
                figures = _measure(args, engine, kind)
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    print(format_report(figures))
    print(note(figures, watched))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
        say(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
