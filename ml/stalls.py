"""Why a job has made no net progress: waiting for an action or a spare, hung, down, or restarting from the same
checkpoint again and again.

Input: what the service knows about a job whose highest step (its high-water mark) has not moved for longer than the
configured time: the step records of one logging stream since it was reached, the job's remedies decided since (an
eviction, a GPU reset, a restart), how many of its processes report, and its checkpoint saves. Output: one reason
(the state the job is in now, the one an on-call engineer acts on) and the facts behind it. Plain data in and out:
no database, no settings.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from ml.ettr import CheckpointSave, StepRecord

# A job that logged no step for this long (or 5x its usual step time, if longer) is not stepping now.
QUIET_S = 60.0
QUIET_FACTOR = 5.0
REMEDIES = ("evict", "reset_gpu", "restart", "rollback")
_WAITING = ("pending", "awaiting_approval")

# The reasons, the first that holds wins: what the job waits on now before what it did before.
WAITING_FOR_ACTION = "waiting_for_action"  # a remedy decided, waiting for a scheduler or a person
WAITING_FOR_SPARE = "waiting_for_spare"  # a machine taken out, and no step since: no replacement, or not restarted
HUNG = "hung"  # no step, processes alive
DOWN = "down"  # no step, no process reports
RESTART_LOOP = "restart_loop"  # restarted twice or more, never past the step it had reached
CATCHING_UP = "catching_up"  # restarted once, redoing steps since its checkpoint
NO_PROGRESS = "no_progress"  # logs steps, but none past the step it had reached
REASONS = (WAITING_FOR_ACTION, WAITING_FOR_SPARE, HUNG, DOWN, RESTART_LOOP, CATCHING_UP, NO_PROGRESS)


@dataclass(frozen=True, slots=True)
class Action:
    """A remedy decided for the job: what, on which node, and how far it got."""

    decision_id: int
    kind: str
    node: str | None
    gpu: str | None  # a reset_gpu's GPU: its index ("3"), or its PCI bus id where the inventory lacks it
    state: str  # pending, awaiting_approval, done, failed, rejected, expired, ...
    created_at: datetime
    acked_at: datetime | None
    message: str | None  # the scheduler's acknowledgement, in its words

    @property
    def what(self) -> str:
        if self.kind == "evict":
            return f"eviction of {self.node}"
        if self.kind == "reset_gpu":
            return f"reset of GPU {self.gpu} on {self.node}"
        return f"{self.kind} of the job"


@dataclass(frozen=True, slots=True)
class StallReason:
    kind: str  # one of REASONS
    text: str  # one line for a person
    details: list[str] = field(default_factory=list)  # the facts behind it, each a line
    restarts: int = 0  # since the step reached
    restart_steps: tuple[int, ...] = ()  # the first step logged after each restart
    checkpoint_step: int | None = None  # the last save at or below the step reached
    last_step: int | None = None
    last_step_at: datetime | None = None
    action_id: int | None = None  # the decision the reason is about


def _clock(ts: datetime) -> str:
    return f"{ts:%H:%M:%S} UTC"


def _ago(now: datetime, ts: datetime) -> str:
    s = max(0.0, (now - ts).total_seconds())
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago" if s < 7200 else f"{s / 3600:.1f} h ago"


def explain(
    *,
    high: int,
    since: datetime,
    now: datetime,
    steps: Sequence[StepRecord],
    actions: Sequence[Action] = (),
    processes_alive: int | None = None,
    world_size: int | None = None,
    checkpoints: Sequence[CheckpointSave] = (),
) -> StallReason:
    """Why the job has not gone past step `high` (first reached at `since`) by `now`.

    `steps`: one logging stream's step records since `since`, oldest first; `actions`: the job's remedies decided
    since `since`; `processes_alive`: its ranks with a live process in the latest snapshots (None: no snapshots).
    """
    records = sorted((s for s in steps if s.ts >= since), key=lambda s: s.ts)
    restarts = [b for a, b in itertools.pairwise(records) if b.step < a.step]
    saves = [c.step for c in checkpoints if c.step <= high and c.ts <= now]
    checkpoint = max(saves) if saves else None
    last = records[-1] if records else None
    last_at = last.ts if last else since
    paces = [
        (b.ts - a.ts).total_seconds() / (b.step - a.step) for a, b in itertools.pairwise(records) if b.step > a.step
    ]
    quiet_s = max(QUIET_S, QUIET_FACTOR * statistics.median(paces)) if paces else QUIET_S
    stepping = (now - last_at).total_seconds() <= quiet_s
    details: list[str] = []
    restart_steps = tuple(r.step for r in restarts)
    if len(restarts) >= 2:
        same = len(set(restart_steps)) == 1
        back_to = (
            f"each back to step {restart_steps[0]}" if same else f"back to steps {', '.join(map(str, restart_steps))}"
        )
        details.append(f"restarted {len(restarts)} times since {_clock(since)}, {back_to}, never past step {high}")
    elif restarts:
        details.append(f"restarted at {_clock(restarts[0].ts)} from step {restarts[0].step} (had reached {high})")
    if checkpoint is not None:
        details.append(f"last checkpoint saved: step {checkpoint}")

    def reason(kind: str, text: str, facts: list[str], action_id: int | None = None) -> StallReason:
        return StallReason(
            kind,
            text,
            facts,
            restarts=len(restarts),
            restart_steps=restart_steps,
            checkpoint_step=checkpoint,
            last_step=last.step if last else None,
            last_step_at=last.ts if last else None,
            action_id=action_id,
        )

    remedies = sorted((a for a in actions if a.kind in REMEDIES), key=lambda a: (a.created_at, a.decision_id))
    waiting = [a for a in remedies if a.state in _WAITING]
    if waiting:
        a = waiting[0]
        who = "a person's approval" if a.state == "awaiting_approval" else "a scheduler"
        text = f"waiting for {who}: {a.what} (decision #{a.decision_id}) decided {_ago(now, a.created_at)}"
        return reason(WAITING_FOR_ACTION, text, details, action_id=a.decision_id)
    # The newest machine taken out with no step since: the job waits for a replacement, or to restart on one.
    out = [a for a in remedies if a.kind == "evict" and a.state == "done" and a.acked_at and a.acked_at >= last_at]
    if out and not stepping:
        a = out[-1]
        text = f"waiting for a spare: {a.node} evicted {_ago(now, a.acked_at or a.created_at)}, no step since"
        if a.message:
            details.insert(0, f"the scheduler said: {a.message}")
        return reason(WAITING_FOR_SPARE, text, details, action_id=a.decision_id)
    if not stepping:
        silent = f"no step since {_clock(last_at)} ({_ago(now, last_at)})"
        if processes_alive:
            of = f" of {world_size}" if world_size else ""
            text = f"hung: {silent}, {processes_alive}{of} processes alive"
            return reason(HUNG, text, details)
        text = f"down: {silent}, no training process reports" if processes_alive == 0 else f"silent: {silent}"
        return reason(DOWN, text, details)
    if len(restarts) >= 2:
        text = f"restarting again and again: {details[0]}"
        return reason(RESTART_LOOP, text, details[1:])
    at = f"at step {last.step}" if last else "no step yet"
    if restarts:
        text = f"catching up: restarted at {_clock(restarts[0].ts)} from step {restarts[0].step}, {at} of {high}"
        return reason(CATCHING_UP, text, details[1:])
    return reason(NO_PROGRESS, f"no step past {high} since {_clock(since)}: {at}", details)
