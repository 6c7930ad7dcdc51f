"""Apply migrations programmatically (CLI, demo, tests) from an installed package or a checkout."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection

import migrations


def alembic_config(url: str | None = None, *, connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def upgrade(url: str | None = None, *, connection: Connection | None = None, revision: str = "head") -> None:
    command.upgrade(alembic_config(url, connection=connection), revision)


def current_and_head(url: str) -> tuple[str | None, str | None]:
    """The database's revision and the newest one this code knows."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine, pool

    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
    return current, head


def downgrade(url: str, *, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)
