"""The SQLAlchemy ORM model of the ``tuned_configs`` table, built from the field list.

One column per field of :data:`spectune.db._fields.ROW_FIELDS` (``speedup`` is stored
so it can be sorted on; ``history`` holds provenances as JSON), typed by the field's
kind, and a unique constraint on the key fields. The schema is created and evolved by
the Alembic migrations in ``spectune/db/migrations``; a test checks that the migrations
produce exactly this model. Only the writers use it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, Integer, String, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, mapped_column
from sqlalchemy.types import TypeDecorator, TypeEngine

from spectune.db._fields import KEY_FIELDS, ROW_FIELDS, TABLE_NAME, Field

__all__ = ["Base", "TunedConfigRecord", "UTCDateTime"]


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware datetime stored as naive UTC (same on SQLite and PostgreSQL)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc)


class Base(DeclarativeBase):
    """Declarative base of spectune's tables."""


def _column_type(field: Field) -> TypeEngine[Any]:
    if field.kind in ("name", "text"):
        return String(field.size)
    return {
        "int": Integer(),
        "float": Float(),
        "bool": Boolean(),
        "json": JSON(),
        "time": UTCDateTime(),
    }[field.kind]


def _model() -> type[Base]:
    namespace: dict[str, Any] = {
        "__doc__": "One row of ``tuned_configs``; see :class:`spectune.db.TunedRow`.",
        "__module__": __name__,
        "__tablename__": TABLE_NAME,
        "__table_args__": (UniqueConstraint(*KEY_FIELDS, name="uq_tuned_configs_key"),),
        "id": mapped_column(Integer, primary_key=True, autoincrement=True),
    }
    for field in ROW_FIELDS:
        namespace[field.name] = mapped_column(_column_type(field), nullable=field.nullable)
    return type("TunedConfigRecord", (Base,), namespace)


#: The mapped class of ``tuned_configs``: one attribute per field, and ``id``.
TunedConfigRecord: Any = _model()
