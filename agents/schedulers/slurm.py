"""Slurm backend: drain a faulty node with scontrol; resume it on return.

evict / cordon: `scontrol update nodename=<node> state=drain reason="faultline: <kind> #<id>: <reason>"`
return:         `scontrol update nodename=<node> state=resume`
reset_gpu:      the same drain, its reason naming the GPU ("faultline: reset_gpu #<id>: reset GPU 3 on ..."); the
                ack and the dry run give the reset to run there: `nvidia-smi -r -i 3`, or by PCI bus id
                (`nvidia-smi -r -i 00000000:3B:00.0`) when the decision names the GPU by `gpu_pci` (faultline
                has no GPU inventory of the node, so no index).
in service?     `scontrol show node -o <node>`: its State= carries no drain, down, fail, maintenance, power or reboot
                flag (the loop asks this of the nodes faultline holds out, to report the ones someone resumed).

Why reset_gpu drains the whole node: Slurm has no state for one GPU of a node. Drain and resume are node
states; `scontrol update nodename=X gres=gpu:7` only changes the count (not which device: gres.conf's File=
lines bind the indexes), is not kept across a slurmctld restart or reconfigure, and a count below what slurmd
reports from gres.conf puts the node in an invalid state of its own. So the supported way to keep jobs off a
GPU is to drain its node: running jobs finish, none start; the reset is done on the drained node (`nvidia-smi
-r -i <gpu index or PCI bus id>`, which needs the GPU idle anyway), and the `return` decision resumes it.

scontrol runs with an argument list (no shell, so nothing in a reason or node name is interpreted) and a
timeout; a non-zero exit fails the decision with scontrol's stderr. Draining a drained node only updates
its reason; resuming a node already in service is refused by Slurm ("Invalid node state specified"),
which we count as done, so both actions are idempotent.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

from agents.schedulers.checks import checks_state
from agents.schedulers.gpus import reset_command
from agents.schedulers.loop import ActionFailed, BackendConfigError

MAX_REASON = 200  # Slurm shows the reason in sinfo -R; keep it readable
_ALREADY_IN_SERVICE = "invalid node state specified"
_NOT_FOUND = "not found"
# Base states and flags (slurm.conf's, as scontrol prints them joined by "+") under which Slurm starts no job there.
_OUT = frozenset(
    {
        "DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "MAINT", "INVAL", "INVALID", "FUTURE", "UNKNOWN",
        "NOT_RESPONDING", "NO_RESPOND", "REBOOT", "REBOOT_ISSUED", "REBOOT_REQUESTED", "POWER_DOWN", "POWERED_DOWN",
        "POWERING_DOWN", "POWERING_UP", "POWER_UP",
    }
)  # fmt: skip
_IN = frozenset({"IDLE", "ALLOCATED", "ALLOC", "MIXED", "MIX", "COMPLETING", "PLANNED", "RESERVED"})
# Suffixes on a state: * not responding, ~ powered off, # powering up, % powering down, ! power down pending,
# @ reboot pending, ^ reboot issued, $ in a maintenance reservation. Each means no new job there now.
_OUT_MARKS = frozenset("*~#%!@^$")
_STATE = re.compile(r"(?:^|\s)State=(\S+)")


def node_in_service(show: str) -> bool | None:
    """From `scontrol show node -o` output: whether Slurm would start a job on the node; None when unclear."""
    match = _STATE.search(show)
    if match is None:
        return None
    state = match.group(1)
    tokens = {t.strip("".join(_OUT_MARKS) + "-") for t in state.upper().split("+")} - {""}
    if _OUT_MARKS & set(state) or tokens & _OUT:
        return False
    return True if tokens & _IN else None


def drain_reason(decision: Mapping[str, Any]) -> str:
    """`faultline: evict #12: <reason>` on one line, truncated, with double quotes made single.

    scontrol strips one double quote at each end of a reason, so a reason must not carry its own.
    """
    text = re.sub(r"\s+", " ", str(decision.get("reason") or "")).strip().replace('"', "'")
    state = checks_state(decision)
    checks = f"checks {state}: " if state else ""  # sinfo -R shows "checks running" while the node is checked
    reason = f"faultline: {decision['kind']} #{decision['id']}: {checks}{text}".rstrip(": ")
    return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 3].rstrip() + "..."


class SlurmBackend:
    name = "Slurm"

    def __init__(self, scontrol: str = "scontrol", *, timeout_s: float = 30.0, required: bool = True) -> None:
        found = shutil.which(scontrol)
        if found is None and required:
            raise BackendConfigError(f"scontrol not found: {scontrol!r} (pass --scontrol PATH)")
        # Not required in a dry run, which never runs it: it can be tried away from the Slurm controller.
        self.scontrol = found or scontrol
        self.timeout_s = timeout_s

    def take_out(self, node: str, decision: Mapping[str, Any]) -> str:
        """Drain: running jobs finish, nothing new starts on the node."""
        self._scontrol(*self._drain_args(node, decision))
        return f"drained {node} in Slurm"

    def reset_gpu(self, node: str, gpu: int | str, decision: Mapping[str, Any]) -> str:
        """Slurm cannot drain one GPU: drain the node, the reason naming the GPU to reset."""
        self._scontrol(*self._drain_args(node, decision))
        return (
            f"drained {node} in Slurm for a reset of GPU {gpu} (Slurm cannot drain one GPU of a node); "
            f"reset it there with {reset_command(gpu)}"
        )

    def preview_reset_gpu(self, node: str, gpu: int | str, decision: Mapping[str, Any]) -> str:
        command = shlex.join([self.scontrol, *self._drain_args(node, decision)])
        return f"would drain {node} for a reset of GPU {gpu}: {command}; then on {node}: {reset_command(gpu)}"

    @staticmethod
    def _drain_args(node: str, decision: Mapping[str, Any]) -> list[str]:
        return ["update", f"nodename={node}", "state=drain", f"reason={drain_reason(decision)}"]

    def put_back(self, node: str, decision: Mapping[str, Any]) -> str:
        """Resume: the node takes jobs again."""
        try:
            self._scontrol("update", f"nodename={node}", "state=resume")
        except ActionFailed as exc:
            if _ALREADY_IN_SERVICE in str(exc).lower():
                return f"{node} already in service in Slurm"
            raise
        return f"resumed {node} in Slurm"

    def in_service(self, node: str) -> bool | None:
        """Whether Slurm would start a job on the node now (resumed after its repair); None for a node it lacks."""
        try:
            shown = self._scontrol("show", "node", "-o", node)
        except ActionFailed as exc:
            if _NOT_FOUND in str(exc).lower():
                return None
            raise
        return node_in_service(shown)

    def _scontrol(self, *args: str) -> str:
        """Run scontrol; its standard output, or ActionFailed with its error."""
        argv = [self.scontrol, *args]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.timeout_s, stdin=subprocess.DEVNULL, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ActionFailed(f"scontrol timed out after {self.timeout_s:g} s") from exc
        except OSError as exc:
            raise ActionFailed(f"cannot run scontrol: {exc}") from exc
        if done.returncode != 0:
            detail = done.stderr.strip() or done.stdout.strip() or "(no output)"
            raise ActionFailed(f"scontrol exited with {done.returncode}: {detail}")
        return done.stdout
