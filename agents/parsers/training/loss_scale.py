"""fp16 dynamic loss scaling: overflowed steps that were skipped, and the scale reaching its floor.

DeepSpeed (`[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 64, reducing to 32`, once
`[deepscale]`), apex amp (`Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0`)
and fairseq (`NOTE: overflow detected, setting loss scale to: 64.0`) skip a step whose gradients hold
inf/NaN and halve the scale. A few at the start are the scale calibrating; the scale at its minimum
(`Current loss scale already at minimum`, fairseq's `Minimum loss scale reached`) means every step
overflows: the gradients are inf/NaN, reported as such.
"""

from __future__ import annotations

import re
from typing import Any

from agents.parsers.training.common import MAX_MESSAGE, Emit, rank_in

_ATTEMPTED = re.compile(r"Attempted loss scale:\s*(?P<from>[\d.e+]+)(?:, reducing to (?P<to>[\d.e+]+))?")
_HYSTERESIS = re.compile(r"hysteresis is (\d+)")
_APEX = re.compile(r"reducing loss scale to\s*(?P<to>[\d.e+]+)")
_FAIRSEQ = re.compile(r"overflow detected, setting loss scale to:\s*(?P<to>[\d.e+]+)")
_MINIMUM = re.compile(
    r"(?i)loss scale already at minimum|minimum loss scale reached|cannot decrease (?:loss )?scale anymore"
)
# OpenAI's guided/improved-diffusion keep the scale's log2 and step it down by one per overflowed step: "Found NaN,
# decreased lg_loss_scale to 17.354".
_LG_SCALE = re.compile(r"Found NaN, decreased lg_loss_scale to\s*(?P<lg>-?[\d.]+(?:e[+-]?\d+)?)")
_FLOOR = 1.0  # DeepSpeed's default min_loss_scale: an overflow at this scale cannot be scaled away


def rule_loss_scale(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if "overflow" not in low and "loss scale" not in low and "lg_loss_scale" not in low:
        return False
    if _MINIMUM.search(body):
        message = body.strip()[:MAX_MESSAGE]
        fields: dict[str, Any] = {"reason": "loss_scale_minimum", "grad_norm": "inf", "message": message}
        emit("grad_norm_nan", "error", fields, rank_in(body, rank))
        return True
    if "OVERFLOW" in body or "Gradient overflow" in body:
        m = _ATTEMPTED.search(body) or _APEX.search(body)
    else:
        m = _FAIRSEQ.search(body) or _LG_SCALE.search(body)
    if not m:
        return False
    groups = m.groupdict()
    if groups.get("lg") is not None:  # the scale as its log2
        groups["to"] = str(2.0 ** min(1023.0, float(groups["lg"])))
    fields = {"attempted": _float(groups.get("from")), "reduced_to": _float(groups.get("to"))}
    hysteresis = _HYSTERESIS.search(body, m.end())
    if hysteresis:
        fields["hysteresis"] = int(hysteresis.group(1))
    scale = fields["attempted"] if fields["attempted"] is not None else fields["reduced_to"]
    at_floor = scale is not None and scale <= _FLOOR
    fields["at_minimum"] = at_floor
    emit("loss_scale_overflow", "error" if at_floor else "warning", fields, rank_in(body, rank))
    return True


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None
