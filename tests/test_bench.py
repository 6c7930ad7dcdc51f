"""`faultline bench ingest` runs end to end at a tiny size (the figures themselves are not asserted:
speed is measured by the benchmark, not by tests)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
