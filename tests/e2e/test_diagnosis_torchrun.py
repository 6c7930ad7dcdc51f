"""End to end on a real torchrun job: agents, API, a real Celery worker with beat, and the decisions API.

Four virtual nodes (one torchrun launcher each) with two ranks each. A hung rank must end in exactly one
eviction naming its node, within the job's hang timeout plus 30 s; the same exception on every rank must be
blamed on user code and evict nothing.
"""

from __future__ import annotations

import importlib.util
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session

if importlib.util.find_spec("torch") is None:
    pytest.skip(
        "PyTorch CPU not installed: real torchrun tests skipped (pip install torch==2.13.0)", allow_module_level=True
    )

from lab.evaluation.torchjob.cluster import TorchCluster, launch
from service.embedded import free_port
from service.tokens import service as tokens
from tests.procs import TORCH_STEPS_S, running, wait_api, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
NODES, PROCS = 4, 2
HANG_TIMEOUT_S = 20


@contextmanager
def diagnosed_job(committed: Any, tmp_path: Path, extra_args: list[str]) -> Iterator[dict[str, Any]]:
    """API, worker with beat, the job registered with a short hang timeout, and one agent per virtual node."""
    with Session(committed) as session:
        agent = tokens.create(session, scope="agent").token
        scheduler = tokens.create(session, scope="scheduler", name="scheduler").token
        session.commit()
    job_id = f"diag-{uuid.uuid4().hex[:8]}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with ExitStack() as stack:
        stack.enter_context(running(["faultline", "serve", "--port", str(port)], log=tmp_path / "api.log"))
        stack.enter_context(running(["faultline", "work", "--beat"], log=tmp_path / "worker.log"))
        wait_api(url)
        client = stack.enter_context(
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {scheduler}"}, timeout=10)
        )
        registered = client.post(
            "/api/v1/jobs", json={"job_id": job_id, "world_size": NODES * PROCS, "hang_timeout_s": HANG_TIMEOUT_S}
        )
        assert registered.status_code == 200, registered.text
        cluster: TorchCluster = stack.enter_context(
            launch(NODES, PROCS, job_id=job_id, log_dir=tmp_path / "job", extra_args=extra_args)
        )
        for node in range(NODES):
            args = cluster.agent_args(node, server=url, node_name=f"vnode-{node}", spool_dir=tmp_path / f"spool-{node}")
            stack.enter_context(running(args, env={"FAULTLINE_AGENT_TOKEN": agent}, log=tmp_path / f"agent-{node}.log"))
        yield {"cluster": cluster, "client": client, "job_id": job_id}


def _decisions(client: httpx.Client, job_id: str, **filters: str) -> list[dict[str, Any]]:
    response = client.get("/api/v1/decisions", params={"job": job_id, **filters})
    assert response.status_code == 200, response.text
    return response.json()["items"]


def test_a_hung_rank_is_evicted_by_node_within_the_hang_timeout_plus_30_s(committed, tmp_path: Path) -> None:
    hung_rank = 5
    with diagnosed_job(committed, tmp_path, ["--hang-rank", str(hung_rank), "--hang-at-step", "6"]) as job:
        job["cluster"].wait_for_step(5, timeout=TORCH_STEPS_S)
        hung_since = time.monotonic()  # step 6 never completes from here on
        client, job_id = job["client"], job["job_id"]
        wait_for(
            lambda: bool(_decisions(client, job_id, kind="evict")),
            timeout=HANG_TIMEOUT_S + 30 - (time.monotonic() - hung_since),
            what="an eviction decision",
        )
        took = time.monotonic() - hung_since
        time.sleep(5)  # a late second eviction would show now
        evictions = _decisions(client, job_id, kind="evict")
        assert [d["node"] for d in evictions] == [f"vnode-{hung_rank // PROCS}"], evictions
        (decision,) = evictions
        assert decision["state"] == "pending"
        incident = client.get(f"/api/v1/incidents/{decision['incident_id']}").json()
        assert incident["root_cause"] == "hang" and incident["blame"] == "infrastructure"
        assert incident["suspects"][0]["node"] == f"vnode-{hung_rank // PROCS}"
        stacks = [f for f in incident["findings"] if f["detector"] == "stacks" and f["subject_kind"] == "node"]
        assert stacks and str(hung_rank) in str(stacks[0]["evidence"]), incident["findings"]
        print(f"hang decided {took:.1f} s after the last step (limit {HANG_TIMEOUT_S + 30} s)")


def test_the_same_exception_on_every_rank_is_user_code_and_evicts_nothing(committed, tmp_path: Path) -> None:
    with diagnosed_job(committed, tmp_path, ["--user-bug-at-step", "4"]) as job:
        job["cluster"].wait_for_step(3, timeout=TORCH_STEPS_S)  # the ranks' start is not what this times
        client, job_id = job["client"], job["job_id"]

        def user_code_incident() -> list[dict[str, Any]]:
            items = client.get("/api/v1/incidents", params={"job": job_id}).json()["items"]
            return [i for i in items if i["blame"] == "user_code"]

        wait_for(lambda: bool(user_code_incident()), timeout=120, what="an incident blamed on user code")
        time.sleep(10)  # the job's end (crashed ranks, torchrun's summary) must not turn into an eviction
        assert _decisions(client, job_id, kind="evict") == []
        (incident,) = user_code_incident()
        assert incident["root_cause"] == "user_code"
        kinds = {d["kind"] for d in _decisions(client, job_id)}
        assert kinds <= {"rollback", "none"}, kinds
