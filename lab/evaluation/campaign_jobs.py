"""What the campaign (lab/evaluation/campaign.py) keeps about each of its jobs: the soak's run of it, its stream
of faults and the fault it is going through."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from lab.evaluation.campaign_checks import CheckDesk
from lab.evaluation.campaign_returns import ReturnDesk
from lab.evaluation.soak import JobRun
from lab.sim.faults import FaultRecord
from lab.sim.mix import Draw
from lab.sim.scenarios import FaultSpec


@dataclass
class Active:
    """The fault a job is going through."""

    index: int
    draw: Draw
    spec: FaultSpec
    record: FaultRecord
    node: str | None
    t: float
    step: int
    since_checkpoint_s: float
    dealt_t: float | None = None
    how: str = ""


@dataclass
class CampaignJob:
    run: JobRun
    draws: Any  # the job's endless stream of draws
    rng: random.Random
    next_at: float
    returns: ReturnDesk  # its scheduler's reports of machines back in service, their gates' answers
    active: Active | None = None
    slots_version: int = 0
    first_step: int = 0
    step_s: float = 1.0
    stale_checks: list[tuple[float, int]] = field(default_factory=list)  # (when, fault index)
    carried: dict[int, list[int]] = field(default_factory=dict)  # fault index -> open incidents judged with it
    seen_incident: int = 0  # the highest incident id seen
    count: int = 0  # faults injected
    in_shop: set[int] = field(default_factory=set)  # machines whose agent is down while they are repaired
    decided: set[int] = field(default_factory=set)  # decision ids the loop has seen
    desk: CheckDesk | None = None  # the stop-time checks its machines answer (campaign_checks.py)
