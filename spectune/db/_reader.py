"""Reading a tuned-config database: one DB-API reader per storage, SQL from the field list.

SQLite files are read with the standard library's ``sqlite3``, opened read-only
(``mode=ro``; the shipped database also ``immutable=1``), PostgreSQL with ``psycopg`` in
read-only transactions. A WAL-mode file on read-only storage (where SQLite cannot create
its ``-shm`` index) is opened ``immutable=1`` when no ``-wal`` file beside it holds
changes, and refused with the reason when one does. What differs between the two, the
connection and the SQL's placeholders and catalog queries, is their backend's
(:mod:`spectune.db._backend`); both run the same SQL, generated from
:data:`spectune.db._fields.ROW_FIELDS`, and every read goes through here: the serving path's
:func:`spectune.db.load_index`, the store's ``rows``, ``count`` and
``best_configs_near``, and the schema check, which the writers also run on their own
connection (:func:`schema_state`). Reading never imports SQLAlchemy.

The schema's revision lives in Alembic's ``alembic_version`` table; readers accept the
revisions :data:`READABLE_REVISIONS` with every column of the field list that their
revision has. A column a later revision added (``Field.since``: the comparison with
vLLM, 0004) is read from a database of an earlier revision as the field's ``missing``
value (a literal in the SQL): a 0002 or 0003 database serves its rows, as not compared
with vLLM, without being upgraded (the plugin never writes, and must not lose rows
because spectune was upgraded before the database). Every failure is a one-line
:class:`spectune.db.DatabaseError` naming the database; only parameterised queries are
run, and nothing read is executed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from spectune.db._backend import (
    BUSY_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    DatabaseURL,
    SqlDialect,
    backend_of,
    dialect_of,
    translate_driver_error,
)
from spectune.db._fields import (
    FIELDS,
    KERNEL_FIELDS,
    LATER_FIELDS,
    ROW_FIELDS,
    RUNNING_FIELDS,
    TABLE_NAME,
)
from spectune.db.errors import (
    MalformedRowError,
    NotADatabaseError,
    SchemaError,
    SchemaTooNewError,
    SchemaTooOldError,
)

if TYPE_CHECKING:
    from spectune.db._row import TunedRow

__all__ = [
    "BUSY_TIMEOUT_S",
    "CONNECT_TIMEOUT_S",
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
REVISIONS = ("0001", "0002", "0003", "0004")
#: The revision this spectune writes (writers upgrade to it).
HEAD_REVISION = REVISIONS[-1]
#: The revisions whose ``tuned_configs`` readers read without an upgrade: later
#: revisions added tables readers never open (0003: the nightly history) or columns
#: readers take as their ``missing`` value where absent (0004: the comparison with
#: vLLM, "not measured"), so serving needs no upgrade.
READABLE_REVISIONS = REVISIONS[REVISIONS.index("0002"):]
#: Alembic's table recording the schema revision.
VERSION_TABLE = "alembic_version"
#: The columns of the table at :data:`HEAD_REVISION`.
TABLE_COLUMNS = ("id", *FIELDS)
#: The columns of the table at each readable revision.
REVISION_COLUMNS = {
    revision: ("id", *(f.name for f in ROW_FIELDS
                       if f.since is None or REVISIONS.index(f.since) <= at))
    for at, revision in enumerate(REVISIONS) if revision in READABLE_REVISIONS
}  # fmt: skip
#: Told of each malformed stored row a read skips (see :meth:`Reader.rows`).
BadRowHandler = Callable[[MalformedRowError], None]
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
    dialect = dialect_of(connection)
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
    missing = sorted(set(REVISION_COLUMNS[state.revision]) - state.columns)
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


class Reader:
    """Reads one database inside one read-only transaction; made by :func:`reading`."""

    def __init__(
        self, connection: Any, *, location: str, sql: SqlDialect | None = None
    ) -> None:
        self._connection = connection
        self._dialect = dialect_of(connection) if sql is None else sql
        self.location = location
        # Column -> the SQL literal it is read as, for the later columns the table
        # lacks (an older revision); known once the schema was read.
        self._absent: dict[str, str] | None = None

    def require_current(self) -> None:
        """Raise unless the database has a schema readers read (see :func:`require_current`)."""
        require_current(self.state(), location=self.location)

    def state(self) -> SchemaState:
        """What the database holds (see :func:`schema_state`)."""
        state = schema_state(self._connection)
        self._absent = {
            f.name: _literal(f.missing) for f in LATER_FIELDS if f.name not in state.columns
        }
        return state

    def _select(self, columns: Sequence[str], where: Sequence[str], order: bool = False) -> str:
        """The SQL reading ``columns`` (see :meth:`SqlDialect.select`), a later column the
        table lacks as its ``missing`` value."""
        if self._absent is None:
            self.state()
        return self._dialect.select(columns, where, order=order, absent=self._absent or {})

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
        # Here, not at the top: the serving path reads no whole row, and the row classes
        # cost milliseconds to build at every vLLM worker's start.
        from spectune.db._row import row_from_stored

        unknown = set(equal) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown field(s) {sorted(unknown)}")
        sql = self._select(TABLE_COLUMNS, tuple(equal), order=True)
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
        sql = self._select((*columns, "config"), _CANDIDATE_FILTER)
        execute = self._connection.execute
        return [
            (kernel, execute(sql, (*running, kernel, hash_)).fetchall())
            for kernel, hash_ in kernel_hashes.items()
        ]


def _literal(value: object) -> str:
    """``value`` (a field's ``missing``: ``None`` or our own text) as an SQL literal."""
    if value is None:
        return "NULL"
    if not isinstance(value, str):
        raise TypeError(f"no SQL literal for {value!r}")
    return "'" + value.replace("'", "''") + "'"


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
    backend = backend_of(url)
    location = backend.display()
    errors = backend.driver_errors()
    connection = backend.open_reader(immutable=immutable)
    try:
        yield Reader(connection, location=location, sql=backend.sql)
    except errors as exc:
        raise translate_driver_error(exc, location) from None
    finally:
        connection.close()
