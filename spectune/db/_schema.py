"""Schema revisions: what a database holds, whether readers can use it, and upgrades.

The revision lives in Alembic's ``alembic_version`` table. Readers only check it
(they never import Alembic, never write): a database must be at
:data:`HEAD_REVISION`. Writers upgrade older databases, and create the schema in an
empty one, inside one locked transaction, so concurrent writers and a process killed
mid-way leave either the old schema or the new one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import column, inspect, select, table, text
from sqlalchemy.engine import Connection, Engine

from spectune.db._errors import (
    NotADatabaseError,
    SchemaError,
    SchemaTooNewError,
    SchemaTooOldError,
)
from spectune.db._models import TABLE_NAME, TunedConfigRecord

__all__ = [
    "HEAD_REVISION",
    "REVISIONS",
    "SchemaState",
    "inspect_schema",
    "migrations_dir",
    "require_current",
    "upgrade",
]

#: Every schema revision, oldest first; a database at another one is from a newer spectune.
REVISIONS = ("0001", "0002")
#: The revision this spectune reads and writes.
HEAD_REVISION = REVISIONS[-1]

_VERSION_TABLE = "alembic_version"
_PG_LOCK_KEY = 0x5BEC7E  # pg_advisory_xact_lock key serializing spectune migrations


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


def inspect_schema(connection: Connection) -> SchemaState:
    """Read the revision, tables and columns of the database behind ``connection``."""
    inspector = inspect(connection)
    tables = frozenset(inspector.get_table_names())
    revision = None
    if _VERSION_TABLE in tables:
        found = connection.execute(
            select(column("version_num")).select_from(table(_VERSION_TABLE))
        ).scalars().all()
        if len(found) > 1:
            raise SchemaError(f"several schema revisions recorded: {sorted(map(ascii, found))}")
        revision = found[0] if found else None
    columns = frozenset()
    if TABLE_NAME in tables:
        columns = frozenset(c["name"] for c in inspector.get_columns(TABLE_NAME))
    return SchemaState(revision=revision, tables=tables, columns=columns)


def require_current(state: SchemaState, *, location: str) -> None:
    """Raise unless ``state`` is a spectune database at :data:`HEAD_REVISION`.

    Raises:
        NotADatabaseError: no spectune tables (empty, or another application's).
        SchemaTooNewError: written by a newer spectune.
        SchemaTooOldError: an older revision (``spectune db upgrade`` migrates it).
        SchemaError: the revision is right but tables or columns are missing.
    """
    _refuse_foreign(state, location=location)
    if state.revision is None:
        raise NotADatabaseError(f"{location} has no spectune tables")
    if state.revision != HEAD_REVISION:
        raise SchemaTooOldError(
            f"{location} has schema revision {state.revision}, older than this spectune's "
            f"{HEAD_REVISION}; run: spectune db upgrade --db {location}"
        )
    if TABLE_NAME not in state.tables:
        raise SchemaError(f"{location} is missing table {TABLE_NAME!r}")
    missing = sorted(set(TunedConfigRecord.__table__.columns.keys()) - state.columns)
    if missing:
        raise SchemaError(f"{location}: table {TABLE_NAME!r} lacks column(s) {missing}")


def _refuse_foreign(state: SchemaState, *, location: str) -> None:
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


def migrations_dir() -> Path:
    """The Alembic script directory inside the package."""
    return Path(__file__).resolve().parent / "migrations"


def upgrade(engine: Engine, *, location: str) -> tuple[str | None, str]:
    """Bring the database to :data:`HEAD_REVISION` (creating the schema when empty).

    Returns:
        The revision before (``None`` for a new database) and after.

    Raises:
        NotADatabaseError: it holds another application's tables.
        SchemaTooNewError: it was written by a newer spectune.
        SchemaError: it is at the head revision but tables or columns are missing.
    """
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
        state = inspect_schema(connection)
        _refuse_foreign(state, location=location)
        before = state.revision
        if before != HEAD_REVISION:
            from alembic import command
            from alembic.config import Config

            config = Config()
            config.set_main_option("script_location", str(migrations_dir()))
            config.attributes["connection"] = connection
            command.upgrade(config, HEAD_REVISION)
            state = inspect_schema(connection)
        require_current(state, location=location)
    return before, HEAD_REVISION
