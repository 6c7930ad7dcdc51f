"""DCGM fields stored as columns of metric_samples (their names belong to ml/metrics.py); any other DCGM field
goes to its `extra` JSON."""

from ml.metrics import FIELD_TO_COLUMN, METRIC_COLUMNS, WINDOW_MAX_COLUMNS, WINDOW_S

__all__ = ["FIELD_TO_COLUMN", "METRIC_COLUMNS", "WINDOW_MAX_COLUMNS", "WINDOW_S"]
