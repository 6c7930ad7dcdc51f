"""The campaign's machines coming back into service, as a real scheduler and a real node bring them back: the
scheduler reports a machine the service holds out of service (evicted, cordoned, in repair) that it has schedulable
again (back from the repair shop into the spare pool) with the function behind POST /api/v1/nodes/NAME/return
(service/nodes/returns.py `report_return`), at the latest before it registers a rank map that places it; the node is
`returning` and the service sends its agent the return gate (a level-1 run_checks directive, forced: it may run a
job's ranks already). The machine answers that directive as any other check (lab/sim/checks.py on its simulated
state), delivered in-process at simulated time through the ingest path's function (service/checks/loop.py `accept`)
GATE_S after the return; the service's verdict makes the node healthy, or takes it out again (an `evict` decision
the campaign's scheduler acts on like any other: lab/evaluation/campaign.py).

A gate directive nobody reported (the service found work placed on a node it held out: "placed before the gate",
one chat alert) is answered the same way; the report counts those (campaign_scoring.py `returns_totals`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from lab.evaluation.campaign_checks import machine_fault
from lab.evaluation.campaign_scoring import GateRow, NodeEnd, NodeNote
from lab.evaluation.soak import SHIP_S
from lab.sim import checks as sim_checks
from lab.sim.pool import REPAIR
from service.checks import loop as checks_loop
from service.checks.schemas import CheckResultIn
from service.config import Settings
from service.errors import Conflict
from service.models import CheckResult, Decision, Directive, Node, NodeEvent
from service.nodes.lifecycle import OUT_OF_SERVICE
from service.nodes.returns import report_return

if TYPE_CHECKING:
    from datetime import datetime

    from lab.sim.model import Cluster

ACTOR = "scheduler:campaign"
# A level-1 gate takes seconds, not the level-2 suite's minutes (lab/sim/config.py `check_seconds`): the directive
# rides the ingest answer to the agent's next batch (one ship interval at most), the checks themselves (NVML driver
# state, host figures, the RDMA ports' counters; DCGM is absent here) run in a second or two, and the results go out
# with the batch after (one more ship interval).
GATE_S = 2 * SHIP_S
SWEEP_EVERY_S = 30.0  # the adapters' default look for nodes back in service (agents/schedulers/loop.py)


@dataclass
class PendingGate:
    directive_id: str
    node: str
    level: int
    only: list[str] | None
    how: str  # return_reported | placed_before_gate
    asked_t: float
    due_t: float


class ReturnDesk:
    """One job's cluster: its scheduler's reports of machines back in service and its machines' answers to their
    return gates."""

    def __init__(self, settings: Settings, *, job_id: str) -> None:
        self.settings, self.job_id = settings, job_id
        self.pending: list[PendingGate] = []
        self.records: list[GateRow] = []
        self.returns: list[dict[str, Any]] = []  # reported: node, t_s, the state it was held in
        self.refused: list[dict[str, Any]] = []  # the service's 409 (a take-out decision still waits): retried
        self._known: set[str] = set()  # gate directives seen
        self._schedulable: frozenset[int] = frozenset()
        self._next_sweep = 0.0
        self._seq = 0

    # -- the scheduler: returns --

    def watch(self, cluster: Cluster, t: float) -> bool:
        """Each simulated second, after the cluster moved: whether to look for returns now (a machine became
        schedulable since the last look, or the periodic look is due)."""
        now = frozenset(m for m in range(cluster.machines) if cluster.schedulable(m))
        gained = bool(now - self._schedulable)
        self._schedulable = now
        return gained or t >= self._next_sweep

    def sweep(self, session: Session, cluster: Cluster, *, t: float, now: datetime) -> list[str]:
        """Report each machine the service holds out of service that the scheduler has schedulable again; the gate
        directives the service sent for them are then expected. Returns the nodes reported."""
        self._next_sweep = t + SWEEP_EVERY_S
        back = [name for m, name in enumerate(cluster.node_names) if cluster.schedulable(m)]
        held = session.execute(
            select(Node.name, Node.state).where(Node.name.in_(back), Node.state.in_(OUT_OF_SERVICE)).order_by(Node.name)
        ).all()
        reported = []
        for name, state in held:
            try:
                with session.begin_nested():
                    report_return(
                        session,
                        name=name,
                        reason="schedulable again in the campaign's scheduler (back from repair)",
                        actor=ACTOR,
                        now=now,
                    )
            except Conflict as exc:  # a take-out decision waits for a person: the next look tries again
                self.refused.append({"node": name, "t_s": t, "message": str(exc)[:300]})
                continue
            self.returns.append({"job_id": self.job_id, "node": name, "t_s": t, "was": state})
            reported.append(name)
        if reported:
            self.expect_gates(session, cluster, t=t, how="return_reported")
        self.expect_gates(session, cluster, t=t, how="placed_before_gate")  # one the ingest path found: answered too
        return reported

    # -- the machines: their gates' checks --

    def expect_gates(self, session: Session, cluster: Cluster, *, t: float, how: str) -> int:
        """The return-gate directives the service sent to this cluster's machines that nobody answers yet: each is
        answered GATE_S from now. Returns how many were new."""
        rows = session.execute(
            select(Directive.id, Directive.params, Node.name)
            .join(Node, Node.id == Directive.node_id)
            .where(Node.name.in_(cluster.node_names), Directive.kind == "run_checks")
        ).all()
        new = 0
        for directive_id, params, node in rows:
            params = params or {}
            key = str(directive_id)
            if key in self._known or params.get("concluded") or params.get("decision_id"):
                continue
            if not params.get("return_on_pass"):
                continue  # a person's look, or a spare's check: nothing waits on it here
            self._known.add(key)
            level, only = int(params.get("level", 1)), params.get("only")
            self.pending.append(PendingGate(key, node, level, only, how, asked_t=t, due_t=t + GATE_S))
            new += 1
        return new

    def gates_due(self, t: float) -> bool:
        return any(p.due_t <= t for p in self.pending)

    def deliver_due(self, session: Session, cluster: Cluster, *, t: float, now: datetime) -> list[int]:
        """The gates' results due by `t`, delivered; the ids of the decisions the service made on them (a failed
        gate's eviction). A machine in the repair shop (its agent down) answers once it is back, while its
        directive lasts."""
        made: list[int] = []
        for p in [p for p in self.pending if p.due_t <= t]:
            machine = cluster.machine_index(p.node)
            node_id = session.scalar(select(Node.id).where(Node.name == p.node))
            if machine is None or node_id is None:
                self.pending.remove(p)
                continue
            if cluster.place[machine] == REPAIR:
                if t - p.asked_t < checks_loop.DIRECTIVE_TTL_S:
                    p.due_t = t + GATE_S  # the agent runs it when the machine is back
                    continue
                self.pending.remove(p)
                self.records.append(GateRow(self.job_id, p.node, t, p.how, "expired", False, conclusion="agent down"))
                continue
            self.pending.remove(p)
            made += self._answer(session, cluster, p, machine=machine, node_id=node_id, t=t, now=now)
        return made

    def _answer(
        self, session: Session, cluster: Cluster, p: PendingGate, *, machine: int, node_id: int, t: float, now: datetime
    ) -> list[int]:
        self._seq += 1
        results = sim_checks.run(cluster, machine, level=p.level, only=p.only, seed=2_000_000 + self._seq)
        items = sim_checks.wire(results, directive_id=p.directive_id, ts=now)
        parsed = [CheckResultIn.model_validate(item, context=self.settings.time_context) for item in items]
        before = set(session.scalars(select(Decision.id).where(Decision.node_id == node_id)))
        done = checks_loop.accept(
            session, node_id=node_id, node=p.node, batch_id=uuid.uuid4(), items=parsed, now=now, settings=self.settings
        )
        conclusion = done.get(p.directive_id, "not concluded")
        made = sorted(set(session.scalars(select(Decision.id).where(Decision.node_id == node_id))) - before)
        verdicts = session.execute(
            select(CheckResult.check, CheckResult.verdict).where(CheckResult.directive_id == p.directive_id)
        ).all()
        failed = {check for check, verdict in verdicts if verdict == "fail"}
        clean = any(v == "pass" for _, v in verdicts) and not any(v == "refused" for _, v in verdicts)
        outcome = "failed" if failed else "passed" if clean else "no_verdict"
        self.records.append(
            GateRow(
                job_id=self.job_id,
                node=p.node,
                t_s=t,
                how=p.how,
                outcome=outcome,
                faulty=any(machine_fault(f.kind) for f in cluster.faults_on(machine)),
                failed_checks=tuple(sorted(failed)),
                conclusion=conclusion[:300],
            )
        )
        return made


def final_states(session: Session, cluster: Cluster, *, job_id: str, start: datetime) -> dict[str, list[Any]]:
    """At the campaign's end, from the service: each machine's state and whether a return gate still waits on it,
    and the work placed on one before its gate (each a `node_before_gate` chat alert)."""
    names = list(cluster.node_names)
    states = dict(session.execute(select(Node.name, Node.state).where(Node.name.in_(names))).all())
    waiting = {
        node
        for node, params in session.execute(
            select(Node.name, Directive.params)
            .join(Node, Node.id == Directive.node_id)
            .where(Node.name.in_(names), Directive.kind == "run_checks")
        )
        if (params or {}).get("return_on_pass") and not (params or {}).get("concluded")
    }
    placed = session.execute(
        select(Node.name, NodeEvent.at)
        .join(Node, Node.id == NodeEvent.node_id)
        .where(Node.name.in_(names), NodeEvent.kind == "placed_before_gate")
        .order_by(NodeEvent.at)
    ).all()
    return {
        "ends": [NodeEnd(job_id, name, states[name], name in waiting) for name in names if name in states],
        "notes": [NodeNote(job_id, name, round((at - start).total_seconds(), 1)) for name, at in placed],
    }
