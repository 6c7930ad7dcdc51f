"""The learned log classifier for lines no rule knows: TF-IDF and a calibrated linear model (see train.py)."""

from ml.classifier.dataset import CATEGORIES
from ml.classifier.model import (
    ArtifactError,
    ArtifactVersionWarning,
    LogClassifier,
    default_classifier,
    find_artifacts,
    load,
    predict,
)

__all__ = [
    "CATEGORIES",
    "ArtifactError",
    "ArtifactVersionWarning",
    "LogClassifier",
    "default_classifier",
    "find_artifacts",
    "load",
    "predict",
]
