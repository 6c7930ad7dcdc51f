"""Every node's state in the service against the simulator's ground truth (`machines` in DIR/ground_truth.json: where
each machine is, whether it runs the job's ranks, since when), as a person reading the node pages would compare them
with the cluster: a machine running ranks is never `evicted`, `in_repair` or `cordoned`; one in the repair shop is;
a free spare is not held out.

    python -m lab.evaluation.node_states --url http://127.0.0.1:8080 --token-file TOKEN --sim-dir .faultline/sim

polls both every `--every` seconds for `--duration` and prints each disagreement older than the propagation
allowance (the scheduler's long poll and ack, or its return sweep, plus a poll); the tests use `disagreements`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

OUT = ("evicted", "in_repair", "cordoned")
ALLOWANCE_S = 8.0


def disagreements(truth: dict[str, Any], states: dict[str, dict[str, Any]], now: datetime) -> list[tuple[str, float]]:
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


def node_states(url: str, token: str, *, prefix: str = "") -> dict[str, dict[str, Any]]:
    """The service's nodes (the API behind the node pages), by name."""
    page = httpx.get(
        f"{url}/api/v1/nodes", params={"limit": 1000}, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    page.raise_for_status()
    return {n["name"]: n for n in page.json()["items"] if n["name"].startswith(prefix)}


class Watch:
    """Disagreements across polls, each aged from the simulator's move or from the first poll that saw it, whichever
    is shorter: the simulator writes its ground truth once a tick, so the service may be a moment ahead of the file."""

    def __init__(self, allowance_s: float = ALLOWANCE_S) -> None:
        self.allowance_s = allowance_s
        self.polls = 0
        self.longest_s = 0.0
        self.stale: list[str] = []
        self._first_seen: dict[str, float] = {}

    def poll(self, truth: dict[str, Any], states: dict[str, dict[str, Any]]) -> list[tuple[str, float]]:
        """This poll's disagreements with their ages; the ones past the allowance are kept in `stale`."""
        self.polls += 1
        found = disagreements(truth, states, datetime.now(UTC))
        mono = time.monotonic()
        self._first_seen = {what: self._first_seen.get(what, mono) for what, _ in found}
        aged = [(what, min(age, mono - self._first_seen[what] + 0.5)) for what, age in found]
        self.longest_s = max([self.longest_s, *(age for _, age in aged)])
        self.stale += [f"{what} ({age:.0f} s)" for what, age in aged if age >= self.allowance_s]
        return aged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.evaluation.node_states", description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="the service, e.g. http://127.0.0.1:8080")
    parser.add_argument("--token-file", type=Path, required=True, help="a file holding a scheduler or operator token")
    parser.add_argument("--sim-dir", type=Path, required=True, help="the simulator's folder (its ground_truth.json)")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between polls (default 2)")
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds to watch (default 1800)")
    parser.add_argument("--allowance", type=float, default=ALLOWANCE_S, help=f"seconds (default {ALLOWANCE_S:g})")
    args = parser.parse_args(argv)
    token = args.token_file.read_text().strip()
    watch = Watch(args.allowance)
    started = time.monotonic()
    states_seen: set[tuple[str, str]] = set()
    while time.monotonic() - started < args.duration:
        try:
            truth = json.loads((args.sim_dir / "ground_truth.json").read_text())
            states = node_states(args.url, token)
        except (OSError, ValueError, httpx.HTTPError) as exc:  # the demo starting or stopping: try the next poll
            print(f"node-states: skipped a poll: {exc}", file=sys.stderr, flush=True)
        else:
            for what, age in watch.poll(truth, states):
                if age >= watch.allowance_s:
                    print(f"node-states: STALE {what} ({age:.0f} s)", flush=True)
            states_seen |= {(n, s["state"]) for n, s in states.items()}
        time.sleep(args.every)
    seen = sorted({state for _, state in states_seen})
    print(
        f"node-states: {watch.polls} polls over {args.duration / 60:.0f} min, longest disagreement "
        f"{watch.longest_s:.1f} s, {len(watch.stale)} beyond {watch.allowance_s:g} s; states seen: {', '.join(seen)}",
        flush=True,
    )
    return 1 if watch.stale else 0


if __name__ == "__main__":
    sys.exit(main())
