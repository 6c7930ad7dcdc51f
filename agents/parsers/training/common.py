"""What the parts of the training parser share: the event factory, the rule signature, small helpers."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from agents.events import Event
from agents.parsers import clip

SOURCE = "training"
MAX_MESSAGE = 1000  # characters of a message kept in an event's fields

# Lines that accompany errors already reported by another line: not news.
BOILERPLATE = (
    "CUDA kernel errors might be asynchronously reported",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING",
    "Compile with `TORCH_USE_CUDA_DSA`",
    "Some NCCL operations have failed or timed out",
    "To avoid data inconsistency, we are taking the entire process down",
    "To enable traceback see:",
    "Details are lost due to multiprocessing",
    # torchrun's agent, copying a worker's error file: the ChildFailedError summary reports the failure.
    "no error file defined for parent, to copy child error file",
)

_MSG_RANK = re.compile(r"(?i)\brank(?: id)?[:= ]\s*(\d{1,6})\b")


class Emit(Protocol):
    """Records one event for the line being classified; `at` is its rank (default: the prefix's)."""

    def __call__(
        self, kind: str, severity: str, fields: dict[str, Any], at: int | None = ..., critical: bool = False
    ) -> None: ...


# A single-line rule: (message, message lowercased, emit, prefix rank) -> True when the line is fully
# explained. Each starts with a cheap substring test: most lines are none of its business.
Rule = Callable[[str, str, Emit, int | None], bool]


def make_event(
    ts: datetime,
    kind: str,
    line: str,
    severity: str,
    fields: dict[str, Any],
    rank: int | None,
    *,
    path: str | None,
    critical: bool = False,
) -> Event:
    return Event(
        ts=ts,
        source=SOURCE,
        kind=kind,
        line=clip(line),
        severity=severity,
        fields=fields,
        rank=rank,
        path=path,
        critical=critical,
    )


def rank_in(body: str, rank: int | None) -> int | None:
    """The prefix's rank, else one the message names ("rank=3 ...", "Rank 3: ...")."""
    if rank is not None or ("ank" not in body and "ANK" not in body):
        return rank
    m = _MSG_RANK.search(body)
    return int(m.group(1)) if m else None


def int_or_none(text: str | None) -> int | None:
    """int() of an optional regex group: None when the group did not take part in the match."""
    return int(text) if text else None


def search_int(regex: re.Pattern[str], text: str, pos: int = 0) -> int | None:
    """The integer in `regex`'s first group at its first match in `text` (from `pos`), or None."""
    found = regex.search(text, pos)
    return int(found.group(1)) if found else None


def is_boilerplate(body: str) -> bool:
    return any(b in body for b in BOILERPLATE)
