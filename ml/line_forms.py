"""The form of a log line no rule knows: the line with its variable parts masked (ml/normalize.py), and a short
stable id of it, so that one new driver's or library's message, repeated on many nodes with other numbers, hosts
and addresses, is counted as one thing (issue 41 point 5).

Pure: the service counts lines per form at ingest (service/unknown_lines/record.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ml.normalize import normalize

# The form is made of a line's first characters: a 64 KiB line would cost milliseconds to normalize, and what
# tells one message from another is at its start.
FORM_CHARS = 400
# The example line kept for a form (the API and the UI show it); the form itself is clipped the same way.
EXAMPLE_CHARS = 500
# Normalizations per `Forms` (one ingest flush) before lines that differ from an earlier one only in their digits
# take its form unnormalized: a flood of one message costs at most this many (about 90 us each).
BUDGET = 512

_DIGITS = b"0123456789"


@dataclass(frozen=True)
class LineForm:
    form: str
    form_id: str  # 16 hex digits: equal for equal forms, on every node and in every release that masks alike


def form_id(form: str) -> str:
    """The short stable id of a form."""
    return hashlib.blake2b(form.encode("utf-8"), digest_size=8).hexdigest()


def form_of(line: str, *, host: str | None = None) -> LineForm:
    """The form of a line (its first FORM_CHARS characters); `host`, the node that logged it, reads <host>."""
    form = normalize(line[:FORM_CHARS], hosts=(host,) if host else ())[:EXAMPLE_CHARS]
    return LineForm(form, form_id(form))


def clip(line: str) -> str:
    """An example line as stored: its first EXAMPLE_CHARS characters, NUL-free (PostgreSQL text refuses NUL)."""
    return line[:EXAMPLE_CHARS].replace("\x00", "")


@dataclass
class Forms:
    """Forms of many lines (one ingest flush): each distinct line is normalized once, and past `budget`
    normalizations a line that differs from an earlier one only in its digits takes that one's form.

    The shortcut can merge two lines whose digits carry meaning (`Errno 5`, `Errno 28`), so it is kept for floods;
    below the budget every line gets its exact form.
    """

    budget: int = BUDGET
    normalized: int = 0
    _exact: dict[tuple[str | None, str], LineForm] = field(default_factory=dict)
    _loose: dict[tuple[str | None, bytes], LineForm] = field(default_factory=dict)

    def of(self, line: str, *, host: str | None = None) -> LineForm:
        head = line[:FORM_CHARS]
        key = (host, head)
        found = self._exact.get(key)
        if found is not None:
            return found
        # Bytes: deleting digits from them is ten times cheaper than from a str (a key only: "replace" is enough).
        loose = (host, head.encode("utf-8", "replace").translate(None, _DIGITS))
        if self.normalized >= self.budget and (found := self._loose.get(loose)) is not None:
            return found
        found = form_of(head, host=host)
        self.normalized += 1
        self._exact[key] = found
        self._loose.setdefault(loose, found)
        return found
