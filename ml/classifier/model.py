"""The shipped log classifier: load an artifact, predict a category and a calibrated confidence per line."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import joblib
import sklearn
from sklearn.exceptions import InconsistentVersionWarning

from ml.normalize import normalize

ARTIFACT_FORMAT = 1
ARTIFACTS_DIR = Path(__file__).resolve().parent.parent / "artifacts"
UNKNOWN = "unknown"
_NAME = re.compile(r"^log_classifier-(?P<version>[\w.-]+)\.joblib$")


class ArtifactError(RuntimeError):
    """An artifact that is missing, unreadable or not a log classifier."""


class ArtifactVersionWarning(UserWarning):
    """The artifact was trained with another scikit-learn major/minor version than the one installed."""


@dataclass(frozen=True, slots=True)
class LogClassifier:
    """A fitted pipeline with its metadata; `predict` applies the normalization it was trained with."""

    pipeline: Any
    metadata: dict[str, Any]
    path: Path | None = None

    @property
    def version(self) -> str:
        return str(self.metadata.get("version", ""))

    @property
    def threshold(self) -> float:
        return float(self.metadata.get("threshold", 0.0))

    @property
    def categories(self) -> list[str]:
        return list(self.metadata.get("categories", []))

    def predict_proba(self, lines: Sequence[str]) -> tuple[list[str], Any]:
        """The classes and an (n_lines, n_classes) array of calibrated probabilities."""
        texts = [normalize(line) if isinstance(line, str) else "" for line in lines]
        return [str(c) for c in self.pipeline.classes_], self.pipeline.predict_proba(texts)

    def predict(self, lines: Sequence[str]) -> list[tuple[str, float]]:
        """(category, confidence) per line; "unknown" where the top probability is below the threshold.

        The confidence is always the top class's calibrated probability, so a declined line shows how unsure
        the model was.
        """
        if not lines:
            return []
        classes, proba = self.predict_proba(lines)
        top = proba.argmax(axis=1)
        out: list[tuple[str, float]] = []
        for row, k in enumerate(top):
            confidence = float(proba[row, k])
            out.append((classes[k] if confidence >= self.threshold else UNKNOWN, round(confidence, 4)))
        return out


def find_artifacts(directory: str | Path | None = None) -> list[Path]:
    """Artifacts in a folder, oldest first (versions are UTC timestamps, so they sort by name)."""
    folder = Path(directory) if directory is not None else ARTIFACTS_DIR
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _NAME.match(p.name)]
    return sorted(found, key=lambda p: _NAME.match(p.name).group("version"))  # type: ignore[union-attr]


def _sidecar(path: Path) -> dict[str, Any]:
    """The JSON sidecar next to an artifact, or {} when it is missing or unreadable."""
    try:
        return dict(json.loads(path.with_suffix(".json").read_text()))
    except (OSError, ValueError, TypeError):
        return {}


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def _warn_on_version(trained_with: str | None, path: Path) -> None:
    """Warn (do not refuse) when the artifact comes from another scikit-learn major/minor release."""
    if trained_with and _major_minor(trained_with) != _major_minor(sklearn.__version__):
        warnings.warn(
            f"{path.name} was trained with scikit-learn {trained_with}, this is {sklearn.__version__}; "
            "loading it anyway (retrain with `faultline ml train` if predictions look wrong)",
            ArtifactVersionWarning,
            stacklevel=3,
        )


def load(path: str | Path | None = None) -> LogClassifier:
    """Load an artifact: the given path, or the newest one shipped in ml/artifacts/."""
    if path is None:
        found = find_artifacts()
        if not found:
            raise ArtifactError(f"no log_classifier-*.joblib in {ARTIFACTS_DIR}; run `faultline ml train`")
        target = found[-1]
    else:
        target = Path(path)
    if not target.is_file():
        raise ArtifactError(f"no artifact at {target}")
    _warn_on_version(_sidecar(target).get("sklearn_version"), target)
    try:
        with warnings.catch_warnings():
            # Our own warning above says it once, in words; sklearn would repeat it per estimator.
            warnings.simplefilter("ignore", InconsistentVersionWarning)
            payload = joblib.load(target)
    except Exception as exc:  # unpickling fails in many ways across library versions
        raise ArtifactError(
            f"cannot load {target} with scikit-learn {sklearn.__version__} ({type(exc).__name__}: {exc}); "
            "retrain with `faultline ml train`"
        ) from exc
    if not isinstance(payload, dict) or "pipeline" not in payload or "metadata" not in payload:
        raise ArtifactError(f"{target} is not a log classifier artifact")
    metadata = dict(payload["metadata"])
    if metadata.get("format") != ARTIFACT_FORMAT:
        raise ArtifactError(f"{target} has artifact format {metadata.get('format')!r}, expected {ARTIFACT_FORMAT}")
    return LogClassifier(payload["pipeline"], metadata, target)


@lru_cache(maxsize=1)
def default_classifier() -> LogClassifier:
    """The newest shipped artifact, loaded once per process."""
    return load()


def predict(lines: Sequence[str], classifier: LogClassifier | None = None) -> list[tuple[str, float]]:
    """(category, confidence) per line with the given classifier or the shipped one."""
    return (classifier or default_classifier()).predict(lines)
