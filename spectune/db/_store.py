"""A tuned-config database opened for reading or writing, and moving rows between them.

:func:`open_store` is the one way in. Writers (``readonly=False``) create the schema in a
new database and upgrade an older one; readers require the current schema and never
write. Reads go through :mod:`spectune.db._reader` (``sqlite3`` or ``psycopg``); only
writing (schema and rows) uses SQLAlchemy, imported when a store is opened for writing.
Every method raises :class:`spectune.db.DatabaseError` with a one-line message naming
the database, never a driver error.

When two rows share a key the promotion rule decides (:func:`resolve`), and the kept
row's history gains the other's provenance: recording, importing and merging never lose
who measured what. A row keeps the comparison with vLLM of its own config; where both
rows hold the same config, the fresher comparison is kept (see :func:`resolve`), and
:meth:`Store.set_vllm_comparison` re-measures a held row's alone.
"""

from __future__ import annotations

import errno
import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.db._backend import SQLiteBackend, backend_of
from spectune.db._checks import Spaces, check_configs
from spectune.db._fields import DEVICE_FIELDS, KEY_FIELDS, VLLM_FIELDS
from spectune.db._files import read_rows_file, refuse_directory
from spectune.db._locations import DatabaseURL, Source, default_sources, parse_target, write_target
from spectune.db._reader import BadRowHandler, reading
from spectune.db._row import Provenance, RowKey, TunedRow, VllmComparison, row_from_stored
from spectune.db.errors import DatabaseError, MalformedRowError
from spectune.identity import DeviceIdentity
from spectune.promotion import MIN_GAIN, is_significantly_faster
from spectune.space import Problem

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = [
    "RecordOutcome",
    "RecordReport",
    "Store",
    "Target",
    "effective_rows",
    "import_rows",
    "merge_databases",
    "open_store",
    "resolve",
    "seal_database",
    "upgrade_database",
    "write_database",
]

logger = logging.getLogger("spectune.db")

#: A database as callers name it: a URL or a file path (or a parsed URL).
Target = str | os.PathLike[str] | DatabaseURL
# Keys per lookup query: 13 parameters each stays far below SQLite's limit.
_KEYS_PER_QUERY = 100
# Concurrent PostgreSQL writers may insert the same new key; the loser retries.
_RETRIES = 5


class RecordOutcome(str, Enum):
    """What recording a row did."""

    INSERTED = "inserted"
    """No row had the key: the row was added."""
    REPLACED = "replaced"
    """The row was significantly faster than the incumbent and replaced it."""
    KEPT = "kept"
    """The incumbent stayed (the row was not significantly faster); its provenance was kept."""
    UNCHANGED = "unchanged"
    """The database already held this measurement: nothing changed."""


@dataclass(frozen=True)
class RecordReport:
    """What recording rows did, one count per :class:`RecordOutcome`."""

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


def resolve(
    incumbent: TunedRow, candidate: TunedRow, *, min_gain: float = MIN_GAIN,
    supersede: bool = False,
) -> tuple[RecordOutcome, TunedRow]:
    """Decide between two rows of the same key.

    The candidate wins only when :func:`spectune.promotion.is_significantly_faster`
    says so, or always with ``supersede`` (a re-measurement of the key on changed
    software or drivers: the incumbent's figures no longer describe this system). Either
    way the winner's ``history`` gains every provenance of both rows (their own and their
    histories) except its own, without duplicates, oldest first.

    The winner keeps its own comparison with vLLM (it is its config's), except where
    both rows hold the same config: then the comparison of the later measurement
    (``tuned_at``; the candidate's on a tie) is kept, a fresher measurement of the same
    config, unless it names no vLLM version (vLLM was absent, or the row predates the
    comparison) while the other does.

    Returns:
        The outcome and the row to store (``incumbent`` itself when unchanged).
    """
    if candidate.key != incumbent.key:
        raise ValueError("candidate and incumbent must have the same key")
    faster = supersede or is_significantly_faster(
        candidate.tuned, incumbent.tuned, min_gain=min_gain
    )
    winner = candidate if faster else incumbent
    seen: dict[object, Provenance] = {}
    for entry in (
        incumbent.provenance,
        *incumbent.history,
        candidate.provenance,
        *candidate.history,
    ):
        seen.setdefault(entry.identity, entry)
    own = winner.provenance.identity
    history = sorted(
        (p for identity, p in seen.items() if identity != own),
        key=lambda p: (p.tuned_at, p.host, p.study),
    )
    merged = winner.replace_history(history)
    if candidate.config == incumbent.config:
        merged = replace(merged, vllm=_fresher_comparison(incumbent, candidate))
    if merged == incumbent:
        return RecordOutcome.UNCHANGED, incumbent
    return (RecordOutcome.REPLACED if faster else RecordOutcome.KEPT), merged


def _fresher_comparison(incumbent: TunedRow, candidate: TunedRow) -> VllmComparison:
    """The comparison with vLLM to keep for two rows of the same config (see :func:`resolve`)."""
    later, earlier = (
        (incumbent, candidate) if incumbent.tuned_at > candidate.tuned_at
        else (candidate, incumbent)
    )  # fmt: skip
    if later.vllm.version is None and earlier.vllm.version is not None:
        return earlier.vllm
    return later.vllm


def open_store(target: Target | Source | None = None, *, readonly: bool = False) -> Store:
    """Open a tuned-config database.

    Args:
        target: A URL, a file path or a :class:`spectune.db._locations.Source` (the
            shipped database's source opens it immutable); ``None`` means where
            writers write (``SPECTUNE_DB`` or the user database).
        readonly: Open for reading only: the database must exist and have the current
            schema. Otherwise the schema is created or upgraded as needed.

    Raises:
        DatabaseError: with a one-line message (not a database, newer or older schema,
            missing tables, cannot connect, ...).
    """
    url, immutable = _resolve(target)
    if readonly:
        with reading(url, immutable=immutable) as reader:
            reader.require_current()
        return Store(url, immutable=immutable)
    from spectune.db._writer import make_engine, translate_errors, upgrade

    location = url.display()
    engine = make_engine(url)
    try:
        with translate_errors(location):
            upgrade(engine, location=location, backend=backend_of(url))
    except BaseException:
        engine.dispose()
        raise
    return Store(url, engine=engine)


def upgrade_database(target: Target | None = None) -> tuple[str | None, str]:
    """Create or upgrade the schema of a database to the current revision.

    Returns:
        The revision before (``None`` for a new database) and after.
    """
    from spectune.db._writer import make_engine, translate_errors, upgrade

    url, _ = _resolve(target)
    engine = make_engine(url)
    try:
        with translate_errors(url.display()):
            return upgrade(engine, location=url.display(), backend=backend_of(url))
    finally:
        engine.dispose()


def _resolve(target: Target | Source | None) -> tuple[DatabaseURL, bool]:
    if target is None:
        return write_target(), False
    if isinstance(target, Source):
        return target.url, target.immutable
    if isinstance(target, DatabaseURL):
        return target, False
    return parse_target(target), False


class Store:
    """An open tuned-config database; use :func:`open_store` to get one.

    Usable as a context manager; :meth:`close` releases its connections.

    Args:
        url: The database.
        engine: The writer's engine; ``None`` for a read-only store.
        immutable: A read-only SQLite file that never changes (the shipped database).
    """

    def __init__(
        self, url: DatabaseURL, *, engine: Engine | None = None, immutable: bool = False
    ) -> None:
        self.url = url
        self.location = url.display()
        self.readonly = engine is None
        self._engine = engine
        self._immutable = immutable

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()

    def count(self) -> int:
        """Number of rows."""
        with reading(self.url, immutable=self._immutable) as reader:
            return reader.count()

    def rows(
        self,
        *,
        kernel: str | None = None,
        device_name: str | None = None,
        on_bad_row: BadRowHandler | None = None,
    ) -> list[TunedRow]:
        """Every row, optionally of one kernel family and one device name, in key order.

        Args:
            kernel: Only rows of this kernel family.
            device_name: Only rows of this device name.
            on_bad_row: Called with each malformed row (a
                :class:`spectune.db.errors.MalformedRowError`), which is then left out;
                ``None`` raises on the first one.

        Raises:
            MalformedRowError: a stored row is malformed (edited by hand), naming the
                database, the row (id and key) and the field.
        """
        equal = {"kernel": kernel, "device_name": device_name}
        with reading(self.url, immutable=self._immutable) as reader:
            return reader.rows(
                on_bad_row=on_bad_row, **{k: v for k, v in equal.items() if v is not None}
            )

    def record(
        self, row: TunedRow, *, min_gain: float = MIN_GAIN, spaces: Spaces | None = None,
        supersede: bool = False,
    ) -> RecordOutcome:
        """Store one row; on a key already present the promotion rule decides.

        Args:
            row: The row.
            min_gain: Promotion threshold (see :func:`spectune.promotion.is_significantly_faster`).
            spaces: Search spaces to check the config against (see
                :func:`spectune.db._checks.check_configs`); ``None`` checks only its shape.
            supersede: Replace the row of the key whatever the rule says (see
                :func:`resolve`); its provenance joins the new row's history.

        Returns:
            What happened (see :class:`RecordOutcome`).
        """
        report = self.record_many([row], min_gain=min_gain, spaces=spaces, supersede=supersede)
        for outcome in RecordOutcome:
            if getattr(report, outcome.value):
                return outcome
        raise AssertionError("record_many reported nothing")

    def record_many(
        self,
        rows: Iterable[TunedRow],
        *,
        min_gain: float = MIN_GAIN,
        spaces: Spaces | None = None,
        supersede: bool = False,
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
            supersede: Each row replaces the one of its key (see :func:`resolve`).

        Raises:
            InvalidRowError: a config outside its space (nothing is written).
        """
        rows = list(rows)
        for index, row in enumerate(rows):
            if not isinstance(row, TunedRow):
                raise TypeError(f"rows[{index}] must be a TunedRow, got {type(row).__name__}")
        check_configs(rows, spaces=spaces, where=self.location)
        if self._engine is None:
            raise DatabaseError(f"{self.location} is open read-only")
        from sqlalchemy.exc import IntegrityError
        from sqlalchemy.orm import Session

        from spectune.db._writer import translate_errors

        with translate_errors(self.location):
            for attempt in range(_RETRIES):
                try:
                    with Session(self._engine) as session, session.begin():
                        return self._record_in(session, rows, min_gain, supersede)
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
        other_devices: bool = False,
    ) -> list[TunedRow]:
        """Rows of the same kernel and device nearest to ``problem``, for warm starts.

        Candidates share the kernel, the device identity, the dtype and whether draft
        probabilities are present (and ``triton`` / ``kernel_hash`` when given).
        Distance is ``|log2 k/k'| + |log2 batch/batch'| + |log2 vocab/vocab'|``; ties go
        to the larger speedup. One row per distinct config. A malformed stored row
        (edited by hand) is left out and logged (logger ``spectune.db``).

        With ``other_devices``, the rows of every *other* device instead (a study on a
        new GPU starts from what other GPU models found): nearest problem first, then
        the same backend and architecture first, then the larger speedup.

        Args:
            kernel: Kernel family name.
            device: Device identity.
            problem: The problem about to be tuned (any batch, not only buckets).
            triton: Only rows measured with this Triton version.
            kernel_hash: Only rows of this kernel source.
            limit: Most rows returned.
            other_devices: Rows of the other devices instead of this one's.
        """
        if not isinstance(problem, Problem):
            raise TypeError(f"problem must be a Problem, got {type(problem).__name__}")
        if not isinstance(device, DeviceIdentity):
            raise TypeError(f"device must be a DeviceIdentity, got {type(device).__name__}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        own = {f.name: getattr(device, f.attribute) for f in DEVICE_FIELDS}
        equal: dict[str, object] = {
            "kernel": kernel,
            **({} if other_devices else own),
            "dtype": problem.dtype,
            "draft_probs": problem.draft_probs,
        }
        if triton is not None:
            equal["triton_version"] = triton
        if kernel_hash is not None:
            equal["kernel_hash"] = kernel_hash
        with reading(self.url, immutable=self._immutable) as reader:
            # Warm starts are hints: a malformed neighbour is left out, not the tuning.
            candidates = reader.rows(on_bad_row=_log_bad_row, **equal)
        if other_devices:
            candidates = [r for r in candidates if r.device != device]

        def distance(row: TunedRow) -> tuple[float, int, float]:
            p = row.problem
            d = (
                abs(math.log2(p.spec_len / problem.spec_len))
                + abs(math.log2(p.batch / problem.batch))
                + abs(math.log2(p.vocab / problem.vocab))
            )
            kin = (row.device.backend, row.device.arch) != (device.backend, device.arch)
            return (d, int(kin), -row.speedup)

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

    def remove(self, key: RowKey) -> bool:
        """Delete the row of ``key`` (a config that no longer beats the default);
        whether there was one. Its provenance is the caller's to keep (the nightly
        history records it)."""
        if self._engine is None:
            raise DatabaseError(f"{self.location} is open read-only")
        from sqlalchemy import delete
        from sqlalchemy.orm import Session

        from spectune.db._models import TunedConfigRecord
        from spectune.db._writer import stored_rows_query, translate_errors

        table = TunedConfigRecord.__table__
        with translate_errors(self.location), Session(self._engine) as session, \
                session.begin():
            ids = [row_id for row_id, *_ in session.execute(stored_rows_query([key]))]
            if ids:
                session.execute(delete(table).where(table.c.id.in_(ids)))
        return bool(ids)

    def set_vllm_comparison(self, key: RowKey, comparison: VllmComparison) -> bool:
        """Replace the comparison with vLLM of the row of ``key`` (a re-measurement of
        its config against vLLM's function), leaving the rest of the row as it is.

        Args:
            key: The row's key (:attr:`spectune.db.TunedRow.key`).
            comparison: The new comparison.

        Returns:
            Whether a row of ``key`` exists (and was updated).
        """
        if not isinstance(comparison, VllmComparison):
            raise TypeError(
                f"comparison must be a VllmComparison, got {type(comparison).__name__}"
            )
        key = tuple(key)
        if len(key) != len(KEY_FIELDS):
            raise ValueError(f"key must hold {len(KEY_FIELDS)} values ({', '.join(KEY_FIELDS)})")
        if self._engine is None:
            raise DatabaseError(f"{self.location} is open read-only")
        from sqlalchemy import update
        from sqlalchemy.orm import Session

        from spectune.db._models import TunedConfigRecord
        from spectune.db._writer import stored_rows_query, translate_errors

        table = TunedConfigRecord.__table__
        values = {f.name: getattr(comparison, f.attribute) for f in VLLM_FIELDS}
        with translate_errors(self.location), Session(self._engine) as session, \
                session.begin():
            ids = [row_id for row_id, *_ in session.execute(stored_rows_query([key]))]
            if ids:
                session.execute(update(table).where(table.c.id.in_(ids)).values(**values))
        return bool(ids)

    def _record_in(
        self, session: Session, rows: Sequence[TunedRow], min_gain: float,
        supersede: bool = False,
    ) -> RecordReport:
        from sqlalchemy import update

        from spectune.db._models import TunedConfigRecord
        from spectune.db._writer import record_values, stored_rows_query

        keys = list(dict.fromkeys(row.key for row in rows))
        # Row id and row of each key already stored; a malformed one raises, naming it:
        # the promotion rule cannot weigh a row against one it cannot read.
        stored: dict[RowKey, tuple[Any, TunedRow]] = {}
        for start in range(0, len(keys), _KEYS_PER_QUERY):
            query = stored_rows_query(keys[start : start + _KEYS_PER_QUERY])
            for row_id, *values in session.execute(query):
                row = row_from_stored(values, location=self.location, row_id=row_id)
                stored[row.key] = (row_id, row)
        current: dict[RowKey, TunedRow] = {key: row for key, (_, row) in stored.items()}
        counts = dict.fromkeys(RecordOutcome, 0)
        for row in rows:
            incumbent = current.get(row.key)
            if incumbent is None:
                current[row.key] = row
                counts[RecordOutcome.INSERTED] += 1
                continue
            outcome, current[row.key] = resolve(incumbent, row, min_gain=min_gain,
                                                supersede=supersede)
            counts[outcome] += 1
        table = TunedConfigRecord.__table__
        for key, row in current.items():
            if key not in stored:
                session.add(TunedConfigRecord(**record_values(row)))
            elif row != stored[key][1]:
                row_id = stored[key][0]
                session.execute(
                    update(table).where(table.c.id == row_id).values(**record_values(row))
                )
        return RecordReport(**{outcome.value: n for outcome, n in counts.items()})


def _log_bad_row(error: MalformedRowError) -> None:
    logger.warning("spectune: skipped %s", error)


def import_rows(
    path: str | os.PathLike[str],
    *,
    into: Target | None = None,
    fmt: str | None = None,
    spaces: Spaces | None = None,
    min_gain: float = MIN_GAIN,
) -> RecordReport:
    """Import a JSON or CSV file of rows, all or nothing, by the promotion rule.

    Args:
        path: The file (see :func:`spectune.db.read_rows_file`).
        into: The database; ``None`` means where writers write.
        fmt: ``json`` or ``csv``; ``None`` picks by suffix.
        spaces: Search spaces to check configs against (see
            :func:`spectune.db._checks.check_configs`).
        min_gain: Promotion threshold on a key already present.
    """
    rows = read_rows_file(path, fmt=fmt)
    check_configs(rows, spaces=spaces, where=str(Path(path)))  # before creating ``into``
    with open_store(into) as store:
        return store.record_many(rows, min_gain=min_gain)


def merge_databases(
    sources: Sequence[Target],
    *,
    into: Target,
    spaces: Spaces | None = None,
    min_gain: float = MIN_GAIN,
) -> RecordReport:
    """Merge databases into ``into`` in one transaction.

    On a key present in several, the faster config is kept when the difference is
    significant by :func:`spectune.promotion.is_significantly_faster` (else the
    incumbent stays), and the kept row's history holds every provenance.

    Args:
        sources: Databases to read (URLs or paths), in order.
        into: The destination, created if needed.
        spaces: Search spaces to check configs against (see
            :func:`spectune.db._checks.check_configs`).
        min_gain: Promotion threshold.
    """
    if isinstance(sources, (str, bytes)) or not sources:
        raise ValueError("sources must be a non-empty sequence of databases")
    rows: list[TunedRow] = []
    for source in sources:
        with open_store(source, readonly=True) as store:
            found = store.rows()
            check_configs(found, spaces=spaces, where=store.location)
        rows.extend(found)
    with open_store(into) as store:
        return store.record_many(rows, min_gain=min_gain)


def write_database(rows: Sequence[TunedRow], path: str | os.PathLike[str]) -> Path:
    """Write ``rows`` to a new SQLite database at ``path``, in rollback-journal mode.

    Writers use WAL, whose readers need a ``-shm`` index beside the file that read-only
    storage cannot hold; a file to hand around is one self-contained rollback-journal
    file instead (like the shipped database). It is built beside ``path`` under another
    name and renamed into place, so ``path`` is either absent or complete. An existing
    file is refused: overwriting a database would lose its rows (merge adds rows to one).

    Returns:
        ``path``.

    Raises:
        IsADirectoryError: ``path`` is a directory.
        FileExistsError: ``path`` exists.
        DatabaseError: the database cannot be written (its folder is missing, ...).
    """
    target = Path(path)
    refuse_directory(target, fmt="sqlite")
    if target.exists():
        raise FileExistsError(
            errno.EEXIST,
            "exists; export writes a new database (spectune db merge adds rows to one)",
            str(target),
        )
    tmp = target.with_name(target.name + ".tmp")
    leftovers = [tmp, *(Path(f"{tmp}{suffix}") for suffix in ("-wal", "-shm", "-journal"))]
    try:
        for stale in leftovers:
            stale.unlink(missing_ok=True)
        with open_store(tmp) as store:
            store.record_many(rows)
        seal_database(tmp)
        os.replace(tmp, target)
    finally:
        for stale in leftovers:
            stale.unlink(missing_ok=True)
    return target


def seal_database(path: Path) -> None:
    """Make a closed SQLite database one self-contained file: rollback-journal mode (no
    ``-wal``/``-shm`` beside it, readable from read-only storage) and vacuumed."""
    SQLiteBackend.seal(path)


def effective_rows(
    sources: Sequence[Source] | None = None, *, on_bad_row: BadRowHandler | None = None
) -> list[tuple[Source, TunedRow]]:
    """The rows readers see, with the source each comes from; an earlier source wins.

    Absent SQLite files are skipped; any other problem raises.

    Args:
        sources: The databases, first wins; ``None`` means :func:`default_sources`.
        on_bad_row: Called with each malformed row, which is then left out (and so
            hides no row of a later source); ``None`` raises on the first one.

    Raises:
        DatabaseError: naming the database that cannot be read.
    """
    if sources is None:
        sources = default_sources()
    seen: dict[RowKey, tuple[Source, TunedRow]] = {}
    for source in sources:
        if source.url.absent:
            continue
        with reading(source.url, immutable=source.immutable) as reader:
            reader.require_current()
            for row in reader.rows(on_bad_row=on_bad_row):
                seen.setdefault(row.key, (source, row))
    return list(seen.values())
