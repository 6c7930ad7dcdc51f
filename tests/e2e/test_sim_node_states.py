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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from lab.sim.config import SimConfig
from lab.sim.runner import SimRunner
from tests.fakes.decisions import make_decision, read_node, scheduler_token
from tests.procs import api_server, wait_for

pytestmark = pytest.mark.slow

# From a machine's move in the simulator to the service's state following it: the stand-in's long poll and ack, or
# its return sweep (every 5 s), plus a poll. A disagreement younger than this is propagation, not a stale state.
ALLOWANCE_S = 8.0
OUT = ("evicted", "in_repair", "cordoned")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with api_server(log=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url


def _states(url: str, token: Path, prefix: str) -> dict[str, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token.read_text().strip()}"}
    page = httpx.get(f"{url}/api/v1/nodes", params={"limit": 1000}, headers=headers, timeout=10).json()
    return {n["name"]: n for n in page["items"] if n["name"].startswith(prefix)}


def _disagreements(truth: dict[str, Any], states: dict[str, dict[str, Any]], now: datetime) -> list[tuple[str, float]]:
    """Machines whose service state contradicts where the simulator has them, with how long the simulator has had
    them there (seconds)."""
    out = []
    for name, where in truth["machines"].items():
        state = states.get(name, {}).get("state")
        age = (now - datetime.fromisoformat(where["since_at"])).total_seconds()
        if state is None:
            continue
        if where["ranks"] and state in OUT:
            out.append((f"{name} runs ranks but the service has it {state}", age))
        elif where["place"] == "repair" and state not in OUT:
            out.append((f"{name} is in the repair shop but the service has it {state}", age))
        elif where["place"] == "spare" and state in OUT:
            out.append((f"{name} is a free spare but the service has it {state}", age))
    return out


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
    polls, stale, seen, lag = 0, [], set(), 0.0
    first_seen: dict[str, float] = {}  # each disagreement still seen: when a poll first saw it
    try:
        wait_for(lambda: (sim_dir / "ground_truth.json").exists(), what="the ground truth", timeout=30)
        wait_for(lambda: len(_states(api, token, prefix)) == 2, what="the job registered", timeout=30)
        m0, m1, spare = (f"{prefix}{n:03d}" for n in range(3))
        plan = [(0.0, m1), (4.0, m0)]  # the second eviction finds no spare free: its node rank waits for m1's repair
        started = time.monotonic()
        while time.monotonic() - started < 45.0:
            while plan and time.monotonic() - started >= plan[0][0]:
                make_decision(committed, node=plan.pop(0)[1], job=job_id, reason="Xid 79 on GPU 1")
            truth = json.loads((sim_dir / "ground_truth.json").read_text())
            states = _states(api, token, prefix)
            now = datetime.now(UTC)
            polls += 1
            found = _disagreements(truth, states, now)
            first_seen = {what: first_seen.get(what, time.monotonic()) for what, _ in found}
            ages = [(what, min(age, time.monotonic() - first_seen[what] + 0.5)) for what, age in found]
            lag = max([lag, *(age for _, age in ages)])
            stale += [f"{what} ({age:.0f} s)" for what, age in ages if age >= ALLOWANCE_S]
            seen |= {(n, s["state"]) for n, s in states.items()}
            back = all(states.get(m, {}).get("state") == "returning" for m in (m0, m1))
            if not plan and back and all(w["place"] != "repair" for w in truth["machines"].values()):
                break
            time.sleep(0.5)
        truth = json.loads((sim_dir / "ground_truth.json").read_text())
        states = _states(api, token, prefix)
    finally:
        stop.set()
        thread.join(timeout=60)
    print(
        f"{polls} polls, longest disagreement {lag:.1f} s, {len(stale)} beyond {ALLOWANCE_S:g} s; "
        f"states seen: {sorted(seen)}"
    )
    assert not thread.is_alive()
    assert stale == []
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
