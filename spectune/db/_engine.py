"""Engines for SQLite and PostgreSQL, and the translation of driver errors into clear ones.

SQLite writers use WAL with ``synchronous=NORMAL`` (a killed process never leaves a
half-written file; committed transactions survive a crash of the process), a busy
timeout, and ``BEGIN IMMEDIATE`` so concurrent writers queue instead of failing when
they upgrade a read lock. Readers open the file with ``mode=ro`` (the shipped database
also ``immutable=1``), so reading never creates or changes a file.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import SQLAlchemyError

from spectune.db._errors import DatabaseError, NotADatabaseError, one_line
from spectune.db._sqlite import BUSY_TIMEOUT_S, translate_sqlite_error

__all__ = ["BUSY_TIMEOUT_S", "READS_ONLY", "make_engine", "translate_errors"]

#: Execution option marking transactions that only read: SQLite starts them deferred,
#: so they never wait for (or hold up) a writer.
READS_ONLY = "spectune_reads_only"


def make_engine(url: URL, *, readonly: bool, immutable: bool = False) -> Engine:
    """An engine for ``url``.

    Args:
        url: A SQLite or ``postgresql+psycopg`` URL (see ``parse_target``).
        readonly: Open without the right to write (SQLite: the file must exist).
        immutable: SQLite only: the file never changes while open (shipped database).

    Raises:
        NotADatabaseError: a read-only SQLite file that does not exist.
    """
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, readonly=readonly, immutable=immutable)
    connect_args: dict[str, object] = {"connect_timeout": 10}
    if readonly:
        connect_args["options"] = "-c default_transaction_read_only=on"
    return create_engine(url, connect_args=connect_args)


def _sqlite_engine(url: URL, *, readonly: bool, immutable: bool) -> Engine:
    path = Path(url.database or "")
    if readonly:
        if not path.is_file():
            raise NotADatabaseError(f"no database file at {path}")
        query = {"mode": "ro", "uri": "true"}
        if immutable:
            query["immutable"] = "1"
        url = URL.create("sqlite", database=f"file:{quote(str(path.absolute()))}", query=query)
    else:
        path.absolute().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, connection_record) -> None:  # type: ignore[no-untyped-def]
        # Let SQLAlchemy's "begin" event below start transactions, not the driver.
        dbapi_connection.isolation_level = None
        if not readonly:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection) -> None:  # type: ignore[no-untyped-def]
        reads_only = readonly or connection.get_execution_options().get(READS_ONLY, False)
        connection.exec_driver_sql("BEGIN" if reads_only else "BEGIN IMMEDIATE")

    return engine


@contextmanager
def translate_errors(location: str) -> Iterator[None]:
    """Turn SQLAlchemy and driver errors inside the block into a one-line ``DatabaseError``."""
    try:
        yield
    except SQLAlchemyError as exc:
        raise _translate(exc, location) from None


def _translate(exc: SQLAlchemyError, location: str) -> DatabaseError:
    orig = getattr(exc, "orig", None)
    detail = one_line(str(orig) if orig is not None else str(exc), limit=200)
    module = type(orig).__module__ if orig is not None else ""
    if module.startswith("sqlite3"):
        return translate_sqlite_error(orig, location)
    if module.startswith("psycopg") and "connect" in type(orig).__name__.lower() + detail:
        return DatabaseError(f"cannot connect to {location}: {detail}")
    return DatabaseError(f"{location}: {detail}")
