"""The errors ``spectune.db`` raises: one base class, each with a message fit for a user."""

from __future__ import annotations

__all__ = [
    "DatabaseError",
    "InvalidRowError",
    "NotADatabaseError",
    "SchemaError",
    "SchemaTooNewError",
    "SchemaTooOldError",
    "one_line",
]


class DatabaseError(Exception):
    """Base of every error of the tuned-config database; the message names the database."""


class NotADatabaseError(DatabaseError):
    """The file is absent, not SQLite, corrupt, or a database of another application."""


class SchemaError(DatabaseError):
    """The database's schema is not one this spectune can use (missing tables or columns)."""


class SchemaTooNewError(SchemaError):
    """The database was written by a newer spectune (unknown schema revision)."""


class SchemaTooOldError(SchemaError):
    """The database has an older schema; ``spectune db upgrade`` migrates it."""


class InvalidRowError(DatabaseError, ValueError):
    """A row (from a file, a database or a caller) is malformed or its config is invalid."""


def one_line(error: BaseException | str, *, limit: int = 300) -> str:
    """The first line of an error's message, printable and at most ``limit`` characters."""
    lines = str(error).strip().splitlines()
    if lines:
        line = lines[0]
    else:
        line = type(error).__name__ if isinstance(error, BaseException) else "unknown error"
    line = "".join(c if c.isprintable() else "?" for c in line)
    return line if len(line) <= limit else line[: limit - 3] + "..."
