"""The service's Celery worker as the chaos campaign runs it: `faultline work`'s app, tasks and queues, with the
campaign's settings.

- The campaign's policy (lab/evaluation/campaign.py CAMPAIGN_POLICY: the blast-radius rail, cooldowns, the breaker
  and the ladder sized for its back-to-back faults), which the calm campaign applies to its in-process passes, is
  applied here to the worker's: the harness hands it over as JSON in POLICY_ENV.
- Results are kept in Redis: the harness keeps the campaign's simulated clock, so it asks for each diagnosis pass
  (with `now`) and waits for it, as the calm campaign runs it in-process.
- A short visibility timeout: a task whose worker was SIGKILLed (acknowledged late, so still unacknowledged) is
  redelivered after it; production's 300 s would outlast most of a short run.
"""

from __future__ import annotations

import json
import os
from typing import Any

POLICY_ENV = "FAULTLINE_CHAOS_POLICY"
VISIBILITY_TIMEOUT_S = 30


class _Fixed:
    """`get_settings` answering one Settings object (the campaign's), with the cache-clearing call a no-op."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def __call__(self) -> Any:
        return self.settings

    def cache_clear(self) -> None:
        pass


def main() -> None:
    from service import config

    # model_copy, as the calm campaign does: the rail's field is validated <= 1 for operators, the campaign's value
    # is deliberate. Set before any service module binds `get_settings` by name.
    policy = json.loads(os.environ.get(POLICY_ENV) or "{}")
    config.get_settings = _Fixed(config.get_settings().model_copy(update=policy))  # type: ignore[assignment]

    from service.worker import QUEUES, celery_app

    celery_app.conf.update(
        result_backend=celery_app.conf.broker_url,
        task_ignore_result=False,
        result_expires=3600,
        broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_S},
    )
    celery_app.worker_main(["worker", "--loglevel", "INFO", "--queues", ",".join(QUEUES), "--concurrency", "1"])


if __name__ == "__main__":
    main()
