"""The tuned-config database: stores and finds tuned launch configurations.

Knows nothing of Triton: kernels, search spaces and identities are handed in by the
caller. The public API, re-exported from private modules:

- rows: :class:`TunedRow`, :class:`Provenance`, :func:`batch_bucket`;
- where databases are: :func:`default_sources`, :func:`user_db_path`,
  :func:`shipped_db_path`, :func:`parse_target`, :class:`Source`;
- reading and writing: :func:`open_store` -> :class:`Store` (``record``,
  ``record_many``, ``rows``, ``best_configs_near``), :func:`upgrade_database`;
- the serving path: :func:`load_index` -> :class:`ConfigIndex` (never raises);
- validators: :func:`check_row` -> :class:`Verdict`, :func:`check_configs`;
- files and merging: :func:`read_rows_file`, :func:`write_rows_file`,
  :func:`import_rows`, :func:`merge_databases`, :func:`effective_rows`.

Importing the package is cheap: what needs SQLAlchemy (:func:`open_store`,
:class:`Store`, :func:`upgrade_database`, the transfers) is imported on first use, and
:func:`load_index` reads SQLite files with the standard library's ``sqlite3``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from spectune.db._buckets import batch_bucket, is_batch_bucket
from spectune.db._checks import SpaceLookup, Spaces, Verdict, check_configs, check_row
from spectune.db._conflict import Outcome, resolve
from spectune.db._errors import (
    DatabaseError,
    InvalidRowError,
    NotADatabaseError,
    SchemaError,
    SchemaTooNewError,
    SchemaTooOldError,
)
from spectune.db._files import (
    EXPORT_FORMATS,
    IMPORT_FORMATS,
    read_rows_file,
    rows_to_json,
    vllm_file_name,
    vllm_tables,
    write_rows_file,
)
from spectune.db._index import ConfigIndex, SourceReport, load_index
from spectune.db._locations import (
    ENV_DB,
    ENV_USER_DB,
    Source,
    default_sources,
    display_url,
    fallback_sources,
    parse_target,
    shipped_db_path,
    user_db_path,
    write_target,
)
from spectune.db._revision import HEAD_REVISION, REVISIONS
from spectune.db._row import FIELDS, KEY_FIELDS, Provenance, TunedRow

if TYPE_CHECKING:
    from spectune.db._store import RecordReport, Store, open_store, upgrade_database
    from spectune.db._transfer import effective_rows, import_rows, merge_databases

#: Public names that need SQLAlchemy -> their module, imported on first access.
_LAZY = {
    "RecordReport": "spectune.db._store",
    "Store": "spectune.db._store",
    "open_store": "spectune.db._store",
    "upgrade_database": "spectune.db._store",
    "effective_rows": "spectune.db._transfer",
    "import_rows": "spectune.db._transfer",
    "merge_databases": "spectune.db._transfer",
}

__all__ = [
    "ENV_DB",
    "ENV_USER_DB",
    "EXPORT_FORMATS",
    "FIELDS",
    "HEAD_REVISION",
    "IMPORT_FORMATS",
    "KEY_FIELDS",
    "REVISIONS",
    "ConfigIndex",
    "DatabaseError",
    "InvalidRowError",
    "NotADatabaseError",
    "Outcome",
    "Provenance",
    "RecordReport",
    "SchemaError",
    "SchemaTooNewError",
    "SchemaTooOldError",
    "Source",
    "SourceReport",
    "SpaceLookup",
    "Spaces",
    "Store",
    "TunedRow",
    "Verdict",
    "batch_bucket",
    "check_configs",
    "check_row",
    "default_sources",
    "display_url",
    "effective_rows",
    "fallback_sources",
    "import_rows",
    "is_batch_bucket",
    "load_index",
    "merge_databases",
    "open_store",
    "parse_target",
    "read_rows_file",
    "resolve",
    "rows_to_json",
    "shipped_db_path",
    "upgrade_database",
    "user_db_path",
    "vllm_file_name",
    "vllm_tables",
    "write_rows_file",
    "write_target",
]


def __getattr__(name: str) -> Any:
    """Import the SQLAlchemy-backed public names on first access."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
