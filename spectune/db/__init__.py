"""The tuned-config database: stores and finds tuned launch configurations.

Knows nothing of Triton: kernels, search spaces and identities are handed in by the
caller. The public API:

- rows: :class:`TunedRow`, :class:`Provenance`, :func:`batch_bucket`;
- where databases are: :func:`default_sources` (``SPECTUNE_DB``, the user database,
  the shipped one), :func:`user_db_path`;
- reading and writing: :func:`open_store` -> :class:`Store` (``record`` ->
  :class:`RecordOutcome`, ``record_many``, ``rows``, ``count``, ``best_configs_near``),
  :func:`upgrade_database`;
- the serving path: :func:`load_index` -> :class:`ConfigIndex` (never raises);
- files and merging: :func:`read_rows_file`, :func:`write_rows_file`,
  :func:`import_rows`, :func:`merge_databases`, :func:`effective_rows`;
- errors: :class:`DatabaseError`, the base of those in :mod:`spectune.db.errors`.

One field list (``spectune.db._fields``) defines a row everywhere: its JSON and CSV
forms, the table, the SQL and the checks. Reading uses one DB-API reader per storage
(``sqlite3`` for SQLite files, ``psycopg`` for PostgreSQL): importing the package and
:func:`load_index` never import SQLAlchemy, which only writers (creating and upgrading
schemas, recording rows) bring in. The serving path is imported at once; the store and
the files, which it does not need, on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from spectune.db._config_index import ConfigIndex, load_index
from spectune.db._locations import default_sources, user_db_path
from spectune.db._row import Provenance, TunedRow, batch_bucket
from spectune.db.errors import DatabaseError

if TYPE_CHECKING:
    from spectune.db._files import read_rows_file, write_rows_file
    from spectune.db._store import (
        RecordOutcome,
        Store,
        effective_rows,
        import_rows,
        merge_databases,
        open_store,
        upgrade_database,
    )

#: Public names the serving path does not need -> their module, imported on first use.
_LAZY = {
    **dict.fromkeys(("read_rows_file", "write_rows_file"), "spectune.db._files"),
    **dict.fromkeys(
        (
            "RecordOutcome",
            "Store",
            "effective_rows",
            "import_rows",
            "merge_databases",
            "open_store",
            "upgrade_database",
        ),
        "spectune.db._store",
    ),
}

__all__ = [
    "ConfigIndex",
    "DatabaseError",
    "Provenance",
    "RecordOutcome",
    "Store",
    "TunedRow",
    "batch_bucket",
    "default_sources",
    "effective_rows",
    "import_rows",
    "load_index",
    "merge_databases",
    "open_store",
    "read_rows_file",
    "upgrade_database",
    "user_db_path",
    "write_rows_file",
]


def __getattr__(name: str) -> Any:
    """Import the names the serving path does not need on first access."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
