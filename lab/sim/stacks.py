"""The stacks `py-spy dump --json` would show of a simulated rank, without a process to dump: the frames
lab/sim/rank.py's functions give when a real rank process acts out the same mode and activity (for harnesses
on accelerated time, which run no processes: the soak and the campaign).

Innermost frame first, as py-spy lists them.
"""

from __future__ import annotations

from typing import Any

from lab.sim.gpu import COMM, COMPUTE, IDLE, SAVE, SPIN, WAIT
from lab.sim.modes import CHECKPOINT, CULPRIT_CKPT, CULPRIT_DATA, CULPRIT_SYNC, NORMAL, VICTIM, VICTIM_BARRIER

_FILE = "lab/sim/rank.py"
_ROOT = ("train_step", "train", "main", "<module>")
_SAVE = ("write_record", "_save", "save", "save_checkpoint")
_ALL_REDUCE = ("_wait_for_work", "all_reduce", "backward")
_DATA = ("_get_data", "_next_data", "__next__")
# Where a rank's mode keeps it (a hang's culprit and its victims), then where a normal rank's activity puts it.
_BY_MODE = {
    VICTIM: _ALL_REDUCE,
    VICTIM_BARRIER: ("_wait_for_work", "barrier", "save_checkpoint"),
    CULPRIT_DATA: _DATA,
    CULPRIT_SYNC: ("synchronize", "forward"),
    CULPRIT_CKPT: _SAVE,
    CHECKPOINT: _SAVE,
}
_BY_ACTIVITY = {
    IDLE: _DATA,  # waiting for its batch
    COMPUTE: ("run_kernels", "forward"),
    WAIT: _ALL_REDUCE,  # done computing, waiting for the slowest rank in the gradient all-reduce
    COMM: _ALL_REDUCE,
    SPIN: _ALL_REDUCE,
    SAVE: _SAVE,
}


def frames(mode: str, activity: str) -> list[str] | None:
    """Function names, innermost first; None when the rank has no live process (dead, or the job is down)."""
    inner = _BY_MODE.get(mode) or (_BY_ACTIVITY.get(activity) if mode == NORMAL else None)
    return [*inner, *_ROOT] if inner is not None else None


def pyspy_threads(pid: int, names: list[str]) -> list[dict[str, Any]]:
    """One main thread in `py-spy dump --json`'s shape."""
    return [
        {
            "pid": pid,
            "thread_id": pid,
            "thread_name": "MainThread",
            "os_thread_id": pid,
            "active": False,
            "owns_gil": False,
            "frames": [
                {"name": name, "filename": _FILE, "short_filename": _FILE, "line": 100 + i, "locals": None}
                for i, name in enumerate(names)
            ],
        }
    ]
