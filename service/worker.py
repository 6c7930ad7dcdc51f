"""The Celery app: Redis broker, JSON only, late acks, explicit task names, queues by kind of work."""

from __future__ import annotations

from datetime import timedelta

from celery import Celery
from celery.signals import beat_init
from kombu import Queue

from service.config import get_settings
from service.schedules import diagnosis_passes

# Queues by kind of work, so a flood of one kind cannot starve another and each can be scaled alone.
QUEUES = ("diagnosis", "notify", "maintenance")


def create_celery() -> Celery:
    settings = get_settings()
    app = Celery(
        "faultline",
        broker=settings.broker_url,
        include=[
            "service.maintenance.tasks",
            "service.diagnosis.tasks",
            "service.decisions.tasks",
            "service.incidents.tasks",
            "service.notify.tasks",
            # No tasks: it registers the web UI's expired sessions with the retention pass above.
            "service.ui.retention",
            # No tasks: it registers the unknown-line counts with the retention pass (log retention).
            "service.unknown_lines.retention",
            # No tasks: it registers old evidence bundles with the retention pass (bundle_retention_days).
            "service.bundles.retention",
            # No tasks: it registers the diagnose loop (stop-time checks after a diagnose decision) with decisions.
            "service.checks.loop",
            "service.checks.tasks",
            "service.jobs.tasks",
            "service.planned.tasks",
            "service.nvlink.tasks",
            "service.shared_causes.tasks",
        ],
    )
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        # Results only of the tasks that ask for them (a split diagnosis pass's group tasks and merge: a chord needs
        # its header's results), in Redis beside the broker, gone after a while.
        result_backend=settings.broker_url,
        result_expires=600,
        # A task is acknowledged after it ran, and redelivered if its worker died mid-way:
        # every task must therefore be idempotent.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_queues=[Queue(name) for name in QUEUES],
        task_default_queue="maintenance",
        task_routes={
            "maintenance.*": {"queue": "maintenance"},
            "diagnosis.*": {"queue": "diagnosis"},
            "notify.*": {"queue": "notify"},
        },
        broker_connection_retry_on_startup=True,
        # Redelivery of unacknowledged tasks (their worker died) after this long: longer than any task runs,
        # and within the diagnosis window, so a lost pass's critical event is still in view when it reruns.
        broker_transport_options={"visibility_timeout": 300},
        worker_hijack_root_logger=False,
        timezone="UTC",
        beat_schedule={
            # Partitions for the next hours (partitions.DEFAULT_AHEAD), so rows rarely meet the default one.
            "ensure-partitions": {
                "task": "maintenance.ensure_partitions",
                "schedule": timedelta(minutes=10),
                "options": {"expires": 600},
            },
            # Retention: drops partitions past it (and prunes agent_batches and expired UI sessions).
            "prune-old-signals": {"task": "maintenance.prune_old_signals", "schedule": timedelta(minutes=10)},
            # Closed hours of GPU samples into compact chunks (service/maintenance/compaction.py): one hour a run.
            "compact-samples": {
                "task": "maintenance.compact_samples",
                "schedule": timedelta(minutes=5),
                "options": {"expires": 300},
            },
            "expire-decisions": {
                "task": "maintenance.expire_decisions",
                "schedule": timedelta(seconds=10),
                "options": {"expires": 10},
            },
            # Retries and grouping windows come due without any new event to wake the sender.
            "notify-send-due": {"task": "notify.send_due", "schedule": timedelta(seconds=2), "options": {"expires": 2}},
            "resolve-quiet-incidents": {
                "task": "maintenance.resolve_quiet_incidents",
                "schedule": timedelta(seconds=60),
                "options": {"expires": 60},
            },
            "resolve-quiet-shared-incidents": {
                "task": "maintenance.resolve_quiet_shared_incidents",
                "schedule": timedelta(seconds=60),
                "options": {"expires": 60},
            },
            # Idle spares due for their checks (service/checks/spares.py), within the budget.
            "check-idle-spares": {
                "task": "maintenance.check_idle_spares",
                "schedule": timedelta(seconds=60),
                "options": {"expires": 60},
            },
            # Each running job's progress mark (service/jobs/progress.py). The "no net progress" list compares the mark
            # with the clock when it is read, so a stalled job is listed on the first read past its threshold.
            "track-job-progress": {
                "task": "maintenance.track_job_progress",
                "schedule": timedelta(seconds=15),
                "options": {"expires": 15},
            },
            # Planned maintenance windows (service/planned/): drain ahead of each, the return gate after it.
            "planned-maintenance": {
                "task": "maintenance.planned_windows",
                "schedule": timedelta(seconds=30),
                "options": {"expires": 30},
            },
            # NVLink domains (service/nvlink/): a domain whose fabric fails gets its domain incident even when no
            # job's diagnosis pass looks at it (its trays idle, or their fabric state the only sign).
            "check-nvlink-domains": {
                "task": "nvlink.check_domains",
                "schedule": timedelta(seconds=30),
                "options": {"expires": 30},
            },
            "detect-active-jobs": {
                "task": "diagnosis.detect_active_jobs",
                "schedule": diagnosis_passes(settings),
                # A pass not started within one interval is superseded by the next one.
                "options": {"expires": settings.diagnosis_interval_s},
            },
        },
    )
    return app


celery_app = create_celery()


@beat_init.connect
def _ensure_partitions_at_start(sender: object, **_: object) -> None:
    # An interval entry first runs one interval after beat starts; a database migrated long ago (a demo
    # folder reused days later) needs the current hour's partitions now, not in 10 minutes.
    celery_app.send_task("maintenance.ensure_partitions", expires=600)
