"""Prometheus metrics of the service itself, exposed at /metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

INGEST_BATCHES = Counter("faultline_ingest_batches_total", "Agent batches received", ["status"])
INGEST_ITEMS = Counter("faultline_ingest_items_total", "Items stored from agent batches", ["kind"])
INGEST_FLUSH_SECONDS = Histogram(
    "faultline_ingest_flush_seconds",
    "Time to write one group of batches",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
INGEST_FLUSH_SIZE = Histogram(
    "faultline_ingest_flush_batches", "Batches per group commit", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256)
)
# Issue 41: error-looking log lines no parser rule knows, by the source that shipped them (kmsg, training, ...);
# service/unknown_lines/ counts them per form, and bounds this label's values.
UNKNOWN_LINES = Counter(
    "faultline_unknown_log_lines_total", "Stored log lines that look like errors but match no known form", ["source"]
)
# Issue 18: time of each repair stage of an incident (ml/repair_times.py); labelled by stage only.
REPAIR_SECONDS = Histogram(
    "faultline_repair_seconds",
    "Time of each repair stage: detect (evidence to incident), decide, act (to the scheduler's ack), return",
    ["stage"],
    buckets=(1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 86_400, 3 * 86_400, 7 * 86_400),
)
# Set when a job's ETTR is computed (API, job page); at most service/jobs/ettr.py MAX_GAUGE_JOBS jobs at once.
JOB_ETTR = Gauge(
    "faultline_job_ettr_ratio",
    "Effective training time ratio of a job from its step progress (span: total since its start, or 1h)",
    ["job", "span"],
    multiprocess_mode="mostrecent",  # with several API processes: the latest computation, not one per pid
)
