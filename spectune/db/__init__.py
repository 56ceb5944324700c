"""The tuned-config database: stores and finds tuned launch configurations.

Knows nothing of Triton: kernels, search spaces and identities are handed in by the
caller. The public API:

- rows: :class:`TunedRow`, :class:`Provenance`, :class:`VllmComparison` (how a row's
  config compared with vLLM's own function; :data:`VS_VLLM_VERDICTS`),
  :func:`batch_bucket`, :func:`utc_now`;
- where databases are: :func:`default_sources` (``SPECTUNE_DB``, the user database,
  the shipped one), :func:`user_db_path`, :func:`write_target` (where writers write),
  :func:`parse_target` (a URL or path -> :class:`DatabaseURL`);
- the storage seam: :func:`backend_of` -> :class:`Backend` (:class:`SQLiteBackend`,
  :class:`PostgresBackend`): everything that differs between SQLite and PostgreSQL, the
  studies beside a configs database included (:meth:`Backend.studies_storage`,
  :func:`study_rdb`, :data:`STUDIES_SCHEMA`, :data:`STUDIES_JOURNAL_SUFFIX`), with
  :func:`display_storage` (a storage without its password) and
  :func:`lost_connection` / :func:`is_permanent` (is a driver's error a lost
  connection, and one that waiting does not cure);
- reading and writing: :func:`open_store` -> :class:`Store` (``record`` ->
  :class:`RecordOutcome`, ``record_many``, ``rows``, ``count``, ``best_configs_near``,
  ``set_vllm_comparison``), :func:`upgrade_database`;
- the serving path: :func:`load_index` -> :class:`ConfigIndex` (never raises;
  ``lookup`` -> a config, ``entry`` -> :class:`IndexEntry`, the config with its
  comparison with vLLM);
- validators: :func:`check_row`;
- files and merging: :func:`read_rows_file`, :func:`write_rows_file`,
  :func:`rows_to_json`, :func:`write_database`, :func:`import_rows`,
  :func:`merge_databases`, :func:`effective_rows`;
- the nightly history (the tuner's): :class:`NightlyRun`, :class:`NightlyResult`,
  :func:`start_night`, :func:`record_result`, :func:`finish_night`, :func:`nights`,
  :func:`night_results`;
- errors: :class:`DatabaseError`, the base of those in :mod:`spectune.db.errors`.

One field list (``spectune.db._fields``) defines a row everywhere: its JSON and CSV
forms, the table, the SQL and the checks. Reading uses one DB-API reader per storage
(``sqlite3`` for SQLite files, ``psycopg`` for PostgreSQL): importing the package and
:func:`load_index` never import SQLAlchemy, which only writers (creating and upgrading
schemas, recording rows) bring in. The serving path is imported at once; the row
classes, the store, the files and the nightly history, which it does not need, on
first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from spectune.db._backend import (
    STUDIES_JOURNAL_SUFFIX,
    STUDIES_SCHEMA,
    Backend,
    DatabaseURL,
    PostgresBackend,
    SQLiteBackend,
    StudyRDB,
    backend_of,
    display_storage,
    is_permanent,
    lost_connection,
    parse_target,
    study_rdb,
)
from spectune.db._buckets import batch_bucket
from spectune.db._checks import check_row
from spectune.db._config_index import ConfigIndex, IndexEntry, load_index
from spectune.db._fields import VS_VLLM_VERDICTS
from spectune.db._locations import Source, default_sources, user_db_path, write_target
from spectune.db.errors import DatabaseError

if TYPE_CHECKING:
    from spectune.db._files import read_rows_file, rows_to_json, write_rows_file
    from spectune.db._night_history import (
        NightlyResult,
        NightlyRun,
        finish_night,
        night_results,
        nights,
        record_result,
        start_night,
    )
    from spectune.db._row import Provenance, TunedRow, VllmComparison, utc_now
    from spectune.db._store import (
        RecordOutcome,
        Store,
        effective_rows,
        import_rows,
        merge_databases,
        open_store,
        upgrade_database,
        write_database,
    )

#: Public names the serving path does not need -> their module, imported on first use.
_LAZY = {
    # The row classes: the serving path reads no whole row.
    **dict.fromkeys(("Provenance", "TunedRow", "VllmComparison", "utc_now"),
                    "spectune.db._row"),
    **dict.fromkeys(("read_rows_file", "rows_to_json", "write_rows_file"), "spectune.db._files"),
    **dict.fromkeys(
        (
            "NightlyResult",
            "NightlyRun",
            "finish_night",
            "night_results",
            "nights",
            "record_result",
            "start_night",
        ),
        "spectune.db._night_history",
    ),
    **dict.fromkeys(
        (
            "RecordOutcome",
            "Store",
            "effective_rows",
            "import_rows",
            "merge_databases",
            "open_store",
            "upgrade_database",
            "write_database",
        ),
        "spectune.db._store",
    ),
}

__all__ = [
    "STUDIES_JOURNAL_SUFFIX",
    "STUDIES_SCHEMA",
    "VS_VLLM_VERDICTS",
    "Backend",
    "ConfigIndex",
    "DatabaseError",
    "DatabaseURL",
    "IndexEntry",
    "NightlyResult",
    "NightlyRun",
    "PostgresBackend",
    "Provenance",
    "RecordOutcome",
    "SQLiteBackend",
    "Source",
    "Store",
    "StudyRDB",
    "TunedRow",
    "VllmComparison",
    "backend_of",
    "batch_bucket",
    "check_row",
    "default_sources",
    "display_storage",
    "effective_rows",
    "finish_night",
    "import_rows",
    "is_permanent",
    "load_index",
    "lost_connection",
    "merge_databases",
    "night_results",
    "nights",
    "open_store",
    "parse_target",
    "read_rows_file",
    "record_result",
    "rows_to_json",
    "start_night",
    "study_rdb",
    "upgrade_database",
    "user_db_path",
    "utc_now",
    "write_database",
    "write_rows_file",
    "write_target",
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
