"""Real torchrun jobs watched by real agents, shipping to the real service.

Two virtual nodes (one torchrun launcher each, rendezvous on loopback), one `faultline agent
--watch-pid` per node. The service must learn the right rank-to-node map and the step progress,
receive real py-spy stacks of a hung job when an operator asks, and the crash's traceback.
"""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

if importlib.util.find_spec("torch") is None:
    pytest.skip(
        "PyTorch CPU not installed: real torchrun tests skipped (pip install torch==2.13.0)", allow_module_level=True
    )

from lab.evaluation.torchjob.cluster import TorchCluster, launch
from service.embedded import free_port
from service.tokens import service as tokens
from tests.procs import TORCH_STEPS_S, running, wait_api, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
NODES, PROCS = 2, 2


@contextmanager
def watched_job(committed: Any, tmp_path: Path, extra_args: list[str]) -> Iterator[dict[str, Any]]:
    """The API, a torchrun job, and one agent per virtual node."""
    with Session(committed) as session:
        agent = tokens.create(session, scope="agent").token
        operator = tokens.create(session, scope="operator", name="oncall").token
        session.commit()
    job_id = f"real-{uuid.uuid4().hex[:8]}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with ExitStack() as stack:
        stack.enter_context(running(["faultline", "serve", "--port", str(port)], log=tmp_path / "api.log"))
        wait_api(url)
        cluster: TorchCluster = stack.enter_context(
            launch(NODES, PROCS, job_id=job_id, log_dir=tmp_path / "job", extra_args=extra_args)
        )
        for node in range(NODES):
            args = cluster.agent_args(node, server=url, node_name=f"vnode-{node}", spool_dir=tmp_path / f"spool-{node}")
            stack.enter_context(running(args, env={"FAULTLINE_AGENT_TOKEN": agent}, log=tmp_path / f"agent-{node}.log"))
        client = stack.enter_context(
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {operator}"}, timeout=10)
        )
        yield {"cluster": cluster, "client": client, "job_id": job_id, "url": url}


def _events(committed: Any, job_id: str, kind: str) -> list[Any]:
    with committed.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT e.rank, n.name, e.fields, e.line FROM log_events e JOIN nodes n ON n.id = e.node_id "
                    "JOIN jobs j ON j.id = e.job_id WHERE j.external_id = :job AND e.kind = :kind ORDER BY e.id"
                ),
                {"job": job_id, "kind": kind},
            )
        )


def test_rank_map_and_step_progress_reach_the_service(committed, tmp_path: Path) -> None:
    with watched_job(committed, tmp_path, ["--workers", "1"]) as w:
        w["cluster"].wait_for_step(5, timeout=TORCH_STEPS_S)

        def mapped() -> bool:
            response = w["client"].get(f"/api/v1/jobs/{w['job_id']}")
            return response.status_code == 200 and len(response.json()["ranks"]) == NODES * PROCS

        wait_for(mapped, timeout=30, what="all ranks in the job's map")
        job = w["client"].get(f"/api/v1/jobs/{w['job_id']}").json()
        assert job["world_size"] == NODES * PROCS and job["source"] == "agent"
        pids = w["cluster"].rank_pids()
        assert [(r["rank"], r["node"], r["local_rank"], r["pid"]) for r in job["ranks"]] == [
            (rank, f"vnode-{rank // PROCS}", rank % PROCS, pids[rank]) for rank in range(NODES * PROCS)
        ]

        def steps_per_rank() -> list[int]:
            ranks = [rank for rank, *_ in _events(committed, w["job_id"], "step")]
            return [ranks.count(rank) for rank in range(NODES * PROCS)]

        # Each agent ships on its own clock, so wait for every rank rather than for a total.
        wait_for(lambda: min(steps_per_rank()) >= 3, timeout=30, what="three step events from every rank")
        steps = _events(committed, w["job_id"], "step")
        by_rank: dict[int, list[int]] = {}
        for rank, node, fields, _line in steps:
            assert node == f"vnode-{rank // PROCS}"  # each agent ships its own node's ranks
            by_rank.setdefault(rank, []).append(fields["step"])
        assert sorted(by_rank) == list(range(NODES * PROCS))
        assert all(s == sorted(s) for s in by_rank.values())

        def children() -> list[Any]:
            with committed.connect() as conn:
                sql = "SELECT children FROM process_snapshots WHERE jsonb_array_length(children) > 0 LIMIT 1"
                return conn.execute(text(sql)).scalar() or []

        wait_for(lambda: bool(children()), timeout=20, what="a snapshot with the DataLoader worker")
        assert children()[0]["name"] == "pt_data_worker"  # the DataLoader worker, under its rank


def test_hung_job_gives_real_stacks_when_directed(committed, tmp_path: Path) -> None:
    with watched_job(committed, tmp_path, ["--hang-rank", "3", "--hang-at-step", "5"]) as w:
        w["cluster"].wait_for_step(4, timeout=TORCH_STEPS_S)
        wait_for(lambda: len(w["cluster"].rank_pids()) == 4, timeout=30, what="the ranks")
        wait_for(lambda: w["client"].get(f"/api/v1/jobs/{w['job_id']}").status_code == 200, timeout=30, what="the job")
        created = w["client"].post(f"/api/v1/jobs/{w['job_id']}/stack-dumps", json={"reason": "no progress"})
        assert created.status_code == 201, created.text
        path = f"/api/v1/jobs/{w['job_id']}/stack-dumps/{created.json()['id']}"

        def all_dumped() -> bool:
            got = w["client"].get(path).json()
            return {d["rank"] for d in got["dumps"]} == {0, 1, 2, 3}

        wait_for(all_dumped, timeout=60, what="a dump from every rank")
        got = w["client"].get(path).json()
        assert got["nodes_reporting"] == NODES
        frames = {d["rank"]: d["frames"] for d in got["dumps"] if not d["error"]}
        assert frames[3][0].startswith("_stuck_in_data_loading (")  # the culprit, caught where it is
        for waiting in (0, 1, 2):
            assert any(f.startswith("all_reduce (") for f in frames[waiting]), frames[waiting]


def test_crashed_rank_traceback_and_torchrun_summary_are_events(committed, tmp_path: Path) -> None:
    with watched_job(committed, tmp_path, ["--crash-rank", "1", "--crash-at-step", "5"]) as w:
        w["cluster"].wait_exited(timeout=120)
        wait_for(lambda: bool(_events(committed, w["job_id"], "child_failed")), timeout=30, what="the ChildFailedError")
        # A traceback is complete once its stream goes quiet (a chained exception could still follow).
        wait_for(
            lambda: any(t[0] == 1 for t in _events(committed, w["job_id"], "traceback")), timeout=30, what="traceback"
        )
        crashed = [t for t in _events(committed, w["job_id"], "traceback") if t[0] == 1]
        assert crashed and crashed[0][1] == "vnode-0"
        assert "RuntimeError" in crashed[0][2]["exc_type"] and "Traceback" in crashed[0][3]
        summary = _events(committed, w["job_id"], "child_failed")
        assert any(1 in (fields.get("failures") or []) or fields.get("root_rank") == 1 for *_, fields, _ in summary)
