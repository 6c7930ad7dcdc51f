"""The log classifier scored on real threads: the thread column, the corpus lines, the split and its report."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from ml.classifier import cli, dataset, model, train
from ml.classifier.dataset import CATEGORIES, WRITTEN, LabeledLine
from ml.normalize import normalize

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


@pytest.fixture(scope="module")
def rows() -> list[LabeledLine]:
    return dataset.load_labeled()


@pytest.fixture(scope="module")
def folds(rows: list[LabeledLine]) -> list[train.ThreadFold]:
    return train.thread_folds(rows, seed=0)


# ---- the thread column and the corpus lines --------------------------------------------------------------------


def test_thread_comes_from_the_header_or_the_source_url() -> None:
    header = "# source: https://github.com/NVIDIA/nccl/issues/928 (NVIDIA/nccl #928)\n"
    assert dataset.thread_of_header(header + "---\nline\n") == "NVIDIA/nccl#928"
    assert dataset.thread_of_header("# source: https://github.com/pytorch/torchtitan/pull/1287 (PR)\n") == (
        "pytorch/torchtitan#1287"
    )
    doc = "# source: https://github.com/stas00/ml-engineering debug/pytorch.md (commit 744d01e1), case study\n"
    assert dataset.thread_of_header(doc) == "stas00/ml-engineering:debug/pytorch.md"
    explicit = "# source: a real run of train.py\n# thread: faultline:tests/torchjob/train.py\n---\n# thread: x#1\n"
    assert dataset.thread_of_header(explicit) == "faultline:tests/torchjob/train.py", "the header's, not the body's"
    assert dataset.thread_of_header("# source: a real run\n---\n") is None


def test_every_real_line_is_verbatim_in_its_corpus_file_and_names_its_thread(rows: list[LabeledLine]) -> None:
    real = [r for r in rows if r.real]
    assert all(r.thread != WRITTEN for r in real) and all(r.thread == WRITTEN for r in rows if not r.real)
    missing = sorted({r.source for r in real if not (CORPUS / r.source).is_file()})
    assert not missing, f"labeled lines from corpus files that are gone: {missing}"
    bodies: dict[str, set[str]] = {}
    for r in real:
        if r.source not in bodies:
            bodies[r.source] = {line.replace("\t", " ").strip() for line in dataset.corpus_body(CORPUS / r.source)}
            assert dataset.corpus_thread(CORPUS / r.source) == r.thread, r.source
        assert r.line in bodies[r.source], (r.source, r.line[:120])


def test_the_real_lines_cover_the_corpus_threads(rows: list[LabeledLine]) -> None:
    # Logs gathered to measure the classifier on threads it never saw stay out of its lines (`# held_out:`).
    corpus = {dataset.corpus_thread(path) for path in CORPUS.glob("*.txt") if "\n# held_out:" not in path.read_text()}
    labeled = {r.thread for r in rows if r.real}
    uncovered = sorted(corpus - labeled)
    print(f"{len(labeled)} of {len(corpus)} corpus threads labeled; not yet: {uncovered}")
    # New corpus files arrive on their own; most threads must already contribute their telling lines.
    assert len(corpus & labeled) >= 0.9 * len(corpus), uncovered
    counts = Counter(r.category for r in rows if r.real)
    assert len([r for r in rows if r.real]) >= 700 and counts["unknown"] < 0.75 * sum(counts.values()), counts
    assert all(counts[c] >= 5 for c in CATEGORIES), "every category has real lines to be scored on"


def test_three_column_data_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "old.tsv"
    path.write_text("category\tline\tsource\nnetwork\tNCCL WARN x\tib.txt\nunknown\tstep 1\twritten\n")
    assert dataset.load_labeled(path) == [
        LabeledLine("network", "NCCL WARN x", "ib.txt", "ib.txt"),
        LabeledLine("unknown", "step 1", WRITTEN, WRITTEN),
    ]
    path.write_text("category\tline\tsource\tthread\nnetwork\tNCCL WARN x\twritten\tNVIDIA/nccl#1\n")
    with pytest.raises(ValueError, match="line 2"):
        dataset.load_labeled(path)


# ---- the split -------------------------------------------------------------------------------------------------


def test_thread_split_never_puts_a_thread_on_both_sides(rows: list[LabeledLine], folds: list[train.ThreadFold]) -> None:
    real = [i for i, r in enumerate(rows) if r.real]
    assert len(folds) == train.THREAD_FOLDS
    tested = sorted(i for fold in folds for i in fold.test)
    assert tested == real, "every real line is tested exactly once"
    for fold in folds:
        test_threads = {rows[i].thread for i in fold.test}
        train_threads = {rows[i].thread for i in fold.train}
        assert test_threads == set(fold.test_threads) and not test_threads & train_threads
        assert WRITTEN in train_threads and WRITTEN not in test_threads
        assert not set(fold.train) & set(fold.test)


def test_no_copy_of_a_test_line_is_in_training(rows: list[LabeledLine], folds: list[train.ThreadFold]) -> None:
    for fold in folds[:2]:  # each fold's check builds its variants; two folds show it
        test_texts = {normalize(rows[i].line) for i in fold.test}
        train_texts = [normalize(rows[i].line) for i in fold.train]
        assert not test_texts & set(train_texts)
        written = [normalize(rows[i].line) for i in fold.train if not rows[i].real]
        assert not train.near_copies(written, sorted(test_texts))
        data = train.fold_data(rows, fold, n_variants=4, seed=0)
        assert not test_texts & set(data.texts), "no generated variant reproduces a test line"
        assert len(data.texts) == len(data.labels) == len(data.groups) == len(data.split_groups)
        assert data.test_texts == [normalize(rows[i].line) for i in fold.test]
    assert sum(fold.dropped for fold in folds) > 0, "the shipped data has written copies of corpus lines"


def test_near_copies_catch_prefixes_and_typos_not_templates() -> None:
    unique_id = "is setting up NCCL communicator and {} ncclUniqueId from [0] via c10d key-value store by key '0'"
    test = [normalize(f"[rank3]: RuntimeError: [2] {unique_id.format('retreiving')}, but store->get('0') got error")]
    candidates = [
        normalize(f"RuntimeError: [1] {unique_id.format('retrieving')}, but store->get('0') got error"),
        normalize("node-1:2:3 [0] NCCL WARN NET/IB : Got async event : port error"),
        normalize("RuntimeError: CUDA error: an illegal memory access was encountered"),
    ]
    assert train.near_copies(candidates, test) == {0}
    assert train.near_copies([], test) == set() and train.near_copies(candidates, []) == set()


def test_thread_split_needs_two_threads() -> None:
    rows = [LabeledLine("network", "NCCL WARN x", "a.txt", "o/r#1"), LabeledLine("unknown", "ok", WRITTEN, WRITTEN)]
    with pytest.raises(ValueError, match="at least 2 threads"):
        train.thread_folds(rows)


def test_thread_report_scores_only_categories_with_real_lines() -> None:
    labels = ["network", "network", "unknown", "oom"]
    predicted = ["network", "storage", "unknown", "oom"]
    text, summary = train.thread_report(labels, predicted)
    assert summary["scored_categories"] == ["network", "oom", "unknown"]
    assert summary["per_class"]["network"]["recall"] == 0.5 and summary["per_class"]["storage"]["support"] == 0
    assert summary["macro_f1"] == pytest.approx((2 / 3 + 1 + 1) / 3, abs=1e-3)
    assert "not scored (no real lines): gpu_hardware, user_code, storage, nan" in text and "confusion" in text


# ---- the figures -----------------------------------------------------------------------------------------------


def test_shipped_artifact_carries_the_thread_figures(rows: list[LabeledLine]) -> None:
    meta = model.load(model.find_artifacts()[-1]).metadata
    figures = meta["thread_cv"]
    real = [r for r in rows if r.real]
    print(train.macro_line(figures), json.dumps(figures["per_class"], indent=1))
    assert figures["n_lines"] == len(real) and figures["n_threads"] == len({r.thread for r in real})
    assert figures["folds"] == train.THREAD_FOLDS and set(figures["per_class"]) == set(CATEGORIES)
    assert figures["macro_f1"] >= 0.8, "docs/diagnosis.md quotes the figure; a drop below this is a regression"
    assert np.isclose(
        figures["macro_f1"], np.mean([figures["per_class"][c]["f1"] for c in figures["scored_categories"]]), atol=1e-3
    )


def _small_tsv(path: Path) -> Path:
    """Written lines for every category and real lines from four threads: enough to train and to split."""
    written = {
        "gpu_hardware": ["NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", "uncorrectable ECC error"],
        "network": ["NCCL WARN NET/IB : Got completion from peer with error 12", "socketStartConnect failed"],
        "user_code": ["KeyError: 'labels'", "TypeError: forward() got an unexpected keyword argument 'x'"],
        "oom": ["torch.OutOfMemoryError: CUDA out of memory.", "Out of memory: Killed process 1234 (python)"],
        "storage": ["OSError: [Errno 28] No space left on device", "OSError: [Errno 122] Disk quota exceeded"],
        "nan": ["step 10 loss nan grad_norm nan", "found NaN in local grad norm"],
        "unknown": ["Epoch 1: 50% loss=1.2", "Saving checkpoint to /ckpt/step_100"],
    }
    lines = ["# a small labeled set", "category\tline\tsource\tthread"]
    lines += [f"{c}\t{t}\t{WRITTEN}\t{WRITTEN}" for c, texts in written.items() for t in texts]
    real = [
        ("network", "node-3:11:12 [1] NCCL WARN NET/IB : Got async event : port error", "a.txt", "o/a#1"),
        ("unknown", "iteration 10/100 | lm loss: 2.1", "a.txt", "o/a#1"),
        ("gpu_hardware", "NVRM: Xid (PCI:0000:cb:00): 48, An uncorrectable double bit error", "b.txt", "o/b#2"),
        ("unknown", "INFO starting training", "b.txt", "o/b#2"),
        ("oom", "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", "c.txt", "o/c#3"),
        ("nan", "iteration 5 | lm loss: nan | grad norm: nan", "c.txt", "o/c#3"),
        ("user_code", "AttributeError: 'NoneType' object has no attribute 'shape'", "d.txt", "o/d#4"),
        ("unknown", "Loaded 100 samples", "d.txt", "o/d#4"),
    ]
    lines += ["\t".join(row) for row in real]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_train_prints_the_thread_table_and_macro_f1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _small_tsv(tmp_path / "small.tsv")
    args = ["train", "--data", str(data), "--variants", "6", "--thread-folds", "2", "--out", str(tmp_path / "a")]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "macro F1 on held-out threads: " in out and "(8 lines from 4 threads, 2 folds)" in out
    assert "precision" in out and "support" in out
    [path] = model.find_artifacts(tmp_path / "a")
    figures = json.loads(path.with_suffix(".json").read_text())["thread_cv"]
    assert figures["n_lines"] == 8 and figures["n_threads"] == 4 and figures["folds"] == 2
    assert 0.0 <= figures["macro_f1"] <= 1.0


def test_cli_train_can_skip_the_thread_evaluation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _small_tsv(tmp_path / "small.tsv")
    args = ["train", "--data", str(data), "--variants", "6", "--thread-folds", "0", "--out", str(tmp_path)]
    assert cli.main(args) == 0
    assert "macro F1 on held-out threads" not in capsys.readouterr().out
    [path] = model.find_artifacts(tmp_path)
    assert "thread_cv" not in json.loads(path.with_suffix(".json").read_text())
