"""The file through which a simulated machine's GPUs answer: the runner writes it (lab/sim/gpuanswers.py), the fake
NVML and PyTorch (lab/sim/fakegpu) in the machine's agent and in the agent's check processes read it.

FAULTLINE_SIM_GPU_STATE names it: the runner sets it in the agent's environment, which the check processes inherit.
A fake library that finds no state asks for one (an empty file beside it, STATE_FILE + ".asked") and waits; the
runner answers at its next tick. `done` turns true once the machine's simulated check time is over: the fake GPU's
long work (the compute check's measurements) waits for it, as a real node's GPUs take minutes to measure.
The inventory beside it (INVENTORY_FILE) is never asked for: the runner keeps it there and current.

Stdlib only: the check processes import it and stay small.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

ENV = "FAULTLINE_SIM_GPU_STATE"
STATE_FILE = "gpu-state.json"
# Beside it, kept current by the runner: what NVML answers without measuring (which GPUs, who they are, whether one
# fell off the bus, their NVLink fabric), read by the fake NVML on every such call, never asked for.
INVENTORY_FILE = "gpu-inventory.json"
ASKED_SUFFIX = ".asked"
WAIT_S = 1800.0  # the longest a fake waits: far past any check's timeout, so a stuck runner shows as one
POLL_S = 0.2


def asked_path(state: Path) -> Path:
    return state.with_name(state.name + ASKED_SUFFIX)


def write(path: Path, state: dict[str, Any]) -> None:
    """Atomically: a reader never sees half a state."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def read(path: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(path.read_text())
        return state
    except FileNotFoundError:
        return None


def inventory_path() -> Path | None:
    """This machine's live inventory file; None when this is no simulated node."""
    name = os.environ.get(ENV)
    return Path(name).with_name(INVENTORY_FILE) if name else None


def load(*, done: bool = False, wait_s: float = WAIT_S) -> dict[str, Any]:
    """This machine's GPU state (asked for when there is none); with `done`, once its check time is over.
    Raises RuntimeError when the simulator does not answer within `wait_s`, or when this is no simulated node."""
    name = os.environ.get(ENV)
    if not name:
        raise RuntimeError(f"no simulated GPU here: {ENV} is not set (the simulator's runner sets it)")
    path = Path(name)
    deadline = time.monotonic() + wait_s
    while True:
        state = read(path)
        if state is None:
            asked_path(path).touch()
        elif state["done"] or not done:
            return state
        if time.monotonic() >= deadline:
            raise RuntimeError(f"the simulator did not answer in {wait_s:g} s ({path})")
        time.sleep(POLL_S)
