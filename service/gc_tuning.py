"""Garbage-collector settings for a serving process.

Startup leaves a large heap (SQLAlchemy, pandas, scikit-learn, SciPy: hundreds of thousands of objects) that every
full collection walked again, and ingest allocates fast enough to cause one every few seconds: profiled under load
(docs/scale.md, "Where ingest spends its time"), collections took a third of the API's CPU.
"""

from __future__ import annotations

import gc

# Ingest makes ~100 tracked containers per batch (samples, their field dicts) that die with the request. At CPython's
# default (700) the young generation was collected every few requests, and what was alive then (batches waiting for
# their flush) was promoted and walked again in the older generations.
YOUNG_THRESHOLD = 20_000
OLDER_THRESHOLDS = (20, 20)


def tune_for_serving() -> None:
    """Freeze what startup allocated (it lives as long as the process; collections skip it from now on) and collect
    the young generation less often. Call once, after the app is built."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
