"""The never-raising reader the vLLM plugin uses: one load, then O(1) lookups.

:func:`load_index` reads every source once (``SPECTUNE_DB``, the user database, the
shipped one; first wins per key), keeps only rows usable on the running system (see
:mod:`spectune.db._checks`) and returns a :class:`ConfigIndex`: a dict keyed by kernel
and problem (batch bucketed) for the running device and Triton version. A source
that is absent, corrupt, of another schema or unreachable is logged and skipped;
nothing here raises.

SQLite files (the user and shipped databases, a ``SPECTUNE_DB`` path or ``sqlite:///``
URL) are read with the standard library's ``sqlite3`` (:mod:`spectune.db._sqlite`):
importing this module and loading from SQLite never imports SQLAlchemy, which only a
PostgreSQL source (or a ``SPECTUNE_DB`` URL that needs parsing) brings in.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.db._buckets import batch_bucket
from spectune.db._checks import Checker, Spaces
from spectune.db._errors import DatabaseError, one_line
from spectune.db._locations import (
    ENV_DB,
    Source,
    shipped_db_path,
    sqlite_file_target,
    sqlite_path,
    user_db_path,
)
from spectune.db._sqlite import read_usable_candidates

if TYPE_CHECKING:
    from spectune.identity import DeviceIdentity, SoftwareIdentity
    from spectune.space import Problem

__all__ = ["ConfigIndex", "SourceReport", "load_index"]

logger = logging.getLogger("spectune.db")


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
    """

    name: str
    location: str
    status: str
    rows: int = 0
    usable: int = 0
    used: int = 0
    error: str = ""

    def describe(self) -> str:
        if self.status == "absent":
            return f"{self.name} {self.location} (absent)"
        if self.status == "error":
            return f"{self.name} {self.location} (skipped: {self.error})"
        return (
            f"{self.name} {self.location} ({self.rows} rows, {self.usable} usable here, "
            f"{self.used} used)"
        )


class ConfigIndex:
    """Tuned configs usable on the running system, in memory.

    :meth:`lookup` is a dict lookup; it returns ``None`` when no usable row matches, in
    which case callers use the kernel's deterministic default config.

    Args:
        running: The running device's identity fields and Triton version the entries
            were loaded for.
        entries: ``(kernel, spec_len, batch bucket, vocab, dtype, draft_probs)`` ->
            config.
        sources: What loading each source found.
    """

    def __init__(
        self,
        *,
        running: tuple[Any, ...] = (),
        entries: Mapping[tuple[Any, ...], dict[str, int]] | None = None,
        sources: Sequence[SourceReport] = (),
    ) -> None:
        self._running = running
        self._entries = dict(entries or {})
        self.sources = tuple(sources)

    def __len__(self) -> int:
        return len(self._entries)

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
            running = (
                device.backend,
                device.arch,
                device.device_name,
                device.cu_count,
                device.warp_size,
                software.triton,
            )
            if running != self._running:
                return None
            config = self._entries.get(
                (
                    kernel,
                    problem.spec_len,
                    batch_bucket(problem.batch),
                    problem.vocab,
                    problem.dtype,
                    problem.draft_probs,
                )
            )
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
    except Exception as exc:  # bad arguments: log, the caller uses defaults
        logger.warning("spectune: tuned configs not loaded: %s", one_line(exc))
        return ConfigIndex()
    reports: list[SourceReport] = []
    places: Sequence[Source | _SqliteFile]
    if sources is None:
        try:
            places = _default_places()
        except Exception as exc:  # a bad SPECTUNE_DB: skip it, read the others
            message = one_line(exc)
            logger.warning("spectune: skipping %s: %s", ENV_DB, message)
            reports.append(
                SourceReport(name=ENV_DB, location="(invalid)", status="error", error=message)
            )
            places = _fallback_places()
    else:
        places = sources
    entries: dict[tuple[Any, ...], dict[str, int]] = {}
    reports += [_load_place(place, checker, entries) for place in places]
    running = (*checker.running_device, checker.software.triton)
    index = ConfigIndex(running=running, entries=entries, sources=reports)
    logger.info("%s", index.describe())
    return index


@dataclass(frozen=True)
class _SqliteFile:
    """A SQLite database file, read with ``sqlite3`` (no SQLAlchemy URL needed).

    Attributes:
        name: As :attr:`Source.name`.
        path: The file (``url.database`` of the equivalent :class:`Source`); also its
            location in reports, as :func:`spectune.db.display_url` gives it.
        immutable: As :attr:`Source.immutable`.
    """

    name: str
    path: str
    immutable: bool = False

    @property
    def location(self) -> str:
        return self.path


def _default_places() -> list[Source | _SqliteFile]:
    """:func:`spectune.db.default_sources`, with SQLite files found without SQLAlchemy.

    Raises:
        DatabaseError: when ``SPECTUNE_DB`` is set but not a usable URL or path.
    """
    env = os.environ.get(ENV_DB)
    first: list[Source | _SqliteFile] = []
    if env:
        path = sqlite_file_target(env)
        if path is not None:
            first = [_SqliteFile(name=ENV_DB, path=path)]
        else:  # PostgreSQL, a URL with a query, or an invalid target: SQLAlchemy parses
            from spectune.db._locations import parse_target

            first = [Source(name=ENV_DB, url=parse_target(env))]
    return [*first, *_fallback_places()]


def _fallback_places() -> list[Source | _SqliteFile]:
    """:func:`spectune.db.fallback_sources` as SQLite files."""
    return [
        _SqliteFile(name="user", path=sqlite_path(user_db_path())),
        _SqliteFile(name="shipped", path=sqlite_path(shipped_db_path()), immutable=True),
    ]


def _load_place(
    place: Source | _SqliteFile,
    checker: Checker,
    entries: dict[tuple[Any, ...], dict[str, int]],
) -> SourceReport:
    location = place.location
    try:
        if isinstance(place, Source):
            url = place.url
            # Read-only SQLite engines open the file with the default driver whatever
            # the URL's driver and query: sqlite3 reads it the same way.
            if url.get_backend_name() != "sqlite" or not url.database:
                return _load_with_sqlalchemy(place, checker, entries)
            place = _SqliteFile(name=place.name, path=url.database, immutable=place.immutable)
        path = Path(place.path)
        if not path.exists():
            return SourceReport(name=place.name, location=location, status="absent")
        total, groups = read_usable_candidates(
            path,
            location=location,
            immutable=place.immutable,
            device=checker.running_device,
            triton=checker.software.triton,
            kernel_hashes=checker.kernel_hashes,
        )
        return _index_rows(place.name, location, total, groups, checker, entries)
    except Exception as exc:  # a reader the serving path uses never raises
        return _skipped(place.name, location, exc)


def _load_with_sqlalchemy(
    source: Source, checker: Checker, entries: dict[tuple[Any, ...], dict[str, int]]
) -> SourceReport:
    """Read a source through SQLAlchemy (PostgreSQL). Raises on any failure."""
    from sqlalchemy import Integer, Text, cast, func, select, tuple_, type_coerce

    from spectune.db._models import TunedConfigRecord as t
    from spectune.db._store import open_store

    location = source.location
    if source.url.get_backend_name() == "sqlite" and not Path(source.url.database or "").exists():
        return SourceReport(name=source.name, location=location, status="absent")
    # Only rows of the running device, Triton version and kernel sources can be usable:
    # let the database filter them, then check configs here.
    device_columns = (t.backend, t.arch, t.device_name, t.cu_count, t.warp_size)
    running = zip(device_columns, checker.running_device, strict=True)
    query = select(
        t.kernel,
        t.spec_len,
        t.batch,
        t.vocab,
        t.dtype,
        # As stored (0/1 on SQLite): skips a per-row conversion; 1 == True as a dict key.
        type_coerce(t.draft_probs, Integer),
        cast(t.config, Text),
    ).where(
        *(column == value for column, value in running),
        t.triton_version == checker.software.triton,
        tuple_(t.kernel, t.kernel_hash).in_(list(checker.kernel_hashes.items())),
    )
    with open_store(source, readonly=True) as store:
        counted, result = store._fetch(select(func.count()).select_from(t), query)
    groups: dict[str, list[Sequence[Any]]] = {}
    for kernel, *rest in result:
        groups.setdefault(kernel, []).append(rest)
    return _index_rows(source.name, location, counted[0][0], groups.items(), checker, entries)


def _index_rows(
    name: str,
    location: str,
    total: int,
    groups: Iterable[tuple[str, Iterable[Sequence[Any]]]],
    checker: Checker,
    entries: dict[tuple[Any, ...], dict[str, int]],
) -> SourceReport:
    """Add the usable rows, given per kernel family as ``(k, batch, vocab, dtype, draft,
    config text)``.

    Rows come from the database's filter on the running device, Triton version and
    kernel hashes; only their configs are left to check, once per distinct config text
    of a family: rows sharing a config share the verdict.
    """
    usable = used = 0
    usable_config = checker.usable_config
    missing: Any = object()
    for kernel, rows in groups:
        verdicts: dict[str, dict[str, int] | None] = {}
        for k, batch, vocab, dtype, draft, text in rows:
            config = verdicts.get(text, missing)
            if config is missing:
                config = verdicts[text] = usable_config(kernel, text)
            if config is None:
                continue
            usable += 1
            key = (kernel, k, batch, vocab, dtype, draft)
            if key not in entries:
                entries[key] = config
                used += 1
    return SourceReport(
        name=name, location=location, status="read", rows=total, usable=usable, used=used
    )


def _skipped(name: str, location: str, exc: Exception) -> SourceReport:
    message = one_line(exc)
    logger.warning("spectune: skipping tuned-config database %s: %s", location, message)
    if not isinstance(exc, DatabaseError):
        logger.debug("details", exc_info=True)
    return SourceReport(name=name, location=location, status="error", error=message)
