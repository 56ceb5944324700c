"""The never-raising reader the vLLM plugin uses: one load, then O(1) lookups.

:func:`load_index` reads every source once (``SPECTUNE_DB``, the user database, the
shipped one; first wins per key), keeps only rows usable on the running system (see
:mod:`spectune.db._checks`) and returns a :class:`ConfigIndex`: per kernel family, a
dict keyed by problem (batch bucketed) for the running device and Triton version. A
source that is absent, corrupt, of another schema or unreachable is logged and
skipped; nothing here raises.

A row edited into nonsense is skipped alone, and counted: the loader checks what it
uses of a row (its key fields, booleans strictly, the batch bucket and the config) as
:class:`spectune.db.TunedRow` would, once per distinct value. It reads no other field
(it must load 10,000 rows within 50 ms: ``benchmarks/bench_db_load.py``), so a row
malformed only elsewhere (a bad timestamp) is still used; ``spectune db validate``
names every malformed row.

Sources are read by :mod:`spectune.db._reader` (``sqlite3`` or ``psycopg``): loading
never imports SQLAlchemy.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from spectune.db._checks import Checker, Spaces, running_identity
from spectune.db._fields import PROBLEM_FIELDS, Field
from spectune.db._locations import ENV_DB, Source, readable_sources
from spectune.db._reader import reading
from spectune.db._row import batch_bucket, is_batch_bucket
from spectune.db.errors import DatabaseError
from spectune.messages import one_line

if TYPE_CHECKING:
    from spectune.identity import DeviceIdentity, SoftwareIdentity
    from spectune.space import Problem

__all__ = ["ConfigIndex", "SourceReport", "load_index"]

logger = logging.getLogger("spectune.db")
_NONE: dict[Any, Any] = {}  # what a lookup finds where nothing is (never written to)

#: The problem's fields a lookup matches exactly; the batch is matched at its bucket.
_EXACT = tuple(f for f in PROBLEM_FIELDS if f.name != "batch")
_EXACT_VALUES = attrgetter(*(f.attribute for f in _EXACT))
#: The columns an entry is read with, in order: the exact fields, then the batch.
KEY_COLUMNS = (*(f.name for f in _EXACT), "batch")

#: Kernel family -> the exact problem fields' values -> batch bucket -> config (nested,
#: so a lookup builds no key tuple but the one the attribute getter returns).
Entries = dict[str, dict[tuple[Any, ...], dict[int, dict[str, int]]]]


@dataclass(frozen=True)
class SourceReport:
    """What loading one source found.

    Attributes:
        name: ``SPECTUNE_DB``, ``user``, ``shipped`` or a caller's label.
        location: File path or URL (without password).
        status: ``read``, ``absent`` or ``error``.
        rows: Rows it holds.
        usable: Rows usable on the running system.
        used: Usable rows not overridden by an earlier source.
        error: The one-line reason when ``status`` is ``error``.
        malformed: Rows measured here that were skipped as malformed (edited into
            values no row may hold).
    """

    name: str
    location: str
    status: str
    rows: int = 0
    usable: int = 0
    used: int = 0
    error: str = ""
    malformed: int = 0

    def describe(self) -> str:
        if self.status == "absent":
            return f"{self.name} {self.location} (absent)"
        if self.status == "error":
            return f"{self.name} {self.location} (skipped: {self.error})"
        skipped = f", {self.malformed} malformed skipped" if self.malformed else ""
        return (
            f"{self.name} {self.location} ({self.rows} rows, {self.usable} usable here, "
            f"{self.used} used{skipped})"
        )


class ConfigIndex:
    """Tuned configs usable on the running system, in memory.

    :meth:`lookup` is two dict lookups; it returns ``None`` when no usable row matches,
    in which case callers use the kernel's deterministic default config.

    Args:
        running: The running system's device identity and Triton version (see
            :func:`spectune.db._checks.running_identity`) the entries were loaded for.
        entries: Kernel family -> the values of the problem's exact fields (all but the
            batch, in field order) -> batch bucket -> config.
        sources: What loading each source found.
    """

    def __init__(
        self,
        *,
        running: tuple[Any, ...] = (),
        entries: Entries | None = None,
        sources: Sequence[SourceReport] = (),
    ) -> None:
        self._running = running
        # The last (device, software) pair found to be the running one: the serving
        # path asks with the same objects every time (they are frozen).
        self._checked: tuple[object, object] = (None, None)
        self._entries: Entries = entries or {}
        self.sources = tuple(sources)

    def __len__(self) -> int:
        return sum(len(b) for table in self._entries.values() for b in table.values())

    def lookup(
        self,
        *,
        device: DeviceIdentity,
        software: SoftwareIdentity,
        kernel: str,
        problem: Problem,
    ) -> dict[str, int] | None:
        """The tuned config for ``problem`` (batch looked up at its bucket), or ``None``.

        Never raises: arguments of the wrong kind simply find nothing.
        """
        try:
            checked = self._checked
            if device is not checked[0] or software is not checked[1]:
                if running_identity(device, software) != self._running:
                    return None
                self._checked = (device, software)
            buckets = self._entries.get(kernel, _NONE).get(_EXACT_VALUES(problem), _NONE)
            config = buckets.get(batch_bucket(problem.batch)) if buckets else None
        except Exception:  # never raise into the serving path
            logger.debug("spectune tuned-config lookup failed", exc_info=True)
            return None
        return None if config is None else dict(config)

    def describe(self) -> str:
        """One line for a log: how many configs, from which databases."""
        parts = "; ".join(s.describe() for s in self.sources) or "no databases"
        return f"spectune: {len(self)} tuned configs usable here, from {parts}"


def load_index(
    *,
    device: DeviceIdentity,
    software: SoftwareIdentity,
    kernel_hashes: Mapping[str, str],
    spaces: Spaces | None = None,
    sources: Sequence[Source] | None = None,
) -> ConfigIndex:
    """Load the tuned configs usable on the running system. Never raises.

    Args:
        device: The running device (``spectune.identity.detect_device()``).
        software: The running software (``spectune.identity.detect_software()``).
        kernel_hashes: Kernel family name -> source hash of the installed kernels;
            rows of other hashes or families are not used.
        spaces: Search spaces of the running backend, kernel name -> space (or a
            ``(kernel, backend) -> space`` callable); rows whose config is outside are
            not used. ``None`` checks only the shape of configs.
        sources: Databases to read, first wins per key; ``None`` means
            :func:`spectune.db.default_sources`.

    Returns:
        The index; empty (with the reason logged and in ``sources``) when nothing could
        be read.
    """
    try:
        checker = Checker(
            device=device, software=software, kernel_hashes=kernel_hashes, spaces=spaces
        )
        reports: list[SourceReport] = []
        if sources is None:
            sources, error = readable_sources()
            if error is not None:  # a bad SPECTUNE_DB: skip it, read the others
                message = one_line(error)
                logger.warning("spectune: skipping %s: %s", ENV_DB, message)
                reports.append(
                    SourceReport(name=ENV_DB, location="(invalid)", status="error", error=message)
                )
        entries: Entries = {}
        reports += [_load(source, checker, entries) for source in sources]
    except Exception as exc:  # bad arguments: log, the caller uses defaults
        logger.warning("spectune: tuned configs not loaded: %s", one_line(exc))
        return ConfigIndex()
    index = ConfigIndex(running=checker.running, entries=entries, sources=reports)
    logger.info("%s", index.describe())
    return index


def _load(source: Source, checker: Checker, entries: Entries) -> SourceReport:
    """Add a source's usable rows to ``entries`` (earlier sources win); never raises."""
    name, location = source.name, source.location
    try:
        if source.url.absent:
            return SourceReport(name=name, location=location, status="absent")
        with reading(source.url, immutable=source.immutable) as reader:
            reader.require_current()
            total = reader.count()
            groups = reader.candidates(
                columns=KEY_COLUMNS, running=checker.running, kernel_hashes=checker.kernel_hashes
            )
    except Exception as exc:  # a reader the serving path uses never raises
        message = one_line(exc)
        logger.warning("spectune: skipping tuned-config database %s: %s", location, message)
        if not isinstance(exc, DatabaseError):
            logger.debug("details", exc_info=True)
        return SourceReport(name=name, location=location, status="error", error=message)
    usable = used = malformed = 0
    # Rows share few problems and fewer buckets: each is checked once, and a problem
    # already in the table was checked when it went in, so a usable row costs no check.
    # The stored values stay the keys: SQLite's 1 and 0 equal (and hash as) True and
    # False, which lookups use; a driver returns an integer column as int, never bool.
    valid_exact = _ExactCheck()
    valid_buckets: set[int] = set()
    stored_config = checker.stored_config
    for kernel, rows in groups:
        if not rows:
            continue
        # Rows come filtered on the running system and kernel hash: only configs are
        # left to check, once per distinct stored config (rows share few configs).
        verdicts = {config: stored_config(kernel, config) for config in {r[-1] for r in rows}}
        table = entries.setdefault(kernel, {})
        find = table.get
        for row in rows:  # (*exact fields, batch, config)
            config, bad_config = verdicts[row[-1]]
            exact, bucket = row[:-2], row[-2]
            buckets = find(exact)
            if bad_config or (buckets is None and not valid_exact(exact)):
                malformed += 1
                continue
            if bucket not in valid_buckets:
                if not is_batch_bucket(bucket):
                    malformed += 1
                    continue
                valid_buckets.add(bucket)
            if config is None:
                continue
            usable += 1
            if buckets is None:
                table[exact] = {bucket: config}
                used += 1
            elif bucket not in buckets:  # an earlier source's entry wins
                buckets[bucket] = config
                used += 1
    if malformed:
        logger.warning(
            "spectune: skipped %d malformed rows of %s (spectune db validate --db %s names "
            "them)", malformed, location, location,
        )  # fmt: skip
    return SourceReport(
        name=name,
        location=location,
        status="read",
        rows=total,
        usable=usable,
        used=used,
        malformed=malformed,
    )


class _ExactCheck:
    """Whether the exact problem fields of a stored row hold values a row may hold.

    ``draft_probs`` must be a boolean, or 0 or 1 as SQLite stores one: not ``'false'``,
    ``'maybe'`` or 2. Each distinct tuple, and each field's distinct value, is checked
    once.
    """

    def __init__(self) -> None:
        self._tuples: dict[tuple[Any, ...], bool] = {}
        self._values: list[dict[Any, bool]] = [{} for _ in _EXACT]

    def __call__(self, stored: tuple[Any, ...]) -> bool:
        valid = self._tuples.get(stored)
        if valid is None:
            valid = self._tuples[stored] = all(
                self._value(field, memo, value)
                for field, memo, value in zip(_EXACT, self._values, stored, strict=True)
            )
        return valid

    @staticmethod
    def _value(field: Field, memo: dict[Any, bool], value: Any) -> bool:
        valid = memo.get(value)
        if valid is None:
            try:
                field.check(field.from_stored(value))
                valid = True
            except (TypeError, ValueError):
                valid = False
            memo[value] = valid
        return valid
