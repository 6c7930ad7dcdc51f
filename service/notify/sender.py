"""The outbox sender: claim a channel's due deliveries, post them as one message, record what happened.

A claim (state `sending`) is committed before the POST, so a worker that dies mid-POST leaves a row that
nobody posts again; such rows are marked failed, visibly, and a person may retry them.
"""

from __future__ import annotations

import email.utils
import fnmatch
import hashlib
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.models import NotificationChannel, NotificationDelivery
from service.notify import formats, outbound

log = logging.getLogger(__name__)

# One message carries at most this many events; more wait for the next message (and the rate limit).
MAX_EVENTS_PER_MESSAGE = 20
# Lark answers HTTP 200 with these codes when a bot sends too fast: worth retrying. Other codes are final.
LARK_RETRYABLE_CODES = frozenset({9499, 11232})
# A POST lasts at most connect + write + read timeouts; a claim older than that plus a margin has lost its worker.
ABANDONED_MARGIN_S = 60.0
ABANDONED_ERROR = "worker stopped while sending; not retried to avoid a duplicate post"
RATE_WINDOW = timedelta(seconds=60)
# Retry-After beyond this is ignored in favor of it: a channel should not go quiet for a day.
MAX_RETRY_AFTER_S = 3600.0


@dataclass
class Outcome:
    """What one POST came to."""

    ok: bool
    retryable: bool = False
    error: str | None = None
    status_code: int | None = None
    retry_after_s: float | None = None


@dataclass
class Claim:
    channel_id: int
    channel_name: str
    kind: str
    url: str
    delivery_ids: list[int]
    message_key: str
    claimed_at: datetime
    body: dict[str, Any]


@dataclass
class SendReport:
    messages: int = 0
    sent: int = 0
    retrying: int = 0
    failed: int = 0
    rate_limited: int = 0
    abandoned: int = 0
    channels: list[str] = field(default_factory=list)


# ---- URLs: secrets that never reach a response or a log ----


def mask_url(url: str) -> str:
    """'https://hooks.slack.com/…XyZ9': enough to recognize a webhook, not enough to use it."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}/…{url[-4:]}"


def scrub(text: str, url: str) -> str:
    """Remove a webhook URL (and its secret path) from an error message."""
    parts = urlsplit(url)
    text = text.replace(url, mask_url(url))
    secret = parts.path + (f"?{parts.query}" if parts.query else "")
    if len(secret) > 1:
        text = text.replace(secret, "/…")
    return text


def url_problem(url: str, *, allowed_hosts: Sequence[str]) -> str | None:
    """Why a channel may not post to this URL, or None. Messages never repeat the URL."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        _ = parts.port  # raises on a malformed port
        httpx.URL(url)  # what the sender will parse: an IDNA-invalid host, say, fails here
    except (ValueError, httpx.InvalidURL):
        return "url is not a valid URL"
    if parts.scheme not in ("http", "https"):
        return "url must start with http:// or https://"
    if not host:
        return "url has no host"
    if allowed_hosts and not any(fnmatch.fnmatchcase(host, pattern.lower()) for pattern in allowed_hosts):
        return f"host {host!r} is not allowed: FAULTLINE_WEBHOOK_ALLOWED_HOSTS permits only {', '.join(allowed_hosts)}"
    return None


# ---- one POST ----


def post(client: httpx.Client, *, kind: str, url: str, body: dict[str, Any], message_key: str) -> Outcome:
    """POST a message and classify the answer; never raises for network or HTTP trouble."""
    headers = {"Content-Type": "application/json"}
    if kind == "json":
        # Receivers can drop a repeat: a retry of the same group of events carries the same key.
        headers["Idempotency-Key"] = message_key
    try:
        response = client.post(url, content=orjson.dumps(body), headers=headers)
    except httpx.TimeoutException:
        return Outcome(ok=False, retryable=True, error="timed out")
    except outbound.RefusedAddress as exc:
        return Outcome(ok=False, retryable=False, error=scrub(str(exc), url))
    except httpx.InvalidURL:
        # Stored before the URL checks were as strict as the sender: retrying cannot help.
        return Outcome(ok=False, retryable=False, error="url is not a valid URL")
    except httpx.TransportError as exc:
        return Outcome(ok=False, retryable=True, error=scrub(f"{type(exc).__name__}: {exc}", url))
    except httpx.HTTPError as exc:
        return Outcome(ok=False, retryable=False, error=scrub(f"{type(exc).__name__}: {exc}", url))
    return classify(kind, response)


def classify(kind: str, response: httpx.Response) -> Outcome:
    """Success, a failure worth retrying (5xx, 429, Lark rate limits, timeouts), or a final failure (4xx)."""
    status = response.status_code
    snippet = response.text[:200].strip()
    if 200 <= status < 300:
        if kind == "lark":
            return _lark_outcome(response)
        return Outcome(ok=True, status_code=status)
    error = f"HTTP {status}" + (f": {snippet}" if snippet else "")
    if status == 429:
        return Outcome(
            ok=False,
            retryable=True,
            error=error,
            status_code=status,
            retry_after_s=retry_after(response.headers.get("Retry-After")),
        )
    if status >= 500 or status == 408:
        return Outcome(ok=False, retryable=True, error=error, status_code=status)
    # Other 4xx (a revoked webhook, a bad payload) and redirects, which are not followed: retrying cannot help.
    return Outcome(ok=False, retryable=False, error=error, status_code=status)


def _lark_outcome(response: httpx.Response) -> Outcome:
    """Lark says 200 even on errors; the body's `code` (or the older `StatusCode`) tells."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return Outcome(ok=True, status_code=response.status_code)
    code = data.get("code", data.get("StatusCode", 0))
    if code in (0, None):
        return Outcome(ok=True, status_code=response.status_code)
    message = str(data.get("msg") or data.get("StatusMessage") or "")[:200]
    return Outcome(
        ok=False,
        retryable=code in LARK_RETRYABLE_CODES,
        error=f"Lark code {code}: {message}".rstrip(": "),
        status_code=response.status_code,
    )


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: a number of seconds or an HTTP date."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def backoff_s(attempts: int, *, settings: Settings) -> float:
    """base * 2^(attempts-1), capped, with ±20% jitter so channels that failed together do not retry together."""
    delay = min(settings.webhook_retry_base_s * 2 ** max(attempts - 1, 0), settings.webhook_retry_max_s)
    return delay * random.uniform(0.8, 1.2)


def abandoned_after_s(settings: Settings) -> float:
    return 3 * settings.webhook_timeout_s + ABANDONED_MARGIN_S


def message_key(delivery_ids: Sequence[int]) -> str:
    """The same group of deliveries gets the same key on every attempt."""
    digest = hashlib.sha256(",".join(str(i) for i in sorted(delivery_ids)).encode()).hexdigest()
    return f"msg-{digest[:24]}"


# ---- the pass ----


def send_due(
    session_factory: sessionmaker[Session], *, now: datetime, settings: Settings, http_client: httpx.Client
) -> SendReport:
    """One pass over the outbox: fail abandoned claims, then post one message per channel that has due events."""
    report = SendReport()
    with session_scope(session_factory) as session:
        report.abandoned = fail_abandoned(session, now=now, settings=settings)
        channel_ids = due_channels(session, now=now)
    started = time.monotonic()

    def clock() -> datetime:
        # Posts to earlier channels take time: a claim must carry the time it was made, or another
        # worker's sweep would take a live claim for an abandoned one.
        return now + timedelta(seconds=time.monotonic() - started)

    for channel_id in channel_ids:
        with session_scope(session_factory) as session:
            claim = claim_channel(session, channel_id=channel_id, now=clock(), settings=settings, report=report)
        if claim is None:
            continue
        outcome = post(http_client, kind=claim.kind, url=claim.url, body=claim.body, message_key=claim.message_key)
        with session_scope(session_factory) as session:
            record_outcome(session, claim=claim, outcome=outcome, now=clock(), settings=settings, report=report)
    return report


def fail_abandoned(session: Session, *, now: datetime, settings: Settings) -> int:
    """Claims older than any POST can last belong to a dead worker: fail them rather than risk a second post."""
    cutoff = now - timedelta(seconds=abandoned_after_s(settings))
    channel_ids = session.scalars(
        update(NotificationDelivery)
        .where(NotificationDelivery.state == "sending", NotificationDelivery.claimed_at < cutoff)
        .values(state="failed", last_error=ABANDONED_ERROR)
        .returning(NotificationDelivery.channel_id)
    ).all()
    if channel_ids:
        names = session.scalars(select(NotificationChannel.name).where(NotificationChannel.id.in_(set(channel_ids))))
        log.warning(
            "%d deliveries to channel(s) %s were abandoned mid-send by a stopped worker; marked failed",
            len(channel_ids),
            ", ".join(sorted(names)),
        )
    return len(channel_ids)


def due_channels(session: Session, *, now: datetime) -> list[int]:
    """Enabled channels whose oldest pending delivery is due."""
    return list(
        session.scalars(
            select(NotificationDelivery.channel_id)
            .join(NotificationChannel, NotificationChannel.id == NotificationDelivery.channel_id)
            .where(NotificationDelivery.state == "pending", NotificationChannel.enabled)
            .group_by(NotificationDelivery.channel_id)
            .having(func.min(NotificationDelivery.next_attempt_at) <= now)
            .order_by(func.min(NotificationDelivery.next_attempt_at))
        )
    )


def claim_channel(
    session: Session, *, channel_id: int, now: datetime, settings: Settings, report: SendReport
) -> Claim | None:
    """Claim the channel's due events as one message, unless its rate limit says wait."""
    # NO KEY UPDATE: one claimer per channel at a time, without blocking inserts that reference the channel.
    channel = session.scalar(
        select(NotificationChannel)
        .where(NotificationChannel.id == channel_id, NotificationChannel.enabled)
        .with_for_update(skip_locked=True, key_share=True)
    )
    if channel is None:
        return None
    window_end = now + timedelta(seconds=channel.group_wait_s)
    rows = list(
        session.scalars(
            select(NotificationDelivery)
            .where(
                NotificationDelivery.channel_id == channel.id,
                NotificationDelivery.state == "pending",
                # Events due within group_wait_s of each other go together; rows backing off further wait.
                NotificationDelivery.next_attempt_at <= window_end,
            )
            .order_by(NotificationDelivery.next_attempt_at, NotificationDelivery.id)
            .limit(MAX_EVENTS_PER_MESSAGE)
            .with_for_update(skip_locked=True)
        )
    )
    if not rows or rows[0].next_attempt_at > now:
        return None
    problem = url_problem(channel.url, allowed_hosts=settings.webhook_allowed_hosts)
    if problem is not None:
        # The allow-list changed since the channel was created: never post to a host it no longer permits.
        for row in rows:
            row.state, row.last_error = "failed", problem
        report.failed += len(rows)
        log.warning("channel %s: %s", channel.name, problem)
        return None
    free_at = _rate_slot(session, channel=channel, now=now)
    if free_at is not None:
        for row in rows:
            row.next_attempt_at = max(row.next_attempt_at, free_at)
        report.rate_limited += 1
        return None
    key = message_key([r.id for r in rows])
    for row in rows:
        row.state, row.claimed_at, row.message_key, row.attempts = "sending", now, key, row.attempts + 1
    session.flush()
    return Claim(
        channel_id=channel.id,
        channel_name=channel.name,
        kind=channel.kind,
        url=channel.url,
        delivery_ids=[r.id for r in rows],
        message_key=key,
        claimed_at=now,
        body=formats.render(channel.kind, [r.payload for r in rows]),
    )


def _rate_slot(session: Session, *, channel: NotificationChannel, now: datetime) -> datetime | None:
    """When the next message may go if the channel used up its messages per minute; None if it may go now."""
    at = func.coalesce(NotificationDelivery.sent_at, NotificationDelivery.claimed_at)
    recent = session.scalars(
        select(func.max(at))
        .where(
            NotificationDelivery.channel_id == channel.id,
            NotificationDelivery.message_key.is_not(None),
            (NotificationDelivery.state == "sending")
            | ((NotificationDelivery.state == "sent") & (NotificationDelivery.sent_at > now - RATE_WINDOW)),
        )
        .group_by(NotificationDelivery.message_key)
        .order_by(func.max(at).desc())
        .limit(channel.rate_limit_per_minute)
    ).all()
    if len(recent) < channel.rate_limit_per_minute:
        return None
    # The oldest of the last `limit` messages leaves the window then.
    return recent[-1] + RATE_WINDOW


def record_outcome(
    session: Session, *, claim: Claim, outcome: Outcome, now: datetime, settings: Settings, report: SendReport
) -> None:
    """Sent, pending again with a backoff, or failed; only rows still held by this claim change."""
    # A sweep that took this claim for a dead worker's (a POST slower than any timeout) is corrected:
    # the truth is what the receiver answered.
    still_ours = (NotificationDelivery.state == "sending") | (
        (NotificationDelivery.state == "failed") & (NotificationDelivery.last_error == ABANDONED_ERROR)
    )
    rows = list(
        session.scalars(
            select(NotificationDelivery)
            .where(
                NotificationDelivery.id.in_(claim.delivery_ids),
                still_ours,
                NotificationDelivery.message_key == claim.message_key,
                NotificationDelivery.claimed_at == claim.claimed_at,
            )
            .with_for_update()
        )
    )
    if len(rows) < len(claim.delivery_ids):
        log.warning(
            "channel %s: %d of %d deliveries changed hands while sending",
            claim.channel_name,
            len(claim.delivery_ids) - len(rows),
            len(claim.delivery_ids),
        )
    report.messages += 1
    report.channels.append(claim.channel_name)
    if outcome.ok:
        for row in rows:
            row.state, row.sent_at = "sent", now
        report.sent += len(rows)
        log.info("channel %s: sent %d event(s) in one message", claim.channel_name, len(rows))
        return
    error = outcome.error or "failed"
    attempts = max((r.attempts for r in rows), default=1)
    delay = outcome.retry_after_s if outcome.retry_after_s is not None else backoff_s(attempts, settings=settings)
    retrying = 0
    for row in rows:
        row.last_error = error
        if outcome.retryable and row.attempts < settings.webhook_max_attempts:
            row.state, row.next_attempt_at = "pending", now + timedelta(seconds=delay)
            retrying += 1
        else:
            row.state = "failed"
    report.retrying += retrying
    report.failed += len(rows) - retrying
    if retrying:
        what = f"retry in {delay:.1f} s"
    elif outcome.retryable:
        what = f"gave up after {attempts} attempts"
    else:
        what = "not retried"
    log.warning("channel %s: %s (%s)", claim.channel_name, error, what)
