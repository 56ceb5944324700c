"""Where databases are: the environment override, the user database, the shipped one.

Readers look in this order, and an earlier source's row wins over a later one's with
the same key:

1. ``SPECTUNE_DB``: a database URL (``sqlite:///…``, ``postgresql+psycopg://…``) or a
   file path; also where writers write when it is set;
2. the user database, ``platformdirs.user_data_dir("spectune")/spectune.db`` (embedded
   SQLite); ``SPECTUNE_USER_DB`` (a path) moves it, which tests use;
3. the database shipped inside the package, opened read-only.

A target (URL or path) is parsed once into a :class:`DatabaseURL`, with the standard
library only, and everything that depends on its storage is its backend's
(:mod:`spectune.db._backend`: :func:`~spectune.db._backend.backend_of`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from spectune.db._backend import DatabaseURL, parse_target
from spectune.db.errors import DatabaseError

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
