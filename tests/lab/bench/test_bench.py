"""`faultline bench ingest` runs end to end at a tiny size (the figures themselves are not asserted:
speed is measured by the benchmark, not by tests)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import text

pytestmark = pytest.mark.slow


def test_bench_ingest_runs_and_counts_every_answered_sample(tmp_path, committed):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "faultline", "bench", "ingest", "--nodes", "8", "--gpus-per-node", "4",
         "--duration", "2", "--capacity-seconds", "2", "--connections", "8", "--api-workers", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    assert figures["rows"]["match"] and figures["rows"]["stored"] >= figures["rows"]["ok_samples"] > 0
    assert figures["paced"]["non_2xx"] == 0 and figures["capacity"]["samples_per_s"] > 0
    assert figures["copy_baseline"]["rows_per_s"] > 0
    assert "HTTP capacity / COPY" in result.stdout and "GPU samples/s" in result.stdout


def test_bench_rejects_nonsense_arguments():
    result = subprocess.run(
        [sys.executable, "-m", "faultline", "bench", "ingest", "--nodes", "0"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "must be positive" in result.stderr


def test_bench_storage_times_retention_against_a_writer_and_leaves_nothing_behind(tmp_path, committed):
    out = tmp_path / "storage.json"
    result = subprocess.run(
        [sys.executable, "-m", "faultline", "bench", "storage", "--gpus", "16", "--hours", "1", "--delete-minutes", "1",
         "--json", str(out)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    for drop in (figures["drop"], figures["drop_small_day"]):
        # Every partition timed in its parts, and the probe inserted through the parent meanwhile.
        assert len(drop["statements_ms"]) == len(drop["commit_ms"]) == len(drop["insert_wait_ms"]) == drop["partitions"]
        assert all(wait > 0 for wait in drop["insert_wait_ms"])
    assert figures["drop"]["partitions_left"] == 0
    assert "an insert waited at most" in result.stdout and "files freed" in result.stdout
    # The same samples compacted (one chunk per GPU-hour) and rolled up into windows (one per GPU and 10 s).
    assert figures["compact"]["chunks"] == 16 and figures["windows"]["rows"] == 16 * 360
    assert figures["compact"]["bytes_per_sample"] < figures["bytes_per_sample"] / 2
    assert "raw, compacted" in result.stdout and "10 s windows" in result.stdout
    with committed.connect() as conn:
        left = conn.execute(
            text(
                "SELECT count(*) FROM pg_class WHERE relname LIKE 'metric\\_samples\\_p209%' "
                "OR relname LIKE 'metric\\_chunks\\_p209%' OR relname LIKE 'metric\\_windows\\_p209%' "
                "OR relname = :plain"
            ),
            {"plain": "bench_storage_unpartitioned"},
        ).scalar_one()
        probe_rows = conn.execute(text("SELECT count(*) FROM metric_samples WHERE job_id = -4242")).scalar_one()
    assert left == 0 and probe_rows == 0


def test_bench_diagnosis_times_a_cold_pass_steady_ones_and_the_first_after_a_worker_restart(tmp_path, committed):
    out = tmp_path / "diagnosis.json"
    result = subprocess.run(
        [sys.executable, "-m", "faultline", "bench", "diagnosis", "--gpus", "16", "--passes", "2", "--history", "60",
         "--json", str(out)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    [size] = json.loads(out.read_text())["sizes"]
    assert size["gpus"] == 16 and size["cold_s"] > 0 and size["p95_s"] > 0
    # A fresh process ran the pass on what the passes before stored (its stages timed as any pass's).
    assert size["restart_s"] > 0 and "rollup" in size["restart_timings"]
    assert "after a worker restart" in result.stderr + result.stdout and "restart s" in result.stdout
