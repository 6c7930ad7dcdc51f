"""The schema comes only from the migrations, and the models agree with them."""

from __future__ import annotations

import subprocess
import sys
import uuid

import psycopg
import pytest
from sqlalchemy import create_engine, inspect

from service import migrate
from service.config import to_sqlalchemy_url
from service.models import Base
from tests.conftest import _state, _to_url


@pytest.fixture
def empty_database() -> str:
    name = f"faultline_mig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_state["server_url"], autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield _to_url(_state["server_url"], name)
    with psycopg.connect(_state["server_url"], autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_upgrade_from_empty_builds_every_table_and_downgrade_removes_them(empty_database):
    url = to_sqlalchemy_url(empty_database)
    migrate.upgrade(url)
    engine = create_engine(url)
    assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    assert migrate.current_and_head(url)[0] == migrate.current_and_head(url)[1]
    migrate.downgrade(url, revision="base")
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    migrate.upgrade(url)
    engine.dispose()


def test_alembic_check_finds_models_and_migrations_in_agreement(database_url):
    """The same `alembic check` a developer runs from the repository root."""
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "check"],
        capture_output=True,
        text=True,
        env={"FAULTLINE_DATABASE_URL": database_url, "FAULTLINE_REDIS_URL": "redis://unused", "PATH": ""},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No new upgrade operations detected" in result.stdout + result.stderr
