"""The storage seam: everything that differs between SQLite and PostgreSQL, in one place.

A database target (a file path, ``sqlite:///PATH`` or ``postgresql+psycopg://...``) is
parsed once into a :class:`DatabaseURL` (standard library only) and resolved by
:func:`backend_of` to its :class:`Backend`: :class:`SQLiteBackend` or
:class:`PostgresBackend`. A backend offers what the rest of ``spectune.db`` and the
tuner's study storage need, so that no other module asks which storage it has:

- naming it: :meth:`Backend.display` (the file, or the URL without its password),
  :attr:`Backend.absent` (a SQLite file not there yet);
- reading (:mod:`spectune.db._reader`): :meth:`Backend.open_reader`, a DB-API connection
  in a read-only transaction (``sqlite3`` read-only, WAL files on read-only storage
  included; ``psycopg`` in a read-only transaction), :attr:`Backend.sql`, the SQL that
  differs (placeholders, catalog queries, JSON as text), :meth:`Backend.driver_errors`;
- writing (:mod:`spectune.db._writer`): :meth:`Backend.make_engine` (SQLAlchemy; SQLite:
  WAL, ``BEGIN IMMEDIATE``, a foreign file refused before anything persists), and the
  locking of schema upgrades (:attr:`Backend.write_lock_poll_s`,
  :meth:`Backend.limit_lock_wait`, :meth:`Backend.lock_migrations`,
  :meth:`Backend.is_lock_timeout`, :func:`alter_in_batches`);
- the studies beside a configs database (:mod:`spectune.search._storage`):
  :meth:`Backend.studies_storage` (a JournalStorage file beside a SQLite file; the same
  PostgreSQL database, in the schema :data:`STUDIES_SCHEMA`), and for an Optuna RDB URL,
  :func:`study_rdb` (engine arguments, whether it is a server to retry, and PostgreSQL's
  lock and schema creation before Optuna creates its tables).

Driver errors of either storage become one-line :class:`~spectune.db.errors.DatabaseError`
messages naming the database (:func:`translate_driver_error`). Importing this module
imports neither SQLAlchemy nor psycopg: only the functions that need them do.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlencode

from spectune.db._fields import KEY_FIELDS, ROW_FIELDS, TABLE_NAME
from spectune.db.errors import DatabaseError, NotADatabaseError
from spectune.messages import one_line

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Connection, Engine

__all__ = [
    "BUSY_TIMEOUT_S",
    "CONNECT_TIMEOUT_S",
    "READS_ONLY",
    "STUDIES_JOURNAL_SUFFIX",
    "STUDIES_SCHEMA",
    "Backend",
    "DatabaseURL",
    "PostgresBackend",
    "SQLiteBackend",
    "SqlDialect",
    "StudyRDB",
    "alter_in_batches",
    "backend_of",
    "dialect_of",
    "display_storage",
    "is_driver_error",
    "is_permanent",
    "lost_connection",
    "parse_target",
    "study_rdb",
    "translate_driver_error",
]

#: How long a SQLite connection waits for another writer's lock before giving up.
BUSY_TIMEOUT_S = 30.0
#: How long a PostgreSQL connection attempt may take.
CONNECT_TIMEOUT_S = 10
#: Execution option marking transactions that only read: SQLite starts them deferred,
#: so they never wait for (or hold up) a writer.
READS_ONLY = "spectune_reads_only"
#: PostgreSQL schema holding Optuna's tables beside a configs database.
STUDIES_SCHEMA = "spectune_studies"
#: What replaces a SQLite configs file's suffix to name its studies' journal file.
STUDIES_JOURNAL_SUFFIX = ".studies.journal"


class _LazyPattern:
    """A regular expression compiled at its first use, not at import: compiling this
    module's patterns costs every vLLM worker about 2 ms at start, and the serving path
    needs none of them unless a URL names a database or something fails (``re`` keeps
    what it compiled)."""

    __slots__ = ("_flags", "_source")

    def __init__(self, source: str, flags: int = 0) -> None:
        self._source = source
        self._flags = flags

    def __getattr__(self, name: str) -> Any:
        return getattr(re.compile(self._source, self._flags), name)


_POSTGRES_DRIVER = "postgresql+psycopg"
# DRIVER://[USER[:PASSWORD]@][HOST|[IPV6]][:PORT][/DATABASE][?QUERY], as SQLAlchemy reads
# URLs: user, password and database are percent-decoded, the host is not.
_URL = _LazyPattern(
    r"(?P<driver>[\w+]+)://"
    r"(?:(?P<username>[^:/]*)(?::(?P<password>[^@]*))?@)?"
    r"(?:\[(?P<ipv6>[^/?]+)\]|(?P<host>[^/:?]+))?"
    r"(?::(?P<port>[^/?]*))?"
    r"(?:/(?P<database>[^?]*))?"
    r"(?:\?(?P<query>.*))?",
    re.DOTALL,
)
# A SQLite writer waits for the write lock in waits of at most this long while it
# creates or upgrades the schema, reading the revision again between them.
_LOCK_POLL_S = 1.0
# First pause before trying a lost switch to WAL again; it doubles up to _LOCK_POLL_S.
_WAL_RETRY_FIRST_S = 0.001
# The journal mode a SQLite file records in its header (bytes 18 and 19): 2 is WAL.
_WAL_HEADER = b"\x02\x02"
_SQLITE_MESSAGES = (
    (_LazyPattern(r"file is not a database|file is encrypted"), "is not a SQLite database"),
    (_LazyPattern(r"malformed|corrupt"), "is corrupt"),
    (_LazyPattern(r"unable to open database"), "cannot be opened"),
    (_LazyPattern(r"readonly database|read-only"), "is read-only here"),
    (_LazyPattern(r"database is locked|database table is locked"), "is locked by another writer"),
)
_PG_LOCK_KEY = 0x5BEC7E  # pg_advisory_xact_lock key serializing spectune migrations
# Serializes the creation of the studies schema and of Optuna's tables by concurrent
# workers (Optuna's create_all is not safe against a concurrent one). Apart from the
# configs database's migration lock (_PG_LOCK_KEY).
_PG_INIT_LOCK_KEY = 0x5BEC57
_SCHEMA_NAME = _LazyPattern(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# Exceptions (module, class name) that mean the connection, not the request, failed.
_TRANSIENT_TYPES = frozenset(
    {
        ("psycopg", "OperationalError"),
        ("psycopg", "InterfaceError"),
        ("psycopg2", "OperationalError"),
        ("psycopg2", "InterfaceError"),
        ("sqlalchemy.exc", "OperationalError"),
        ("sqlalchemy.exc", "InterfaceError"),
        ("sqlalchemy.exc", "DisconnectionError"),
        ("sqlalchemy.exc", "TimeoutError"),
    }
)
# Connection failures that waiting does not cure: a wrong name, user or password.
_PERMANENT = _LazyPattern(
    r"does not exist|authentication failed|no pg_hba\.conf entry|permission denied|"
    r"password|unsupported|invalid (?:dsn|connection option)",
    re.IGNORECASE,
)
_JSON_FIELDS = frozenset(f.name for f in ROW_FIELDS if f.kind == "json")


# -- targets ----------------------------------------------------------------------------


class DatabaseURL(NamedTuple):
    """A parsed database target: a SQLite file or a PostgreSQL database.

    A named tuple (cheap to define at import, immutable); its ``repr`` hides the
    password. What depends on the storage is its :class:`Backend`'s
    (:func:`backend_of`).

    Attributes:
        driver: ``sqlite`` (or ``sqlite+DRIVER``) or ``postgresql+psycopg``.
        database: SQLite: the file (absolute when given as a path); PostgreSQL: the
            database name.
        username: PostgreSQL user.
        password: PostgreSQL password (never shown).
        host: PostgreSQL host.
        port: PostgreSQL port.
        query: Further connection parameters, ``(name, value)`` pairs.
    """

    driver: str
    database: str | None
    username: str | None = None
    password: str | None = None
    host: str | None = None
    port: int | None = None
    query: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:
        return f"DatabaseURL({self.display()!r})"

    @classmethod
    def sqlite_file(cls, path: str | os.PathLike[str]) -> DatabaseURL:
        """The URL of a SQLite file (relative paths from the current directory)."""
        return cls(driver=SQLiteBackend.name, database=str(Path(path).expanduser().absolute()))

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.driver.split("+")[0]

    @property
    def is_sqlite(self) -> bool:
        return self.backend == SQLiteBackend.name

    @property
    def absent(self) -> bool:
        """A SQLite file that does not exist (readers skip it, writers create it)."""
        backend = _BACKENDS.get(self.backend)
        return backend is not None and backend(self).absent

    def display(self) -> str:
        """The target for messages: the file for SQLite, the URL without password else."""
        backend = _BACKENDS.get(self.backend)
        return self.url_text() if backend is None else backend(self).display()

    def url_text(self) -> str:
        """The URL, its password shown as ``***``."""
        text = self.driver + "://"
        if self.username is not None:
            text += quote(self.username, safe=" +")
            if self.password is not None:
                text += ":***"
            text += "@"
        if self.host is not None:
            text += f"[{self.host}]" if ":" in self.host else self.host
        if self.port is not None:
            text += f":{self.port}"
        if self.database is not None:
            text += "/" + quote(self.database, safe=" +/")
        if self.query:
            text += "?" + "&".join(
                f"{quote_plus(k)}={quote_plus(v)}" for k, v in sorted(self.query)
            )
        return text

    def connect_params(self) -> dict[str, Any]:
        """PostgreSQL: the keyword arguments of ``psycopg.connect`` (the query overrides)."""
        parts = (
            ("host", self.host),
            ("port", self.port),
            ("user", self.username),
            ("password", self.password),
            ("dbname", self.database),
        )
        return {**{k: v for k, v in parts if v is not None}, **dict(self.query)}

    def sqlalchemy_url(self) -> URL:
        """The same target as a SQLAlchemy URL (for the writers' engines)."""
        from sqlalchemy.engine import URL

        return URL.create(
            self.driver,
            username=self.username,
            password=self.password,
            host=self.host,
            port=self.port,
            database=self.database,
            query=dict(self.query),
        )


def parse_target(target: str | os.PathLike[str]) -> DatabaseURL:
    """Turn a database URL or a file path into a :class:`DatabaseURL`.

    Args:
        target: ``sqlite:///path``, ``postgresql+psycopg://user@host/db``, or a path
            (relative paths are taken from the current directory).

    Raises:
        DatabaseError: for an empty target, an unparsable URL or a database other than
            SQLite or PostgreSQL.
    """
    if isinstance(target, os.PathLike):
        return DatabaseURL.sqlite_file(target)
    if not isinstance(target, str) or not target.strip():
        raise DatabaseError(f"database must be a URL or a path, got {target!r}")
    if "://" not in target:
        return DatabaseURL.sqlite_file(target)
    url = _parse_url(target)
    if url is None:
        raise DatabaseError("cannot parse database URL (unparsable)")
    backend = _BACKENDS.get(url.backend)
    if backend is None:
        raise DatabaseError(
            f"unsupported database {url.backend!r} in {url.display()}: use a file path, "
            "sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
        )
    backend.check_target(url)
    return url


def _parse_url(text: str) -> DatabaseURL | None:
    """The parts of a URL, or ``None`` when it is not one (or repeats a parameter)."""
    match = _URL.fullmatch(text)
    if match is None:
        return None
    port = match["port"]
    if port is not None and not (port.isascii() and port.isdigit()):
        return None
    query = tuple(parse_qsl(match["query"] or ""))
    if len({name for name, _ in query}) != len(query):
        return None

    def decoded(part: str | None) -> str | None:
        return None if part is None else unquote(part)

    return DatabaseURL(
        driver=match["driver"],
        database=decoded(match["database"]),
        username=decoded(match["username"]),
        password=decoded(match["password"]),
        host=match["ipv6"] or match["host"],
        port=None if port is None else int(port),
        query=query,
    )


def display_storage(storage: str | os.PathLike[str]) -> str:
    """A storage spec for messages: a URL without its password, a path as is."""
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", os.fspath(storage))


# -- the SQL that differs ---------------------------------------------------------------


class SqlDialect(NamedTuple):
    """What differs in the readers' SQL: placeholders, catalog queries, JSON columns."""

    marker: str
    tables: str
    columns: str  # (name, hidden) of a table's columns; one parameter, the table
    json_column: str  # how a JSON column is selected as text

    def select(
        self, columns: Sequence[str], where: Sequence[str] = (), order: bool = False,
        absent: Mapping[str, str] | None = None,
    ) -> str:
        """``SELECT columns FROM tuned_configs WHERE c = ? AND ...`` (JSON as text).

        ``absent``: column -> an SQL literal it is read as (a column an older schema
        lacks: ``'not measured' AS vs_vllm``).
        """
        absent = absent or {}
        shown = [
            f"{absent[c]} AS {c}" if c in absent
            else self.json_column.format(c) if c in _JSON_FIELDS else c
            for c in columns
        ]  # fmt: skip
        sql = f"SELECT {', '.join(shown)} FROM {TABLE_NAME}"
        if where:
            sql += " WHERE " + " AND ".join(f"{c} = {self.marker}" for c in where)
        if order:
            sql += " ORDER BY " + ", ".join(KEY_FIELDS)
        return sql


# -- the backends -----------------------------------------------------------------------


class Backend(ABC):
    """One storage of tuned configs; made by :func:`backend_of`.

    Args:
        url: The database.
    """

    #: The URL scheme (``DatabaseURL.backend``) this backend serves.
    name: ClassVar[str]
    #: The readers' SQL.
    sql: ClassVar[SqlDialect]
    #: SQLite: the longest single wait for the write lock while creating or upgrading
    #: the schema (the revision is read again between waits); ``None``: one wait.
    write_lock_poll_s: ClassVar[float | None] = None

    def __init__(self, url: DatabaseURL) -> None:
        self.url = url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.display()!r})"

    @classmethod
    def check_target(cls, url: DatabaseURL) -> None:
        """Raise :class:`DatabaseError` when ``url`` cannot hold tuned configs."""
        return None  # any target of the scheme can

    @property
    def location(self) -> str:
        """The database for messages (:meth:`display`)."""
        return self.display()

    @property
    def absent(self) -> bool:
        """Whether the database does not exist yet (readers skip it, writers create it)."""
        return False

    @property
    def local_file(self) -> str | None:
        """The one local file the database is, whose state says whether it changed (what
        the serving path's read cache keys on); ``None`` for a server's database."""
        return None

    def display(self) -> str:
        """The URL without its password."""
        return self.url.url_text()

    # -- reading

    @abstractmethod
    def driver_errors(self) -> tuple[type[BaseException], ...]:
        """The driver's error classes (importing the driver).

        Raises:
            DatabaseError: the driver is not installed.
        """

    @abstractmethod
    def open_reader(self, *, immutable: bool = False) -> Any:
        """A DB-API connection inside a read-only transaction (every query of it sees
        the same snapshot).

        Args:
            immutable: SQLite: the file never changes while open (the shipped database),
                so it is read without locks.

        Raises:
            DatabaseError: with a one-line message naming the database.
        """

    # -- writing

    @abstractmethod
    def make_engine(
        self,
        *,
        user_db: Callable[[], Path] | None = None,
        identify: Callable[[], None] | None = None,
    ) -> Engine:
        """A writer's SQLAlchemy engine.

        Args:
            user_db: The user database's path (SQLite: the one file whose missing folder
                spectune creates).
            identify: SQLite: called before the first connection to a file that exists
                (the writer refuses a foreign database there, unchanged).

        Raises:
            DatabaseError: the database is not one a writer may open.
        """

    @contextlib.contextmanager
    def limit_lock_wait(self, raw: Any, *, wait_s: float | None) -> Iterator[None]:
        """Around a transaction on the driver connection ``raw``: wait at most
        ``wait_s`` for the write lock (``None``: as configured)."""
        yield

    def lock_migrations(self, connection: Connection) -> None:
        """Inside a writer's transaction: serialize schema changes with other writers."""
        return None  # the transaction's own write lock serializes them

    def is_lock_timeout(self, error: BaseException) -> bool:
        """Whether ``error`` is a wait for the write lock that ran out."""
        return False

    # -- studies

    @abstractmethod
    def studies_storage(self) -> str:
        """Where the studies of this configs database live: a JournalStorage file path,
        or an RDB URL (see the module docstring)."""


class SQLiteBackend(Backend):
    """A SQLite file: read with ``sqlite3``, written through SQLAlchemy in WAL mode."""

    name = "sqlite"
    sql = SqlDialect(
        marker="?",
        tables=(
            "SELECT name FROM main.sqlite_master WHERE type = 'table' "
            "AND name NOT LIKE 'sqlite~_%' ESCAPE '~' ORDER BY name"
        ),
        columns="SELECT name, hidden FROM pragma_table_xinfo(?, 'main')",
        # sqlite3 returns JSON columns as the text stored; a CAST would copy every value.
        json_column="{}",
    )
    write_lock_poll_s = _LOCK_POLL_S

    @classmethod
    def check_target(cls, url: DatabaseURL) -> None:
        if url.database in (None, "", ":memory:"):
            raise DatabaseError("an in-memory SQLite database cannot hold tuned configs")

    @property
    def path(self) -> Path:
        """The file."""
        return Path(self.url.database or "")

    @property
    def absent(self) -> bool:
        return not self.path.exists()

    @property
    def local_file(self) -> str | None:
        return self.url.database or None

    def display(self) -> str:
        if self.url.database:
            return self.url.database
        return super().display()

    # -- reading

    def driver_errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error,)

    def open_reader(self, *, immutable: bool = False) -> sqlite3.Connection:
        """A read-only connection to the file, inside a read transaction.

        A WAL-mode file is read through its ``-shm`` index, which SQLite creates beside
        it when absent: on read-only storage (a read-only volume, a package directory)
        it cannot, and ``mode=ro`` fails with "unable to open database file". The file
        is then complete when no ``-wal`` file beside it holds changes (the last writer
        to close folds them in and removes it), and is opened ``immutable=1``, which
        needs no index; when one does, immutable would silently read it without them,
        so it is refused with the reason instead.
        """
        location = self.display()
        path = self.path
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
                f"{location} cannot be read here: it is in WAL mode and {wal.name} holds "
                f"changes not yet in the file, which SQLite cannot read without creating "
                f"{path.name}-shm beside it (read-only storage?); open it once where it is "
                f"writable (spectune db upgrade --db PATH) to fold them in"
            )
        try:
            return _connect_sqlite(path, immutable=True)
        except sqlite3.Error as exc:
            raise translate_driver_error(exc, location) from None

    # -- writing

    def make_engine(
        self,
        *,
        user_db: Callable[[], Path] | None = None,
        identify: Callable[[], None] | None = None,
    ) -> Engine:
        """WAL with ``synchronous=NORMAL`` (a killed process never leaves a half-written
        file), a busy timeout, and ``BEGIN IMMEDIATE`` so concurrent writers queue
        instead of failing when they upgrade a read lock (transactions marked
        :data:`READS_ONLY` begin deferred).

        Before the first connection changes anything (``journal_mode=WAL`` is written
        into the file's header), the file is identified read-only: a file that is not
        SQLite, another application's database or a newer spectune's is refused
        unchanged. A file that does not exist must have an existing folder, unless it is
        the user database (the platform's data directory is spectune's to make).
        """
        from sqlalchemy import create_engine, event

        self._check_writable(user_db, identify)
        engine = create_engine(
            self.url.sqlalchemy_url(), connect_args={"timeout": BUSY_TIMEOUT_S}
        )

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

    def _check_writable(
        self, user_db: Callable[[], Path] | None, identify: Callable[[], None] | None
    ) -> None:
        location = self.display()
        path = self.path.absolute()
        if path.exists():
            if identify is not None:
                identify()
            return
        folder = path.parent
        if folder.is_dir():
            return
        if user_db is not None and path == user_db().expanduser().absolute():
            folder.mkdir(parents=True, exist_ok=True)
            return
        why = "is not a directory" if folder.exists() else "does not exist"
        raise DatabaseError(
            f"cannot create {location}: its folder {folder} {why} (spectune creates no "
            "folder for a database it is given; create it first)"
        )

    @contextlib.contextmanager
    def limit_lock_wait(self, raw: Any, *, wait_s: float | None) -> Iterator[None]:
        if wait_s is None:
            yield
            return
        # No transaction yet: the pragma runs before BEGIN.
        raw.execute(f"PRAGMA busy_timeout = {int(wait_s * 1000)}")
        try:
            yield
        finally:
            raw.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")

    def is_lock_timeout(self, error: BaseException) -> bool:
        from sqlalchemy.exc import OperationalError

        return isinstance(error, (OperationalError, sqlite3.OperationalError)) and _is_locked(
            error
        )

    # -- files

    @staticmethod
    def seal(path: Path) -> None:
        """Make a closed SQLite database one self-contained file: rollback-journal mode
        (no ``-wal``/``-shm`` beside it, readable from read-only storage) and vacuumed."""
        connection = sqlite3.connect(path, isolation_level=None)
        try:
            connection.execute("PRAGMA journal_mode=DELETE")
            connection.execute("VACUUM")
        finally:
            connection.close()

    # -- studies

    def studies_storage(self) -> str:
        """For ``DIR/NAME.db``, the JournalStorage file ``DIR/NAME.studies.journal``."""
        path = self.path
        return str(path.with_name(path.stem + STUDIES_JOURNAL_SUFFIX))


class PostgresBackend(Backend):
    """A PostgreSQL database: read with ``psycopg`` in read-only transactions, written
    through SQLAlchemy; migrations serialized by an advisory lock."""

    name = "postgresql"
    sql = SqlDialect(
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

    @classmethod
    def check_target(cls, url: DatabaseURL) -> None:
        if url.driver != _POSTGRES_DRIVER:
            raise DatabaseError(
                f"use the psycopg driver for PostgreSQL ({_POSTGRES_DRIVER}://...), "
                f"got {url.driver!r}"
            )

    # -- reading

    def driver_errors(self) -> tuple[type[BaseException], ...]:
        return (_psycopg(self.display()).Error,)

    def open_reader(self, *, immutable: bool = False) -> Any:
        location = self.display()
        psycopg = _psycopg(location)
        params = {
            **self.url.connect_params(),
            "connect_timeout": CONNECT_TIMEOUT_S,
            "options": "-c default_transaction_read_only=on",
        }
        try:
            return psycopg.connect(**params)
        except psycopg.Error as exc:
            raise translate_driver_error(exc, location, connecting=True) from None

    # -- writing

    def make_engine(
        self,
        *,
        user_db: Callable[[], Path] | None = None,
        identify: Callable[[], None] | None = None,
    ) -> Engine:
        from sqlalchemy import create_engine

        return create_engine(
            self.url.sqlalchemy_url(), connect_args={"connect_timeout": CONNECT_TIMEOUT_S}
        )

    def lock_migrations(self, connection: Connection) -> None:
        from sqlalchemy import text

        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})

    # -- studies

    def studies_storage(self) -> str:
        """The same URL with ``options=-c search_path=spectune_studies`` added, so that
        Optuna's tables live in the schema :data:`STUDIES_SCHEMA` of the same database
        (created by :func:`study_rdb`'s preparation when missing); it opens as is in
        ``optuna-dashboard``."""
        url = self.url
        query = dict(url.query)
        option = f"-c search_path={STUDIES_SCHEMA}"
        # libpq applies -c settings in order: ours, last, wins over a search_path given.
        query["options"] = f"{query['options']} {option}" if query.get("options") else option
        text = f"{url.driver}://"
        if url.username is not None:
            text += quote(url.username, safe="")
            if url.password is not None:
                text += ":" + quote(url.password, safe="")
            text += "@"
        if url.host is not None:
            text += f"[{url.host}]" if ":" in url.host else url.host
        if url.port is not None:
            text += f":{url.port}"
        text += "/" + quote(url.database or "", safe="")
        return text + "?" + urlencode(sorted(query.items()), quote_via=quote)

    @contextlib.contextmanager
    def studies_lock(self, spec: str) -> Iterator[None]:
        """Hold the studies' init lock; create the schema the URL's search_path names.

        Args:
            spec: The storage URL as given (for messages).

        Raises:
            ValueError: the URL would put Optuna's tables beside spectune's configs (no
                search_path, and the configs table in the default schema).
        """
        from sqlalchemy import text
        from sqlalchemy.schema import CreateSchema

        schema = _search_path_schema(dict(self.url.query).get("options", ""))
        key = {"key": _PG_INIT_LOCK_KEY}
        engine = self.make_engine()
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT pg_advisory_lock(:key)"), key)
                try:
                    if schema is not None:
                        connection.execute(CreateSchema(schema, if_not_exists=True))
                    elif connection.execute(
                        text("SELECT to_regclass(:table)"), {"table": TABLE_NAME}
                    ).scalar() is not None:
                        # Optuna's alembic_version would meet ours, and break both.
                        raise ValueError(
                            f"{display_storage(spec)} holds spectune's tuned configs: keep "
                            f"the studies in their own schema, "
                            f"{display_storage(self.studies_storage())}"
                        )
                    connection.commit()
                    yield
                finally:
                    with contextlib.suppress(Exception):  # closing the connection frees it
                        connection.execute(text("SELECT pg_advisory_unlock(:key)"), key)
                        connection.commit()
        finally:
            engine.dispose()


_BACKENDS: dict[str, type[Backend]] = {
    SQLiteBackend.name: SQLiteBackend,
    PostgresBackend.name: PostgresBackend,
}


def backend_of(target: str | os.PathLike[str] | DatabaseURL) -> Backend:
    """The backend of a database target (a URL, a path or a parsed URL).

    Raises:
        DatabaseError: ``target`` is not a usable database target.
    """
    url = target if isinstance(target, DatabaseURL) else parse_target(target)
    backend = _BACKENDS.get(url.backend)
    if backend is None:
        raise DatabaseError(f"unsupported database {url.backend!r}")
    return backend(url)


def dialect_of(connection: Any) -> SqlDialect:
    """The SQL of the storage a DB-API ``connection`` (``sqlite3`` or ``psycopg``) reads."""
    return (SQLiteBackend if isinstance(connection, sqlite3.Connection) else PostgresBackend).sql


def alter_in_batches(connection: Connection) -> bool:
    """Whether Alembic alters tables by copying them on this SQLAlchemy connection."""
    return connection.dialect.name == SQLiteBackend.name


# -- driver errors ----------------------------------------------------------------------


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


def is_driver_error(error: BaseException) -> bool:
    """Whether ``error`` was raised by ``sqlite3`` or ``psycopg``."""
    return type(error).__module__.startswith(("sqlite3", "psycopg"))


def lost_connection(error: BaseException) -> BaseException | None:
    """The driver's connection error in ``error``'s chain (the innermost), if any.

    Recognized by class names, so that no database driver is imported: psycopg's (2 and
    3) and SQLAlchemy's operational and interface errors (Optuna wraps them in a
    ``StorageInternalError``), or an error that invalidated its connection.
    """
    found = None
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "connection_invalidated", False) or any(
            (klass.__module__, klass.__name__) in _TRANSIENT_TYPES
            for klass in type(current).__mro__
        ):
            found = current
        current = current.__cause__ or current.__context__
    return found


def is_permanent(error: BaseException) -> bool:
    """Whether a connection error names what waiting does not cure (a missing database
    or role, a rejected password)."""
    return _PERMANENT.search(str(error)) is not None


# -- Optuna's RDB storages --------------------------------------------------------------


class StudyRDB(NamedTuple):
    """How to open an Optuna RDB storage URL.

    Attributes:
        engine_kwargs: Optuna's ``RDBStorage(engine_kwargs=...)``.
        server: A database server: retried while unreachable, with a cache in front.
        prepare: Run around creating the storage (PostgreSQL through psycopg: the init
            lock, and the studies schema created); ``None``: nothing.
    """

    engine_kwargs: dict[str, Any]
    server: bool
    prepare: Callable[[], contextlib.AbstractContextManager[None]] | None = None


def study_rdb(url: str) -> StudyRDB:
    """How Optuna's RDB storage at ``url`` (``sqlite:///x.db``, ``postgresql+psycopg://...``,
    any SQLAlchemy URL) is opened.

    SQLite: a long busy timeout, opened once. A server: connections checked before use
    (a pooled one from before a restart is replaced, not failed), a connect timeout on
    PostgreSQL, and through psycopg the init lock around Optuna's table creation.
    """
    if url.startswith(SQLiteBackend.name):
        return StudyRDB(engine_kwargs={"connect_args": {"timeout": 60}}, server=False)
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith(PostgresBackend.name):
        engine_kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    prepare = None
    if url.startswith(_POSTGRES_DRIVER + "://"):

        def prepare() -> contextlib.AbstractContextManager[None]:
            return PostgresBackend(parse_target(url)).studies_lock(url)

    return StudyRDB(engine_kwargs=engine_kwargs, server=True, prepare=prepare)


# -- helpers ----------------------------------------------------------------------------


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


def _is_locked(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", exc)
    return isinstance(orig, sqlite3.OperationalError) and "locked" in str(orig).lower()


def _psycopg(location: str) -> Any:
    try:
        import psycopg
    except ImportError:
        raise DatabaseError(
            f"{location}: reading PostgreSQL needs psycopg (pip install 'psycopg[binary]')"
        ) from None
    return psycopg


def _search_path_schema(options: str) -> str | None:
    """The first schema of a ``-c search_path=...`` in libpq ``options``, if any."""
    found = re.findall(r"-c\s*search_path\s*=\s*([^\s]+)", options)
    if not found:
        return None
    first = found[-1].split(",")[0].strip().strip('"')
    if not _SCHEMA_NAME.fullmatch(first):
        raise ValueError(f"unsupported schema name in the storage URL's search_path: {first!r}")
    return first
