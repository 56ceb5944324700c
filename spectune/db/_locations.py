"""Where databases are: the environment override, the user database, the shipped one.

Readers look in this order, and an earlier source's row wins over a later one's with
the same key:

1. ``SPECTUNE_DB``: a database URL (``sqlite:///…``, ``postgresql+psycopg://…``) or a
   file path; also where writers write when it is set;
2. the user database, ``platformdirs.user_data_dir("spectune")/spectune.db`` (embedded
   SQLite); ``SPECTUNE_USER_DB`` (a path) moves it, which tests use;
3. the database shipped inside the package, opened read-only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

from spectune.db._errors import DatabaseError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

# SQLAlchemy is imported only where a URL object is made or parsed: the serving path
# reads SQLite files without it (see sqlite_file_target).

__all__ = [
    "ENV_DB",
    "ENV_USER_DB",
    "Source",
    "default_sources",
    "display_url",
    "fallback_sources",
    "parse_target",
    "shipped_db_path",
    "sqlite_file_target",
    "sqlite_path",
    "user_db_path",
    "write_target",
]

#: Environment variable naming the database to read first and to write to.
ENV_DB = "SPECTUNE_DB"
#: Environment variable moving the user database (a file path).
ENV_USER_DB = "SPECTUNE_USER_DB"

_SUPPORTED = ("sqlite", "postgresql")


@dataclass(frozen=True)
class Source:
    """One database readers look in.

    Attributes:
        name: ``SPECTUNE_DB``, ``user`` or ``shipped`` (or a caller's label).
        url: Where it is.
        immutable: Whether the file never changes (the shipped database): SQLite then
            opens it without locking or journal files.
    """

    name: str
    url: URL
    immutable: bool = False

    @property
    def location(self) -> str:
        return display_url(self.url)


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


def parse_target(target: str | os.PathLike[str]) -> URL:
    """Turn a database URL or a file path into a URL.

    Args:
        target: ``sqlite:///path``, ``postgresql+psycopg://user@host/db``, or a path
            (relative paths are taken from the current directory).

    Raises:
        DatabaseError: for an empty target, an unparsable URL or a database other than
            SQLite or PostgreSQL.
    """
    if isinstance(target, os.PathLike):
        return _sqlite_url(Path(target))
    if not isinstance(target, str) or not target.strip():
        raise DatabaseError(f"database must be a URL or a path, got {target!r}")
    if "://" not in target:
        return _sqlite_url(Path(target))
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(target)
    except (ArgumentError, ValueError):
        raise DatabaseError(f"cannot parse database URL {_redact(target)}") from None
    backend = url.get_backend_name()
    if backend not in _SUPPORTED:
        raise DatabaseError(
            f"unsupported database {backend!r} in {display_url(url)}: use a file path, "
            "sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
        )
    if backend == "postgresql" and url.drivername != "postgresql+psycopg":
        raise DatabaseError(
            f"use the psycopg driver for PostgreSQL (postgresql+psycopg://...), "
            f"got {url.drivername!r}"
        )
    if backend == "sqlite" and url.database in (None, "", ":memory:"):
        raise DatabaseError("an in-memory SQLite database cannot hold tuned configs")
    return url


def display_url(url: URL) -> str:
    """The URL for messages: the file path for SQLite, the URL without password else."""
    if url.get_backend_name() == "sqlite" and url.database:
        return url.database
    return url.render_as_string(hide_password=True)


def write_target() -> URL:
    """Where writers write: ``SPECTUNE_DB`` when set, else the user database."""
    env = os.environ.get(ENV_DB)
    return parse_target(env) if env else _sqlite_url(user_db_path())


def default_sources() -> list[Source]:
    """The databases readers look in, first wins (see the module docstring).

    Raises:
        DatabaseError: when ``SPECTUNE_DB`` is set but not a usable URL or path.
    """
    env = os.environ.get(ENV_DB)
    first = [Source(name=ENV_DB, url=parse_target(env))] if env else []
    return [*first, *fallback_sources()]


def fallback_sources() -> list[Source]:
    """The user and the shipped database: what readers look in after ``SPECTUNE_DB``."""
    return [
        Source(name="user", url=_sqlite_url(user_db_path())),
        Source(name="shipped", url=_sqlite_url(shipped_db_path()), immutable=True),
    ]


def sqlite_path(path: Path) -> str:
    """The database of the SQLite URL :func:`parse_target` makes for a file path."""
    return str(path.expanduser().absolute())


# sqlite:///DATABASE as SQLAlchemy's make_url reads it when DATABASE has no query.
_PLAIN_SQLITE_URL = re.compile(r"sqlite(?:\+pysqlite)?:///(?P<database>[^?]*)", re.DOTALL)


def sqlite_file_target(target: str) -> str | None:
    """The SQLite file ``target`` names, found without SQLAlchemy, or ``None``.

    Gives the database :func:`parse_target` would give (``url.database``, which is also
    how the database is displayed) for a file path or a plain ``sqlite:///`` URL (the
    default driver, no query). ``None`` for anything else, including targets
    :func:`parse_target` refuses: callers then use :func:`parse_target`.
    """
    if not isinstance(target, str) or not target.strip():
        return None
    if "://" not in target:
        return sqlite_path(Path(target))
    match = _PLAIN_SQLITE_URL.fullmatch(target)
    if match is None:
        return None
    database = unquote(match["database"])
    return None if database in ("", ":memory:") else database


def _sqlite_url(path: Path) -> URL:
    from sqlalchemy.engine import URL

    return URL.create("sqlite", database=sqlite_path(path))


def _redact(text: str) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return display_url(make_url(text))
    except (ArgumentError, ValueError):
        return "(unparsable)"
