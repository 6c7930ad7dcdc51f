"""Server-side commands of `faultline` (argument parsing lives in faultline/cli.py)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from service.config import Settings, get_settings

if TYPE_CHECKING:
    from service.breaker.schemas import BreakerOut
    from service.planned.schemas import WindowIn


def _settings(args: argparse.Namespace) -> Settings:
    data_dir: Path | None = getattr(args, "data_dir", None)
    if data_dir is not None:
        from service.embedded import use_data_dir

        use_data_dir(data_dir.resolve())
    try:
        return get_settings()
    except ValidationError as exc:
        messages = "; ".join(err["msg"].removeprefix("Value error, ") for err in exc.errors())
        raise SystemExit(f"faultline: configuration error: {messages}") from None


def configure_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("FAULTLINE_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("pgserver", "httpx", "alembic.runtime.plugins"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run(args: argparse.Namespace) -> int:
    configure_logging()
    handler = {
        "serve": _serve,
        "work": _work,
        "migrate": _migrate,
        "token": _token,
        "backtest": _backtest,
        "breaker": _breaker,
        "maintenance": _maintenance,
    }[args.command]
    return handler(args)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    settings = _settings(args)
    if args.workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # Several processes: Prometheus metrics are summed from files in a shared folder.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="faultline-prom-")
    uvicorn.run(
        "service.asgi:app",
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=settings.log_level.lower(),
        # Per-request work that ingest, at thousands of requests a second, cannot afford; faultline
        # does not use client addresses, so X-Forwarded-For handling buys nothing.
        access_log=False,
        proxy_headers=False,
    )
    return 0


def _work(args: argparse.Namespace) -> int:
    _settings(args)
    from service.worker import QUEUES, celery_app

    data_dir: Path | None = args.data_dir
    schedule = (data_dir.resolve() if data_dir else Path(tempfile.gettempdir())) / "faultline-beat-schedule"
    if args.beat_only:
        celery_app.start(["beat", "--loglevel", "INFO", "--schedule", str(schedule)])
        return 0
    argv = ["worker", "--loglevel", "INFO", "--queues", args.queues or ",".join(QUEUES)]
    if args.concurrency:
        argv += ["--concurrency", str(args.concurrency)]
    if args.beat:
        argv += ["--beat", "--schedule", str(schedule)]
    celery_app.worker_main(argv)
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from service import migrate

    settings = _settings(args)
    if args.check:
        current, head = migrate.current_and_head(settings.sqlalchemy_url)
        if current == head:
            print(f"database is up to date (revision {head})")
            return 0
        print(f"database is at {current or 'an empty schema'}; head is {head}: run `faultline migrate`")
        return 1
    migrate.upgrade(settings.sqlalchemy_url)
    print("database migrated to head", file=sys.stderr)
    return 0


def _token(args: argparse.Namespace) -> int:
    from service.db import session_scope
    from service.errors import FaultlineError
    from service.tokens import service as tokens

    _settings(args)
    try:
        with session_scope() as session:
            if args.token_command == "create":
                ttl = timedelta(days=args.ttl_days) if args.ttl_days else None
                new = tokens.create(
                    session,
                    scope=args.scope,
                    name=args.name,
                    node_name=args.node,
                    node_pattern=args.node_pattern,
                    ttl=ttl,
                )
                bound = f", bound to node {args.node}" if args.node else ""
                bound += f", for nodes matching {args.node_pattern}" if args.node_pattern else ""
                print(f"created {args.scope} token id {new.record.id}{bound}; it is shown only once:", file=sys.stderr)
                print(new.token)
            elif args.token_command == "list":
                now = datetime.now(UTC)
                for record in tokens.list_all(session):
                    state = tokens.state_of(record, now=now)
                    nodes = record.node_name or record.node_pattern or "-"
                    print(
                        f"{record.id}\t{record.prefix}…\t{record.scope}\t{nodes}\t"
                        f"{record.name or '-'}\t{state}\texpires {record.expires_at or 'never'}"
                    )
            else:
                tokens.revoke(session, token_id=args.token_id, keep_an_admin=False)
                print(f"revoked token {args.token_id}", file=sys.stderr)
    except FaultlineError as exc:
        print(f"faultline: {exc.message}", file=sys.stderr)
        return 2
    return 0


def _backtest(args: argparse.Namespace) -> int:
    import json

    from service.arguments import duration_s, utc_time
    from service.db import get_engine, make_sessionmaker
    from service.decisions import backtest, backtest_report, overrides
    from service.errors import FaultlineError

    settings = _settings(args)
    try:
        until = utc_time(args.until) if args.until else datetime.now(UTC)
        since = until - timedelta(seconds=duration_s(args.since))
        candidate = overrides.candidate(settings, overrides.load_file(args.policy))
    except argparse.ArgumentTypeError as exc:
        print(f"faultline backtest: {exc}", file=sys.stderr)
        return 2
    except FaultlineError as exc:
        print(f"faultline backtest: bad policy: {exc.message}", file=sys.stderr)
        return 2
    from service import migrate

    current, head = migrate.current_and_head(settings.sqlalchemy_url)
    if current != head:
        # It never writes, so it cannot migrate: an older database is refused before any query fails on it.
        print(
            f"faultline backtest: the database is at {current or 'an empty schema'}, this code needs {head}: "
            "run `faultline migrate` first (with the same --data-dir or FAULTLINE_DATABASE_URL)",
            file=sys.stderr,
        )
        return 2
    session = make_sessionmaker(get_engine())()
    try:
        with backtest.read_only(session):
            result = backtest.run(
                session, settings=settings, candidate=candidate, since=since, until=until, job_ids=args.job
            )
    finally:
        session.rollback()
        session.close()
    sys.stdout.write(backtest_report.as_text(result))
    if args.json:
        args.json.write_text(json.dumps(backtest_report.as_dict(result), indent=2) + "\n")
    return 0


def _breaker(args: argparse.Namespace) -> int:
    """`faultline breaker status|reset`: run where the database is reachable, as `faultline token` is."""
    import getpass

    from service.breaker import service as breaker
    from service.db import session_scope
    from service.errors import FaultlineError

    settings = _settings(args)
    now = datetime.now(UTC)
    try:
        with session_scope() as session:
            if args.breaker_command == "reset":
                reason = args.reason.strip()
                if not reason:
                    print("faultline breaker reset: --reason must say why automation may resume", file=sys.stderr)
                    return 2
                actor = args.by or f"operator:cli:{getpass.getuser()}"
                state = breaker.reset(session, reason=reason[:1000], actor=actor, now=now, settings=settings)
                print(f"fleet breaker reset by {actor}: automatic take-outs resume", file=sys.stderr)
            else:
                state = breaker.status(session, now=now, settings=settings)
    except FaultlineError as exc:
        print(f"faultline breaker: {exc.message}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(state.model_dump_json(indent=2))
        return 0
    print(breaker_text(state))
    return 0


def breaker_text(state: BreakerOut) -> str:
    """The breaker's state in a few lines for a terminal."""
    lines = [f"state: {state.state}" + ("" if state.enabled else " (disabled: FAULTLINE_BREAKER_ENABLED=false)")]
    if state.state == "tripped":
        lines.append(f"tripped at: {state.tripped_at:%Y-%m-%d %H:%M:%S} UTC" if state.tripped_at else "tripped")
        lines.append(f"why: {state.tripped_reason}")
    lines.append(
        f"out now: {state.out_now} of {state.fleet_now} nodes by automatic decisions (limit {state.limit_now}), "
        f"counting since {state.counting_since:%Y-%m-%d %H:%M:%S} UTC"
    )
    lines.append(f"decisions held for a person: {state.held_decisions}")
    if state.reset_at is not None:
        lines.append(f"last reset: {state.reset_at:%Y-%m-%d %H:%M:%S} UTC by {state.reset_by}: {state.reset_reason}")
    return "\n".join(lines)


def _maintenance(args: argparse.Namespace) -> int:
    """`faultline maintenance announce|list|cancel`: planned maintenance windows (service/planned/)."""
    from service.db import session_scope
    from service.errors import FaultlineError
    from service.planned import service as planned

    _settings(args)
    now = datetime.now(UTC)
    actor = f"operator:cli:{os.environ.get('USER') or 'unknown'}"
    try:
        with session_scope() as session:
            if args.maintenance_command == "announce":
                window_in = _window_in(args, now=now)
                window = planned.announce(session, name=args.node, window_in=window_in, actor=actor, now=now)
                print(f"announced window {window.id} of {window.node}: {window.starts_at} to {window.ends_at}")
            elif args.maintenance_command == "list":
                page = planned.list_windows(
                    session, name=args.node, current=args.current, limit=1000, cursor=None, now=now
                )
                for w in page.items:
                    print(
                        f"{w.id}\t{w.node}\t{w.state}\t{w.starts_at.isoformat()}\t{w.ends_at.isoformat()}\t"
                        f"{w.source}\t{w.reason}"
                    )
            else:
                window = planned.cancel(session, name=args.node, window_id=args.window_id, actor=actor, now=now)
                print(f"maintenance window {window.id} of {window.node} is {window.state}")
    except (argparse.ArgumentTypeError, ValidationError) as exc:
        print(f"faultline maintenance: {_messages(exc)}", file=sys.stderr)
        return 2
    except FaultlineError as exc:
        print(f"faultline maintenance: {exc.message}", file=sys.stderr)
        return 2
    return 0


def _window_in(args: argparse.Namespace, *, now: datetime) -> WindowIn:
    from service.arguments import duration_s, utc_time
    from service.planned.schemas import WindowIn

    relative = args.start.startswith("+")
    start = now + timedelta(seconds=duration_s(args.start[1:])) if relative else utc_time(args.start)
    end = start + timedelta(seconds=duration_s(args.duration)) if args.duration else utc_time(args.end)
    return WindowIn(starts_at=start, ends_at=end, reason=args.reason)


def _messages(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}" for e in exc.errors())
    return str(exc)
