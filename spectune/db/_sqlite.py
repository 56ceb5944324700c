"""The serving path's SQLite reader: the standard library's ``sqlite3``, no SQLAlchemy.

:func:`read_usable_candidates` opens a database file read-only (``mode=ro``; the shipped
database also ``immutable=1``), checks its schema revision with the same rules and
messages as the SQLAlchemy reader (:func:`spectune.db._revision.require_current`), and
reads the rows measured on the running device, Triton version and kernel sources,
with the same query the SQLAlchemy loader builds. Every failure is a one-line
:class:`spectune.db.DatabaseError`; driver errors are translated the way
:func:`spectune.db._engine.translate_errors` translates them. Only parameterised
queries are run; nothing read is executed.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from spectune.db._errors import DatabaseError, NotADatabaseError, one_line
from spectune.db._revision import (
    TABLE_NAME,
    VERSION_TABLE,
    SchemaState,
    require_current,
    several_revisions,
)

__all__ = [
    "BUSY_TIMEOUT_S",
    "read_only_uri",
    "read_usable_candidates",
    "translate_sqlite_error",
]

#: How long a SQLite connection waits for another writer's lock before giving up.
BUSY_TIMEOUT_S = 30.0

_SQLITE_MESSAGES = (
    (re.compile(r"file is not a database|file is encrypted"), "is not a SQLite database"),
    (re.compile(r"malformed|corrupt"), "is corrupt"),
    (re.compile(r"unable to open database"), "cannot be opened"),
    (re.compile(r"readonly database|read-only"), "is read-only here"),
    (re.compile(r"database is locked|database table is locked"), "is locked by another writer"),
)

# The SQL the SQLAlchemy reader runs on SQLite (see spectune.db._index and _schema).
_TABLES = (
    "SELECT name FROM main.sqlite_master WHERE type='table' "
    "AND name NOT LIKE 'sqlite~_%' ESCAPE '~' ORDER BY name"
)
_REVISIONS = f"SELECT version_num FROM {VERSION_TABLE}"
_COLUMNS = "SELECT name, hidden FROM pragma_table_xinfo(?, 'main')"
_COUNT = f"SELECT count(*) FROM {TABLE_NAME}"
# One query per installed kernel family (the kernel column is then known): the same
# rows as SQLAlchemy's "(kernel, kernel_hash) IN (...)" and the same unique-index search.
_CANDIDATES = (
    "SELECT spec_len, batch, vocab, dtype, draft_probs, CAST(config AS TEXT) "
    f"FROM {TABLE_NAME} WHERE backend = ? AND arch = ? AND device_name = ? "
    "AND cu_count = ? AND warp_size = ? AND triton_version = ? "
    "AND kernel = ? AND kernel_hash = ?"
)


def translate_sqlite_error(error: BaseException, location: str) -> DatabaseError:
    """A one-line :class:`DatabaseError` naming ``location`` for a ``sqlite3`` error."""
    detail = one_line(str(error), limit=200)
    for pattern, what in _SQLITE_MESSAGES:
        if pattern.search(detail):
            if what in ("is not a SQLite database", "is corrupt"):
                return NotADatabaseError(f"{location} {what} ({detail})")
            if what == "is locked by another writer":
                return DatabaseError(
                    f"{location} {what} (waited {BUSY_TIMEOUT_S:g} s); try again later"
                )
            return DatabaseError(f"{location} {what} ({detail})")
    return DatabaseError(f"{location}: {detail}")


def read_only_uri(path: Path, *, immutable: bool) -> str:
    """The ``file:`` URI opening ``path`` read-only (and immutable when it never changes)."""
    uri = f"file:{quote(str(path.absolute()))}?mode=ro"
    return uri + "&immutable=1" if immutable else uri


def read_usable_candidates(
    path: Path,
    *,
    location: str,
    immutable: bool,
    device: Sequence[Any],
    triton: str,
    kernel_hashes: Mapping[str, str],
) -> tuple[int, list[tuple[str, list[tuple[Any, ...]]]]]:
    """Count the rows of a database file and read those measured on the running system.

    Args:
        path: The database file; it must exist.
        location: Names the database in messages.
        immutable: The file never changes while open (the shipped database).
        device: The running device's ``(backend, arch, device_name, cu_count,
            warp_size)``.
        triton: The running Triton version.
        kernel_hashes: Kernel family name -> source hash of the installed kernels.

    Returns:
        The number of rows, and for each kernel family of ``kernel_hashes``, the
        family and the ``(spec_len, batch, vocab, dtype, draft_probs, config text)`` of
        its rows of the running device, Triton version and kernel source hash
        (``draft_probs`` as stored: 0 or 1).

    Raises:
        DatabaseError: with a one-line message (no file, not SQLite, corrupt, another
            schema revision, missing tables or columns, ...).
    """
    if not path.is_file():
        raise NotADatabaseError(f"no database file at {path}")
    try:
        connection = sqlite3.connect(
            read_only_uri(path, immutable=immutable),
            uri=True,
            timeout=BUSY_TIMEOUT_S,
            isolation_level=None,
        )
        try:
            connection.execute("BEGIN")
            require_current(_schema_state(connection), location=location)
            (total,) = connection.execute(_COUNT).fetchone()
            running = (*device, triton)
            groups = [
                (kernel, connection.execute(_CANDIDATES, (*running, kernel, hash_)).fetchall())
                for kernel, hash_ in kernel_hashes.items()
            ]
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise translate_sqlite_error(exc, location) from None
    return total, groups


def _schema_state(connection: sqlite3.Connection) -> SchemaState:
    """What the database holds, read as SQLAlchemy's SQLite inspector reads it."""
    tables = frozenset(name for (name,) in connection.execute(_TABLES))
    revision = None
    if VERSION_TABLE in tables:
        found = [value for (value,) in connection.execute(_REVISIONS)]
        if len(found) > 1:
            raise several_revisions(found)
        revision = found[0] if found else None
    columns: frozenset[str] = frozenset()
    if TABLE_NAME in tables:
        columns = frozenset(
            name for name, hidden in connection.execute(_COLUMNS, (TABLE_NAME,)) if hidden != 1
        )
    return SchemaState(revision=revision, tables=tables, columns=columns)
