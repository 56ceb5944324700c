"""The SQLAlchemy 2 typed ORM model of the ``tuned_configs`` table.

One column per entry of :data:`spectune.db._row.FIELDS` (``speedup`` is stored so it
can be sorted on; ``history`` holds provenances as JSON). The schema is created and
evolved by the Alembic migrations in ``spectune/db/migrations``; a test checks that the
migrations produce exactly this model.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, DateTime, Float, String, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from spectune.db._names import NAME_MAX, TEXT_MAX
from spectune.db._revision import TABLE_NAME
from spectune.db._row import KEY_FIELDS

__all__ = ["TABLE_NAME", "Base", "TunedConfigRecord", "UTCDateTime"]


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


class TunedConfigRecord(Base):
    """One row of ``tuned_configs``; see :class:`spectune.db.TunedRow` for the fields."""

    __tablename__ = TABLE_NAME
    __table_args__ = (UniqueConstraint(*KEY_FIELDS, name="uq_tuned_configs_key"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    kernel: Mapped[str] = mapped_column(String(NAME_MAX))
    kernel_hash: Mapped[str] = mapped_column(String(NAME_MAX))
    backend: Mapped[str] = mapped_column(String(32))
    arch: Mapped[str] = mapped_column(String(NAME_MAX))
    device_name: Mapped[str] = mapped_column(String(NAME_MAX))
    cu_count: Mapped[int]
    warp_size: Mapped[int]
    triton_version: Mapped[str] = mapped_column(String(NAME_MAX))
    spec_len: Mapped[int]
    batch: Mapped[int]
    vocab: Mapped[int]
    dtype: Mapped[str] = mapped_column(String(16))
    draft_probs: Mapped[bool]
    torch_version: Mapped[str] = mapped_column(String(NAME_MAX))
    runtime_version: Mapped[str] = mapped_column(String(NAME_MAX))
    spectune_version: Mapped[str] = mapped_column(String(NAME_MAX))
    config: Mapped[dict[str, int]] = mapped_column(JSON)
    tuned_p20_us: Mapped[float] = mapped_column(Float)
    tuned_p50_us: Mapped[float] = mapped_column(Float)
    tuned_p80_us: Mapped[float] = mapped_column(Float)
    default_p20_us: Mapped[float] = mapped_column(Float)
    default_p50_us: Mapped[float] = mapped_column(Float)
    default_p80_us: Mapped[float] = mapped_column(Float)
    speedup: Mapped[float] = mapped_column(Float)
    trials: Mapped[int]
    tuning_seconds: Mapped[float] = mapped_column(Float)
    tuned_at: Mapped[datetime] = mapped_column(UTCDateTime)
    host: Mapped[str] = mapped_column(String(TEXT_MAX))
    study: Mapped[str] = mapped_column(String(TEXT_MAX))
    # Added by revision 0002; NULL in rows written before it means no history.
    history: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
