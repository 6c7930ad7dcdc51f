"""Checkpoint saves: the "saved checkpoint" lines of Megatron-LM, DeepSpeed, PyTorch DCP (torchtitan) and the
Hugging Face Trainer, as `checkpoint_saved` events with the step when it is known.

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
