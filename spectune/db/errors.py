"""The errors ``spectune.db`` raises: one base class, each with a message fit for a user.

Only :class:`DatabaseError` is re-exported by :mod:`spectune.db`; catch it to handle any
of them.
"""

from __future__ import annotations

__all__ = [
    "DatabaseError",
    "InvalidRowError",
    "MalformedRowError",
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


class MalformedRowError(InvalidRowError):
    """A row stored in a database is malformed (edited by hand, or written by another tool).

    Its message is one line naming the database, the row (its id, then its key as
    stored) and the field: ``DB: row id 7: tuned_at is not a time: 'x' (row key: ...)``.

    Attributes:
        location: The database.
        row_id: The row's ``id`` column.
        field: The field that is wrong (its name, or names joined by ``, ``).
        problem: What is wrong, starting with the field's name.
        key: The row's key fields as stored, in one line.
    """

    def __init__(
        self, *, location: str, row_id: object, field: str, problem: str, key: str
    ) -> None:
        if not problem.startswith(field):
            problem = f"{field}: {problem}"
        super().__init__(f"{location}: row id {row_id}: {problem} (row key: {key})")
        self.location = location
        self.row_id = row_id
        self.field = field
        self.problem = problem
        self.key = key
