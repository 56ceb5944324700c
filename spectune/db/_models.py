"""The SQLAlchemy ORM model of the ``tuned_configs`` table, built from the field list.

One column per field of :data:`spectune.db._fields.ROW_FIELDS` (``speedup`` is stored
so it can be sorted on; ``history`` holds provenances as JSON), typed by the field's
kind (with the field's ``missing`` value as server default where it has one), and a
unique constraint on the key fields. The schema is created and evolved by
the Alembic migrations in ``spectune/db/migrations``; a test checks that the migrations
produce exactly this model. Only the writers use it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, Index, Integer, String, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, mapped_column
from sqlalchemy.types import TypeDecorator, TypeEngine

from spectune.db._fields import KEY_FIELDS, ROW_FIELDS, TABLE_NAME, Field

__all__ = ["Base", "NightlyResultRecord", "NightlyRunRecord", "TunedConfigRecord", "UTCDateTime"]


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
        # A column a later revision added with a default (``vs_vllm``) fills the rows
        # already there.
        namespace[field.name] = mapped_column(
            _column_type(field), nullable=field.nullable, server_default=field.missing
        )
    return type("TunedConfigRecord", (Base,), namespace)


#: The mapped class of ``tuned_configs``: one attribute per field, and ``id``.
TunedConfigRecord: Any = _model()


def _name(size: int = 128, *, nullable: bool = False) -> Any:
    return mapped_column(String(size), nullable=nullable)


class NightlyRunRecord(Base):
    """One night of ``spectune nightly`` on one device (schema revision 0003)."""

    __tablename__ = "nightly_runs"

    id = mapped_column(Integer, primary_key=True, autoincrement=True)
    job = _name()
    host = _name(256)
    backend = _name(32)
    arch = _name()
    device_name = _name()
    cu_count = mapped_column(Integer, nullable=False)
    warp_size = mapped_column(Integer, nullable=False)
    triton_version = _name()
    torch_version = _name()
    runtime_version = _name()
    driver_version = _name()
    spectune_version = _name()
    budget_seconds = mapped_column(Float, nullable=False)
    started_at = mapped_column(UTCDateTime, nullable=False)
    finished_at = mapped_column(UTCDateTime, nullable=True)
    # running | complete | budget (stopped by its budget) | interrupted | failed
    status = _name(32)
    summary = mapped_column(JSON, nullable=True)


class NightlyResultRecord(Base):
    """What one night did for one shape: tuned, re-tuned or re-checked, and the verdict."""

    __tablename__ = "nightly_results"
    __table_args__ = (Index("ix_nightly_results_run_id", "run_id"),)

    id = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id = mapped_column(Integer, nullable=False)
    kernel = _name()
    kernel_hash = _name()
    spec_len = mapped_column(Integer, nullable=False)
    batch = mapped_column(Integer, nullable=False)
    vocab = mapped_column(Integer, nullable=False)
    dtype = _name(16)
    draft_probs = mapped_column(Boolean, nullable=False)
    action = _name(16)  # tune | retune | recheck
    reason = _name(1024)
    verdict = _name(32)
    config = mapped_column(JSON, nullable=True)
    tuned_p20_us = mapped_column(Float, nullable=True)
    tuned_p50_us = mapped_column(Float, nullable=True)
    tuned_p80_us = mapped_column(Float, nullable=True)
    default_p20_us = mapped_column(Float, nullable=True)
    default_p50_us = mapped_column(Float, nullable=True)
    default_p80_us = mapped_column(Float, nullable=True)
    recorded_p50_us = mapped_column(Float, nullable=True)
    evaluations = mapped_column(Integer, nullable=True)
    evaluations_to_best = mapped_column(Integer, nullable=True)
    seconds = mapped_column(Float, nullable=False)
    message = _name(1024)
    finished_at = mapped_column(UTCDateTime, nullable=False)
    # Revision 0004: the comparison with vLLM's own function the night measured or found
    # recorded (NULL in results of earlier nights, and where there was none).
    vs_vllm = _name(16, nullable=True)
    vllm_p50_us = mapped_column(Float, nullable=True)
    vllm_version = _name(nullable=True)
    served_p50_us = mapped_column(Float, nullable=True)
