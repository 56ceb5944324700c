"""Rows in files: JSON and CSV (export and import), vLLM-style JSON (export only).

- ``json``: a list of row objects with the keys of :data:`spectune.db._fields.FIELDS`
  (what ``spectune db show --json`` prints).
- ``csv``: one row per line, the same columns, each typed by its field's kind
  (:data:`spectune.db._fields.ROW_FIELDS`); ``config`` and ``history`` as JSON text;
  text a spreadsheet would run as a formula is escaped (see ``Field.to_csv``); an
  empty cell is ``None`` (a nullable field's).

Files written before a field was added (``Field.since``: the comparison with vLLM) may
lack it: it reads as the field's ``missing`` value (not measured).
- ``vllm-json``: one file per kernel family and device, named like vLLM's tuned config
  files (``kernel=rejection_sample,device_name=AMD_Instinct_MI300X.json``), holding
  ``{problem: {batch: config}}``. It lacks the identity needed to validate rows, so it
  cannot be imported.

Files are parsed with ``json`` and ``csv`` only; nothing read is ever executed.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from spectune.db._fields import FIELDS, LATER_FIELDS, ROW_FIELDS, check_name, reject_constant
from spectune.db._row import TunedRow
from spectune.db.errors import InvalidRowError
from spectune.messages import one_line

__all__ = [
    "EXPORT_FORMATS",
    "IMPORT_FORMATS",
    "read_rows_file",
    "refuse_directory",
    "rows_to_json",
    "vllm_file_name",
    "vllm_tables",
    "write_rows_file",
]

EXPORT_FORMATS = ("json", "csv", "vllm-json")
IMPORT_FORMATS = ("json", "csv")

_MAX_FILE_BYTES = 256 * 1024 * 1024
#: The columns a CSV file written before them may lack.
_LATER = frozenset(f.name for f in LATER_FIELDS)


def rows_to_json(rows: Iterable[TunedRow]) -> str:
    """The rows as a JSON list (indented, keys in :data:`FIELDS` order)."""
    return json.dumps([row.to_dict() for row in rows], indent=2, allow_nan=False) + "\n"


def write_rows_file(
    rows: Sequence[TunedRow], path: str | os.PathLike[str], *, fmt: str
) -> list[Path]:
    """Write ``rows`` to ``path`` in ``fmt``.

    Args:
        rows: The rows.
        path: A file (``json``, ``csv``) or a directory, created if needed (``vllm-json``).
        fmt: One of :data:`EXPORT_FORMATS`.

    Returns:
        The files written.

    Raises:
        IsADirectoryError: ``path`` is a directory and ``fmt`` writes a file.
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"fmt must be one of {EXPORT_FORMATS}, got {fmt!r}")
    target = Path(path)
    if fmt != "vllm-json":
        refuse_directory(target, fmt=fmt)
    if fmt == "json":
        _write_text(target, rows_to_json(rows))
        return [target]
    if fmt == "csv":
        _write_text(target, _rows_to_csv(rows))
        return [target]
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, table in vllm_tables(rows).items():
        file = target / name
        _write_text(file, json.dumps(table, indent=4, sort_keys=False) + "\n")
        written.append(file)
    return written


def read_rows_file(path: str | os.PathLike[str], *, fmt: str | None = None) -> list[TunedRow]:
    """Read rows written by :func:`write_rows_file` (``json`` or ``csv``).

    Args:
        path: The file.
        fmt: One of :data:`IMPORT_FORMATS`; ``None`` picks by the file's suffix.

    Raises:
        InvalidRowError: naming the file and, for a bad row, its number (from 1).
        OSError: the file cannot be read.
    """
    file = Path(path)
    if fmt is None:
        fmt = file.suffix.lower().lstrip(".")
        if fmt not in IMPORT_FORMATS:
            raise InvalidRowError(
                f"{file}: cannot tell the format from the suffix; pass a format "
                f"({', '.join(IMPORT_FORMATS)})"
            )
    if fmt not in IMPORT_FORMATS:
        raise InvalidRowError(
            f"cannot import format {fmt!r}; importable: {', '.join(IMPORT_FORMATS)}"
        )
    if file.stat().st_size > _MAX_FILE_BYTES:
        raise InvalidRowError(f"{file}: larger than {_MAX_FILE_BYTES // 2**20} MiB")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InvalidRowError(f"{file}: not UTF-8 text") from None
    records = _parse_json(file, text) if fmt == "json" else _parse_csv(file, text)
    rows = []
    for number, record in enumerate(records, start=1):
        try:
            rows.append(TunedRow.from_dict(record))
        except InvalidRowError as exc:
            raise InvalidRowError(f"{file}: row {number}: {exc}") from None
    return rows


def refuse_directory(path: Path, *, fmt: str) -> None:
    """Raise ``IsADirectoryError`` naming ``path`` when it is a directory (``fmt`` writes a
    file there: replacing it would fail, naming a temporary file instead)."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"is a directory; format {fmt} writes a file",
                                str(path))  # fmt: skip


def vllm_file_name(*, kernel: str, device_name: str) -> str:
    """File name of a kernel's tuned configs for one device, in vLLM's style."""
    check_name("kernel", kernel)
    check_name("device_name", device_name)
    return f"kernel={kernel},device_name={device_name}.json"


def vllm_tables(rows: Iterable[TunedRow]) -> dict[str, dict[str, Any]]:
    """The contents of the ``vllm-json`` files, file name -> JSON object.

    Each file maps ``"spec_len=K,vocab=V,dtype=D,draft_probs=B"`` to ``{batch: config}``
    (batch as a string, like vLLM's files). Where rows of one device name differ only
    in Triton version, CU count or kernel hash, the most recently tuned one is kept.
    ``triton_version`` is set when every row of the file shares one.
    """
    chosen: dict[tuple[str, str, int], TunedRow] = {}
    for row in sorted(rows, key=lambda r: r.tuned_at):
        p = row.problem
        problem = (
            f"spec_len={p.spec_len},vocab={p.vocab},dtype={p.dtype},"
            f"draft_probs={str(p.draft_probs).lower()}"
        )
        name = vllm_file_name(kernel=row.kernel, device_name=row.device.device_name)
        chosen[(name, problem, p.batch)] = row
    tables: dict[str, dict[str, Any]] = {}
    tritons: dict[str, set[str]] = {}
    for (name, problem, batch), row in sorted(chosen.items(), key=lambda item: item[0]):
        tables.setdefault(name, {}).setdefault(problem, {})[str(batch)] = dict(row.config)
        tritons.setdefault(name, set()).add(row.software.triton)
    for name, versions in tritons.items():
        if len(versions) == 1:
            tables[name] = {"triton_version": versions.pop(), **tables[name]}
    return tables


def _rows_to_csv(rows: Iterable[TunedRow]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIELDS)
    for row in rows:
        record = row.to_dict()
        writer.writerow([f.to_csv(record[f.name]) for f in ROW_FIELDS])
    return out.getvalue()


def _parse_json(file: Path, text: str) -> list[Any]:
    try:
        data = json.loads(text, parse_constant=reject_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidRowError(f"{file}: not valid JSON ({one_line(exc, limit=200)})") from None
    if not isinstance(data, list):
        raise InvalidRowError(f"{file}: expected a JSON list of rows, got {type(data).__name__}")
    return data


def _parse_csv(file: Path, text: str) -> list[dict[str, Any]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = reader.fieldnames or []
        unknown = [h for h in header if h not in FIELDS]
        missing = [f for f in FIELDS if f not in header and f not in _LATER]
        if unknown or missing or len(header) != len(set(header)):
            raise InvalidRowError(
                f"{file}: CSV header must be the row fields; unknown "
                f"{[ascii(h) for h in unknown][:5]}, missing {missing[:5]}"
            )
        records = []
        for number, raw in enumerate(reader, start=1):
            try:
                records.append(_csv_record(raw))
            except ValueError as exc:
                raise InvalidRowError(f"{file}: row {number}: {exc}") from None
        return records
    except csv.Error as exc:
        raise InvalidRowError(f"{file}: not valid CSV ({one_line(exc, limit=200)})") from None


def _csv_record(raw: dict[str | None, Any]) -> dict[str, Any]:
    if None in raw or any(value is None for value in raw.values()):
        raise ValueError("wrong number of fields")
    return {f.name: f.from_csv(raw[f.name]) for f in ROW_FIELDS if f.name in raw}


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:  # whatever failed, no half-written file is left beside the target
        tmp.unlink(missing_ok=True)
