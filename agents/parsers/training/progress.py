"""Training progress: step lines (loss, grad norm, lr, time per step), their NaNs and spikes."""

from __future__ import annotations

import math
import re
import statistics
from collections import deque
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from agents.events import Event
from agents.parsers.training.common import MAX_MESSAGE, Emit, make_event, rank_in

# Each pattern needs a named group `step`; optional groups: loss, grad_norm, elapsed_ms, lr, total, and the
# counts skipped and nan_iterations. A pattern whose `step` group did not take part in the match (the
# Trainer's log dict has no step) gets the last step seen. Lookaheads of the form (?=(?:.*?X(?P<g>...))?)
# pick up fields in any order, and a field a line lacks is simply absent.
MEGATRON_PATTERN = (
    # Megatron-LM / Megatron-DeepSpeed / NeMo Megatron-Bridge:
    # " iteration      100/  500000 | consumed samples: ... | elapsed time per iteration (ms): 1234.5 |
    #   learning rate: 3.0E-04 | ... | lm loss: 2.345E+00 | loss scale: 1.0 | grad norm: 1.23 |
    #   number of skipped iterations:   0 | number of nan iterations:   0 |"
    r"iteration\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*\|"
    r"(?=(?:.*?elapsed time per iteration(?: \(ms\))?:\s*(?P<elapsed_ms>[^\s|]+))?)"
    r"(?=(?:.*?learning rate:\s*(?P<lr>[^\s|]+))?)"
    r"(?=(?:.*?\|\s*(?:lm[ _])?loss:\s*(?P<loss>[^\s|]+))?)"
    r"(?=(?:.*?grad norm:\s*(?P<grad_norm>[^\s|]+))?)"
    r"(?=(?:.*?number of skipped iterations:\s*(?P<skipped>\d+))?)"
    r"(?=(?:.*?number of nan iterations:\s*(?P<nan_iterations>\d+))?)"
)
DEFAULT_STEP_PATTERNS: tuple[str, ...] = (
    MEGATRON_PATTERN,
    # Hugging Face Trainer: {'loss': 2.345, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}
    r"""\{['"]loss['"]: (?P<loss>[^,}]+)"""
    r"""(?=(?:.*?['"]grad_norm['"]: (?P<grad_norm>[^,}]+))?)"""
    r"""(?=(?:.*?['"]learning_rate['"]: (?P<lr>[^,}]+))?)"""
    r"""(?=(?:.*?['"]step['"]: (?P<step>\d+))?)""",
    # tqdm training bars (Trainer, Lightning "Epoch 0: ..."), not dataset/eval bars:
    # "  5%|▌         | 50/1000 [00:10<03:10,  5.00it/s, loss=2.6]", Lightning's "train_loss_step=2.6", any
    # "<name>_loss=" a training script puts in its bar
    r"^(?:\s*|Epoch \d+:\s*|(?:Training|Train|Steps?|Iteration)s?:?\s*)"
    r"\d{1,3}%\|[^|]{0,200}\|\s*(?P<step>\d+)/(?P<total>\d+)\b"
    r"(?=(?:[^\]]*?(?<![\w.])(?:\w+_)?loss(?:_step)?=(?P<loss>[^\s,\]]+))?)",
    # DeepSpeed's log_dist: "[Rank 0] step=35, skipped=0, lr=[2.17e-06, 2.17e-06], mom=[[0.9, 0.95]]"
    r"\bstep=(?P<step>\d+), skipped=(?P<skipped>\d+)(?=(?:.*?\blr=\[?(?P<lr>[-+\w.]+))?)",
    # mmengine / mmcv runners and the PyTorch examples' meters: "Epoch(train) [1][240/735]  lr: 1.9e-04 ...
    # loss: 2.51  grad_norm: nan", "Iter [10100/316440]	lr: 3.990e-04, ..., loss: nan", "Epoch [1][100/62598]",
    # "Epoch: [21][1390/1930]  Time 0.690 (0.986) ... Loss 2.5681 (10.9521)", "Epoch: [127/300][ 35/464]"
    # (an epoch needs its iteration bracket after it: ">>> Epoch: [127/300]" alone is not a step)
    r"\b(?:Epoch(?:\(train\))?:?\s*\[\s*\d+(?:/\d+)?\]|Iter(?:\(train\))?:?)\s*\[\s*(?P<step>\d+)/(?P<total>\d+)\]"
    r"(?=(?:.*?(?<![\w.])lr:\s*(?P<lr>[-+\w.]+))?)"
    r"(?=(?:.*?(?<![\w.])(?i:loss)[:\s]\s*(?P<loss>[-+\w.]+))?)"
    r"(?=(?:.*?(?<![\w.])grad_norm:\s*(?P<grad_norm>[-+\w.]+))?)",
    # nanoGPT / lit-gpt style: "iter 100: loss 2.3456, time 50.00ms", "iter 83592: loss 1.5455, time: 4401.19ms"
    r"(?i)^\s*iter(?:ation)?\s+(?P<step>\d+)(?:\s*/\s*(?P<total>\d+))?\s*[:|,]"
    r"(?=(?:.*?\bloss[\s=:]+(?P<loss>[-+\w.]+))?)"
    r"(?=(?:.*?\btime[\s=:]+(?P<elapsed_ms>[\d.]+)\s*ms)?)",
    # "Train epoch: 0, batch: 790/34799, loss: nan, learning rate: 0.0001" (a batch count with its total; not
    # "batch size: 64")
    r"(?i)\bbatch[\s=:]+(?P<step>\d+)\s*/\s*(?P<total>\d+)"
    r"(?=(?:.*?\b(?:\w+_)?loss[\s=:]+(?P<loss>[-+\w.]+))?)"
    r"(?=(?:.*?\b(?:lr|learning[_ ]rate)[\s=:]+(?P<lr>[-+\w.]+))?)",
    # generic: "step=100 loss=2.3 grad_norm=1.1", "step 100 | loss 2.3", "Step 100/1000, loss: 2.3",
    # "step: 100 total_loss: nan" (not "step: 1172.13", a duration; not "at step 200", a mention; not nccl-tests'
    # "step: 2(factor)", its message sizes' growth);
    # "[Loss] nan | ... | [step]   104 |" too
    r"(?i)(?<!at )(?<!to )(?<!from )(?<!after )(?<!before )\bstep\]?[\s=:]+(?P<step>\d+)(?![.\d(])"
    r"(?:\s*/\s*(?P<total>\d+))?"
    r"(?=(?:.*?\b(?:\w+_)?loss\]?[\s=:]+(?P<loss>[-+\w.]+))?)"
    r"(?=(?:.*?\bgrad[_ ]norm[\s=:]+(?P<grad_norm>[-+\w.]+))?)"
    r"(?=(?:.*?\b(?:lr|learning[_ ]rate)[\s=:]+\[?(?P<lr>[-+\w.]+))?)",
)
# Cheap literal hints for the default step patterns: the lowercased line must contain one of them.
_STEP_HINTS: dict[str, tuple[str, ...]] = dict(
    zip(
        DEFAULT_STEP_PATTERNS,
        (
            ("iteration",),
            ("{'loss'", '{"loss"'),
            ("%|",),
            ("skipped=",),
            ("epoch(train)", "epoch [", "epoch: [", "epoch:[", "iter [", "iter(train)"),
            ("iter",),
            ("batch",),
            ("step",),
        ),
        strict=True,
    )
)
_COUNTS = ("skipped", "nan_iterations")  # integer groups a step pattern may have
# Loose loggers put the values anywhere on the line, before the step too ("[Loss] nan | ... | [step] 104"):
# for the last three default patterns a value the lookaheads missed is looked for on the whole line.
_ANYWHERE = frozenset(DEFAULT_STEP_PATTERNS[-3:])
_VALUE_ANYWHERE = {
    "loss": re.compile(r"(?i)\b(?:\w+_)?loss\]?[\s=:]+([-+\w.]+)"),
    "grad_norm": re.compile(r"(?i)\bgrad[_ ]norm\]?[\s=:]+([-+\w.]+)"),
}
_VALUES = ("loss", "grad_norm", "elapsed_ms", "lr")  # numeric groups a step pattern may have
_JUDGED = ("loss", "grad_norm")  # values checked for NaN and spikes

_WINDOW = 20  # recent values the spike check compares with
_MIN_HISTORY = 5  # values needed before judging a spike

# NaN/inf reported in words, not on a step line: "loss is nan", "grad norm is inf at rank 3".
# "train_loss': nan" and "eval_loss: nan" too: a loss named with a prefix is still a loss.
_NAN_LOSS = re.compile(r"(?i)(?:\b|_)loss(?:es)?\b[^|\n]{0,40}?\b(?:nan|inf)\b|\b(?:nan|inf)\b[^|\n]{0,20}?\bloss\b")
# A logger's key-value table, one row per line (OpenAI's guided/improved-diffusion and baselines `logger.dumpkvs`):
# "| loss          | nan       |", "| grad_norm | inf |". Only a whole two-cell row: other pipe-separated lines put
# several fields on one line, where a NaN may belong to a neighbour.
_NAN_ROW = re.compile(r"(?i)^\|\s*(?P<name>[\w./-]*(?:loss|norm)[\w./-]*)\s*\|\s*[+-]?(?:nan|inf)\s*\|$")
# autograd's anomaly mode: "Function 'MulBackward0' returned nan values in its 0th output."
_NAN_AUTOGRAD = re.compile(r"(?i)returned (?:nan|inf) values in its \w+ output")
_NAN_GRAD = re.compile(
    r"(?i)\bgrad(?:ient)?s?[ _-]?norm\b[^|\n]{0,40}?\b(?:nan|inf)\b"
    r"|\b(?:nan|inf)\b[^|\n]{0,40}?\bgrad(?:ient)?s?[ _-]?norm\b"
)
_DEVICE = re.compile(r"\bDevice:? (\d+)")


class Progress:
    """Reads step lines and keeps what judging the next one needs: the last step, recent values."""

    def __init__(self, step_patterns: Sequence[str], spike_factor: float, path: str | None) -> None:
        self.spike_factor = spike_factor
        self.path = path
        # (regex, literals one of which the lowercased line must contain, or None): user patterns get no hint.
        self.step_patterns: list[tuple[re.Pattern[str], tuple[str, ...] | None]] = []
        for pattern in step_patterns:
            compiled = re.compile(pattern)
            if "step" not in compiled.groupindex:
                raise ValueError(f"step pattern has no named group 'step': {pattern!r}")
            self.step_patterns.append((compiled, _STEP_HINTS.get(pattern)))
        self.last_step: int | None = None
        self._loss_seen = False  # a Megatron line reported a loss: one without it then hides a NaN
        self._history: dict[str, deque[float]] = {name: deque(maxlen=_WINDOW) for name in _JUDGED}

    def read(self, raw: str, body: str, low: str, ts: datetime, rank: int | None) -> list[Event]:
        """A `step` event for a progress line (the first pattern that matches), and any anomaly in it."""
        for pattern, hint in self.step_patterns:
            if hint is not None and not any(h in low for h in hint):
                continue
            m = pattern.search(body)
            if m is None:
                continue
            groups = m.groupdict()
            step = int(groups["step"]) if groups.get("step") else self.last_step
            if step is not None:
                self.last_step = step
            fields: dict[str, Any] = {"step": step}
            if groups.get("total"):
                fields["total"] = int(groups["total"])
            values: dict[str, float] = {}
            if pattern.pattern in _ANYWHERE:
                for name, regex in _VALUE_ANYWHERE.items():
                    if not groups.get(name) and (found := regex.search(body)):
                        groups[name] = found.group(1)
            for name in _VALUES:
                value = _num(groups.get(name))
                if value is not None:
                    values[name] = value
                    fields[name] = _wire(value)
            for name in _COUNTS:
                if groups.get(name):
                    fields[name] = int(groups[name])
            rank = rank_in(body, rank)  # "rank=3 step=5 ..." from a plain logging line
            missing = pattern.pattern == MEGATRON_PATTERN and self._loss_missing("loss" in values, fields)
            events = [make_event(ts, "step", raw, "debug", fields, rank, path=self.path)]
            for name in _JUDGED:
                if name in values:
                    events += self._judge(name, values[name], step, raw, ts, rank)
            if fields.get("nan_iterations") or missing:
                # Megatron counts NaN losses, and leaves a NaN loss out of its line rather than print it.
                nan = {"step": step, "loss": "nan", "reason": "nan_iterations" if not missing else "loss_missing"}
                if fields.get("nan_iterations"):
                    nan["nan_iterations"] = fields["nan_iterations"]
                events.append(make_event(ts, "nan_loss", raw, "error", nan, rank, path=self.path))
            return events
        return []

    def _loss_missing(self, has_loss: bool, fields: dict[str, Any]) -> bool:
        """A Megatron line without its loss after lines with one, no iteration skipped: the loss was NaN."""
        if has_loss:
            self._loss_seen = True
            return False
        missing = self._loss_seen and not fields.get("skipped") and not fields.get("nan_iterations")
        if missing:
            fields["loss_missing"] = True
        return missing

    def _judge(
        self, name: str, value: float, step: int | None, raw: str, ts: datetime, rank: int | None
    ) -> list[Event]:
        """NaN/inf, or a jump past spike_factor x the recent median: an anomaly event besides the step."""
        history = self._history[name]
        if not math.isfinite(value):
            kind = "nan_loss" if name == "loss" else "grad_norm_nan"
            return [make_event(ts, kind, raw, "error", {"step": step, name: _wire(value)}, rank, path=self.path)]
        events: list[Event] = []
        if len(history) >= _MIN_HISTORY:
            median = statistics.median(history)
            if median > 0 and value > self.spike_factor * median:
                kind = "loss_spike" if name == "loss" else "grad_norm_spike"
                fields = {"step": step, name: value, "median": median, "factor": round(value / median, 2)}
                events.append(make_event(ts, kind, raw, "warning", fields, rank, path=self.path))
        history.append(value)
        return events


def rule_nan(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    """A NaN/inf loss or grad norm reported in words (step lines are judged by `Progress`)."""
    if "nan" not in low and "inf" not in low:
        return False
    if "returned" in low and _NAN_AUTOGRAD.search(body):
        kind = "grad_norm_nan"  # a backward function produced the NaN: the gradients carry it
    elif "loss" not in low and "norm" not in low:
        return False
    elif row := _NAN_ROW.match(body.strip()):
        kind = "nan_loss" if "loss" in row.group("name").lower() else "grad_norm_nan"
    elif _NAN_GRAD.search(body):
        kind = "grad_norm_nan"
    elif _NAN_LOSS.search(body):
        kind = "nan_loss"
    else:
        return False
    fields: dict[str, Any] = {"message": body.strip()[:MAX_MESSAGE]}
    device = _DEVICE.search(body)
    if device:
        fields["device"] = int(device.group(1))
    emit(kind, "error", fields, rank_in(body, rank))
    return True


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.strip().rstrip(",|;)]}'\""))
    except ValueError:
        return None


def _wire(value: float) -> float | str:
    """JSON has no NaN or infinity: non-finite values travel as "nan", "inf", "-inf"."""
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
