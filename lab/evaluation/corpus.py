"""`faultline eval --corpus [DIR]`: every real log of the corpus, end to end, scored against its label.

Each log is replayed (`faultline replay`'s code: the agent's parsers, POST /api/v1/ingest, the worker, incidents
and decisions) as one node of a two-node job whose other node is an innocent peer stepping normally through the
same minutes. A log is right when the outcome matches its label (the `# class:` and `# accept:` header lines):

- machine: a decision on the log's node of an accepted kind (or, where `none` is accepted, no decision on it),
  and no decision on it of a kind not accepted
- application: no decision on either node, an incident that does not blame the infrastructure, and only accepted
  job-level decisions
- either: an incident; decisions on the log's node only of accepted kinds
- benign: no incident and no decision

Where the label lists incident categories, an incident of one of them is needed too (machine, application,
either). In every class the innocent peer must not be accused: no decision on it and not an incident's suspect.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agents.events import Event
from agents.parsers import parse_text
from agents.parsers.training import TrainingLogParser
from agents.replay import Replay, load, run
from agents.replay.client import NODE_KINDS, Outcome, ReplayClient
from agents.replay.timeline import LogFile, NodeReplay, guess_kind
from lab.evaluation.parser_corpus import Fixture, fixture_paths, read_fixture
from ml.findings import CATEGORIES
from service.models.diagnosis import DECISION_KINDS

CLASSES = ("machine", "application", "either", "benign")
PEER_STEP_S = 2.0
PEER_MIN_SPAN_S = 40.0


@dataclass(frozen=True, slots=True)
class Label:
    """What a right outcome for one log looks like."""

    cls: str
    kinds: frozenset[str]  # accepted decision kinds
    categories: frozenset[str]  # accepted incident categories (empty: any)


@dataclass
class LogResult:
    name: str
    label: Label | None
    right: bool | None  # None: no label, replayed but not scored
    why: str
    innocent_accused: bool
    outcome: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        label = self.label
        return {
            "file": self.name,
            "class": label.cls if label else None,
            "accept": sorted(label.kinds | label.categories) if label else None,
            "right": self.right,
            "why": self.why,
            "innocent_accused": self.innocent_accused,
            "error": self.error,
            "outcome": self.outcome,
        }


def parse_label(header: dict[str, str]) -> Label | None:
    """The label of a corpus file's header; None when it has no `# class:` line. Raises ValueError on bad values."""
    cls = header.get("class", "").strip()
    if not cls:
        return None
    if cls not in CLASSES:
        raise ValueError(f"class {cls!r} is not one of {', '.join(CLASSES)}")
    tokens = {t.strip() for t in header.get("accept", "").split(",") if t.strip()}
    unknown = tokens - set(DECISION_KINDS) - set(CATEGORIES)
    if unknown:
        raise ValueError(f"accept: {', '.join(sorted(unknown))} is neither a decision kind nor an incident category")
    return Label(cls, frozenset(tokens & set(DECISION_KINDS)), frozenset(tokens & set(CATEGORIES)))


def _suspects(outcome: Outcome) -> set[str]:
    return {str(s.get("node")) for i in outcome.incidents for s in i.get("suspects") or []}


def judge(label: Label, outcome: Outcome, *, node: str, peer: str) -> tuple[bool, str, bool]:
    """Whether the outcome is right for the label, why not (or what it was), and whether the peer was accused."""
    accused = bool(outcome.node_decisions(peer)) or peer in _suspects(outcome)
    mine = {d.get("kind") for d in outcome.node_decisions(node)}
    job_kinds = {d.get("kind") for d in outcome.decisions if d.get("kind") not in NODE_KINDS}
    categories = {i.get("root_cause") for i in outcome.incidents}
    blames = {i.get("blame") for i in outcome.incidents}
    seen = f"incidents {sorted(map(str, categories)) or '-'}, decisions on the node {sorted(map(str, mine)) or '-'}"
    if accused:
        return False, f"the innocent peer was accused; {seen}", True
    if label.cls != "benign" and label.categories and not categories & label.categories:
        return False, f"no incident of {', '.join(sorted(label.categories))}; {seen}", False
    if label.cls == "machine":
        if not mine & label.kinds and (mine or "none" not in label.kinds or not outcome.incidents):
            return False, f"no accepted decision ({', '.join(sorted(label.kinds))}) on the node; {seen}", False
        if mine - label.kinds:
            return False, f"decisions {sorted(map(str, mine - label.kinds))} on the node not accepted; {seen}", False
    elif label.cls == "application":
        if mine:
            return False, f"a machine was acted on for the application's fault; {seen}", False
        if not outcome.incidents:
            return False, "no incident", False
        if "infrastructure" in blames:
            return False, f"the infrastructure was blamed; {seen}", False
        if job_kinds - label.kinds - {"none"}:
            return False, f"job decisions {sorted(map(str, job_kinds))} not accepted; {seen}", False
    elif label.cls == "either":
        if not outcome.incidents:
            return False, "no incident", False
        if mine - label.kinds:
            return False, f"decisions {sorted(map(str, mine - label.kinds))} on the node not accepted; {seen}", False
    elif outcome.incidents or outcome.decisions:
        return False, f"a benign log made {seen}", False
    return True, seen, False


def peer_replay(name: str, *, ranks: Sequence[int], end: datetime, span_s: float) -> NodeReplay:
    """An innocent node of the same job: each of its ranks logs a normal training step every PEER_STEP_S through
    the replay's minutes, read by the agent's training-log parser like any other log. Its lines carry no loss: in
    a data-parallel job every rank reports the same all-reduced loss, so a peer's clean loss beside the log's
    NaN would be evidence the real job never had."""
    span = max(span_s, PEER_MIN_SPAN_S)
    start = end - timedelta(seconds=span)
    steps = int(span / PEER_STEP_S)
    lines = [
        f"[rank{rank}]:{(start + timedelta(seconds=i * PEER_STEP_S)):%Y-%m-%d %H:%M:%S},000 - root - INFO - "
        f"step: {100 + i}  memory: 41.20GiB(52.00%)  tps: 5,800  tflops: 339.16  mfu: 34.29%"
        for i in range(steps)
        for rank in ranks
    ]
    events: list[Event] = parse_text(TrainingLogParser(), "\n".join(lines) + "\n", now=end)
    return NodeReplay(name, events, [])


def readers(fixture: Fixture) -> list[str]:
    """The agent's readers a corpus file goes through (`faultline replay`'s file kinds): its `# parser:` line's, else
    the one its lines look like, as `faultline replay` guesses it (a kernel log's NVRM lines are no training log's)."""
    parser = fixture.parser if "parser" in fixture.header else guess_kind(fixture.text)
    return ["kernel", "training"] if parser == "both" else [parser]


class CorpusRun:
    """Replays every labeled log of a folder into one service, a few at a time."""

    def __init__(
        self,
        url: str,
        *,
        token: str,
        agent_token: str,
        tag: str,
        parallel: int = 8,
        timeout_s: float = 90.0,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.url, self.token, self.agent_token = url, token, agent_token
        self.tag, self.parallel, self.timeout_s, self.say = tag, parallel, timeout_s, say
        self._done = 0
        self._lock = threading.Lock()

    def run(self, paths: Sequence[Path]) -> list[LogResult]:
        with ThreadPoolExecutor(max_workers=self.parallel) as pool:
            return list(pool.map(self._one, range(len(paths)), paths, [len(paths)] * len(paths)))

    def _one(self, index: int, path: Path, total: int) -> LogResult:
        result = self._replay(index, path)
        with self._lock:
            self._done += 1
            mark = {True: "right", False: "WRONG", None: "unlabeled"}[result.right]
            why = f" ({result.why})" if result.right is False else ""
            self.say(f"[{self._done}/{total}] {path.name}: {mark}{why}")
        return result

    def _replay(self, index: int, path: Path) -> LogResult:
        try:
            fixture = read_fixture(path)
            label = parse_label(fixture.header)
        except (OSError, ValueError) as exc:
            return LogResult(path.name, None, False, f"unreadable: {exc}", False, error=str(exc))
        node, peer = f"{self.tag}-{index:03d}-a", f"{self.tag}-{index:03d}-b"
        job_id = f"{self.tag}-{index:03d}"
        files = [LogFile(node, path, kind) for kind in readers(fixture)]
        client = ReplayClient(self.url, token=self.token, agent_token=self.agent_token)
        try:
            loaded = load(files)
            own_ranks = {e.rank for e in loaded.nodes[0].events if e.rank is not None}
            peer_ranks = [max(own_ranks, default=0) + 1]
            loaded = Replay(
                [
                    *loaded.nodes,
                    peer_replay(peer, ranks=peer_ranks, end=datetime.now(UTC), span_s=loaded.span_s),
                ],
                loaded.files,
                loaded.span_s,
            )
            outcome = run(client, loaded, job_id=job_id, timeout_s=self.timeout_s)
        except Exception as exc:  # an unreadable file or a service error must not stop the other logs' replays
            return LogResult(path.name, label, False, f"replay failed: {exc}", False, error=str(exc))
        finally:
            client.close()
        if label is None:
            return LogResult(path.name, None, None, "no label", peer in _suspects(outcome), outcome.to_json())
        right, why, accused = judge(label, outcome, node=node, peer=peer)
        return LogResult(path.name, label, right, why, accused, outcome.to_json())


def summarize(results: Sequence[LogResult]) -> dict[str, Any]:
    """Totals and per-class figures; unlabeled logs are counted apart."""
    scored = [r for r in results if r.right is not None]
    per_class: dict[str, dict[str, Any]] = {}
    for cls in CLASSES:
        rows = [r for r in scored if r.label and r.label.cls == cls]
        right = sum(1 for r in rows if r.right)
        per_class[cls] = {"logs": len(rows), "right": right, "accuracy": round(right / len(rows), 4) if rows else None}
    right = sum(1 for r in scored if r.right)
    return {
        "totals": {
            "logs": len(scored),
            "right": right,
            "accuracy": round(right / len(scored), 4) if scored else 0.0,
            "innocent_accused": sum(1 for r in results if r.innocent_accused),
            "unlabeled": len(results) - len(scored),
            "errors": sum(1 for r in results if r.error),
        },
        "per_class": per_class,
    }


def format_report(results: Sequence[LogResult], summary: dict[str, Any]) -> str:
    """Per log (right or wrong, and why when wrong), per class, and the totals."""
    rows = [f"{'log':<62} {'class':<11} result"]
    for r in sorted(results, key=lambda r: (r.label.cls if r.label else "~", r.name)):
        mark = {True: "right", False: "WRONG", None: "-"}[r.right]
        rows.append(f"{r.name[:62]:<62} {(r.label.cls if r.label else 'unlabeled'):<11} {mark}")
        if r.right is False:
            rows.append(f"    {r.why}")
    rows.append("")
    rows.append(f"{'class':<12} {'logs':>5} {'right':>6} {'accuracy':>9}")
    for cls, row in summary["per_class"].items():
        accuracy = f"{row['accuracy']:.1%}" if row["accuracy"] is not None else "-"
        rows.append(f"{cls:<12} {row['logs']:>5} {row['right']:>6} {accuracy:>9}")
    t = summary["totals"]
    rows.append(
        f"{'total':<12} {t['logs']:>5} {t['right']:>6} {t['accuracy']:>9.1%}   innocent peer accused: "
        f"{t['innocent_accused']}" + (f"   unlabeled: {t['unlabeled']}" if t["unlabeled"] else "")
    )
    kinds = Counter(r.label.cls for r in results if r.label)
    rows.append(f"({sum(kinds.values())} labeled logs: " + ", ".join(f"{k} {v}" for k, v in kinds.items()) + ")")
    return "\n".join(rows)


def corpus_paths(folder: Path) -> list[Path]:
    """The corpus files of a folder (or the one file given)."""
    if folder.is_file():
        return [folder]
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder")
    return fixture_paths(folder)


def _cell(text: str, limit: int = 90) -> str:
    text = " ".join(text.replace("|", "/").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def labels_table(paths: Sequence[Path]) -> str:
    """The corpus's labels as the Markdown table of its README (tests/fixtures/logs/README.md), from the files'
    headers: `python -m lab.evaluation.corpus [DIR]` prints it."""
    rows = [
        "| file | class | accept | thread | what the thread says |",
        "|---|---|---|---|---|",
    ]
    for path in paths:
        fixture = read_fixture(path)
        h = fixture.header
        rows.append(
            f"| {path.name} | {h.get('class', '')} | {_cell(h.get('accept', ''), 60)} | {h.get('thread', '')} "
            f"| {_cell(h.get('root_cause', ''))} |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    import sys

    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "tests/fixtures/logs"
    print(labels_table(corpus_paths(folder)), end="")
