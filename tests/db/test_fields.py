"""The one field list: the row, the table, the files and the SQL all come from it."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import JSON, Boolean, Float, Integer, String

from spectune.db._backend import PostgresBackend, SQLiteBackend
from spectune.db._fields import (
    FIELDS,
    KERNEL_FIELDS,
    KEY_FIELDS,
    PROBLEM_FIELDS,
    PROVENANCE_FIELDS,
    ROW_FIELDS,
    RUNNING_FIELDS,
    Field,
)
from spectune.db._models import TunedConfigRecord, UTCDateTime
from spectune.db._reader import TABLE_COLUMNS

from .conftest import make_row


def test_table_columns_are_the_models() -> None:
    assert set(TABLE_COLUMNS) == set(TunedConfigRecord.__table__.columns.keys())
    assert len(TABLE_COLUMNS) == len(set(TABLE_COLUMNS))
    assert ("id", *FIELDS) == TABLE_COLUMNS


def test_model_columns_follow_the_kinds() -> None:
    columns = TunedConfigRecord.__table__.columns
    types = {"int": Integer, "float": Float, "bool": Boolean, "json": JSON, "time": UTCDateTime}
    for field in ROW_FIELDS:
        column = columns[field.name]
        if field.kind in ("name", "text"):
            assert isinstance(column.type, String)
            assert column.type.length == field.size
        else:
            assert isinstance(column.type, types[field.kind]), field.name
        nullable = ("history", "vllm_p50_us", "vllm_version", "vllm_reason", "vllm_peak_mib",
                    "tuned_peak_mib")
        assert column.nullable == (field.name in nullable), field.name
        default = column.server_default
        assert (None if default is None else default.arg) == field.missing, field.name
    (unique,) = [c for c in TunedConfigRecord.__table__.constraints if c.name]
    assert tuple(c.name for c in unique.columns) == KEY_FIELDS


def test_the_key_is_running_system_kernel_and_problem() -> None:
    parts = {f.name for f in (*RUNNING_FIELDS, *KERNEL_FIELDS, *PROBLEM_FIELDS)}
    assert parts == set(KEY_FIELDS)
    assert [f.name for f in RUNNING_FIELDS] == [
        "backend", "arch", "device_name", "cu_count", "warp_size", "triton_version"
    ]  # fmt: skip
    assert [f.name for f in KERNEL_FIELDS] == ["kernel", "kernel_hash"]
    assert [f.name for f in PROBLEM_FIELDS] == [
        "spec_len", "batch", "vocab", "dtype", "draft_probs"
    ]  # fmt: skip


def test_every_field_is_read_from_a_row_and_provenance_fields_from_entries() -> None:
    row = make_row(history=(make_row(host="old").provenance,))
    data = row.to_dict()
    for field in ROW_FIELDS:
        assert field.to_plain(field.read(row)) == data[field.name]
    entry = row.provenance
    for field in PROVENANCE_FIELDS:
        assert field.read(entry) == field.read(row)
    assert tuple(entry.to_dict()) == tuple(f.name for f in PROVENANCE_FIELDS)


def test_stored_values_read_back_as_plain_ones() -> None:
    row = make_row()
    data = row.to_dict()
    by_name = {f.name: f for f in ROW_FIELDS}
    # SQLite's forms: 0/1 booleans, naive UTC time text, JSON text, NULL history.
    assert by_name["draft_probs"].from_stored(1) is True
    assert by_name["draft_probs"].from_stored(2) == 2  # refused later, not turned into True
    stored_time = row.tuned_at.replace(tzinfo=None).isoformat(sep=" ")
    assert by_name["tuned_at"].from_stored(stored_time) == data["tuned_at"]
    assert by_name["config"].from_stored('{"BLOCK_V": 64}') == {"BLOCK_V": 64}
    assert by_name["history"].from_stored(None) == []
    assert by_name["vllm_version"].from_stored(None) is None
    with pytest.raises(ValueError, match="config is not valid JSON"):
        by_name["config"].from_stored("{nope")


def test_select_lists_come_from_the_fields() -> None:
    for dialect in (SQLiteBackend.sql, PostgresBackend.sql):
        sql = dialect.select(("id", *FIELDS), ("kernel", "batch"), order=True)
        for name in FIELDS:
            assert name in sql
        assert sql.count(dialect.marker) == 2
        assert sql.endswith("ORDER BY " + ", ".join(KEY_FIELDS))
    assert "CAST(config AS TEXT)" in PostgresBackend.sql.select(("config",))


def test_field_names_are_plain_identifiers() -> None:
    """The readers' SQL is formatted from field names only: they must be plain."""
    for name in FIELDS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
    with pytest.raises(ValueError, match="unknown field"):
        from spectune.db._reader import Reader

        Reader(None, location="x").rows(**{"kernel; DROP TABLE tuned_configs": 1})


def test_a_field_kind_must_be_known() -> None:
    with pytest.raises(ValueError, match="kind"):
        Field("x", "blob", "x")
