"""`faultline eval --soak`: its arguments, its targets, and short real soaks through PostgreSQL and the real
diagnosis passes (a healthy job draws nothing; a job with a fatal Xid is evicted, so the harness's data does
reach the detectors)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from sqlalchemy import Engine

from lab.evaluation import soak
from lab.evaluation.soak import run_soak
from lab.evaluation.soak_config import DAY_S, SoakConfig, SoakJob, parse_duration, parse_jobs
from lab.evaluation.soak_report import targets
from service.config import get_settings
from service.ingest.service import store_batches
from tests.conftest import count


def test_durations() -> None:
    assert parse_duration("24h") == 86400 and parse_duration("90m") == 5400 and parse_duration("2d") == 172800
    assert parse_duration("45") == 45 and parse_duration("1.5h") == 5400
    for bad in ("", "0h", "-1h", "1w", "h", "1 hour"):
        with pytest.raises(ValueError, match="bad soak duration"):
            parse_duration(bad)


def test_jobs() -> None:
    jobs = parse_jobs("4x8:tp8, 8x8:tp8pp4,2x4")
    assert [(j.name, j.nodes, j.gpus_per_node, j.tp, j.pp) for j in jobs] == [
        ("a", 4, 8, 8, 1),
        ("b", 8, 8, 8, 4),
        ("c", 2, 4, 1, 1),
    ]
    assert parse_jobs("2x2:pp2")[0].pp == 2
    for bad in ("", "4x", "4x8:tp3", "0x8", "4x8:dp2", "4*8"):
        with pytest.raises(ValueError, match="soak job"):
            parse_jobs(bad)


def _report(evictions: list[int], diagnoses: list[int], days: float) -> dict[str, Any]:
    jobs = [{"evictions": e, "diagnoses": d} for e, d in zip(evictions, diagnoses, strict=True)]
    return {"simulated_s": days * DAY_S, "jobs": jobs}


def test_targets_count_every_eviction_and_diagnoses_per_job_day() -> None:
    def status(report: dict[str, Any]) -> list[str]:
        return [t["status"] for t in targets(report)]

    assert status(_report([0, 0, 0], [1, 0, 1], 1.0)) == ["PASS", "PASS"]
    assert status(_report([0, 1, 0], [0, 0, 0], 1.0)) == ["FAIL", "PASS"]
    assert status(_report([0, 0, 0], [0, 2, 0], 1.0)) == ["PASS", "FAIL"]  # one job over, though 0.67 on average
    assert status(_report([0, 0, 0], [0, 2, 0], 2.0)) == ["PASS", "PASS"]


def _soak(jobs: tuple[SoakJob, ...], seconds: float) -> dict[str, Any]:
    config = SoakConfig(duration_s=seconds, seed=7, jobs=jobs)
    return run_soak(config, get_settings(), say=lambda _: None, processes=1)


def test_a_healthy_soak_ships_every_kind_of_data_and_draws_no_decision(committed: Engine) -> None:
    report = _soak((SoakJob("a", 2, 2), SoakJob("b", 2, 4, tp=4)), 240.0)
    assert [j["job_id"].rsplit("-", 1)[1] for j in report["jobs"]] == ["a", "b"]
    for job in report["jobs"]:
        # Beat's marks fall every interval whatever the start's phase; a pass after a stack answer comes on top.
        assert job["beat_passes"] == 240 / get_settings().diagnosis_interval_s <= job["passes"]
        assert job["steps_trained"] > 100 and job["faults"] == []
        assert job["batches"] >= job["nodes"] * 240 / soak.SHIP_S * 0.6  # a late node and agent restarts ship less
        assert "agent_late_start" in job["noise"]  # realism is on
    with committed.connect() as conn:
        for table in ("metric_samples", "node_samples", "log_events", "process_snapshots"):
            assert count(conn, table) > 0, table
    assert report["decisions"] == [] and all(t["status"] == "PASS" for t in report["targets"])


def test_a_fatal_xid_in_a_soak_job_is_evicted(committed: Engine) -> None:
    report = _soak((SoakJob("a", 2, 2, scenario="gpu_lost", fault_after=60.0),), 150.0)
    (job,) = report["jobs"]
    (fault,) = job["faults"]
    evicted = {d["node"] for d in report["decisions"] if d["kind"] == "evict"}
    assert evicted == set(fault["nodes"])
    # The Xid 79 comes 2 s after the fault's first sign (AER); its agent ships it at once, as `faultline agent` does
    # (its block complete a second later), not at the next 5 s tick, and the fast pass decides it then.
    assert all(62.0 <= d["t_s"] <= 64.0 for d in report["decisions"] if d["kind"] == "evict")
    assert targets(report)[0]["status"] == "FAIL"  # the soak's own target: an eviction fails it


def test_a_gpu_reset_xid_resets_that_gpu_and_keeps_the_node(committed: Engine) -> None:
    report = _soak((SoakJob("a", 2, 2, scenario="gpu_reset", fault_after=60.0),), 150.0)
    (fault,) = report["jobs"][0]["faults"]
    (node,) = fault["nodes"]
    kinds = {(d["kind"], d["node"]) for d in report["decisions"]}
    assert ("reset_gpu", node) in kinds and not any(k == "evict" for k, _ in kinds), report["decisions"]
    reset = next(d for d in report["decisions"] if d["kind"] == "reset_gpu")
    assert reset["gpu"] == fault["gpus"][node][0]


def test_an_interrupt_ends_the_soak_between_two_simulated_seconds(
    committed: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C or SIGTERM in the middle of a write lets the write finish: an interrupt inside a COPY left its
    connection unusable and the failed rollback hid the interrupt (a campaign worker died without its report)."""
    stored: list[int] = []

    def interrupted_while_storing(session: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        store_batches(session, **kwargs)
        stored.append(len(kwargs["batches"]))

    monkeypatch.setattr(soak, "store_batches", interrupted_while_storing)
    report = _soak((SoakJob("a", 2, 2),), 240.0)
    assert stored and stored[0] > 0  # the batch being stored when the signal came was stored whole
    assert report["interrupted"] and report["simulated_s"] == soak.SHIP_S
    with committed.connect() as conn:
        assert count(conn, "node_samples") > 0
