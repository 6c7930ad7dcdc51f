"""The one settings class: every knob is an environment variable prefixed FAULTLINE_."""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FAULTLINE_", extra="ignore")

    # Connection URLs carry passwords, so they are secrets and have no defaults:
    # embedded mode (`faultline demo`, `--data-dir`) fills them in.
    database_url: SecretStr | None = None
    redis_url: SecretStr | None = None
    embedded: bool = False

    public_url: str = "http://127.0.0.1:8080"
    ingest_max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # The largest body of the other API routes and the UI's forms (read before the token is checked).
    api_max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    # Ingest requests one API process works on at once; more are answered 503 + Retry-After at once.
    ingest_max_in_flight: int = Field(default=1024, ge=1)
    # Times a node may report: this old (spool replays after an outage) to this far ahead (clock skew).
    ingest_max_age_s: float = Field(default=30 * 86400.0, gt=0)
    ingest_max_ahead_s: float = Field(default=86400.0, gt=0)
    # Group commit: ingest requests that arrive together share one transaction.
    ingest_flush_max_batches: int = Field(default=256, ge=1)
    ingest_flush_max_wait_ms: float = Field(default=0.0, ge=0)
    # A revoked token keeps working on an API process for at most this long.
    token_cache_seconds: float = Field(default=10.0, ge=0)
    db_pool_size: int = Field(default=8, ge=1)
    metric_retention_hours: float = Field(default=72.0, gt=0)
    log_retention_days: float = Field(default=30.0, gt=0)
    log_level: str = "INFO"

    # Diagnosis: how often every active job is examined, over how much recent data.
    diagnosis_interval_s: float = Field(default=5.0, gt=0)
    diagnosis_window_s: float = Field(default=300.0, ge=30)
    # A job of at least this many GPUs has its pass split across workers (service/diagnosis/split.py: a Celery
    # chord of one task per node group of about `diagnosis_split_group_gpus` GPUs, then a merge); smaller jobs
    # keep the single-task pass. 0: never split. A split pass not merged after `diagnosis_split_timeout_s` (a
    # worker died) no longer holds the next periodic pass back.
    diagnosis_split_min_gpus: int = Field(default=32768, ge=0)
    diagnosis_split_group_gpus: int = Field(default=16384, ge=1)
    diagnosis_split_timeout_s: float = Field(default=60.0, gt=0)
    # A 10 s metric window is summarized this long after its end: agents ship every 5 s, so its samples
    # have arrived by then. Later samples stay raw (plots, evidence) but miss their window.
    window_grace_s: float = Field(default=6.0, ge=0)
    # Node samples (ports, host) are read at the agent's ship tick and shipped with it: their 10 s window is whole
    # about a second after its end. Built and judged then, a port's fault is seen 10 s sooner, in the pass that
    # compares the GPUs of the window before, not in the one that builds the GPU windows (window_grace_s).
    node_window_grace_s: float = Field(default=1.0, ge=0)
    # A job of this many GPUs or more compares peers one pass after its GPU windows close (windows.JUDGE_LAG_S):
    # building the windows and comparing them each take about a second at 16,384 GPUs, too much for one pass. A
    # smaller job's pass does both in a fraction of a second and judges a window as soon as it closed, 5 s sooner.
    diagnosis_judge_lag_min_gpus: int = Field(default=4096, ge=0)
    # A job whose agents reported within this long is active.
    active_job_s: float = Field(default=120.0, gt=0)
    # After a stack-dump request, aggregate what arrived by this deadline even if some ranks never answer.
    stack_dump_deadline_s: float = Field(default=15.0, gt=0)
    # A hang's stacks accuse a machine only when a second look this long after the first names it again: a hang
    # persists, a rank caught in a loader hiccup just as a long checkpoint ends is training again by then.
    hang_confirm_s: float = Field(default=10.0, gt=0)
    # Fail-slow localization: this many stack-dump rounds, this far apart (ByteRobust: 5 rounds, 10 s).
    failslow_rounds: int = Field(default=5, ge=1, le=20)
    failslow_round_s: float = Field(default=5.0, gt=0)
    # A rank apart in many rounds but not yet beyond noise gets more rounds, up to this many in all.
    failslow_max_rounds: int = Field(default=12, ge=1, le=40)

    # Policy guard rails. `act`: decisions go to schedulers; `shadow`: decided and recorded, never acted on;
    # `approval`: every decision waits for a person.
    policy_mode: Literal["act", "shadow", "approval"] = "act"
    # Actions that always wait for a person, even in `act` mode (e.g. ["evict"]).
    policy_approval_required_for: list[Literal["evict", "reset_gpu", "restart", "rollback", "diagnose"]] = []
    policy_evict_min_confidence: float = Field(default=0.8, ge=0, le=1)
    policy_diagnose_min_confidence: float = Field(default=0.5, ge=0, le=1)
    policy_rollback_min_confidence: float = Field(default=0.7, ge=0, le=1)
    policy_restart_min_confidence: float = Field(default=0.5, ge=0, le=1)
    # Blast radius: never more than this share of a job's nodes evicted per hour (at least one node).
    policy_max_evict_share_per_hour: float = Field(default=0.25, gt=0, le=1)
    # Network signals flap: evict only after this many occurrences on one node within the window.
    policy_network_flap_count: int = Field(default=2, ge=1)
    policy_network_flap_window_s: float = Field(default=300.0, gt=0)
    # ...except a flap that broke the job's connections (IB completion errors of it: NCCL's communicator is lost, the
    # job is interrupted already) with no other machine's link down within this many seconds of it, decided once that
    # long has passed; 0: such a flap waits for the count too.
    policy_network_broken_flap_s: float = Field(default=10.0, ge=0)
    # No second eviction of a node, nor a second restart/rollback of a job, within these.
    policy_node_cooldown_s: float = Field(default=1800.0, ge=0)
    policy_job_cooldown_s: float = Field(default=600.0, ge=0)
    # GPU-level remediation: when every finding asking to evict a node is on one GPU and the Xid catalog says a
    # reset of that GPU clears it, decide reset_gpu (node and GPU index) instead of evicting the node. More
    # than `policy_reset_gpu_max_per_window` resets of one GPU within the window escalate to evicting the node.
    policy_reset_gpu_enabled: bool = True
    policy_reset_gpu_window_s: float = Field(default=86400.0, gt=0)
    policy_reset_gpu_max_per_window: int = Field(default=1, ge=1)
    # A machine whose decision a person rejected is not accused again on the same kind of evidence (see
    # service/decisions/rejects.py) for this long, unless different evidence about it arrives.
    policy_reject_memory_s: float = Field(default=86400.0, ge=0)
    # The escalation ladder (ml/ladder.py): restart -> reset_gpu -> reboot -> repair -> rma. A remedy did not hold
    # when its node faults again with a finding of the same family within `policy_ladder_hold_s` (faults within
    # `policy_ladder_settle_s` of it are its own burst); the next remedy then stands a rung higher. At least a
    # reboot from `policy_ladder_fatal_count` faults of a family within `policy_ladder_fatal_window_s`; a vendor
    # replacement (RMA) from `policy_ladder_rma_count` remedies of the node within `policy_ladder_rma_window_s`.
    policy_ladder_enabled: bool = True
    policy_ladder_hold_s: float = Field(default=86400.0, gt=0)
    policy_ladder_settle_s: float = Field(default=120.0, ge=0)
    policy_ladder_fatal_count: int = Field(default=3, ge=2)
    policy_ladder_fatal_window_s: float = Field(default=86400.0, gt=0)
    policy_ladder_rma_count: int = Field(default=4, ge=2)
    policy_ladder_rma_window_s: float = Field(default=7 * 86400.0, gt=0)
    # Shared causes (service/shared_causes/, ml/shared_causes.py): findings of one category starting within
    # `shared_cause_window_s` on at least `shared_cause_min_nodes` nodes (or `shared_cause_min_share` of the nodes
    # with one label value, when that is more) that share a rack, switch, power domain, driver, firmware, kernel or
    # storage mount, and are concentrated in it (at least `shared_cause_min_lift` times the label's share of the
    # fleet), open one shared incident: its members are cordoned from new work, with no per-node eviction. A minute:
    # a switch, a rack's power or a mount takes its nodes down within seconds of each other; independent faults
    # minutes apart on three nodes of one rack are not one cause (5 minutes grouped such pairs in a dense campaign).
    shared_causes_enabled: bool = True
    shared_cause_window_s: float = Field(default=60.0, gt=0)
    shared_cause_min_nodes: int = Field(default=3, ge=2)
    shared_cause_min_share: float = Field(default=0.5, gt=0, le=1)
    shared_cause_min_lift: float = Field(default=2.0, ge=1)
    # An open shared incident none of whose members found anything for this long resolves itself.
    shared_cause_quiet_resolve_s: float = Field(default=1800.0, gt=0)
    # NVLink domains (service/nvlink/, GB200 NVL72): fabric trouble (NVLink findings within `nvlink_domain_window_s`,
    # GPU fabric state not completed or unhealthy) on at least `nvlink_domain_min_trays` trays of one domain, or its
    # fabric manager degraded, opens one domain incident that cordons the domain's trays; one tray alone is evicted.
    nvlink_domains_enabled: bool = True
    nvlink_domain_window_s: float = Field(default=300.0, gt=0)
    nvlink_domain_min_trays: int = Field(default=2, ge=2)
    # A tray's NVLink findings wait this long before it is decided alone: its domain's other trays report within it.
    nvlink_domain_settle_s: float = Field(default=15.0, ge=0)
    # A decision nobody acknowledged by then expires.
    decision_ttl_s: float = Field(default=1800.0, gt=0)
    # The longest a `GET /decisions?wait=` long poll may hold a request.
    decision_max_wait_s: float = Field(default=60.0, gt=0)
    # An incident with no new findings and nothing pending for this long resolves itself.
    incident_quiet_resolve_s: float = Field(default=900.0, gt=0)
    # A running job whose highest step has not moved for this long (or 3x its time between step lines, when it logs
    # less often) is listed as making no net progress: the overview and GET /api/v1/stalled-jobs.
    job_no_progress_s: float = Field(default=600.0, gt=0)
    # An earlier incident of the same root cause on the same node within this long makes a repeat failure: shown on
    # the incident and the node (service/nodes/history.py).
    node_repeat_window_s: float = Field(default=86400.0, gt=0)
    # A job-wide incident of a cause that stops the job (a hang, a crash, a user's bug, NaN loss) is over once the
    # job has logged a step this long after the incident's last evidence (relaunched or rolled back, it trains again).
    incident_recovered_after_s: float = Field(default=120.0, gt=0)

    # Fleet circuit breaker (service/breaker/): automatic take-outs (evict, cordon, diagnose) stop once the nodes
    # faultline took out within the window, and that are still out, would exceed `breaker_max_share` of the fleet
    # (at least `breaker_min_nodes`, at most `breaker_max_nodes` when set); from then on every decision that would
    # take a node out or reset a GPU waits for a person, one chat alert goes out, and only an operator's reset (API,
    # CLI, UI) resumes automation. Counting restarts at each reset.
    breaker_enabled: bool = True
    breaker_max_share: float = Field(default=0.10, gt=0, le=1)
    breaker_max_nodes: int | None = Field(default=None, ge=1)
    breaker_min_nodes: int = Field(default=3, ge=1)
    breaker_window_s: float = Field(default=86400.0, gt=0)

    # Node lifecycle. An evicted node stays out at least this long; a lemon (a suspect in this many
    # different jobs within the window) this long, and comes back only with passing diagnostics.
    node_quarantine_s: float = Field(default=3600.0, ge=0)
    node_lemon_jobs: int = Field(default=3, ge=2)
    node_lemon_window_days: float = Field(default=30.0, gt=0)
    node_lemon_quarantine_s: float = Field(default=7 * 86400.0, ge=0)
    # Every return to service needs a passing diagnostics report, not only a lemon's.
    node_return_requires_diagnostics: bool = False

    # Planned maintenance (service/planned/): this long before a window starts, its node's job is asked to checkpoint
    # and the node is drained (a `cordon` decision); the node's silence lasts this long past the window's end (its
    # reboot, its agent's first report), and it returns through the return gate once its agent reports after the end.
    maintenance_lead_s: float = Field(default=900.0, ge=0)
    maintenance_grace_s: float = Field(default=900.0, ge=0)

    # Stop-time checks on idle spares (service/checks/spares.py): a node with no ranks in a running job, in service,
    # whose agent reports, is sent the level-1 checks when its last check is older than this (0: never), at most
    # this many at once.
    checks_spare_interval_s: float = Field(default=6 * 3600.0, ge=0)
    checks_spare_max_concurrent: int = Field(default=2, ge=1)

    # Evidence bundles (service/bundles/): an evict, diagnose or RMA decision asks its node's agent for a tar.gz of
    # the kernel log, GPU state, diagnostics, its last samples and stacks, collected within `bundle_timeout_s` and
    # at most `bundle_max_bytes` (uploads over it get 413). Nothing stored `bundle_grace_s` after the collection
    # time is up reads "no bundle: agent unreachable". Bundles are deleted after `bundle_retention_days`.
    bundle_enabled: bool = True
    bundle_max_bytes: int = Field(default=20 * 1024 * 1024, ge=64 * 1024, le=1024 * 1024 * 1024)
    bundle_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    bundle_grace_s: float = Field(default=30.0, ge=0, le=3600)
    bundle_retention_days: float = Field(default=90.0, gt=0)

    # Chat webhooks: hosts a channel may post to (shell patterns, e.g. "hooks.slack.com", "*.larksuite.com");
    # empty allows any host.
    webhook_allowed_hosts: list[str] = []
    # Webhooks connect only to public addresses; these ranges (CIDR) or hosts (shell patterns) may be
    # private, loopback or link-local too (an in-cluster chat relay, a test receiver).
    webhook_allowed_private: list[str] = []
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    webhook_max_attempts: int = Field(default=8, ge=1)
    # Retry backoff: base * 2^(attempt-1) seconds, capped, with jitter.
    webhook_retry_base_s: float = Field(default=2.0, gt=0)
    webhook_retry_max_s: float = Field(default=300.0, gt=0)

    # Web UI. A sign-in lasts this long. Behind an authenticating proxy (oauth2-proxy, an SSO gateway), name
    # the header it puts the user in: requests from the trusted proxy addresses are then signed in as that
    # user, with `ui_proxy_scope`, or admin for the users listed in `ui_proxy_admins`.
    ui_session_hours: float = Field(default=12.0, gt=0)
    ui_trusted_user_header: str | None = None
    ui_trusted_proxies: list[str] = ["127.0.0.1/32", "::1/128"]
    ui_proxy_scope: Literal["operator", "admin"] = "operator"
    ui_proxy_admins: list[str] = []
    # The overview lists the incidents of this many hours, resolved ones included, with their outcome.
    ui_recent_hours: float = Field(default=6.0, gt=0, le=168)

    @model_validator(mode="after")
    def _require_connections(self) -> Settings:
        missing = [f"FAULTLINE_{name.upper()}" for name in ("database_url", "redis_url") if getattr(self, name) is None]
        if missing and not self.embedded:
            raise ValueError(
                f"{', '.join(missing)} must be set (or run `faultline demo` / pass --data-dir "
                "to use the embedded PostgreSQL and Redis)"
            )
        return self

    @property
    def time_context(self) -> dict[str, tuple[timedelta, timedelta]]:
        """Validation context for agents' and alerts' times: (max age, max ahead) of the server's clock."""
        return {"time_window": (timedelta(seconds=self.ingest_max_age_s), timedelta(seconds=self.ingest_max_ahead_s))}

    @property
    def sqlalchemy_url(self) -> str:
        return to_sqlalchemy_url(self.database_url.get_secret_value() if self.database_url else "")

    @property
    def broker_url(self) -> str:
        return self.redis_url.get_secret_value() if self.redis_url else ""


def to_sqlalchemy_url(url: str) -> str:
    """Accept plain libpq URLs (postgresql://) and pin SQLAlchemy to psycopg 3."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def to_libpq_url(url: str) -> str:
    """The same URL in the form psycopg.connect() takes."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@lru_cache
def get_settings() -> Settings:
    return Settings()
