"""Checkpoint saves: the "saved checkpoint" lines of Megatron-LM, DeepSpeed, PyTorch DCP (torchtitan) and the
Hugging Face Trainer, as `checkpoint_saved` events with the step when it is known; and the loads a restarted job
resumes from, as `checkpoint_loaded` events (below).

A restart resumes from the last save, so the service measures the steps a failure made the job redo (ETTR).
The lines, as each framework prints them:

- Megatron-LM: `successfully saved checkpoint from iteration    2000 to /ckpt [ t 1/1, p 1/1 ]`, older
  `successfully saved checkpoint at iteration    2000 to /ckpt` (its "saving checkpoint at ..." line before
  the save is not one: the save may still fail).
- DeepSpeed: `[Rank 0] Saving model checkpoint: /ckpt/global_step2000/mp_rank_00_model_states.pt` and
  `zero checkpoint saved /ckpt/global_step2000/zero_pp_rank_0_mp_rank_00_optim_states.pt` (step from the
  `global_stepN` folder).
- torchtitan (PyTorch DCP): `Saving the checkpoint (or staging if async is enabled).`, then
  `Finished saving the checkpoint (or staging if async is enabled)in 3.21 seconds.` (sic: no space), and
  `Saving a full checkpoint at last step, step 1000.`. Most carry no step: the log's last step line gives it
  (torchtitan saves right after the step it logged), marked `"step_from": "last_step"`.
- Hugging Face Trainer: `Saving model checkpoint to out/checkpoint-500` (step from `checkpoint-N`).
"""

from __future__ import annotations

import re
from typing import Any

CHECKPOINT_SAVED = "checkpoint_saved"

_MEGATRON = re.compile(r"successfully saved checkpoint (?:from|at) iteration\s+(?P<step>\d+) to (?P<path>\S+)")
_DEEPSPEED = re.compile(r"Saving model checkpoint: (?P<path>\S+)|zero checkpoint saved (?P<zero>\S+)")
_HF = re.compile(r"Saving model checkpoint to (?P<path>\S+)")
_DCP = re.compile(
    r"(?P<finished>Finished saving|Saving) (?:the|a) (?:[\w ]{0,40} )?checkpoint\b"
    r"(?=(?:.*?\bin (?P<seconds>\d+(?:\.\d+)?) seconds)?)(?=(?:.*?\bstep (?P<step>\d+))?)"
)
_GLOBAL_STEP = re.compile(r"global_step(\d+)")
_HF_STEP = re.compile(r"checkpoint-(\d+)")


def read_checkpoint(body: str, low: str, last_step: int | None) -> dict[str, Any] | None:
    """The fields of a `checkpoint_saved` event for a save line (framework, step, path, seconds), or None."""
    if "checkpoint" not in low:
        return None
    fields: dict[str, Any]
    if m := _MEGATRON.search(body):
        fields = {"framework": "megatron", "step": int(m["step"]), "path": m["path"]}
    elif m := _DEEPSPEED.search(body):
        path = m["path"] or m["zero"]
        fields = {"framework": "deepspeed", "path": path}
        if found := _GLOBAL_STEP.search(path):
            fields["step"] = int(found.group(1))
    elif m := _HF.search(body):
        fields = {"framework": "hf_trainer", "path": m["path"]}
        if found := _HF_STEP.search(m["path"]):
            fields["step"] = int(found.group(1))
    elif m := _DCP.search(body):
        fields = {"framework": "dcp", "phase": "finished" if m["finished"].startswith("F") else "started"}
        if m["seconds"]:
            fields["seconds"] = float(m["seconds"])
        if m["step"]:
            fields["step"] = int(m["step"])
    else:
        return None
    if "step" not in fields and last_step is not None:
        fields["step"] = last_step
        fields["step_from"] = "last_step"
    return fields


# --- loads: the checkpoint a restarted job resumed from ---

CHECKPOINT_LOADED = "checkpoint_loaded"

# (framework, pattern with a `step`), each the framework's own line once it has loaded a checkpoint:
# - Megatron-LM: `  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 2000` (older releases
#   without the bracket); its "loading ... checkpoint from ... at iteration" line before it is not counted twice.
# - Hugging Face Trainer: `  Continuing training from global step 500`.
# - torchtitan (PyTorch DCP): `Loading the checkpoint at step 1000.`
# - A trainer's own line: `resuming from checkpoint at step=2000` (or `resumed ... iteration 2000`).
_LOADS = (
    ("megatron", re.compile(r"successfully loaded checkpoint from (?P<path>\S+).*? at iteration\s+(?P<step>\d+)")),
    ("hf_trainer", re.compile(r"Continuing training from global step (?P<step>\d+)")),
    ("dcp", re.compile(r"Loading the checkpoint at step (?P<step>\d+)")),
    (
        "generic",
        re.compile(r"\bresum(?:ing|ed) from (?:the )?checkpoint\b.*?\b(?:step|iteration)[= :]\s*(?P<step>\d+)"),
    ),
)


def read_checkpoint_load(body: str, low: str) -> dict[str, Any] | None:
    """The fields of a `checkpoint_loaded` event (framework, step, path when the line names it), or None."""
    if "checkpoint" not in low and "continuing training" not in low:
        return None
    for framework, pattern in _LOADS:
        if m := pattern.search(body):
            fields: dict[str, Any] = {"framework": framework, "step": int(m["step"])}
            if "path" in m.groupdict():
                fields["path"] = m["path"]
            return fields
    return None
