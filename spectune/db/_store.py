"""A tuned-config database opened for reading or writing: rows in, rows out.

:func:`open_store` is the one way in. Writers (``readonly=False``) create the schema in a
new database and upgrade an older one; readers require the current schema and never
write. Every method raises :class:`spectune.db.DatabaseError` with a one-line message
naming the database, never a driver error.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.engine import URL, Engine, Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from spectune.db._checks import Spaces, check_configs
from spectune.db._conflict import Outcome, resolve
from spectune.db._engine import READS_ONLY, make_engine, translate_errors
from spectune.db._errors import DatabaseError, InvalidRowError
from spectune.db._locations import Source, display_url, parse_target, write_target
from spectune.db._models import TunedConfigRecord
from spectune.db._row import FIELDS, KEY_FIELDS, RowKey, TunedRow
from spectune.db._schema import inspect_schema, require_current, upgrade
from spectune.identity import DeviceIdentity
from spectune.promotion import MIN_GAIN
from spectune.space import Problem

__all__ = ["RecordReport", "Store", "open_store", "upgrade_database"]

_KEY_COLUMNS = tuple(getattr(TunedConfigRecord, name) for name in KEY_FIELDS)
# Keys per lookup query: 13 parameters each stays far below SQLite's limit.
_KEYS_PER_QUERY = 100
# Concurrent PostgreSQL writers may insert the same new key; the loser retries.
_RETRIES = 5


@dataclass(frozen=True)
class RecordReport:
    """What recording rows did, one count per :class:`Outcome`."""

    inserted: int = 0
    replaced: int = 0
    kept: int = 0
    unchanged: int = 0

    @property
    def total(self) -> int:
        return self.inserted + self.replaced + self.kept + self.unchanged

    def describe(self) -> str:
        return (
            f"{self.total} rows: {self.inserted} inserted, {self.replaced} replaced an "
            f"incumbent, {self.kept} kept the incumbent, {self.unchanged} already present"
        )


def open_store(
    target: str | os.PathLike[str] | URL | Source | None = None, *, readonly: bool = False
) -> Store:
    """Open a tuned-config database.

    Args:
        target: A URL, a file path or a :class:`Source` (the shipped database's source
            opens it immutable); ``None`` means where writers write (``SPECTUNE_DB`` or
            the user database).
        readonly: Open for reading only: the database must exist and have the current
            schema. Otherwise the schema is created or upgraded as needed.

    Raises:
        DatabaseError: with a one-line message (not a database, newer or older schema,
            missing tables, cannot connect, ...).
    """
    url, immutable = _resolve(target)
    location = display_url(url)
    engine = make_engine(url, readonly=readonly, immutable=immutable and readonly)
    try:
        with translate_errors(location):
            if readonly:
                with engine.connect() as connection:
                    require_current(inspect_schema(connection), location=location)
            else:
                upgrade(engine, location=location)
    except BaseException:
        engine.dispose()
        raise
    return Store(engine, url=url, readonly=readonly)


def upgrade_database(target: str | os.PathLike[str] | URL | None = None) -> tuple[str | None, str]:
    """Create or upgrade the schema of a database to the current revision.

    Returns:
        The revision before (``None`` for a new database) and after.
    """
    url, _ = _resolve(target)
    location = display_url(url)
    engine = make_engine(url, readonly=False)
    try:
        with translate_errors(location):
            return upgrade(engine, location=location)
    finally:
        engine.dispose()


def _resolve(target: str | os.PathLike[str] | URL | Source | None) -> tuple[URL, bool]:
    if target is None:
        return write_target(), False
    if isinstance(target, Source):
        return target.url, target.immutable
    if isinstance(target, URL):
        return target, False
    return parse_target(target), False


class Store:
    """An open tuned-config database; use :func:`open_store` to get one.

    Usable as a context manager; :meth:`close` releases its connections.
    """

    def __init__(self, engine: Engine, *, url: URL, readonly: bool) -> None:
        self._engine = engine
        self._reader = engine.execution_options(**{READS_ONLY: True})
        self.url = url
        self.readonly = readonly
        self.location = display_url(url)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._engine.dispose()

    def _fetch(self, *queries: Select[Any]) -> list[list[Row[Any]]]:
        """Rows of Core ``queries``, read in one transaction (the loader's fast path)."""
        with translate_errors(self.location), self._reader.connect() as connection:
            return [connection.execute(query).all() for query in queries]

    def count(self) -> int:
        """Number of rows."""
        with translate_errors(self.location), Session(self._reader) as session:
            return int(session.scalar(select(func.count()).select_from(TunedConfigRecord)) or 0)

    def rows(self, *, kernel: str | None = None, device_name: str | None = None) -> list[TunedRow]:
        """Every row, optionally of one kernel family and one device name, in key order.

        Raises:
            InvalidRowError: a stored row is malformed (edited by hand), naming its id.
        """
        query = select(TunedConfigRecord).order_by(*_KEY_COLUMNS)
        if kernel is not None:
            query = query.where(TunedConfigRecord.kernel == kernel)
        if device_name is not None:
            query = query.where(TunedConfigRecord.device_name == device_name)
        with translate_errors(self.location), Session(self._reader) as session:
            return [self._to_row(record) for record in session.scalars(query)]

    def record(
        self, row: TunedRow, *, min_gain: float = MIN_GAIN, spaces: Spaces | None = None
    ) -> Outcome:
        """Store one row; on a key already present the promotion rule decides.

        Args:
            row: The row.
            min_gain: Promotion threshold (see :func:`spectune.promotion.is_significantly_faster`).
            spaces: Search spaces to check the config against (see
                :func:`spectune.db.check_configs`); ``None`` checks only its shape.

        Returns:
            What happened (see :class:`Outcome`).
        """
        report = self.record_many([row], min_gain=min_gain, spaces=spaces)
        for outcome in Outcome:
            if getattr(report, outcome.value):
                return outcome
        raise AssertionError("record_many reported nothing")

    def record_many(
        self,
        rows: Iterable[TunedRow],
        *,
        min_gain: float = MIN_GAIN,
        spaces: Spaces | None = None,
    ) -> RecordReport:
        """Store rows in one transaction: all of them or, on error, none.

        A row whose key is already present (in the database or earlier in ``rows``)
        replaces the incumbent only when
        :func:`spectune.promotion.is_significantly_faster`; either way the stored row's
        history keeps both provenances.

        Args:
            rows: The rows.
            min_gain: Promotion threshold.
            spaces: Search spaces to check configs against; ``None`` checks only shape.

        Raises:
            InvalidRowError: a config outside its space (nothing is written).
        """
        rows = list(rows)
        for index, row in enumerate(rows):
            if not isinstance(row, TunedRow):
                raise TypeError(f"rows[{index}] must be a TunedRow, got {type(row).__name__}")
        check_configs(rows, spaces=spaces, where=self.location)
        if self.readonly:
            raise DatabaseError(f"{self.location} is open read-only")
        with translate_errors(self.location):
            for attempt in range(_RETRIES):
                try:
                    with Session(self._engine) as session, session.begin():
                        return self._record_in(session, rows, min_gain)
                except IntegrityError:
                    if attempt == _RETRIES - 1:
                        raise
        raise AssertionError("unreachable")

    def best_configs_near(
        self,
        *,
        kernel: str,
        device: DeviceIdentity,
        problem: Problem,
        triton: str | None = None,
        kernel_hash: str | None = None,
        limit: int = 5,
    ) -> list[TunedRow]:
        """Rows of the same kernel and device nearest to ``problem``, for warm starts.

        Candidates share the kernel, the device identity, the dtype and whether draft
        probabilities are present (and ``triton`` / ``kernel_hash`` when given).
        Distance is ``|log2 k/k'| + |log2 batch/batch'| + |log2 vocab/vocab'|``; ties go
        to the larger speedup. One row per distinct config.

        Args:
            kernel: Kernel family name.
            device: Device identity.
            problem: The problem about to be tuned (any batch, not only buckets).
            triton: Only rows measured with this Triton version.
            kernel_hash: Only rows of this kernel source.
            limit: Most rows returned.
        """
        if not isinstance(problem, Problem):
            raise TypeError(f"problem must be a Problem, got {type(problem).__name__}")
        if not isinstance(device, DeviceIdentity):
            raise TypeError(f"device must be a DeviceIdentity, got {type(device).__name__}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        t = TunedConfigRecord
        query = select(t).where(
            t.kernel == kernel,
            t.backend == device.backend,
            t.arch == device.arch,
            t.device_name == device.device_name,
            t.cu_count == device.cu_count,
            t.warp_size == device.warp_size,
            t.dtype == problem.dtype,
            t.draft_probs == problem.draft_probs,
        )
        if triton is not None:
            query = query.where(t.triton_version == triton)
        if kernel_hash is not None:
            query = query.where(t.kernel_hash == kernel_hash)
        with translate_errors(self.location), Session(self._reader) as session:
            candidates = [self._to_row(record) for record in session.scalars(query)]

        def distance(row: TunedRow) -> tuple[float, float]:
            p = row.problem
            d = (
                abs(math.log2(p.spec_len / problem.spec_len))
                + abs(math.log2(p.batch / problem.batch))
                + abs(math.log2(p.vocab / problem.vocab))
            )
            return (d, -row.speedup)

        out: list[TunedRow] = []
        seen: set[tuple[tuple[str, int], ...]] = set()
        for row in sorted(candidates, key=distance):
            config_key = tuple(sorted(row.config.items()))
            if config_key not in seen:
                seen.add(config_key)
                out.append(row)
                if len(out) == limit:
                    break
        return out

    # -- internals ---------------------------------------------------------------

    def _record_in(
        self, session: Session, rows: Sequence[TunedRow], min_gain: float
    ) -> RecordReport:
        keys = list(dict.fromkeys(row.key for row in rows))
        stored: dict[RowKey, tuple[TunedConfigRecord, TunedRow]] = {}
        for start in range(0, len(keys), _KEYS_PER_QUERY):
            chunk = keys[start : start + _KEYS_PER_QUERY]
            # FOR UPDATE: a concurrent PostgreSQL writer of the same keys waits for this
            # transaction instead of overwriting its history (SQLite ignores it; its
            # writers are serialized by BEGIN IMMEDIATE).
            # OR of equalities, not a row-value IN: SQLite searches the unique index
            # for each key instead of scanning it.
            matches = (
                and_(*(column == value for column, value in zip(_KEY_COLUMNS, key, strict=True)))
                for key in chunk
            )
            query = select(TunedConfigRecord).where(or_(*matches)).with_for_update()
            for record in session.scalars(query):
                row = self._to_row(record)
                stored[row.key] = (record, row)
        current: dict[RowKey, TunedRow] = {key: row for key, (_, row) in stored.items()}
        counts = dict.fromkeys(Outcome, 0)
        for row in rows:
            incumbent = current.get(row.key)
            if incumbent is None:
                current[row.key] = row
                counts[Outcome.INSERTED] += 1
                continue
            outcome, current[row.key] = resolve(incumbent, row, min_gain=min_gain)
            counts[outcome] += 1
        for key, row in current.items():
            if key not in stored:
                session.add(TunedConfigRecord(**_values(row)))
            elif row != stored[key][1]:
                record = stored[key][0]
                for name, value in _values(row).items():
                    setattr(record, name, value)
        return RecordReport(**{outcome.value: n for outcome, n in counts.items()})

    def _to_row(self, record: TunedConfigRecord) -> TunedRow:
        data: dict[str, Any] = {name: getattr(record, name) for name in FIELDS}
        data["tuned_at"] = record.tuned_at.isoformat() if record.tuned_at else None
        data["history"] = record.history or []
        try:
            return TunedRow.from_dict(data)
        except InvalidRowError as exc:
            raise InvalidRowError(f"{self.location}: row id {record.id}: {exc}") from None


def _values(row: TunedRow) -> dict[str, Any]:
    values = row.to_dict()
    values["tuned_at"] = row.tuned_at
    return values
