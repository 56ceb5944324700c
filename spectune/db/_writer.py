"""Writing a tuned-config database: SQLAlchemy engines, schema creation and upgrades.

SQLite writers use WAL with ``synchronous=NORMAL`` (a killed process never leaves a
half-written file; committed transactions survive a crash of the process), a busy
timeout, and ``BEGIN IMMEDIATE`` so concurrent writers queue instead of failing when
they upgrade a read lock. Processes racing to open a new file retry its first switch to
WAL, which SQLite fails at once for the losers (:func:`_enter_wal`). PostgreSQL writers
serialise migrations with an advisory lock.

Before a SQLite writer's first connection changes anything (``journal_mode=WAL`` is
written into the file's header), the file is identified read-only by the readers' code:
a file that is not SQLite, another application's database or a newer spectune's is
refused unchanged. No directory is created for a database, except the user database's
own folder (the platform's data directory, which is spectune's to make).

Writers create the schema in an empty database and upgrade an older one (Alembic)
inside one locked transaction, so concurrent writers and a process killed mid-way leave
either the old schema or the new one. They judge the schema with the readers' query
(:func:`spectune.db._reader.schema_state`) run on their own connection. Driver errors
become the readers' one-line messages (:func:`spectune.db._reader.translate_driver_error`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import and_, create_engine, event, or_, select, text, type_coerce
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.sql import Select
from sqlalchemy.types import NullType

from spectune.db._fields import KEY_FIELDS, ROW_FIELDS
from spectune.db._locations import DatabaseURL, user_db_path
from spectune.db._reader import (
    BUSY_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    HEAD_REVISION,
    SchemaState,
    reading,
    refuse_foreign,
    require_current,
    schema_state,
    translate_driver_error,
)
from spectune.db._row import RowKey, TunedRow
from spectune.db.errors import DatabaseError

__all__ = [
    "READS_ONLY",
    "make_engine",
    "migrations_dir",
    "record_values",
    "stored_rows_query",
    "translate_errors",
    "upgrade",
]

#: Execution option marking transactions that only read: SQLite starts them deferred,
#: so they never wait for (or hold up) a writer.
READS_ONLY = "spectune_reads_only"
#: Longest single wait for SQLite's write lock while creating or upgrading the schema.
_LOCK_POLL_S = 1.0
#: First pause before trying a lost switch to WAL again; it doubles up to _LOCK_POLL_S.
_WAL_RETRY_FIRST_S = 0.001
_PG_LOCK_KEY = 0x5BEC7E  # pg_advisory_xact_lock key serializing spectune migrations


def make_engine(url: DatabaseURL) -> Engine:
    """A writer's engine for ``url``.

    A SQLite file that exists is identified first, read-only (see the module
    docstring); one that does not must have an existing folder, unless it is the user
    database.

    Raises:
        DatabaseError: the file is not one a writer may open, or its folder is missing.
    """
    if not url.is_sqlite:
        return create_engine(
            url.sqlalchemy_url(), connect_args={"connect_timeout": CONNECT_TIMEOUT_S}
        )
    _check_sqlite_target(url)
    engine = create_engine(url.sqlalchemy_url(), connect_args={"timeout": BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, connection_record) -> None:  # type: ignore[no-untyped-def]
        # Let SQLAlchemy's "begin" event below start transactions, not the driver.
        dbapi_connection.isolation_level = None
        _enter_wal(dbapi_connection)
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")

    @event.listens_for(engine, "begin")
    def _on_begin(connection) -> None:  # type: ignore[no-untyped-def]
        reads_only = connection.get_execution_options().get(READS_ONLY, False)
        connection.exec_driver_sql("BEGIN" if reads_only else "BEGIN IMMEDIATE")

    return engine


def _enter_wal(connection: sqlite3.Connection) -> None:
    """Switch ``connection``'s database to WAL, retrying while another process does.

    The first switch of a new file writes its header under an exclusive lock. A process
    that loses that race is told "database is locked" at once: SQLite skips the busy
    wait there, as waiting could deadlock. The winner is done within milliseconds, so
    the switch is tried again (it then finds the file in WAL already) until the busy
    timeout.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    pause = _WAL_RETRY_FIRST_S
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL").fetchall()
            return
        except sqlite3.OperationalError as exc:
            if not _is_locked(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, _LOCK_POLL_S)


def _check_sqlite_target(url: DatabaseURL) -> None:
    location = url.display()
    path = Path(url.database or "").absolute()
    if path.exists():
        with reading(url) as reader:
            refuse_foreign(reader.state(), location=location)
        return
    folder = path.parent
    if folder.is_dir():
        return
    if path == user_db_path().expanduser().absolute():
        folder.mkdir(parents=True, exist_ok=True)
        return
    why = "is not a directory" if folder.exists() else "does not exist"
    raise DatabaseError(
        f"cannot create {location}: its folder {folder} {why} (spectune creates no folder "
        "for a database it is given; create it first)"
    )


@contextmanager
def translate_errors(location: str) -> Iterator[None]:
    """Turn SQLAlchemy and driver errors inside the block into a one-line ``DatabaseError``."""
    try:
        yield
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None)
        raise translate_driver_error(exc if orig is None else orig, location) from None
    except Exception as exc:  # the schema query runs on the driver's connection
        if not type(exc).__module__.startswith(("sqlite3", "psycopg")):
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
            state = _state(connection)
        if state.revision == HEAD_REVISION:
            require_current(state, location=location)
            return HEAD_REVISION, HEAD_REVISION
        try:
            return _upgrade_locked(
                engine, location=location, lock_wait_s=_LOCK_POLL_S if sqlite else None
            )
        except (OperationalError, sqlite3.OperationalError) as exc:
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
        finally:
            if lock_wait_s is not None:
                raw.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")  # type: ignore[union-attr]
    return before, HEAD_REVISION


def _is_locked(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", exc)
    return isinstance(orig, sqlite3.OperationalError) and "locked" in str(orig).lower()
