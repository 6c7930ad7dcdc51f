"""Every node's state in the service against the simulator's ground truth, through evict -> repair -> return.

The simulated cluster (3 machines: 2 in the job, 1 spare) runs with its scheduler stand-in against a real API
(uvicorn on the test database). Evictions are written straight into the database, as in the adapters' tests; the
stand-in carries them out, the repair shop returns the machines (one straight into the job, whose node rank waited
for a spare; one into the spare pool), and the stand-in reports each return as the adapters do. Twice a second the
test reads DIR/ground_truth.json (`machines`: where each machine is, whether it runs the job's ranks, since when) and
the service's node list, and counts the disagreements older than the propagation allowance. A disagreement's age is
the shorter of how long the simulator has had the machine where it is and how long the polls have seen it: the
simulator writes its ground truth once a tick, so the service may be a moment ahead of the file.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from lab.evaluation.node_states import ALLOWANCE_S, Watch, node_states
from lab.sim.config import SimConfig
from lab.sim.runner import SimRunner
from tests.fakes.decisions import make_decision, read_node, scheduler_token
from tests.procs import api_server, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with api_server(log=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url


def test_node_states_follow_the_simulator_through_evict_repair_and_return(
    api: str, committed: Engine, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    prefix, job_id = f"st{uuid.uuid4().hex[:6]}-", f"sim-states-{uuid.uuid4().hex[:6]}"
    sim_dir = tmp_path / "sim"
    config = SimConfig(
        nodes=2, gpus_per_node=2, spares=1, scenario="healthy", seed=5, job_id=job_id, node_prefix=prefix,
        dir=sim_dir, agents=False, server=api, scheduler_token=token.read_text().strip(),
        restart_seconds=2.0, repair_seconds=12.0,
    )  # fmt: skip
    stop = threading.Event()
    runner = SimRunner(config, stop=stop, out=open(tmp_path / "sim.log", "w"))  # noqa: SIM115
    thread = threading.Thread(target=runner.run, kwargs={"handle_signals": False}, daemon=True)
    thread.start()
    watch, seen = Watch(ALLOWANCE_S), set()
    scheduler = token.read_text().strip()
    try:
        wait_for(lambda: (sim_dir / "ground_truth.json").exists(), what="the ground truth", timeout=30)
        wait_for(lambda: len(node_states(api, scheduler, prefix=prefix)) == 2, what="the job registered", timeout=30)
        m0, m1, spare = (f"{prefix}{n:03d}" for n in range(3))
        plan = [(0.0, m1), (4.0, m0)]  # the second eviction finds no spare free: its node rank waits for m1's repair
        started = time.monotonic()
        while time.monotonic() - started < 45.0:
            while plan and time.monotonic() - started >= plan[0][0]:
                make_decision(committed, node=plan.pop(0)[1], job=job_id, reason="Xid 79 on GPU 1")
            truth = json.loads((sim_dir / "ground_truth.json").read_text())
            states = node_states(api, scheduler, prefix=prefix)
            watch.poll(truth, states)
            seen |= {(n, s["state"]) for n, s in states.items()}
            back = all(states.get(m, {}).get("state") == "returning" for m in (m0, m1))
            if not plan and back and all(w["place"] != "repair" for w in truth["machines"].values()):
                break
            time.sleep(0.5)
        truth = json.loads((sim_dir / "ground_truth.json").read_text())
        states = node_states(api, scheduler, prefix=prefix)
    finally:
        stop.set()
        thread.join(timeout=60)
    print(
        f"{watch.polls} polls, longest disagreement {watch.longest_s:.1f} s, {len(watch.stale)} beyond "
        f"{ALLOWANCE_S:g} s; states seen: {sorted(seen)}"
    )
    assert not thread.is_alive()
    assert watch.polls > 10 and watch.stale == []
    # Both went through repair and came back: m1 straight into the job's waiting node rank, m0 into the spare pool.
    assert {(m1, "evicted"), (m0, "evicted"), (m1, "returning"), (m0, "returning")} <= seen
    assert truth["machines"][m1]["ranks"] and truth["machines"][spare]["ranks"]
    assert truth["machines"][m0]["place"] == "spare"
    for name in (m0, m1):
        history = read_node(api, token, name)["history"]
        kinds = [(e["kind"], e["source"]) for e in reversed(history)]
        # Reported back by the scheduler before any work was put there: nothing placed before its gate.
        assert kinds[-2:] == [("evict_done", "decision_ack"), ("return_reported", "scheduler")], kinds
        assert states[name]["work_before_gate_at"] is None
