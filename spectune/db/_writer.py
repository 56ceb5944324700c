"""Writing a tuned-config database: SQLAlchemy engines, schema creation and upgrades.

What differs between the storages is their backend's (:mod:`spectune.db._backend`):
SQLite writers use WAL with ``synchronous=NORMAL``, a busy timeout and ``BEGIN
IMMEDIATE`` so concurrent writers queue instead of failing when they upgrade a read lock;
a SQLite file is identified read-only before a writer's first connection changes
anything (a file that is not SQLite, another application's database or a newer
spectune's is refused unchanged); PostgreSQL writers serialise migrations with an
advisory lock. No directory is created for a database, except the user database's own
folder (the platform's data directory, which is spectune's to make).

Writers create the schema in an empty database and upgrade an older one (Alembic)
inside one locked transaction, so concurrent writers and a process killed mid-way leave
either the old schema or the new one. They judge the schema with the readers' query
(:func:`spectune.db._reader.schema_state`) run on their own connection. Driver errors
become the readers' one-line messages (:func:`spectune.db._reader.translate_driver_error`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import and_, or_, select, type_coerce
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql import Select
from sqlalchemy.types import NullType

from spectune.db._backend import READS_ONLY, Backend, DatabaseURL, backend_of, is_driver_error
from spectune.db._fields import KEY_FIELDS, ROW_FIELDS
from spectune.db._locations import user_db_path
from spectune.db._reader import (
    BUSY_TIMEOUT_S,
    HEAD_REVISION,
    SchemaState,
    reading,
    refuse_foreign,
    require_current,
    schema_state,
    translate_driver_error,
)
from spectune.db._row import RowKey, TunedRow

__all__ = [
    "READS_ONLY",
    "make_engine",
    "migrations_dir",
    "record_values",
    "stored_rows_query",
    "translate_errors",
    "upgrade",
]


def make_engine(url: DatabaseURL) -> Engine:
    """A writer's engine for ``url`` (see :meth:`spectune.db._backend.Backend.make_engine`).

    A SQLite file that exists is identified first, read-only (see the module
    docstring); one that does not must have an existing folder, unless it is the user
    database.

    Raises:
        DatabaseError: the file is not one a writer may open, or its folder is missing.
    """

    def identify() -> None:
        with reading(url) as reader:
            refuse_foreign(reader.state(), location=url.display())

    return backend_of(url).make_engine(user_db=user_db_path, identify=identify)


@contextmanager
def translate_errors(location: str) -> Iterator[None]:
    """Turn SQLAlchemy and driver errors inside the block into a one-line ``DatabaseError``."""
    try:
        yield
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None)
        raise translate_driver_error(exc if orig is None else orig, location) from None
    except Exception as exc:  # the schema query runs on the driver's connection
        if not is_driver_error(exc):
            raise
        raise translate_driver_error(exc, location) from None


def migrations_dir() -> Path:
    """The Alembic script directory inside the package."""
    return Path(__file__).resolve().parent / "migrations"


def record_values(row: TunedRow) -> dict[str, Any]:
    """The column values of ``row`` for the ORM model (times as datetimes)."""
    values = row.to_dict()
    for field in ROW_FIELDS:
        if field.kind == "time":
            values[field.name] = field.read(row)
    return values


def stored_rows_query(keys: Sequence[RowKey]) -> Select[Any]:
    """``SELECT id, every field FROM tuned_configs WHERE key IN keys FOR UPDATE``.

    The values come back as the driver returns them, as the readers get them (feed them
    to :func:`spectune.db._row.row_from_stored`): the ORM's JSON, DateTime and Boolean
    types would convert them first, so a row edited by hand would fail there with a
    message naming no row, or a ``'false'`` would read back as ``True``.

    FOR UPDATE: a concurrent PostgreSQL writer of the same keys waits for this
    transaction instead of overwriting its history (SQLite ignores it; its writers are
    serialized by BEGIN IMMEDIATE). An OR of equalities, not a row-value IN: SQLite
    searches the unique index for each key instead of scanning it.
    """
    from spectune.db._models import TunedConfigRecord

    table = TunedConfigRecord.__table__
    key_columns = [table.c[name] for name in KEY_FIELDS]
    matches = (
        and_(*(column == value for column, value in zip(key_columns, key, strict=True)))
        for key in keys
    )
    columns = [type_coerce(table.c[f.name], NullType()).label(f.name) for f in ROW_FIELDS]
    return select(table.c.id, *columns).where(or_(*matches)).with_for_update()


def _state(connection: Connection) -> SchemaState:
    return schema_state(connection.connection.dbapi_connection)


def upgrade(engine: Engine, *, location: str, backend: Backend) -> tuple[str | None, str]:
    """Bring the database to :data:`HEAD_REVISION` (creating the schema when empty).

    Args:
        engine: The writer's engine (:func:`make_engine`).
        location: The database for messages.
        backend: Its backend (how schema changes are locked).

    Returns:
        The revision before (``None`` for a new database) and after.

    Raises:
        NotADatabaseError: it holds another application's tables.
        SchemaTooNewError: it was written by a newer spectune.
        SchemaError: it is at the head revision but tables or columns are missing.
    """
    # A database already at the head revision is opened without taking the write lock:
    # in SQLite's WAL mode a reader never waits for writers. When it is not (new, or
    # older), SQLite's write lock is asked for in short waits, reading the revision
    # again between them: while other processes record rows one transaction after
    # another, a single long wait for the lock can starve (SQLite's lock is not fair),
    # though one of them has meanwhile created the schema.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        reader = engine.connect().execution_options(**{READS_ONLY: True})
        with reader as connection, connection.begin():
            state = _state(connection)
        if state.revision == HEAD_REVISION:
            require_current(state, location=location)
            return HEAD_REVISION, HEAD_REVISION
        try:
            return _upgrade_locked(
                engine, location=location, backend=backend,
                lock_wait_s=backend.write_lock_poll_s,
            )  # fmt: skip
        except Exception as exc:
            if not (backend.is_lock_timeout(exc) and time.monotonic() < deadline):
                raise


def _upgrade_locked(
    engine: Engine, *, location: str, backend: Backend, lock_wait_s: float | None
) -> tuple[str | None, str]:
    """Upgrade under the write lock, waiting at most ``lock_wait_s`` for it (``None``:
    as the backend waits)."""
    with engine.connect() as connection:
        raw = connection.connection.dbapi_connection
        with backend.limit_lock_wait(raw, wait_s=lock_wait_s), connection.begin():
            backend.lock_migrations(connection)
            state = _state(connection)
            refuse_foreign(state, location=location)
            before = state.revision
            if before != HEAD_REVISION:
                from alembic import command
                from alembic.config import Config

                config = Config()
                config.set_main_option("script_location", str(migrations_dir()))
                config.attributes["connection"] = connection
                command.upgrade(config, HEAD_REVISION)
                state = _state(connection)
            require_current(state, location=location)
    return before, HEAD_REVISION
