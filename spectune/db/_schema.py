"""Schema revisions: what a database holds, whether readers can use it, and upgrades.

The revision lives in Alembic's ``alembic_version`` table. Readers only check it
(they never import Alembic, never write): a database must be at
:data:`HEAD_REVISION`. Writers upgrade older databases, and create the schema in an
empty one, inside one locked transaction, so concurrent writers and a process killed
mid-way leave either the old schema or the new one.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from sqlalchemy import column, inspect, select, table, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from spectune.db._engine import BUSY_TIMEOUT_S, READS_ONLY
from spectune.db._revision import (
    HEAD_REVISION,
    REVISIONS,
    TABLE_NAME,
    VERSION_TABLE,
    SchemaState,
    refuse_foreign,
    require_current,
    several_revisions,
)

__all__ = [
    "HEAD_REVISION",
    "REVISIONS",
    "SchemaState",
    "inspect_schema",
    "migrations_dir",
    "require_current",
    "upgrade",
]

#: Longest single wait for SQLite's write lock while creating or upgrading the schema.
_LOCK_POLL_S = 1.0
_PG_LOCK_KEY = 0x5BEC7E  # pg_advisory_xact_lock key serializing spectune migrations


def inspect_schema(connection: Connection) -> SchemaState:
    """Read the revision, tables and columns of the database behind ``connection``."""
    inspector = inspect(connection)
    tables = frozenset(inspector.get_table_names())
    revision = None
    if VERSION_TABLE in tables:
        found = connection.execute(
            select(column("version_num")).select_from(table(VERSION_TABLE))
        ).scalars().all()
        if len(found) > 1:
            raise several_revisions(list(found))
        revision = found[0] if found else None
    columns = frozenset()
    if TABLE_NAME in tables:
        columns = frozenset(c["name"] for c in inspector.get_columns(TABLE_NAME))
    return SchemaState(revision=revision, tables=tables, columns=columns)


def migrations_dir() -> Path:
    """The Alembic script directory inside the package."""
    return Path(__file__).resolve().parent / "migrations"


def upgrade(engine: Engine, *, location: str) -> tuple[str | None, str]:
    """Bring the database to :data:`HEAD_REVISION` (creating the schema when empty).

    Returns:
        The revision before (``None`` for a new database) and after.

    Raises:
        NotADatabaseError: it holds another application's tables.
        SchemaTooNewError: it was written by a newer spectune.
        SchemaError: it is at the head revision but tables or columns are missing.
    """
    # A database already at the head revision is opened without taking the write lock:
    # in SQLite's WAL mode a reader never waits for writers. When it is not (new, or
    # older), the write lock is asked for in short waits, reading the revision again
    # between them: while other processes record rows one transaction after another,
    # a single long wait for the lock can starve (SQLite's lock is not fair), though
    # one of them has meanwhile created the schema.
    sqlite = engine.dialect.name == "sqlite"
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        reader = engine.connect().execution_options(**{READS_ONLY: True})
        with reader as connection, connection.begin():
            state = inspect_schema(connection)
        if state.revision == HEAD_REVISION:
            refuse_foreign(state, location=location)
            require_current(state, location=location)
            return HEAD_REVISION, HEAD_REVISION
        try:
            return _upgrade_locked(
                engine, location=location, lock_wait_s=_LOCK_POLL_S if sqlite else None
            )
        except OperationalError as exc:
            if not (sqlite and _is_locked(exc) and time.monotonic() < deadline):
                raise


def _upgrade_locked(
    engine: Engine, *, location: str, lock_wait_s: float | None
) -> tuple[str | None, str]:
    """Upgrade under the write lock; on SQLite wait at most ``lock_wait_s`` for it."""
    with engine.connect() as connection:
        raw = connection.connection.dbapi_connection
        if lock_wait_s is not None:  # no transaction yet: the pragma runs before BEGIN
            raw.execute(f"PRAGMA busy_timeout = {int(lock_wait_s * 1000)}")  # type: ignore[union-attr]
        try:
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY}
                    )
                state = inspect_schema(connection)
                refuse_foreign(state, location=location)
                before = state.revision
                if before != HEAD_REVISION:
                    from alembic import command
                    from alembic.config import Config

                    config = Config()
                    config.set_main_option("script_location", str(migrations_dir()))
                    config.attributes["connection"] = connection
                    command.upgrade(config, HEAD_REVISION)
                    state = inspect_schema(connection)
                require_current(state, location=location)
        finally:
            if lock_wait_s is not None:
                raw.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")  # type: ignore[union-attr]
    return before, HEAD_REVISION


def _is_locked(exc: OperationalError) -> bool:
    orig = getattr(exc, "orig", None)
    return isinstance(orig, sqlite3.OperationalError) and "locked" in str(orig).lower()
