"""The errors ``spectune.db`` raises: one base class, each with a message fit for a user.

Only :class:`DatabaseError` is re-exported by :mod:`spectune.db`; catch it to handle any
of them.
"""

from __future__ import annotations

__all__ = [
    "DatabaseError",
    "InvalidRowError",
    "NotADatabaseError",
    "SchemaError",
    "SchemaTooNewError",
    "SchemaTooOldError",
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
