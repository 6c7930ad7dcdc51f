"""The real-log corpus: every file labeled and cited, the labels table beside the files in step with them, and the
end-to-end scoring rules of `faultline eval --corpus` (the replay itself: tests/e2e/test_replay.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from agents.replay.client import Outcome
from lab.evaluation import corpus
from lab.evaluation.parser_corpus import Fixture, read_fixture
from tests import paths

LOGS = paths.FIXTURES / "logs"
MIN_LOGS = 100


def test_every_log_is_labeled_with_its_thread() -> None:
    files = corpus.corpus_paths(LOGS)
    assert len(files) >= MIN_LOGS
    classes: Counter[str] = Counter()
    for path in files:
        header = read_fixture(path).header
        label = corpus.parse_label(header)
        assert label is not None, f"{path.name}: no '# class:' line"
        assert label.kinds or label.categories, f"{path.name}: no '# accept:' values"
        assert header.get("thread"), f"{path.name}: no '# thread:' line"
        # A public thread, or (one file) a real torchrun job of this repository's own.
        assert header.get("source", "").startswith(("http", "a real run of")), f"{path.name}: no source"
        classes[label.cls] += 1
    assert set(classes) == set(corpus.CLASSES), classes


def test_the_labels_table_next_to_the_files_is_in_step_with_them() -> None:
    readme = (LOGS / "README.md").read_text()
    table = corpus.labels_table(corpus.corpus_paths(LOGS))
    assert table in readme, "regenerate it: python -m lab.evaluation.corpus > table, then paste it into README.md"


def test_labels_refuse_unknown_values() -> None:
    with pytest.raises(ValueError, match="class"):
        corpus.parse_label({"class": "hardware"})
    with pytest.raises(ValueError, match="neither a decision kind nor an incident category"):
        corpus.parse_label({"class": "machine", "accept": "evict, reboot"})
    assert corpus.parse_label({"source": "x"}) is None


def _outcome(incidents: list[dict] | None = None, decisions: list[dict] | None = None) -> Outcome:
    return Outcome("j", incidents=incidents or [], decisions=decisions or [], settled=True)


def _incident(cause: str, blame: str, suspects: tuple[str, ...] = ()) -> dict:
    return {"root_cause": cause, "blame": blame, "suspects": [{"node": s} for s in suspects]}


def _decision(kind: str, node: str | None) -> dict:
    return {"kind": kind, "node": node}


MACHINE = corpus.parse_label({"class": "machine", "accept": "evict, reset_gpu, gpu_hardware"})
CONTAINED = corpus.parse_label({"class": "machine", "accept": "reset_gpu, diagnose, none, gpu_hardware"})
APP = corpus.parse_label({"class": "application", "accept": "user_code, job_failure, none, restart"})
EITHER = corpus.parse_label({"class": "either", "accept": "diagnose, none, network, job_failure"})
BENIGN = corpus.parse_label({"class": "benign", "accept": "none"})


@pytest.mark.parametrize(
    ("label", "outcome", "right", "accused"),
    [
        (MACHINE, _outcome([_incident("gpu_hardware", "infrastructure", ("a",))], [_decision("evict", "a")]), 1, 0),
        (MACHINE, _outcome([_incident("gpu_hardware", "infrastructure", ("a",))]), 0, 0),  # nothing decided
        (MACHINE, _outcome([_incident("network", "infrastructure")], [_decision("evict", "a")]), 0, 0),  # category
        (MACHINE, _outcome([_incident("gpu_hardware", "infrastructure")], [_decision("evict", "b")]), 0, 1),
        (CONTAINED, _outcome([_incident("gpu_hardware", "infrastructure")], [_decision("restart", None)]), 1, 0),
        (CONTAINED, _outcome([_incident("gpu_hardware", "infrastructure")], [_decision("evict", "a")]), 0, 0),
        (APP, _outcome([_incident("user_code", "user_code")], [_decision("restart", None)]), 1, 0),
        (APP, _outcome([_incident("user_code", "user_code")], [_decision("diagnose", "a")]), 0, 0),
        (APP, _outcome([_incident("job_failure", "unknown", ("b",))]), 0, 1),  # a suspect is an accusation
        (APP, _outcome([_incident("gpu_hardware", "infrastructure")]), 0, 0),
        (APP, _outcome(), 0, 0),
        (EITHER, _outcome([_incident("network", "unknown")], [_decision("diagnose", "a")]), 1, 0),
        (EITHER, _outcome([_incident("network", "infrastructure")], [_decision("evict", "a")]), 0, 0),
        (BENIGN, _outcome(), 1, 0),
        (BENIGN, _outcome([_incident("unknown", "unknown")]), 0, 0),
    ],
)
def test_judge(label: corpus.Label, outcome: Outcome, right: int, accused: int) -> None:
    ok, why, was_accused = corpus.judge(label, outcome, node="a", peer="b")
    assert (ok, was_accused) == (bool(right), bool(accused)), why


def test_summary_counts_per_class_and_the_innocent_accused() -> None:
    results = [
        corpus.LogResult("m.txt", MACHINE, True, "", False),
        corpus.LogResult("a.txt", APP, False, "peer", True),
        corpus.LogResult("b.txt", BENIGN, True, "", False),
        corpus.LogResult("u.txt", None, None, "no label", False),
    ]
    summary = corpus.summarize(results)
    assert summary["totals"] == {
        "logs": 3,
        "right": 2,
        "accuracy": 0.6667,
        "innocent_accused": 1,
        "unlabeled": 1,
        "errors": 0,
    }
    assert summary["per_class"]["application"] == {"logs": 1, "right": 0, "accuracy": 0.0}
    assert summary["per_class"]["either"] == {"logs": 0, "right": 0, "accuracy": None}
    text = corpus.format_report(results, summary)
    assert "a.txt" in text and "WRONG" in text and "innocent peer accused: 1" in text


def test_a_file_without_a_parser_line_is_read_by_what_its_lines_look_like(tmp_path: Path) -> None:
    def fixture(head: str, body: str) -> Fixture:
        path = tmp_path / "f.txt"
        path.write_text(f"# source: test\n{head}---\n{body}\n")
        return read_fixture(path)

    kernel = "NVRM: Xid (PCI:0000:01:00): 79, pid=1, GPU has fallen off the bus.\n"
    assert corpus.readers(fixture("", kernel)) == ["kernel"]
    assert corpus.readers(fixture("", "step: 12 loss: 2.5\n")) == ["training"]
    assert corpus.readers(fixture("# parser: training\n", kernel)) == ["training"]
    assert corpus.readers(fixture("# parser: both\n", kernel)) == ["kernel", "training"]
