"""The simulated training job's state, which the cluster model (lab/sim/model.py), its faults (lab/sim/faults.py and
the kinds beside it), its real-life noise (lab/sim/realism.py) and its spare pool (lab/sim/pool.py) all move; and
the pauses it goes through."""

from __future__ import annotations

from dataclasses import dataclass, field

# The job's pauses (Job.pause; lab/sim/realism.py runs them): a checkpoint save, an evaluation, a restart from the
# last checkpoint (processes gone), the checkpoint's load when they are back.
CHECKPOINT_PAUSE, EVAL_PAUSE, RESTART_PAUSE, LOAD_PAUSE = "checkpoint", "eval", "restart", "load"


@dataclass
class Job:
    step: int
    seq: int
    state: str = "running"  # running | hung | failed
    phase: float = 0.0  # seconds into the current step
    started_at: float = 0.0  # sim time the current step started
    compute: list[float] = field(default_factory=list)  # per rank: compute time of this step
    compute_max: float = 0.0
    duration: float = 0.0
    comm_factor: float = 1.0
    stall_until: float = 0.0
    nan: bool = False
    loss_drift: float = 0.0
    # Pauses (lab/sim/realism.py): "" while training, else checkpoint | eval | restart | load.
    pause: str = ""
    pause_started: float = 0.0
    pause_until: float = 0.0
    stuck_rank: int | None = None  # the rank whose checkpoint save never returns
    stall_rank: int | None = None  # the rank whose data loader is stalling
    last_checkpoint: int = 0  # the iteration a restart resumes from
    loss_spike: float = 0.0  # the loss's current excess over its trend, as a fraction
