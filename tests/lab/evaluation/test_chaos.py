"""The chaos campaign's scheduler and killer (lab/evaluation/chaos.py) on real processes: a Redis server, a child
started as the service's are and an embedded PostgreSQL, killed with real signals and restarted; and the
duplicate-decision count."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import psycopg
import pytest

from lab.evaluation.campaign_chaos import comparison, duplicate_decisions
from lab.evaluation.chaos import (
    TARGETS,
    Blow,
    Chaos,
    Target,
    kill_group,
    restart_postgres,
    schedule,
    stop_postgres_immediately,
)
from service.embedded import free_port, redis_answers, start_redis
from service.processes import spawn


def test_schedule_is_seeded_sorted_and_hits_every_target() -> None:
    a = schedule(7, blows=8, span_s=(60.0, 3000.0))
    assert a == schedule(7, blows=8, span_s=(60.0, 3000.0))
    assert a != schedule(8, blows=8, span_s=(60.0, 3000.0))
    assert [b.t_s for b in a] == sorted(b.t_s for b in a)
    assert all(60.0 <= b.t_s <= 3000.0 and 1.0 <= b.down_s <= 6.0 for b in a)
    assert sorted(b.target for b in a) == sorted(TARGETS * 2)  # each in turn: twice each
    assert all(b.land_s == 0.0 for b in a if b.target == "postgres")  # the database's blow lands at its tick
    assert schedule(1, blows=0, span_s=(0.0, 1.0)) == []
    with pytest.raises(ValueError):
        schedule(1, blows=2, span_s=(10.0, 5.0))


def _redis(port: int, *command: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        parts = [f"*{len(command)}\r\n".encode()] + [f"${len(c)}\r\n{c}\r\n".encode() for c in command]
        s.sendall(b"".join(parts))
        return s.recv(64)


def test_redis_and_a_service_child_killed_and_restarted(tmp_path: Path) -> None:
    redis = start_redis(tmp_path, port=free_port())
    port = int(redis.url.rsplit(":", 1)[1].split("/")[0])
    http_port = free_port()
    children = {"api": spawn(["http.server", "--bind", "127.0.0.1", str(http_port)], env=dict(os.environ))}
    try:
        assert _redis(port, "SET", "k", "v").startswith(b"+OK")
        time.sleep(1.5)  # the append-only file is written every second

        def restart_redis() -> int:
            nonlocal redis
            redis = start_redis(tmp_path, port=port)
            return redis.process.pid

        def kill_redis() -> int:
            redis.process.kill()
            redis.process.wait(10)
            return redis.process.pid

        def respawn() -> int:
            children["api"] = spawn(["http.server", "--bind", "127.0.0.1", str(http_port)], env=dict(os.environ))
            return children["api"].pid

        first_redis, first_api = redis.process.pid, children["api"].pid
        chaos = Chaos(
            [Blow(10.0, "redis", 0.0, 0.3), Blow(20.0, "api", 0.2, 0.3)],
            {
                "redis": Target("redis", kill_redis, restart_redis),
                "api": Target("api", lambda: kill_group(children["api"]), respawn),
            },
            say=lambda _m: None,
        )
        chaos.due(5.0)
        assert chaos.log == []  # nothing due yet
        chaos.due(10.0)
        chaos.wait_idle()
        assert chaos.up["redis"].is_set() and redis_answers(port)
        assert _redis(port, "GET", "k").endswith(b"v\r\n")  # what it had written came back
        chaos.due(25.0)
        chaos.wait_idle()
        time.sleep(1.0)
        # The restarted child outlives the blow: started on the chaos thread, which lives on (PR_SET_PDEATHSIG).
        assert children["api"].poll() is None and children["api"].pid != first_api
        assert [e["target"] for e in chaos.log] == ["redis", "api"]
        assert chaos.log[0]["pid"] == first_redis and chaos.log[0]["new_pid"] == redis.process.pid
        assert all("error" not in e and e["killed_at"] < e["restarted_at"] for e in chaos.log)
        assert chaos.log[1]["tick_s"] == 25.0
    finally:
        for child in children.values():
            if child.poll() is None:
                kill_group(child)
        redis.stop()


def test_postgres_immediate_stop_and_restart(tmp_path: Path) -> None:
    pgserver = pytest.importorskip("pgserver")
    server = pgserver.get_server(tmp_path / "pg", cleanup_mode="stop")
    try:
        uri = server.get_uri()
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (x int)")
            conn.execute("INSERT INTO kept VALUES (1)")
        chaos = Chaos(
            [Blow(1.0, "postgres", 0.0, 3.0)],
            {
                "postgres": Target(
                    "postgres",
                    lambda: stop_postgres_immediately(Path(server.pgdata)),
                    lambda: restart_postgres(server),
                )
            },
            say=lambda _m: None,
        )
        chaos.due(1.0)
        assert not chaos.db_up.is_set()  # dealt at the tick: the harness's database steps wait from here
        with pytest.raises(psycopg.OperationalError):  # down for 3 s before its restart starts
            psycopg.connect(uri, connect_timeout=1)
        chaos.wait_idle()
        assert chaos.db_up.is_set()
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:  # the same address, crash-recovered
            assert conn.execute("SELECT x FROM kept").fetchall() == [(1,)]
        assert chaos.log[0]["pid"] is not None and "error" not in chaos.log[0], chaos.log
        assert chaos.log[0]["new_pid"] not in (None, chaos.log[0]["pid"])  # a new postmaster
    finally:
        server.cleanup()


def test_duplicate_decisions_and_the_comparison() -> None:
    decisions = [
        {"id": 1, "job_id": "j", "t_s": 100.0, "kind": "evict", "node": "n1"},
        {"id": 2, "job_id": "j", "t_s": 150.0, "kind": "evict", "node": "n1"},  # the same fault decided again
        {"id": 3, "job_id": "j", "t_s": 400.0, "kind": "evict", "node": "n1"},  # a later fault of the machine
        {"id": 4, "job_id": "j", "t_s": 160.0, "kind": "diagnose", "node": "n1"},  # another kind
        {"id": 5, "job_id": "j", "t_s": 110.0, "kind": "restart", "node": None},  # job-level: not counted
        {"id": 6, "job_id": "j", "t_s": 120.0, "kind": "restart", "node": None},
    ]
    assert duplicate_decisions(decisions) == [2]
    totals = {
        "faults": 2, "recall": 1.0, "recall_all": 1.0, "median_s": 5.0, "p95_s": 9.0, "false_accusations": 0,
        "decisions": 6, "incidents_per_fault": 1.0,
    }  # fmt: skip
    chaos = {"totals": totals, "decisions": decisions, "ettr_projection": {"ettr": 0.97}}
    calm = {"totals": {**totals, "recall": 0.5}, "decisions": decisions[:1]}
    rows = {name: (a, b) for name, a, b in comparison(chaos, calm)}
    assert rows["recall (localizable)"] == (0.5, 1.0)
    assert rows["duplicate decisions"] == (0, 1)
    assert rows["projected ETTR (16k GPUs)"] == (None, 0.97)
    assert all(a is None for _, a, _ in comparison(chaos, None))


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--campaign", "--chaos", "--faults", "1"], {"FAULTLINE_DATABASE_URL": "postgresql://x@h/db"}, "unset"),
        (["--campaign", "--chaos", "--faults", "1", "--calm", "/nonexistent.json"], {}, "--calm"),
        (["--campaign", "--project-ettr", "x.json"], {}, "give one"),
    ],
)
def test_bad_chaos_arguments_are_refused_before_anything_starts(
    argv: list[str], env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from lab.evaluation.cli import main

    monkeypatch.delenv("FAULTLINE_DATABASE_URL", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main([*argv, "--data-dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "postgres").exists()  # no server was started
