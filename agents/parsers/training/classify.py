"""Reading one line on its own: the single-line rules in order, NaN lines, and unexplained errors."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from agents.events import Event
from agents.parsers.training.common import Rule, is_boilerplate, make_event, rank_in
from agents.parsers.training.crashes import rule_crash, rule_dataloader
from agents.parsers.training.cuda import rule_cuda, rule_gpu_lost, rule_oom
from agents.parsers.training.elastic import rule_elastic
from agents.parsers.training.loss_scale import rule_loss_scale
from agents.parsers.training.mismatch import rule_collective_mismatch
from agents.parsers.training.nccl import rule_duplicate_gpu, rule_ib, rule_nccl_error, rule_nccl_warn
from agents.parsers.training.progress import rule_nan
from agents.parsers.training.storage import rule_storage
from agents.parsers.training.verbs import rule_ib_verbs
from agents.parsers.training.watchdog import rule_collective_timeout, rule_watchdog

# Most specific first: the first rule that explains a line ends its reading.
_RULES: tuple[Rule, ...] = (
    rule_watchdog,
    rule_ib,
    rule_ib_verbs,
    rule_collective_mismatch,
    rule_nccl_warn,
    rule_nccl_error,
    rule_duplicate_gpu,
    rule_oom,
    rule_cuda,
    rule_gpu_lost,
    rule_dataloader,
    rule_storage,
    rule_collective_timeout,
    rule_elastic,
    rule_loss_scale,
    rule_crash,
)

_ERROR_LEVELS = frozenset({"E", "F", "ERROR", "CRITICAL"})
_ERRORISH = re.compile(
    r"(?:Error|Exception)\b|\berror:|\b(?:ERROR|FATAL|Fatal|failed|Failed|FAILED|Killed|Segmentation fault|core dumped"
    r"|panic)\b"
)
# Substrings one of which every _ERRORISH match contains: a C-speed test before the regex.
_ERROR_WORDS = (
    "rror",
    "xception",
    "ERROR",
    "FATAL",
    "Fatal",
    "ailed",
    "FAILED",
    "Killed",
    "Segmentation",
    "core dumped",
    "panic",
)


def classify(
    raw: str,
    body: str,
    ts: datetime,
    rank: int | None,
    local_rank: int | None,
    *,
    path: str | None,
    stepped: bool = False,
    level: str | None = None,
    low: str | None = None,
) -> list[Event]:
    """Single-line rules, most specific first; several may apply (a NCCL error carrying an IB one).

    `stepped`: the line was a progress line (its NaNs are judged there); `level`: its log level.
    """
    events: list[Event] = []

    def emit(kind: str, severity: str, fields: dict[str, Any], at: int | None = rank, critical: bool = False) -> None:
        if local_rank is not None:
            fields.setdefault("local_rank", local_rank)
        events.append(make_event(ts, kind, raw, severity, fields, at, path=path, critical=critical))

    if "NCCL INFO" in body:
        return events  # NCCL's chatter, including its "-> 6" return-code chains
    if low is None:
        low = body.lower()
    for rule in _RULES:
        if rule(body, low, emit, rank):
            return events
    if not stepped and rule_nan(body, low, emit, rank):
        return events
    if events:
        return events
    if body.startswith("    ") or body.lstrip().startswith(("frame #", 'File "')) or is_boilerplate(body):
        return events  # stack frames and source lines of a traceback we did not see begin
    if body.strip() == "Last error:":
        return events  # NCCL's heading for the line after it, which says what the error was
    if level in _ERROR_LEVELS or (any(w in body for w in _ERROR_WORDS) and _ERRORISH.search(body)):
        emit("unmatched_error", "warning", {"level": level} if level else {}, rank_in(body, rank))
    return events


def read_error(text: str, ts: datetime) -> tuple[dict[str, Any] | None, int | None]:
    """The most specific single-line reading of an exception message, as a dict with its kind, and its rank.

    Only a NCCL error that carries an IB completion error reads two ways: the NCCL error wins, the
    IB one rides along under "related".
    """
    found = [e for e in classify(text, text, ts, None, None, path=None) if e.kind != "unmatched_error"]
    if not found:
        return None, None
    main = found[-1]
    error: dict[str, Any] = {"kind": main.kind, **main.fields}
    if len(found) > 1:
        error["related"] = [{"kind": e.kind, **e.fields} for e in found[:-1]]
    return error, main.rank


def add_error(fields: dict[str, Any], message: str, ts: datetime) -> int | None:
    """Put the reading of a block's exception message under "error" and "error_kind"; returns its rank."""
    error, rank = read_error(message, ts)
    if error is not None:
        fields["error"] = error
        fields["error_kind"] = error["kind"]
    return rank
