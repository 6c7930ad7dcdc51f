"""The preflight across real nodes: one `faultline preflight` process per node, joined in a gloo process group (the
control plane: who measures what, and the figures back), node rank 0 coordinating the search.

Each round the coordinator sends the round's groups; every node in a group runs the check suite's all-reduce
(agents/checks/collectives.py: its ranks are their own processes, killed at the probe's timeout) with the group's
first node as the rendezvous, on a port that node picked, plus a latency figure and an all-to-all; the figures
come back through the control plane and the coordinator judges them (agents/preflight/search.py). The control plane
carries a few hundred bytes a round, so gloo on the hosts' ordinary network is enough, whatever the data plane's
backend (NCCL on GPUs, gloo on CPU).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agents.checks import collectives
from agents.checks.collectives import Peer
from agents.checks.result import CheckResult
from agents.preflight import local
from agents.preflight.search import Criteria, Figures, Group, LocalReport, Outcome, Round, probe_timeout, search

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Plan:
    """Where this node stands in the allocation, and how to measure."""

    node: str  # this node's name (the service's, usually its hostname)
    addr: str  # where the other nodes reach this one
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    backend: str = "nccl"  # the data plane's: nccl on GPUs, gloo on CPU
    nproc: int = 1  # ranks per node in the cross-node groups (the node's GPUs with NCCL)
    local_ranks: int = 1  # ranks of the local all-reduce (fewer than two: not run)
    nbytes: int = 64 * 2**20
    iters: int = 10
    latency_iters: int = 20
    probe_timeout_s: float = 30.0
    local_timeout_s: float = 60.0
    deadline_s: float = 180.0
    criteria: Criteria = field(default_factory=Criteria)


@dataclass(slots=True)
class Run:
    """What every node learns at the end (the coordinator's outcome, as plain data)."""

    nodes: list[str]
    outcome: dict[str, Any] | None = None
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # node -> its check results (wire)
    aborted: str | None = None
    seconds: float = 0.0
    local_seconds: float = 0.0  # this node's own checks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def run(plan: Plan, *, fleet: Callable[[list[dict[str, Any]]], Criteria] | None = None) -> Run:
    """The whole preflight, from this node's side. `fleet`, on the coordinator, turns the nodes' local results into
    the criteria (the service's fleet cut-offs, fetched by the caller); never raises for a peer that failed or a
    control plane that broke: the run comes back `aborted`, and the job is not held for it."""
    import torch.distributed as dist

    started = time.monotonic()
    deadline = started + plan.deadline_s
    out = Run(nodes=[])
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{plan.master_addr}:{plan.master_port}",
            rank=plan.node_rank,
            world_size=plan.nnodes,
            timeout=timedelta(seconds=plan.deadline_s),  # also how long the nodes wait for each other to come
        )
    except Exception as exc:  # a node that never came, a port taken: no verdict, the job is not held
        out.aborted = f"the nodes did not meet at {plan.master_addr}:{plan.master_port}: {type(exc).__name__}: {exc}"
        out.seconds = round(time.monotonic() - started, 1)
        return out
    try:
        began = time.monotonic()
        results = local.run_local(backend=plan.backend, gpus=plan.local_ranks, timeout=plan.local_timeout_s)
        out.local_seconds = round(time.monotonic() - began, 1)
        mine = (plan.node, plan.addr, [r.to_wire() for r in results])
        everyone: list[Any] = [None] * plan.nnodes
        dist.all_gather_object(everyone, mine)
        out.nodes = [n for n, _, _ in everyone]
        addrs = {n: a for n, a, _ in everyone}
        out.results = {n: list(r) for n, _, r in everyone}
        if plan.node_rank == 0:
            criteria = fleet(everyone_results(out.results)) if fleet else plan.criteria
            reports = {n: local.report_of(n, [CheckResult(**r) for r in out.results[n]]) for n in out.nodes}
            try:
                outcome = _coordinate(plan, out.nodes, addrs, reports, criteria, deadline)
            except Exception as exc:  # tell the others at once rather than leave them waiting for the time-out
                dist.broadcast_object_list([("done", {"aborted": f"{type(exc).__name__}: {exc}"[:500]})], src=0)
                raise
            out.outcome = as_plain(outcome)
            dist.broadcast_object_list([("done", out.outcome)], src=0)
        else:
            out.outcome = _follow(plan, out.nodes, addrs)
            if "aborted" in out.outcome:
                out.aborted, out.outcome = f"the coordinator failed: {out.outcome['aborted']}", None
    except Exception as exc:
        log.debug("preflight control plane", exc_info=True)
        out.aborted = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # a broken group cannot always be torn down; the process ends anyway
            log.debug("destroy_process_group", exc_info=True)
    out.seconds = round(time.monotonic() - started, 1)
    return out


def everyone_results(results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [{**r, "node": n} for n, rs in results.items() for r in rs]


def _coordinate(
    plan: Plan,
    nodes: list[str],
    addrs: dict[str, str],
    reports: dict[str, LocalReport],
    criteria: Criteria,
    deadline: float,
) -> Outcome:
    import torch.distributed as dist

    finished: list[float] = []

    def measure(groups: list[Group]) -> list[Figures]:
        timeout = probe_timeout(finished, ceiling=plan.probe_timeout_s)
        dist.broadcast_object_list([("measure", (groups, timeout))], src=0)
        figures = _measure_my_part(plan, nodes, addrs, groups, timeout)
        finished.extend(f.seconds for f in figures if f.seconds is not None and not f.error)
        return figures

    # A round may take up to a probe's timeout: none starts that could end past the deadline.
    def stop() -> bool:
        return time.monotonic() + probe_timeout(finished, ceiling=plan.probe_timeout_s) + 5 > deadline

    return search(nodes, measure, local=reports, criteria=criteria, stop=stop, on_round=_stamp)


def _stamp(r: Round) -> None:
    """When the round ended: the service counts a node's failing rounds in time, as repeated observations."""
    r.ended_at = datetime.now(UTC).isoformat()


def _follow(plan: Plan, nodes: list[str], addrs: dict[str, str]) -> dict[str, Any]:
    import torch.distributed as dist

    while True:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        kind, payload = box[0]
        if kind == "done":
            return dict(payload)
        groups, timeout = payload
        _measure_my_part(plan, nodes, addrs, [tuple(g) for g in groups], float(timeout))


def _measure_my_part(
    plan: Plan, nodes: list[str], addrs: dict[str, str], groups: list[Group], timeout: float
) -> list[Figures]:
    """Every node: its group's all-reduce (if it is in one), then everybody's figures gathered; each group's figure
    is its slowest member's (an error anywhere is the group's)."""
    import torch.distributed as dist

    mine = next(((i, g) for i, g in enumerate(groups) if plan.node in g), None)
    port = free_port() if mine is not None and mine[1][0] == plan.node else None
    ports: list[Any] = [None] * plan.nnodes
    dist.all_gather_object(ports, (plan.node, port))
    leader_port = {n: p for n, p in ports if p is not None}
    figures: dict[str, Any] | None = None
    if mine is not None:
        _, group = mine
        peer = Peer(addrs[group[0]], leader_port[group[0]], group.index(plan.node), len(group))
        result = collectives.allreduce(
            "preflight_allreduce",
            nproc=plan.nproc,
            backend=plan.backend,
            peer=peer,
            nbytes=plan.nbytes,
            iters=plan.iters,
            timeout=timeout,
            latency_iters=plan.latency_iters,
            alltoall=True,
        )
        error = None
        if result.status != "pass":
            error = "; ".join(result.evidence.get("errors") or result.evidence.get("problems") or ["failed"])[:300]
        figures = {
            "busbw": result.measured,
            "latency": result.evidence.get("latency_us"),
            "error": error,
            "seconds": result.duration_s,
        }
    everyone: list[Any] = [None] * plan.nnodes
    dist.all_gather_object(everyone, (plan.node, figures))
    by_node = dict(everyone)
    out = []
    for group in groups:
        figs = [by_node.get(n) for n in group]
        errors = [f"{n}: {f['error']}" for n, f in zip(group, figs, strict=True) if f and f["error"]]
        if errors or any(f is None for f in figs):
            out.append(Figures(error="; ".join(errors)[:300] or "a node did not measure"))
            continue
        bws = [f["busbw"] for f in figs if f and f["busbw"] is not None]
        lats = [f["latency"] for f in figs if f and f["latency"] is not None]
        took = [f["seconds"] for f in figs if f and f.get("seconds") is not None]
        out.append(Figures(min(bws) if bws else None, max(lats) if lats else None, seconds=max(took) if took else None))
    return out


def as_plain(outcome: Outcome) -> dict[str, Any]:
    """The outcome as JSON-able data: what every node prints and what the service is sent."""
    return {
        "nodes": outcome.nodes,
        "rounds": [plain_round(r) for r in outcome.rounds],
        "named": [_named(n) for n in outcome.named],
        "unresolved": [_named(n) for n in outcome.unresolved],
        "measurements": outcome.measurements,
        "complete": outcome.complete,
    }


def plain_round(r: Round) -> dict[str, Any]:
    return {
        "index": r.index,
        "phase": r.phase,
        "seconds": r.seconds,
        "at": r.ended_at,
        "groups": [
            {"nodes": list(m.nodes), "verdict": m.verdict, "why": m.why, "figures": dict(m.figures), "ref": m.ref}
            for m in r.groups
        ],
    }


def _named(n: Any) -> dict[str, Any]:
    return {"node": n.node, "shape": n.shape, "why": n.why, "peer": n.peer, "rounds": list(n.rounds)}
