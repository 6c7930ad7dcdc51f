"""Training the log classifier: grouped held-out split, calibrated linear model, threshold from validation, and a
cross-validation over the real corpus lines split by thread.

Splits are grouped by base line (GroupShuffleSplit): variants of one line never sit on both sides, otherwise
the held-out accuracy would measure memory of numbers, not reading of unseen lines. The calibration folds
inside the model are grouped the same way, else the probabilities come out overconfident.

The held-out split still scores mostly written lines and their variants. The figure that says how the model reads
logs it has never seen is the thread cross-validation (`evaluate_by_thread`): the real lines are split by the
GitHub thread they were quoted from, each fold trains on the written lines and the other threads' real lines and
scores the held-out threads' real lines as they are (no variants). Lines of one thread share a cluster, a software
version and often a template, so a split by line would let a model recognize a thread instead of reading a line.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import sklearn
from joblib import Parallel, delayed
from sklearn.calibration import CalibratedClassifierCV
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer
from sklearn.metrics import accuracy_score, classification_report, confusion_matrix, precision_recall_fscore_support
from sklearn.model_selection import GroupKFold, GroupShuffleSplit, StratifiedGroupKFold
from sklearn.pipeline import FeatureUnion, Pipeline
from sklearn.svm import LinearSVC

from ml.classifier import dataset
from ml.classifier.features import cue_tokens
from ml.classifier.model import ARTIFACT_FORMAT, ARTIFACTS_DIR, UNKNOWN
from ml.normalize import normalize

ARTIFACT_STEM = "log_classifier"
# Placeholders from ml.normalize (<num>, <pci>) are whole tokens; digits stay so kept codes (Xid 79) count.
_WORD_TOKENS = r"<\w+>|[A-Za-z_][A-Za-z0-9_]*|\d+"
_THRESHOLDS = np.round(np.arange(0.20, 0.91, 0.01), 2)
_CALIBRATION_FOLDS = 5
_VALIDATION_FOLDS = 4
THREAD_FOLDS = 5
# A written line this close to a held-out real line (Jaccard of character trigrams after normalization) is taken for
# a copy of it: written lines were composed from real messages, some from the corpus itself, and a copy in training
# would score memory, not reading. Measured on the shipped data, 0.8 catches prefix-only and one-word differences
# (retreiving/retrieving) while lines that merely share a template (two different NCCL WARNs) stay below it.
NEAR_COPY_JACCARD = 0.8

Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ThreadFold:
    """One fold of the thread split, as indexes into the labeled rows.

    `test` holds the real lines of `test_threads`; `train` the written lines and the other threads' real lines,
    less those that are copies of a test line (`dropped`: the same normalized text, or a written near-copy).
    """

    train: list[int]
    test: list[int]
    test_threads: list[str]
    dropped: int


@dataclass(slots=True)
class ThreadEvaluation:
    """Predictions pooled over the thread folds: one per real line, each from a model that never saw its thread."""

    labels: list[str]
    predicted: list[str]
    predicted_no_threshold: list[str]
    threads: list[str]
    folds: int
    thresholds: list[float]
    dropped: int
    report: str
    summary: dict[str, Any]
    proba: np.ndarray  # pooled held-out probabilities, one row per real line, columns in CATEGORIES order


@dataclass(slots=True)
class TrainResult:
    """A trained pipeline, its metadata (the sidecar's content), the held-out report and held-out predictions."""

    pipeline: Pipeline
    metadata: dict[str, Any]
    report: str
    confusion: list[list[int]] = field(default_factory=list)
    heldout_labels: list[str] = field(default_factory=list)
    heldout_proba: np.ndarray | None = None  # columns in pipeline.classes_ order
    thread_cv: ThreadEvaluation | None = None


def build_pipeline(seed: int = 0, *, calibration_cv: Any = _CALIBRATION_FOLDS) -> Pipeline:
    """TF-IDF over word 1-2 grams and character 2-5 grams, then a linear SVM with sigmoid-calibrated probabilities."""
    features = FeatureUnion(
        [
            (
                "word",
                TfidfVectorizer(
                    token_pattern=_WORD_TOKENS, ngram_range=(1, 2), sublinear_tf=True, min_df=2, max_features=8000
                ),
            ),
            (
                "char",
                TfidfVectorizer(
                    analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=3, max_features=16000
                ),
            ),
            ("cues", CountVectorizer(analyzer=cue_tokens, binary=True, lowercase=False)),
        ]
    )
    svm = LinearSVC(C=0.5, class_weight="balanced", random_state=seed)
    # ensemble=False: one SVM on all rows, calibrators fit on its cross-validated scores (one model to ship).
    clf = CalibratedClassifierCV(svm, method="sigmoid", cv=calibration_cv, ensemble=False)
    return Pipeline([("features", features), ("clf", clf)])


def fit(texts: Sequence[str], labels: Sequence[str], groups: Sequence[int], *, seed: int = 0) -> Pipeline:
    """Fit the pipeline on normalized texts, with calibration folds grouped by base line."""
    folds = min(_CALIBRATION_FOLDS, len(set(groups)))
    splits = list(GroupKFold(n_splits=folds).split(texts, labels, groups))
    pipeline = build_pipeline(seed, calibration_cv=splits)
    pipeline.fit(list(texts), list(labels))
    pipeline.named_steps["clf"].cv = folds  # the index lists served their purpose; do not pickle them
    return pipeline


def apply_threshold(classes: Sequence[str], proba: np.ndarray, threshold: float) -> list[str]:
    """Top class per row, or "unknown" where its probability is below the threshold."""
    top = proba.argmax(axis=1)
    return [UNKNOWN if proba[i, k] < threshold else classes[k] for i, k in enumerate(top)]


def macro_f1(labels: Sequence[str], predicted: Sequence[str]) -> float:
    """F1 averaged over the categories present in `labels` (one absent from the data cannot be scored)."""
    present = [c for c in dataset.CATEGORIES if c in set(labels)]
    if not present:
        return 0.0
    return float(np.mean(precision_recall_fscore_support(labels, predicted, labels=present, zero_division=0)[2]))


def choose_threshold(
    classes: Sequence[str],
    proba: np.ndarray,
    labels: Sequence[str],
    score: Callable[[Sequence[str], Sequence[str]], float] = accuracy_score,
) -> float:
    """The threshold with the best `score` (default accuracy) on validation rows; the middle of the best plateau."""
    scores = np.array([score(labels, apply_threshold(classes, proba, t)) for t in _THRESHOLDS])
    best = np.flatnonzero(scores >= scores.max() - 1e-9)
    return float(_THRESHOLDS[best[len(best) // 2]])


def _out_of_fold(
    texts: np.ndarray, labels: np.ndarray, groups: np.ndarray, *, seed: int, folds: int = _VALIDATION_FOLDS
) -> tuple[np.ndarray, list[str]]:
    """Validation probabilities for every training row from models that never saw its base line."""
    classes = sorted(set(labels))
    proba = np.zeros((len(texts), len(classes)))
    for fit_rows, val_rows in GroupKFold(n_splits=folds, shuffle=True, random_state=seed).split(texts, labels, groups):
        model = fit(texts[fit_rows], labels[fit_rows], groups[fit_rows], seed=seed)
        cols = [classes.index(c) for c in model.classes_]
        proba[np.ix_(val_rows, cols)] = model.predict_proba(list(texts[val_rows]))
    return proba, classes


def grouped_split(groups: np.ndarray, test_size: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indexes of a grouped split: no group on both sides."""
    splitter = GroupShuffleSplit(n_splits=1, test_size=test_size, random_state=seed)
    return next(splitter.split(np.zeros(len(groups)), groups=groups))


def _report(labels: Sequence[str], predicted: Sequence[str]) -> tuple[str, dict[str, Any], list[list[int]]]:
    """Per-class precision/recall text, the same as a dict, and the confusion matrix (rows true, columns predicted)."""
    cats = list(dataset.CATEGORIES)
    text = classification_report(labels, predicted, labels=cats, digits=3, zero_division=0)
    p, r, f, s = precision_recall_fscore_support(labels, predicted, labels=cats, zero_division=0)
    per_class = {
        c: {"precision": round(float(p[i]), 4), "recall": round(float(r[i]), 4), "f1": round(float(f[i]), 4),
            "support": int(s[i])}
        for i, c in enumerate(cats)
    }  # fmt: skip
    matrix = confusion_matrix(labels, predicted, labels=cats).tolist()
    return text + "\n" + _confusion_text(matrix), per_class, matrix


def _confusion_text(matrix: list[list[int]]) -> str:
    """A confusion matrix over all categories as text, rows true and columns predicted."""
    cats = list(dataset.CATEGORIES)
    width = max(len(c) for c in cats)
    lines = ["confusion (rows: true, columns: predicted)", " " * (width + 1) + " ".join(f"{c[:8]:>8}" for c in cats)]
    lines += [f"{c:>{width}} " + " ".join(f"{n:>8}" for n in row) for c, row in zip(cats, matrix, strict=True)]
    return "\n".join(lines)


def near_copies(candidates: Sequence[str], targets: Sequence[str], threshold: float = NEAR_COPY_JACCARD) -> set[int]:
    """Indexes of `candidates` whose character-trigram set overlaps some target's by at least `threshold` (Jaccard).

    Both sides are compared as given (the callers pass normalized text), so hosts and numbers do not count.
    """
    if not candidates or not targets:
        return set()
    vectorizer = CountVectorizer(analyzer="char", ngram_range=(3, 3), binary=True, lowercase=True)
    vectorizer.fit([*candidates, *targets])
    a, b = vectorizer.transform(candidates), vectorizer.transform(targets)
    shared = (a @ b.T).toarray()
    size_a, size_b = np.asarray(a.sum(axis=1)).ravel(), np.asarray(b.sum(axis=1)).ravel()
    union = size_a[:, None] + size_b[None, :] - shared
    jaccard = np.divide(shared, union, out=np.zeros_like(shared, dtype=float), where=union > 0)
    return {int(i) for i in np.flatnonzero(jaccard.max(axis=1) >= threshold)}


def thread_folds(
    rows: Sequence[dataset.LabeledLine],
    *,
    n_splits: int = THREAD_FOLDS,
    seed: int = 0,
    near_copy: float = NEAR_COPY_JACCARD,
) -> list[ThreadFold]:
    """Split the real lines by thread (stratified by category where the threads allow); written lines always train.

    A training line is left out of a fold when its normalized text is a test line's (the same message quoted in
    two threads, or a written copy), and a written line also when it is a near-copy of one (`near_copies`).
    """
    real = [i for i, row in enumerate(rows) if row.real]
    threads = [rows[i].thread for i in real]
    n = min(n_splits, len(set(threads)))
    if n < 2:
        raise ValueError(f"a thread split needs real lines from at least 2 threads, found {len(set(threads))}")
    normalized = [normalize(row.line) for row in rows]
    categories = [rows[i].category for i in real]
    splitter: StratifiedGroupKFold | GroupKFold = StratifiedGroupKFold(n_splits=n, shuffle=True, random_state=seed)
    if max(categories.count(c) for c in set(categories)) < n:  # too few lines to stratify at all (tiny data sets)
        splitter = GroupKFold(n_splits=n, shuffle=True, random_state=seed)
    folds: list[ThreadFold] = []
    with warnings.catch_warnings():
        # Rare categories have fewer threads than folds; stratification then does what it can, which is fine.
        warnings.simplefilter("ignore", UserWarning)
        splits = list(splitter.split(np.zeros(len(real)), categories, threads))
    for _, test_pos in splits:
        test = [real[k] for k in test_pos]
        test_threads = sorted({rows[i].thread for i in test})
        test_texts = {normalized[i] for i in test}
        others = [i for i, row in enumerate(rows) if row.thread not in test_threads and normalized[i] not in test_texts]
        written = [i for i in others if not rows[i].real]
        copies = {written[k] for k in near_copies([normalized[i] for i in written], sorted(test_texts), near_copy)}
        train_rows = [i for i in others if i not in copies]
        folds.append(ThreadFold(train_rows, test, test_threads, len(rows) - len(test) - len(train_rows)))
    return folds


@dataclass(frozen=True, slots=True)
class FoldData:
    """One fold's training rows (normalized base lines and variants) and its test texts (normalized real lines).

    `split_groups` groups the training rows for an inner split: a real line's thread, else its base line.
    """

    texts: np.ndarray
    labels: np.ndarray
    groups: np.ndarray
    split_groups: np.ndarray
    test_texts: list[str]


def fold_data(rows: Sequence[dataset.LabeledLine], fold: ThreadFold, *, n_variants: int, seed: int) -> FoldData:
    """Variants made from the fold's training lines only, less any that normalizes to a test line's text."""
    train_rows = [rows[i] for i in fold.train]
    data = dataset.build(train_rows, n_variants=n_variants, seed=seed)
    texts = np.array([normalize(t) for t in data.texts], dtype=object)
    test_texts = [normalize(rows[i].line) for i in fold.test]
    keep = ~np.isin(texts, np.array(sorted(set(test_texts)), dtype=object))  # a prefix can make a test line anew
    groups = np.array(data.groups)[keep]
    origin = np.array(data.origin)[keep]
    keys = [
        f"thread:{train_rows[o].thread}" if o >= 0 and train_rows[o].real else f"line:{g}"
        for o, g in zip(origin, groups, strict=True)
    ]
    split_groups = np.unique(np.array(keys, dtype=object), return_inverse=True)[1]
    return FoldData(texts[keep], np.array(data.labels, dtype=object)[keep], groups, split_groups, test_texts)


def _fit_predict(rows: Sequence[dataset.LabeledLine], fold: ThreadFold, *, n_variants: int, seed: int) -> np.ndarray:
    """Fit on one fold's training lines (variants from them only) and return its test lines' probabilities, with a
    column per category in CATEGORIES order (zeros for a category the fold's training lacked)."""
    data = fold_data(rows, fold, n_variants=n_variants, seed=seed)
    model = fit(data.texts, data.labels, data.groups, seed=seed)
    proba = np.zeros((len(data.test_texts), len(dataset.CATEGORIES)))
    proba[:, [dataset.CATEGORIES.index(c) for c in model.classes_]] = model.predict_proba(data.test_texts)
    return proba


def _fold_predict(
    rows: Sequence[dataset.LabeledLine], fold: ThreadFold, *, n_variants: int, seed: int, inner_folds: int
) -> tuple[np.ndarray, float]:
    """One outer fold: its test lines' probabilities and a threshold chosen without a look at its test threads.

    The threshold comes from an inner thread split of the fold's own training lines, by macro F1 on their real lines:
    chosen on written lines and variants it came out too high for real lines, which read less confidently.
    """
    train_rows = [rows[i] for i in fold.train]
    if len({row.thread for row in train_rows if row.real}) < 2:
        # Too few threads left to split (tiny data sets only): the threshold of the rows' own grouped split.
        data = fold_data(rows, fold, n_variants=n_variants, seed=seed)
        fit_rows, val_rows = grouped_split(data.split_groups, 0.25, seed)
        inner_model = fit(data.texts[fit_rows], data.labels[fit_rows], data.groups[fit_rows], seed=seed)
        val_proba = inner_model.predict_proba(list(data.texts[val_rows]))
        threshold = choose_threshold(list(inner_model.classes_), val_proba, list(data.labels[val_rows]))
        return _fit_predict(rows, fold, n_variants=n_variants, seed=seed), threshold
    inner_labels: list[str] = []
    inner_proba: list[np.ndarray] = []
    for inner in thread_folds(train_rows, n_splits=inner_folds, seed=seed):
        inner_labels += [train_rows[i].category for i in inner.test]
        inner_proba.append(_fit_predict(train_rows, inner, n_variants=n_variants, seed=seed))
    threshold = choose_threshold(dataset.CATEGORIES, np.vstack(inner_proba), inner_labels, score=macro_f1)
    return _fit_predict(rows, fold, n_variants=n_variants, seed=seed), threshold


def thread_report(labels: Sequence[str], predicted: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """Per-class precision, recall, F1 and support, and the macro F1 over the categories that have real lines.

    A category without real lines (one the corpus has no thread for yet) cannot be scored: it is listed with support
    0 and left out of the macro average; a line wrongly read as it still costs its true category's recall.
    """
    scored = [c for c in dataset.CATEGORIES if c in set(labels)]
    text = classification_report(labels, predicted, labels=scored, digits=3, zero_division=0)
    p, r, f, s = precision_recall_fscore_support(labels, predicted, labels=list(dataset.CATEGORIES), zero_division=0)
    per_class = {
        c: {"precision": round(float(p[i]), 4), "recall": round(float(r[i]), 4), "f1": round(float(f[i]), 4),
            "support": int(s[i])}
        for i, c in enumerate(dataset.CATEGORIES)
    }  # fmt: skip
    macro = macro_f1(labels, predicted)
    unscored = [c for c in dataset.CATEGORIES if c not in scored]
    if unscored:
        text += f"not scored (no real lines): {', '.join(unscored)}\n"
    matrix = confusion_matrix(labels, predicted, labels=list(dataset.CATEGORIES)).tolist()
    summary = {
        "macro_f1": round(macro, 4),
        "accuracy": round(float(accuracy_score(labels, predicted)), 4) if labels else 0.0,
        "per_class": per_class,
        "scored_categories": scored,
        "confusion": matrix,
    }
    return text + _confusion_text(matrix), summary


def evaluate_by_thread(
    rows: Sequence[dataset.LabeledLine],
    *,
    n_splits: int = THREAD_FOLDS,
    n_variants: int = 20,
    seed: int = 0,
    inner_folds: int = 2,
    n_jobs: int = -1,
) -> ThreadEvaluation:
    """Cross-validate over the real lines grouped by thread and pool the held-out predictions (see `thread_folds`).

    Each fold's threshold comes from a nested thread split of its training lines (`_fold_predict`), so no choice
    made for a fold has seen its test threads; the pooled probabilities are kept to choose the shipped threshold.
    """
    folds = thread_folds(rows, n_splits=n_splits, seed=seed)
    results = Parallel(n_jobs=min(n_jobs if n_jobs > 0 else len(folds), len(folds)))(
        delayed(_fold_predict)(rows, fold, n_variants=n_variants, seed=seed, inner_folds=inner_folds) for fold in folds
    )
    classes = list(dataset.CATEGORIES)
    labels: list[str] = []
    predicted: list[str] = []
    argmax: list[str] = []
    threads: list[str] = []
    thresholds: list[float] = []
    for fold, (proba, threshold) in zip(folds, results, strict=True):
        labels += [rows[i].category for i in fold.test]
        threads += [rows[i].thread for i in fold.test]
        predicted += apply_threshold(classes, proba, threshold)
        argmax += [classes[k] for k in proba.argmax(axis=1)]
        thresholds.append(threshold)
    pooled = np.vstack([proba for proba, _ in results])
    report, summary = thread_report(labels, predicted)
    _, summary_argmax = thread_report(labels, argmax)
    summary.update(
        {
            "macro_f1_no_threshold": summary_argmax["macro_f1"],
            "n_lines": len(labels),
            "n_threads": len(set(threads)),
            "folds": len(folds),
            "fold_thresholds": thresholds,
            "dropped_train_lines": sum(f.dropped for f in folds),
            "near_copy_jaccard": NEAR_COPY_JACCARD,
            "split": "StratifiedGroupKFold over the real lines, grouped by thread; written lines always train",
        }
    )
    dropped = summary["dropped_train_lines"]
    return ThreadEvaluation(
        labels, predicted, argmax, threads, len(folds), thresholds, dropped, report, summary, pooled
    )


def macro_line(summary: dict[str, Any]) -> str:
    """The one-line headline of a thread evaluation."""
    return (
        f"macro F1 on held-out threads: {summary['macro_f1']:.3f} "
        f"({summary['n_lines']} lines from {summary['n_threads']} threads, {summary['folds']} folds)"
    )


def train(
    data_path: str | Path | None = None,
    *,
    seed: int = 0,
    n_variants: int = 20,
    test_size: float = 0.2,
    n_thread_folds: int = THREAD_FOLDS,
    log: Log | None = None,
) -> TrainResult:
    """Score the real lines by thread (`evaluate_by_thread`), build the dataset, hold out a grouped test split, fit.

    The threshold is chosen on the thread cross-validation's pooled predictions of the real lines (macro F1), the
    lines most like those the service will see; with `n_thread_folds=0` (no thread evaluation) it is chosen on
    out-of-fold predictions of the training rows (accuracy), as before the real lines were enough to choose on.
    The shipped model is the one evaluated on the held-out split: fit on everything but the test split.
    """
    say = log or (lambda _msg: None)
    rows = dataset.load_labeled(data_path)
    evaluation = None
    if n_thread_folds:
        evaluation = evaluate_by_thread(rows, n_splits=n_thread_folds, n_variants=n_variants, seed=seed)
        say(
            f"real lines by thread: {evaluation.summary['folds']} folds, each trained on the written lines and the "
            f"other threads' lines ({evaluation.dropped} copies of test lines left out of training in all)"
        )
        say(evaluation.report)
        say(
            macro_line(evaluation.summary)
            + f"; argmax without threshold: {evaluation.summary['macro_f1_no_threshold']:.3f}"
        )
    data = dataset.build(rows, n_variants=n_variants, seed=seed)
    say(f"{len(rows)} labeled lines, {len(data.texts)} rows with variants and noise, {len(set(data.groups))} groups")
    texts = np.array([normalize(t) for t in data.texts], dtype=object)
    labels = np.array(data.labels, dtype=object)
    groups = np.array(data.groups)

    dev, test = grouped_split(groups, test_size, seed)
    say(f"split by base line: {len(dev)} train rows, {len(test)} held-out test rows")
    if evaluation is not None:
        threshold = choose_threshold(dataset.CATEGORIES, evaluation.proba, evaluation.labels, score=macro_f1)
        threshold_from = "macro F1 of the thread cross-validation's held-out real lines"
    else:
        oof_proba, classes = _out_of_fold(texts[dev], labels[dev], groups[dev], seed=seed)
        threshold = choose_threshold(classes, oof_proba, list(labels[dev]))
        threshold_from = "accuracy of out-of-fold validation predictions"
    say(f"threshold {threshold:.2f}, chosen by {threshold_from}")

    pipeline = fit(texts[dev], labels[dev], groups[dev], seed=seed)
    proba = pipeline.predict_proba(list(texts[test]))
    predicted = apply_threshold(list(pipeline.classes_), proba, threshold)
    raw = [pipeline.classes_[k] for k in proba.argmax(axis=1)]
    accuracy = float(accuracy_score(labels[test], predicted))
    report, per_class, matrix = _report(list(labels[test]), predicted)
    now = datetime.now(UTC)
    metadata: dict[str, Any] = {
        "format": ARTIFACT_FORMAT,
        "version": now.strftime("%Y%m%d%H%M%S"),
        "created_at": now.isoformat(timespec="seconds"),
        "sklearn_version": sklearn.__version__,
        "data_sha256": dataset.data_sha256(data_path),
        "n_labeled": len(rows),
        "n_real": sum(row.real for row in rows),
        "n_train": len(dev),
        "n_test": len(test),
        "heldout_accuracy": round(accuracy, 4),
        "heldout_accuracy_no_threshold": round(float(accuracy_score(labels[test], raw)), 4),
        "threshold": threshold,
        "threshold_chosen_by": threshold_from,
        "categories": list(dataset.CATEGORIES),
        "per_class": per_class,
        "seed": seed,
        "n_variants": n_variants,
        "preprocess": "ml.normalize.normalize",
        "model": "tfidf(word 1-2, char_wb 2-5) + NaN cue + LinearSVC, sigmoid-calibrated (CalibratedClassifierCV)",
    }
    if evaluation is not None:
        metadata["thread_cv"] = evaluation.summary
    say(f"held-out accuracy: {accuracy:.4f} (argmax without threshold: {metadata['heldout_accuracy_no_threshold']})")
    say(report)
    return TrainResult(pipeline, metadata, report, matrix, list(labels[test]), proba, evaluation)


def save(result: TrainResult, out_dir: str | Path | None = None) -> Path:
    """Write log_classifier-<version>.joblib and its JSON sidecar; returns the .joblib path."""
    directory = Path(out_dir) if out_dir is not None else ARTIFACTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{ARTIFACT_STEM}-{result.metadata['version']}"
    path = directory / f"{stem}.joblib"
    joblib.dump({"pipeline": result.pipeline, "metadata": result.metadata}, path, compress=("zlib", 6))
    (directory / f"{stem}.json").write_text(json.dumps(result.metadata, indent=2, sort_keys=True) + "\n")
    return path
