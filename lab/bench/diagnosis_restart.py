"""The first diagnosis pass after a worker restart, for `faultline bench diagnosis`: a fresh process starts as a
worker does (`detect.warm_up`, the classifier loaded before any pass) and times one pass of a job whose windows and
detector state earlier passes stored, so only what a process keeps in memory is cold.

`python -m lab.bench.diagnosis_restart JOB_ID NOW` (NOW in ISO 8601) prints one JSON line: the pass's seconds and
stage timings, and the process's start-up seconds apart. The database and Redis come from the environment, as a
worker's do."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m lab.bench.diagnosis_restart JOB_ID NOW", file=sys.stderr)
        return 2
    job_id, now = argv[0], datetime.fromisoformat(argv[1])
    started = time.perf_counter()
    from service.config import get_settings
    from service.db import session_scope
    from service.diagnosis import detect, service

    detect.warm_up()
    settings = get_settings()
    ready = time.perf_counter()
    with session_scope() as session:
        result = service.diagnose_job(session, job_id=job_id, settings=settings, now=now)
    seconds = time.perf_counter() - ready
    print(json.dumps({"seconds": seconds, "startup_s": ready - started, "timings": result.timings}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
