"""Where databases are: the environment override, the user database, the shipped one.

Readers look in this order, and an earlier source's row wins over a later one's with
the same key:

1. ``SPECTUNE_DB``: a database URL (``sqlite:///…``, ``postgresql+psycopg://…``) or a
   file path; also where writers write when it is set;
2. the user database, ``platformdirs.user_data_dir("spectune")/spectune.db`` (embedded
   SQLite); ``SPECTUNE_USER_DB`` (a path) moves it, which tests use;
3. the database shipped inside the package, opened read-only.

A target (URL or path) is parsed once, here, into a :class:`DatabaseURL`, with the
standard library only: the readers connect with its :meth:`DatabaseURL.connect_params`
(``sqlite3`` or ``psycopg``), the writers with its :meth:`DatabaseURL.sqlalchemy_url`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import parse_qsl, quote, quote_plus, unquote

from spectune.db.errors import DatabaseError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

__all__ = [
    "ENV_DB",
    "ENV_USER_DB",
    "DatabaseURL",
    "Source",
    "default_sources",
    "parse_target",
    "readable_sources",
    "shipped_db_path",
    "user_db_path",
    "write_target",
]

#: Environment variable naming the database to read first and to write to.
ENV_DB = "SPECTUNE_DB"
#: Environment variable moving the user database (a file path).
ENV_USER_DB = "SPECTUNE_USER_DB"

_SUPPORTED = ("sqlite", "postgresql")
_POSTGRES_DRIVER = "postgresql+psycopg"
# DRIVER://[USER[:PASSWORD]@][HOST|[IPV6]][:PORT][/DATABASE][?QUERY], as SQLAlchemy reads
# URLs: user, password and database are percent-decoded, the host is not.
_URL = re.compile(
    r"(?P<driver>[\w+]+)://"
    r"(?:(?P<username>[^:/]*)(?::(?P<password>[^@]*))?@)?"
    r"(?:\[(?P<ipv6>[^/?]+)\]|(?P<host>[^/:?]+))?"
    r"(?::(?P<port>[^/?]*))?"
    r"(?:/(?P<database>[^?]*))?"
    r"(?:\?(?P<query>.*))?",
    re.DOTALL,
)


class DatabaseURL(NamedTuple):
    """A parsed database target: a SQLite file or a PostgreSQL database.

    A named tuple (cheap to define at import, immutable); its ``repr`` hides the
    password.

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
        return cls(driver="sqlite", database=str(Path(path).expanduser().absolute()))

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.driver.split("+")[0]

    @property
    def is_sqlite(self) -> bool:
        return self.backend == "sqlite"

    @property
    def absent(self) -> bool:
        """A SQLite file that does not exist (readers skip it, writers create it)."""
        return self.is_sqlite and not Path(self.database or "").exists()

    def display(self) -> str:
        """The target for messages: the file for SQLite, the URL without password else."""
        if self.is_sqlite and self.database:
            return self.database
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


class Source(NamedTuple):
    """One database readers look in.

    Attributes:
        name: ``SPECTUNE_DB``, ``user`` or ``shipped`` (or a caller's label).
        url: Where it is.
        immutable: Whether the file never changes (the shipped database): SQLite then
            opens it without locking or journal files.
    """

    name: str
    url: DatabaseURL
    immutable: bool = False

    @property
    def location(self) -> str:
        return self.url.display()


def user_db_path() -> Path:
    """Path of the user database (it may not exist yet)."""
    override = os.environ.get(ENV_USER_DB)
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("spectune")) / "spectune.db"


def shipped_db_path() -> Path:
    """Path of the read-only database shipped inside the package."""
    return Path(__file__).resolve().parent.parent / "data" / "tuned.db"


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
    if url.backend not in _SUPPORTED:
        raise DatabaseError(
            f"unsupported database {url.backend!r} in {url.display()}: use a file path, "
            "sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
        )
    if url.backend == "postgresql" and url.driver != _POSTGRES_DRIVER:
        raise DatabaseError(
            f"use the psycopg driver for PostgreSQL ({_POSTGRES_DRIVER}://...), got {url.driver!r}"
        )
    if url.is_sqlite and url.database in (None, "", ":memory:"):
        raise DatabaseError("an in-memory SQLite database cannot hold tuned configs")
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


def write_target() -> DatabaseURL:
    """Where writers write: ``SPECTUNE_DB`` when set, else the user database."""
    env = os.environ.get(ENV_DB)
    return parse_target(env) if env else DatabaseURL.sqlite_file(user_db_path())


def readable_sources() -> tuple[list[Source], DatabaseError | None]:
    """The databases readers look in, first wins (see the module docstring).

    Returns:
        The sources, and the error that made a set ``SPECTUNE_DB`` unusable (it is
        then left out, the others kept), or ``None``.
    """
    found = [
        Source(name="user", url=DatabaseURL.sqlite_file(user_db_path())),
        Source(name="shipped", url=DatabaseURL.sqlite_file(shipped_db_path()), immutable=True),
    ]
    env = os.environ.get(ENV_DB)
    if env:
        try:
            found.insert(0, Source(name=ENV_DB, url=parse_target(env)))
        except DatabaseError as exc:
            return found, exc
    return found, None


def default_sources() -> list[Source]:
    """The databases readers look in, first wins (see the module docstring).

    Raises:
        DatabaseError: when ``SPECTUNE_DB`` is set but not a usable URL or path.
    """
    found, error = readable_sources()
    if error is not None:
        raise error
    return found
