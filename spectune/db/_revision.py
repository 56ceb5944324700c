"""What a reader requires of a database's schema, without SQLAlchemy.

The revision lives in Alembic's ``alembic_version`` table; readers accept only
:data:`HEAD_REVISION` with the table and columns of :data:`TABLE_COLUMNS`. Both the
SQLAlchemy reader (:mod:`spectune.db._schema`) and the serving path's ``sqlite3``
reader (:mod:`spectune.db._sqlite`) judge a database with :func:`require_current`, so
they refuse the same databases with the same messages. A test checks that
:data:`TABLE_COLUMNS` names exactly the columns of the ORM model.
"""

from __future__ import annotations

from dataclasses import dataclass

from spectune.db._errors import (
    NotADatabaseError,
    SchemaError,
    SchemaTooNewError,
    SchemaTooOldError,
)
from spectune.db._row import FIELDS

__all__ = [
    "HEAD_REVISION",
    "REVISIONS",
    "TABLE_COLUMNS",
    "TABLE_NAME",
    "VERSION_TABLE",
    "SchemaState",
    "refuse_foreign",
    "require_current",
]

#: Every schema revision, oldest first; a database at another one is from a newer spectune.
REVISIONS = ("0001", "0002")
#: The revision this spectune reads and writes.
HEAD_REVISION = REVISIONS[-1]
#: The table of tuned configs.
TABLE_NAME = "tuned_configs"
#: Alembic's table recording the schema revision.
VERSION_TABLE = "alembic_version"
#: The columns of :data:`TABLE_NAME` at :data:`HEAD_REVISION` (those of the ORM model).
TABLE_COLUMNS = ("id", *FIELDS)


@dataclass(frozen=True)
class SchemaState:
    """What a database holds.

    Attributes:
        revision: The recorded schema revision; ``None`` when there is none.
        tables: Names of its tables.
        columns: Names of the columns of ``tuned_configs`` (empty when it is absent).
    """

    revision: str | None
    tables: frozenset[str]
    columns: frozenset[str]


def several_revisions(found: list[object]) -> SchemaError:
    """The error for an ``alembic_version`` table holding more than one row."""
    return SchemaError(f"several schema revisions recorded: {sorted(map(ascii, found))}")


def require_current(state: SchemaState, *, location: str) -> None:
    """Raise unless ``state`` is a spectune database at :data:`HEAD_REVISION`.

    Raises:
        NotADatabaseError: no spectune tables (empty, or another application's).
        SchemaTooNewError: written by a newer spectune.
        SchemaTooOldError: an older revision (``spectune db upgrade`` migrates it).
        SchemaError: the revision is right but tables or columns are missing.
    """
    refuse_foreign(state, location=location)
    if state.revision is None:
        raise NotADatabaseError(f"{location} has no spectune tables")
    if state.revision != HEAD_REVISION:
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
