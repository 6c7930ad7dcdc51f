"""How well the parsers read a folder of real log excerpts: per file and in total, against labeled expectations.

Each fixture file is a header of `# key: value` lines, a `---` line, then the log text. Its `# expect:`
line(s) list the events a correct reading must produce, comma-separated:

    # expect: watchdog_timeout*4, traceback>nccl_error, step*3, grad_norm_nan*2

`kind` is an event kind, `*n` how many of them (default 1), `>error_kind` the kind of the error a block
(traceback, crash, child_failed) wraps. `# expect: none` marks a benign sample: no critical event may
come out of it. The recognition rate is the share of expected events the parsers produced (an expected
item found fewer times than listed counts only the ones found). `# parser: kernel|training|both` says
which of the agent's parsers reads the file, as the agent reads a kernel log or a training log (default
training). Unexplained errors (`unmatched_error`) and critical events from benign samples are reported
beside the rate.

    python -m lab.evaluation.parser_corpus tests/fixtures/logs [--verbose]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from agents.events import Event
from agents.parsers import parse_text
from agents.parsers.kernel import KernelLogParser
from agents.parsers.training import TrainingLogParser

HEADER_END = "\n---\n"
PARSERS = ("training", "kernel", "both")
_EXPECT_ITEM = re.compile(r"^(?P<kind>[a-z][a-z0-9_.-]*)(?:>(?P<error>[a-z][a-z0-9_.-]*))?(?:\*(?P<n>\d+))?$")
_NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)  # "now" for stamps without a year; the rate does not depend on it


@dataclass(frozen=True, slots=True)
class Expected:
    """One labeled expectation: `count` events of `kind` (wrapping an error of `error_kind` if given)."""

    kind: str
    error_kind: str | None = None
    count: int = 1

    def label(self) -> str:
        text = self.kind + (f">{self.error_kind}" if self.error_kind else "")
        return text + (f"*{self.count}" if self.count != 1 else "")


@dataclass(frozen=True, slots=True)
class Fixture:
    """A fixture file: its header values, its expectations and the log text."""

    path: Path
    header: dict[str, str]
    expected: tuple[Expected, ...]
    benign: bool
    text: str
    parser: str = "training"


@dataclass(slots=True)
class FileScore:
    """What the parsers made of one fixture."""

    name: str
    lines: int
    expected: int
    recognized: int
    missed: list[str] = field(default_factory=list)
    extra: int = 0  # events of an expected kind beyond the count expected (a line read twice, a false step)
    unexplained: int = 0  # unmatched_error events: an error the parsers saw but could not name
    false_alarms: int = 0  # critical events from a benign sample
    kinds: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class Report:
    """Per-file scores and the totals."""

    files: list[FileScore]

    @property
    def expected(self) -> int:
        return sum(f.expected for f in self.files)

    @property
    def recognized(self) -> int:
        return sum(f.recognized for f in self.files)

    @property
    def rate(self) -> float:
        return self.recognized / self.expected if self.expected else 1.0

    @property
    def lines(self) -> int:
        return sum(f.lines for f in self.files)


def parse_expect(value: str) -> tuple[tuple[Expected, ...], bool]:
    """The items of an `# expect:` value, and whether it marks a benign sample (`none`)."""
    items: list[Expected] = []
    benign = False
    for raw in value.split(","):
        token = raw.strip()
        if not token:
            continue
        if token == "none":
            benign = True
            continue
        m = _EXPECT_ITEM.match(token)
        if not m:
            raise ValueError(f"bad expectation {token!r}: expected kind[>error_kind][*n]")
        items.append(Expected(m.group("kind"), m.group("error"), int(m.group("n") or 1)))
    return tuple(items), benign


def read_fixture(path: Path) -> Fixture:
    """A fixture file split into header, expectations and log text."""
    content = path.read_text(encoding="utf-8")
    head, sep, text = content.partition(HEADER_END)
    if not sep:
        raise ValueError(f"{path}: no '---' line after the header")
    header: dict[str, str] = {}
    expected: list[Expected] = []
    benign = False
    for line in head.splitlines():
        if not line.startswith("#") or ":" not in line:
            continue
        key, _, value = line[1:].partition(":")
        key, value = key.strip(), value.strip()
        if key == "expect":
            items, none = parse_expect(value)
            expected += items
            benign = benign or none
        else:
            header[key] = value
    parser = header.get("parser", "training")
    if parser not in PARSERS:
        raise ValueError(f"{path}: unknown parser {parser!r} (one of {', '.join(PARSERS)})")
    return Fixture(path, header, tuple(expected), benign, text, parser)


def read_events(text: str, parser: str = "training") -> list[Event]:
    """Every event the named parser(s) of the agent make of `text`."""
    events: list[Event] = []
    if parser in ("kernel", "both"):
        events += parse_text(KernelLogParser(), text, now=_NOW)
    if parser in ("training", "both"):
        events += parse_text(TrainingLogParser(), text, now=_NOW)
    return events


def _error_kinds(event: Event) -> set[str]:
    """The kinds of the errors an event wraps: its own "error_kind" and the related readings."""
    error = event.fields.get("error")
    kinds: set[str] = set()
    if isinstance(error, dict):
        if isinstance(error.get("kind"), str):
            kinds.add(error["kind"])
        for related in error.get("related") or []:
            if isinstance(related, dict) and isinstance(related.get("kind"), str):
                kinds.add(related["kind"])
    return kinds


def score(fixture: Fixture, events: Sequence[Event] | None = None) -> FileScore:
    """How many of the fixture's expected events the parsers produced."""
    if events is None:
        events = read_events(fixture.text, fixture.parser)
    result = FileScore(
        name=fixture.path.name,
        lines=sum(1 for line in fixture.text.splitlines() if line.strip()),
        expected=sum(e.count for e in fixture.expected),
        recognized=0,
        kinds=Counter(e.kind for e in events),
    )
    for item in fixture.expected:
        found = sum(
            1 for e in events if e.kind == item.kind and (item.error_kind is None or item.error_kind in _error_kinds(e))
        )
        result.recognized += min(found, item.count)
        result.extra += max(0, found - item.count)
        if found < item.count:
            result.missed.append(f"{item.label()} (found {found})")
    result.unexplained = result.kinds.get("unmatched_error", 0)
    if fixture.benign:
        result.false_alarms = sum(1 for e in events if e.critical)
    return result


def fixture_paths(folder: Path) -> list[Path]:
    """The fixture files of a folder, sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".txt", ".log"))


def measure(paths: Iterable[Path]) -> Report:
    """Score every fixture file."""
    return Report([score(read_fixture(p)) for p in paths])


def format_report(report: Report, *, verbose: bool = False) -> str:
    """The per-file table and the totals, as printed by the CLI."""
    rows = [f"{'file':<58} {'lines':>5} {'expect':>6} {'found':>5} {'rate':>6} {'extra':>5} {'unexpl':>6}"]
    for f in report.files:
        rate = f"{f.recognized / f.expected:.0%}" if f.expected else ("ok" if not f.false_alarms else "ALARM")
        counts = f"{f.lines:>5} {f.expected:>6} {f.recognized:>5} {rate:>6} {f.extra:>5} {f.unexplained:>6}"
        rows.append(f"{f.name[:58]:<58} {counts}")
        if f.missed:
            rows.append(f"    missed: {'; '.join(f.missed)}")
        if f.false_alarms:
            rows.append(f"    critical events from a benign sample: {f.false_alarms}")
        if verbose:
            rows.append(f"    events: {dict(sorted(f.kinds.items()))}")
    labeled = sum(1 for f in report.files if f.expected or f.false_alarms == 0)
    rows.append(
        f"TOTAL files={len(report.files)} labeled={labeled} lines={report.lines} expected={report.expected} "
        f"recognized={report.recognized} rate={report.rate:.1%} extra={sum(f.extra for f in report.files)} "
        f"unexplained={sum(f.unexplained for f in report.files)} "
        f"false_alarms={sum(f.false_alarms for f in report.files)}"
    )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m lab.evaluation.parser_corpus FOLDER...`: print the table; exit 1 below --min-rate."""
    parser = argparse.ArgumentParser(prog="python -m lab.evaluation.parser_corpus", description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="folders of fixture files (or files)")
    parser.add_argument("--min-rate", type=float, default=0.0, help="exit 1 when the total rate is below this")
    parser.add_argument("--verbose", "-v", action="store_true", help="list the event kinds of each file")
    args = parser.parse_args(argv)
    paths: list[Path] = []
    for folder in args.folders:
        paths += fixture_paths(folder) if folder.is_dir() else [folder]
    report = measure(paths)
    print(format_report(report, verbose=args.verbose))
    return 0 if report.rate >= args.min_rate else 1


if __name__ == "__main__":
    sys.exit(main())
