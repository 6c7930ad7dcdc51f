"""Alembic environment: runs against FAULTLINE_DATABASE_URL or a connection handed in by the caller."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, create_engine, pool, text

from service.models import Base

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _skip_partitions(connection: Connection) -> Callable[[str | None, str, Mapping[str, str | None]], bool]:
    """Autogenerate compares the partitioned parents with the models; their partitions (made at run time
    by service/maintenance/partitions.py) are not in the models and are no schema drift. Read lazily: only
    autogenerate asks, and a query now would open the transaction alembic means to begin itself."""
    partitions: set[str] = set()

    def include_name(name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
        if type_ != "table":
            return True
        if not partitions:
            sql = text("SELECT relname FROM pg_class WHERE relispartition")
            partitions.update(connection.execute(sql).scalars(), [""])  # "" marks it read
        return name not in partitions

    return include_name


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from service.config import get_settings

    return get_settings().sqlalchemy_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            compare_type=True,
            include_name=_skip_partitions(connection),
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(
            connection=conn, target_metadata=target_metadata, compare_type=True, include_name=_skip_partitions(conn)
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
