"""Reading a tuned-config database: one DB-API reader per storage, SQL from the field list.

SQLite files are read with the standard library's ``sqlite3``, opened read-only
(``mode=ro``; the shipped database also ``immutable=1``), PostgreSQL with ``psycopg`` in
read-only transactions. A WAL-mode file on read-only storage (where SQLite cannot create
its ``-shm`` index) is opened ``immutable=1`` when no ``-wal`` file beside it holds
changes, and refused with the reason when one does (see :func:`_open_sqlite`). Both run
the same SQL, generated from :data:`spectune.db._fields.ROW_FIELDS` (only the
placeholder differs), and every read goes through here: the serving path's
:func:`spectune.db.load_index`, the store's ``rows``, ``count`` and
``best_configs_near``, and the schema check, which the writers also run on their own
connection (:func:`schema_state`). Reading never imports SQLAlchemy.

The schema's revision lives in Alembic's ``alembic_version`` table; readers accept the
revisions whose ``tuned_configs`` is today's (:data:`READABLE_REVISIONS`) with every column
of the field list. Every failure is a one-line
:class:`spectune.db.DatabaseError` naming the database; only parameterised queries are
run, and nothing read is executed.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

from spectune.db._fields import (
    FIELDS,
    KERNEL_FIELDS,
    KEY_FIELDS,
    ROW_FIELDS,
    RUNNING_FIELDS,
    TABLE_NAME,
)
from spectune.db._locations import DatabaseURL
from spectune.db._row import TunedRow, row_from_stored
from spectune.db.errors import (
    DatabaseError,
    MalformedRowError,
    NotADatabaseError,
    SchemaError,
    SchemaTooNewError,
    SchemaTooOldError,
)
from spectune.messages import one_line

__all__ = [
    "BUSY_TIMEOUT_S",
    "HEAD_REVISION",
    "READABLE_REVISIONS",
    "REVISIONS",
    "TABLE_COLUMNS",
    "VERSION_TABLE",
    "BadRowHandler",
    "Reader",
    "SchemaState",
    "reading",
    "refuse_foreign",
    "require_current",
    "schema_state",
    "translate_driver_error",
]

#: Every schema revision, oldest first; a database at another one is from a newer spectune.
REVISIONS = ("0001", "0002", "0003")
#: The revision this spectune writes (writers upgrade to it).
HEAD_REVISION = REVISIONS[-1]
#: The revisions whose ``tuned_configs`` readers read as is: later revisions only added
#: tables readers never open (0003: the nightly history), so serving needs no upgrade.
READABLE_REVISIONS = REVISIONS[REVISIONS.index("0002"):]
#: Alembic's table recording the schema revision.
VERSION_TABLE = "alembic_version"
#: The columns of the table at :data:`HEAD_REVISION`.
TABLE_COLUMNS = ("id", *FIELDS)
#: How long a SQLite connection waits for another writer's lock before giving up.
BUSY_TIMEOUT_S = 30.0
#: How long a PostgreSQL connection attempt may take.
CONNECT_TIMEOUT_S = 10

_SQLITE_MESSAGES = (
    (re.compile(r"file is not a database|file is encrypted"), "is not a SQLite database"),
    (re.compile(r"malformed|corrupt"), "is corrupt"),
    (re.compile(r"unable to open database"), "cannot be opened"),
    (re.compile(r"readonly database|read-only"), "is read-only here"),
    (re.compile(r"database is locked|database table is locked"), "is locked by another writer"),
)


_JSON_FIELDS = frozenset(f.name for f in ROW_FIELDS if f.kind == "json")

#: Told of each malformed stored row a read skips (see :meth:`Reader.rows`).
BadRowHandler = Callable[[MalformedRowError], None]
# The journal mode a SQLite file records in its header (bytes 18 and 19): 2 is WAL.
_WAL_HEADER = b"\x02\x02"


class _Dialect(NamedTuple):
    """What differs between the storages: placeholders, catalog queries, JSON columns."""

    marker: str
    tables: str
    columns: str  # (name, hidden) of a table's columns; one parameter, the table
    json_column: str  # how a JSON column is selected as text

    def select(self, columns: Sequence[str], where: Sequence[str] = (), order: bool = False) -> str:
        """``SELECT columns FROM tuned_configs WHERE c = ? AND ...`` (JSON as text)."""
        shown = [self.json_column.format(c) if c in _JSON_FIELDS else c for c in columns]
        sql = f"SELECT {', '.join(shown)} FROM {TABLE_NAME}"
        if where:
            sql += " WHERE " + " AND ".join(f"{c} = {self.marker}" for c in where)
        if order:
            sql += " ORDER BY " + ", ".join(KEY_FIELDS)
        return sql


_SQLITE = _Dialect(
    marker="?",
    tables=(
        "SELECT name FROM main.sqlite_master WHERE type = 'table' "
        "AND name NOT LIKE 'sqlite~_%' ESCAPE '~' ORDER BY name"
    ),
    columns="SELECT name, hidden FROM pragma_table_xinfo(?, 'main')",
    # sqlite3 returns JSON columns as the text stored; a CAST would copy every value.
    json_column="{}",
)
_POSTGRES = _Dialect(
    marker="%s",
    tables=(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = "
        "current_schema() AND table_type = 'BASE TABLE' ORDER BY table_name"
    ),
    columns=(
        "SELECT column_name, 0 FROM information_schema.columns WHERE table_schema = "
        "current_schema() AND table_name = %s"
    ),
    # psycopg would parse JSON into dicts; as text it is parsed, and cached, by us.
    json_column="CAST({} AS TEXT)",
)
_COUNT = f"SELECT count(*) FROM {TABLE_NAME}"
_REVISION = f"SELECT version_num FROM {VERSION_TABLE}"
#: What selects the rows of one kernel family measured on the running system.
_CANDIDATE_FILTER = tuple(f.name for f in (*RUNNING_FIELDS, *KERNEL_FIELDS))


class SchemaState(NamedTuple):
    """What a database holds.

    Attributes:
        revision: The recorded schema revision; ``None`` when there is none.
        tables: Names of its tables.
        columns: Names of the columns of ``tuned_configs`` (empty when it is absent).
    """

    revision: str | None
    tables: frozenset[str]
    columns: frozenset[str]


def schema_state(connection: Any) -> SchemaState:
    """Read the revision, tables and columns through a DB-API ``connection``.

    ``connection`` is a ``sqlite3`` or ``psycopg`` connection (a writer passes the one
    under its transaction). Driver errors propagate.
    """
    dialect = _SQLITE if isinstance(connection, sqlite3.Connection) else _POSTGRES
    tables = frozenset(name for (name,) in connection.execute(dialect.tables).fetchall())
    revision = None
    if VERSION_TABLE in tables:
        found = [value for (value,) in connection.execute(_REVISION).fetchall()]
        if len(found) > 1:
            raise SchemaError(f"several schema revisions recorded: {sorted(map(ascii, found))}")
        revision = found[0] if found else None
    columns: frozenset[str] = frozenset()
    if TABLE_NAME in tables:
        found_columns = connection.execute(dialect.columns, (TABLE_NAME,)).fetchall()
        columns = frozenset(name for name, hidden in found_columns if hidden != 1)
    return SchemaState(revision=revision, tables=tables, columns=columns)


def require_current(state: SchemaState, *, location: str) -> None:
    """Raise unless ``state`` is a spectune database whose rows this spectune reads
    (:data:`READABLE_REVISIONS`).

    Raises:
        NotADatabaseError: no spectune tables (empty, or another application's).
        SchemaTooNewError: written by a newer spectune.
        SchemaTooOldError: an older revision (``spectune db upgrade`` migrates it).
        SchemaError: the revision is right but tables or columns are missing.
    """
    refuse_foreign(state, location=location)
    if state.revision is None:
        raise NotADatabaseError(f"{location} has no spectune tables")
    if state.revision not in READABLE_REVISIONS:
        raise SchemaTooOldError(
            f"{location} has schema revision {state.revision}, older than this spectune's "
            f"{HEAD_REVISION}; run: spectune db upgrade --db {location}"
        )
    if TABLE_NAME not in state.tables:
        raise SchemaError(f"{location} is missing table {TABLE_NAME!r}")
    missing = sorted(set(TABLE_COLUMNS) - state.columns)
    if missing:
        raise SchemaError(f"{location}: table {TABLE_NAME!r} lacks column(s) {missing}")


def refuse_foreign(state: SchemaState, *, location: str) -> None:
    """Raise when ``state`` is another application's database or a newer spectune's.

    Raises:
        NotADatabaseError: tables but no schema revision.
        SchemaTooNewError: a revision this spectune does not know.
    """
    if state.revision is None and state.tables:
        raise NotADatabaseError(
            f"{location} is not a spectune database (it has tables "
            f"{sorted(map(ascii, state.tables))[:5]} but no schema revision)"
        )
    if state.revision is not None and state.revision not in REVISIONS:
        raise SchemaTooNewError(
            f"{location} has schema revision {state.revision!r}, which this spectune does "
            f"not know (newest known: {HEAD_REVISION}); it was written by a newer spectune: "
            "upgrade spectune to use it"
        )


def translate_driver_error(
    error: BaseException, location: str, *, connecting: bool = False
) -> DatabaseError:
    """A one-line :class:`DatabaseError` naming ``location`` for a ``sqlite3`` or
    ``psycopg`` error (``connecting``: raised while connecting)."""
    detail = one_line(str(error), limit=200)
    if isinstance(error, sqlite3.Error):
        for pattern, what in _SQLITE_MESSAGES:
            if pattern.search(detail):
                if what in ("is not a SQLite database", "is corrupt"):
                    return NotADatabaseError(f"{location} {what} ({detail})")
                if what == "is locked by another writer":
                    return DatabaseError(
                        f"{location} {what} (waited {BUSY_TIMEOUT_S:g} s); try again later"
                    )
                return DatabaseError(f"{location} {what} ({detail})")
    elif type(error).__module__.startswith("psycopg") and (
        connecting or "connect" in type(error).__name__.lower() + detail
    ):
        return DatabaseError(f"cannot connect to {location}: {detail}")
    return DatabaseError(f"{location}: {detail}")


class Reader:
    """Reads one database inside one read-only transaction; made by :func:`reading`."""

    def __init__(self, connection: Any, *, location: str) -> None:
        self._connection = connection
        self._dialect = _SQLITE if isinstance(connection, sqlite3.Connection) else _POSTGRES
        self.location = location

    def require_current(self) -> None:
        """Raise unless the database has the current schema (see :func:`require_current`)."""
        require_current(self.state(), location=self.location)

    def state(self) -> SchemaState:
        """What the database holds (see :func:`schema_state`)."""
        return schema_state(self._connection)

    def count(self) -> int:
        """Number of rows."""
        (total,) = self._connection.execute(_COUNT).fetchone()
        return int(total)

    def rows(self, *, on_bad_row: BadRowHandler | None = None, **equal: object) -> list[TunedRow]:
        """The rows whose fields equal ``equal`` (field name -> value), in key order.

        Args:
            on_bad_row: Called with each malformed row, which is then left out; ``None``
                raises on the first one.
            equal: Field name -> value.

        Raises:
            MalformedRowError: a stored row is malformed (edited by hand), naming the
                database, the row and the field (unless ``on_bad_row`` is given).
        """
        unknown = set(equal) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown field(s) {sorted(unknown)}")
        sql = self._dialect.select(TABLE_COLUMNS, tuple(equal), order=True)
        found = self._connection.execute(sql, tuple(equal.values())).fetchall()
        rows = []
        for row_id, *values in found:
            try:
                rows.append(row_from_stored(values, location=self.location, row_id=row_id))
            except MalformedRowError as exc:
                if on_bad_row is None:
                    raise
                on_bad_row(exc)
        return rows

    def candidates(
        self, *, columns: Sequence[str], running: Sequence[Any], kernel_hashes: Mapping[str, str]
    ) -> list[tuple[str, list[tuple[Any, ...]]]]:
        """The rows measured on the running system, per installed kernel family.

        Args:
            columns: The fields to read of each row (the config follows them).
            running: The values of the running fields (device identity, Triton
                version) on the running system, in field order.
            kernel_hashes: Kernel family name -> source hash of the installed kernels
                (the values of the kernel fields).

        Returns:
            For each family, its rows as ``columns`` (``draft_probs`` as stored: 0/1
            on SQLite) followed by the config as stored.
        """
        # One query per family: each an equality search of the unique index's prefix.
        sql = self._dialect.select((*columns, "config"), _CANDIDATE_FILTER)
        execute = self._connection.execute
        return [
            (kernel, execute(sql, (*running, kernel, hash_)).fetchall())
            for kernel, hash_ in kernel_hashes.items()
        ]


@contextmanager
def reading(url: DatabaseURL, *, immutable: bool = False) -> Iterator[Reader]:
    """Open the database at ``url`` for reading, in one read-only transaction.

    Args:
        url: The database; a SQLite file must exist.
        immutable: SQLite only: the file never changes while open (the shipped
            database), so it is read without locks.

    Raises:
        DatabaseError: with a one-line message naming the database (no file, not
            SQLite, corrupt, cannot connect, a failing query...), also for driver
            errors raised inside the block.
    """
    location = url.display()
    errors: tuple[type[BaseException], ...]
    if url.is_sqlite:
        connection = _open_sqlite(url, immutable=immutable, location=location)
        errors = (sqlite3.Error,)
    else:
        psycopg = _psycopg(location)
        connection = _open_postgres(url, location=location)
        errors = (psycopg.Error,)
    try:
        yield Reader(connection, location=location)
    except errors as exc:
        raise translate_driver_error(exc, location) from None
    finally:
        connection.close()


def _open_sqlite(url: DatabaseURL, *, immutable: bool, location: str) -> sqlite3.Connection:
    """A read-only connection to a SQLite file, inside a read transaction.

    A WAL-mode file is read through its ``-shm`` index, which SQLite creates beside it
    when absent: on read-only storage (a read-only volume, a package directory) it
    cannot, and ``mode=ro`` fails with "unable to open database file". The file is then
    complete when no ``-wal`` file beside it holds changes (the last writer to close
    folds them in and removes it), and is opened ``immutable=1``, which needs no index;
    when one does, immutable would silently read it without them, so it is refused with
    the reason instead.
    """
    path = Path(url.database or "")
    if not path.is_file():
        raise NotADatabaseError(f"no database file at {path}")
    try:
        return _connect_sqlite(path, immutable=immutable)
    except sqlite3.Error as exc:
        if immutable or not _is_wal_without_index(exc, path):
            raise translate_driver_error(exc, location) from None
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise DatabaseError(
            f"{location} cannot be read here: it is in WAL mode and {wal.name} holds changes "
            f"not yet in the file, which SQLite cannot read without creating {path.name}-shm "
            f"beside it (read-only storage?); open it once where it is writable (spectune db "
            f"upgrade --db PATH) to fold them in"
        )
    try:
        return _connect_sqlite(path, immutable=True)
    except sqlite3.Error as exc:
        raise translate_driver_error(exc, location) from None


def _connect_sqlite(path: Path, *, immutable: bool) -> sqlite3.Connection:
    uri = f"file:{quote(str(path.absolute()))}?mode=ro"
    if immutable:
        uri += "&immutable=1"
    connection = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        # One transaction: every query of the reader sees the same snapshot. The first
        # read opens the file (and a WAL file's index): a file that cannot be read
        # fails here, not in the middle of a caller's reading.
        connection.execute("BEGIN")
        connection.execute("SELECT 1 FROM main.sqlite_master LIMIT 1").fetchall()
    except BaseException:
        connection.close()
        raise
    return connection


def _is_wal_without_index(error: sqlite3.Error, path: Path) -> bool:
    """Whether ``error`` is SQLite failing to open the ``-shm`` index of a WAL-mode file."""
    name = getattr(error, "sqlite_errorname", None)  # Python 3.11+; the message before
    if name != "SQLITE_CANTOPEN" and not (name is None and "unable to open" in str(error)):
        return False
    try:
        with path.open("rb") as file:
            header = file.read(20)
    except OSError:
        return False
    return header[:16] == b"SQLite format 3\x00" and header[18:20] == _WAL_HEADER


def _psycopg(location: str) -> Any:
    try:
        import psycopg
    except ImportError:
        raise DatabaseError(
            f"{location}: reading PostgreSQL needs psycopg (pip install 'psycopg[binary]')"
        ) from None
    return psycopg


def _open_postgres(url: DatabaseURL, *, location: str) -> Any:
    psycopg = _psycopg(location)
    params = {
        **url.connect_params(),
        "connect_timeout": CONNECT_TIMEOUT_S,
        "options": "-c default_transaction_read_only=on",
    }
    try:
        return psycopg.connect(**params)
    except psycopg.Error as exc:
        raise translate_driver_error(exc, location, connecting=True) from None
