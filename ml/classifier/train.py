"""Training the log classifier: grouped held-out split, calibrated linear model, threshold from validation.

Splits are grouped by base line (GroupShuffleSplit): variants of one line never sit on both sides, otherwise
the held-out accuracy would measure memory of numbers, not reading of unseen lines. The calibration folds
inside the model are grouped the same way, else the probabilities come out overconfident.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import sklearn
from sklearn.calibration import CalibratedClassifierCV
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.metrics import accuracy_score, classification_report, confusion_matrix, precision_recall_fscore_support
from sklearn.model_selection import GroupKFold, GroupShuffleSplit
from sklearn.pipeline import FeatureUnion, Pipeline
from sklearn.svm import LinearSVC

from ml.classifier import dataset
from ml.classifier.model import ARTIFACT_FORMAT, ARTIFACTS_DIR, UNKNOWN
from ml.normalize import normalize

ARTIFACT_STEM = "log_classifier"
# Placeholders from ml.normalize (<num>, <pci>) are whole tokens; digits stay so kept codes (Xid 79) count.
_WORD_TOKENS = r"<\w+>|[A-Za-z_][A-Za-z0-9_]*|\d+"
_THRESHOLDS = np.round(np.arange(0.20, 0.91, 0.01), 2)
_CALIBRATION_FOLDS = 5
_VALIDATION_FOLDS = 4

Log = Callable[[str], None]


@dataclass(slots=True)
class TrainResult:
    """A trained pipeline, its metadata (the sidecar's content), the held-out report and held-out predictions."""

    pipeline: Pipeline
    metadata: dict[str, Any]
    report: str
    confusion: list[list[int]] = field(default_factory=list)
    heldout_labels: list[str] = field(default_factory=list)
    heldout_proba: np.ndarray | None = None  # columns in pipeline.classes_ order


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


def choose_threshold(classes: Sequence[str], proba: np.ndarray, labels: Sequence[str]) -> float:
    """The threshold with the best accuracy on validation rows; the middle of the best plateau."""
    scores = np.array([accuracy_score(labels, apply_threshold(classes, proba, t)) for t in _THRESHOLDS])
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
    width = max(len(c) for c in cats)
    lines = ["confusion (rows: true, columns: predicted)", " " * (width + 1) + " ".join(f"{c[:8]:>8}" for c in cats)]
    lines += [f"{c:>{width}} " + " ".join(f"{n:>8}" for n in row) for c, row in zip(cats, matrix, strict=True)]
    return text + "\n" + "\n".join(lines), per_class, matrix


def train(
    data_path: str | Path | None = None,
    *,
    seed: int = 0,
    n_variants: int = 20,
    test_size: float = 0.2,
    log: Log | None = None,
) -> TrainResult:
    """Build the dataset, hold out a grouped test split, pick the threshold on a grouped validation split, fit.

    The shipped model is the one evaluated: fit on everything but the test split.
    """
    say = log or (lambda _msg: None)
    rows = dataset.load_labeled(data_path)
    data = dataset.build(rows, n_variants=n_variants, seed=seed)
    say(f"{len(rows)} labeled lines, {len(data.texts)} rows with variants and noise, {len(set(data.groups))} groups")
    texts = np.array([normalize(t) for t in data.texts], dtype=object)
    labels = np.array(data.labels, dtype=object)
    groups = np.array(data.groups)

    dev, test = grouped_split(groups, test_size, seed)
    say(f"split by base line: {len(dev)} train rows, {len(test)} held-out test rows")
    oof_proba, classes = _out_of_fold(texts[dev], labels[dev], groups[dev], seed=seed)
    threshold = choose_threshold(classes, oof_proba, list(labels[dev]))
    say(f"threshold chosen on out-of-fold validation predictions: {threshold:.2f}")

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
        "n_train": len(dev),
        "n_test": len(test),
        "heldout_accuracy": round(accuracy, 4),
        "heldout_accuracy_no_threshold": round(float(accuracy_score(labels[test], raw)), 4),
        "threshold": threshold,
        "categories": list(dataset.CATEGORIES),
        "per_class": per_class,
        "seed": seed,
        "n_variants": n_variants,
        "preprocess": "ml.normalize.normalize",
        "model": "tfidf(word 1-2, char_wb 2-5) + LinearSVC, sigmoid-calibrated (CalibratedClassifierCV)",
    }
    say(f"held-out accuracy: {accuracy:.4f} (argmax without threshold: {metadata['heldout_accuracy_no_threshold']})")
    say(report)
    return TrainResult(pipeline, metadata, report, matrix, list(labels[test]), proba)


def save(result: TrainResult, out_dir: str | Path | None = None) -> Path:
    """Write log_classifier-<version>.joblib and its JSON sidecar; returns the .joblib path."""
    directory = Path(out_dir) if out_dir is not None else ARTIFACTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{ARTIFACT_STEM}-{result.metadata['version']}"
    path = directory / f"{stem}.joblib"
    joblib.dump({"pipeline": result.pipeline, "metadata": result.metadata}, path, compress=("zlib", 6))
    (directory / f"{stem}.json").write_text(json.dumps(result.metadata, indent=2, sort_keys=True) + "\n")
    return path
