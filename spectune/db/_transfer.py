"""Moving rows between databases and files: import, merge, and what readers see."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.engine import URL

from spectune.db._checks import Spaces, check_configs
from spectune.db._files import read_rows_file
from spectune.db._locations import Source, default_sources
from spectune.db._row import RowKey, TunedRow
from spectune.db._store import RecordReport, open_store
from spectune.promotion import MIN_GAIN

__all__ = ["effective_rows", "import_rows", "merge_databases"]

Target = str | os.PathLike[str] | URL


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
        spaces: Search spaces to check configs against (see :func:`check_configs`).
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
        spaces: Search spaces to check configs against (see :func:`check_configs`).
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


def effective_rows(sources: Sequence[Source] | None = None) -> list[tuple[Source, TunedRow]]:
    """The rows readers see, with the source each comes from; an earlier source wins.

    Absent SQLite files are skipped; any other problem raises.

    Raises:
        DatabaseError: naming the database that cannot be read.
    """
    if sources is None:
        sources = default_sources()
    seen: dict[RowKey, tuple[Source, TunedRow]] = {}
    for source in sources:
        if source.url.get_backend_name() == "sqlite" and not Path(
            source.url.database or ""
        ).exists():
            continue
        with open_store(source, readonly=True) as store:
            for row in store.rows():
                seen.setdefault(row.key, (source, row))
    return list(seen.values())
