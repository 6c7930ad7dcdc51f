"""Alembic migrations: the only way the schema is built, in tests and in production."""
