"""Schema revisions and Alembic migrations, including a checked-in database of revision 0001.

The tests that may touch the schema use SQLAlchemy directly, as the writers do.
"""

from __future__ import annotations

import logging
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from spectune.db import VllmComparison, load_index, open_store, upgrade_database
from spectune.db._locations import Source, parse_target
from spectune.db._models import Base
from spectune.db._reader import HEAD_REVISION, REVISIONS
from spectune.db._writer import migrations_dir
from spectune.db.errors import (
    NotADatabaseError,
    SchemaError,
    SchemaTooNewError,
    SchemaTooOldError,
)

from .conftest import ASSETS, KERNEL, KERNEL_HASH, MI300X, SOFTWARE, later, make_row, write_db


def engine_for(target: str):  # type: ignore[no-untyped-def]
    return create_engine(parse_target(target).sqlalchemy_url())


def test_revisions_are_the_migration_scripts() -> None:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    script = ScriptDirectory.from_config(config)
    assert script.get_heads() == [HEAD_REVISION]
    walked = [rev.revision for rev in script.walk_revisions()]
    assert list(reversed(walked)) == list(REVISIONS)


def test_migrations_build_exactly_the_model(db_url: str) -> None:
    assert upgrade_database(db_url) == (None, HEAD_REVISION)
    engine = engine_for(db_url)
    try:
        with engine.connect() as connection:
            diffs = compare_metadata(MigrationContext.configure(connection), Base.metadata)
            version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()
    assert diffs == []
    assert version == HEAD_REVISION
    assert upgrade_database(db_url) == (HEAD_REVISION, HEAD_REVISION)


@pytest.fixture
def old_file(tmp_path: Path) -> Path:
    """A copy of the checked-in database of schema revision 0001."""
    copy = tmp_path / "schema_0001.db"
    shutil.copyfile(ASSETS / "schema_0001.db", copy)
    return copy


def test_checked_in_0001_file_is_upgraded_with_its_rows(old_file: Path) -> None:
    with pytest.raises(SchemaTooOldError, match="spectune db upgrade"):
        open_store(old_file, readonly=True)
    assert upgrade_database(old_file) == ("0001", HEAD_REVISION)
    with open_store(old_file, readonly=True) as store:
        rows = store.rows()
    assert [(r.device.device_name, r.problem.batch, r.problem.vocab) for r in rows] == [
        ("NVIDIA_H200", 64, 151936),
        ("AMD_Instinct_MI300X", 8, 128256),
    ]
    mi300x = rows[1]
    assert mi300x.config == {"BLOCK_V": 1024, "num_warps": 4, "waves_per_eu": 1}
    assert mi300x.speedup == 1.5
    assert mi300x.tuned_at == datetime(2025, 11, 1, 12, 0, tzinfo=timezone.utc)
    assert mi300x.history == ()
    assert rows[0].tuned_at == datetime(2025, 11, 2, 8, 30, 0, 250000, tzinfo=timezone.utc)
    # The upgraded file takes new rows and histories.
    with open_store(old_file) as store:
        faster = make_row(p50=5.0, host="new", tuned_at=later(1))
        assert store.record(faster).value == "replaced"
        (replaced,) = store.rows(device_name="AMD_Instinct_MI300X")
    assert [h.host for h in replaced.history] == ["node-a"]


def test_writers_upgrade_an_older_database_readers_skip_it(
    old_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        index = load_index(
            device=MI300X,
            software=SOFTWARE,
            kernel_hashes={KERNEL: KERNEL_HASH},
            sources=[Source(name="old", url=parse_target(str(old_file)))],
        )
    assert index.sources[0].status == "error"
    assert "older than this spectune" in index.sources[0].error
    with open_store(old_file) as store:
        assert store.count() == 2
    with open_store(old_file, readonly=True) as store:
        assert store.count() == 2


def test_asset_is_still_revision_0001() -> None:
    engine = engine_for(str(ASSETS / "schema_0001.db"))
    try:
        with engine.connect() as connection:
            version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
            assert version == "0001"
            columns = {c["name"] for c in inspect(connection).get_columns("tuned_configs")}
    finally:
        engine.dispose()
    assert "history" not in columns


def _set_revision(target: str, revision: str) -> None:
    engine = engine_for(target)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
    finally:
        engine.dispose()


def test_newer_schema_is_refused_everywhere(db_url: str) -> None:
    with open_store(db_url) as store:
        store.record(make_row())
    _set_revision(db_url, "0099_from_the_future")
    for action in (lambda: open_store(db_url, readonly=True), lambda: open_store(db_url),
                   lambda: upgrade_database(db_url)):  # fmt: skip
        with pytest.raises(SchemaTooNewError, match="newer spectune"):
            action()
    index = load_index(device=MI300X, software=SOFTWARE, kernel_hashes={KERNEL: KERNEL_HASH},
                       sources=[Source(name="new", url=parse_target(db_url))])  # fmt: skip
    assert index.sources[0].status == "error"
    assert "0099_from_the_future" in index.sources[0].error


def _execute(target: str, statement: str) -> None:
    engine = engine_for(target)
    try:
        with engine.begin() as connection:
            connection.execute(text(statement))
    finally:
        engine.dispose()


def test_missing_table(db_url: str) -> None:
    upgrade_database(db_url)
    _execute(db_url, "DROP TABLE tuned_configs")
    with pytest.raises(SchemaError, match="missing table 'tuned_configs'"):
        open_store(db_url, readonly=True)
    with pytest.raises(SchemaError, match="missing table"):
        open_store(db_url)


def test_missing_column(db_url: str) -> None:
    upgrade_database(db_url)
    _execute(db_url, "ALTER TABLE tuned_configs DROP COLUMN study")
    with pytest.raises(SchemaError, match=r"lacks column\(s\) \['study'\]"):
        open_store(db_url, readonly=True)


def test_another_applications_database_is_left_alone(tmp_path: Path) -> None:
    path = str(tmp_path / "app.db")
    _execute(path, "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    with pytest.raises(NotADatabaseError, match="not a spectune database"):
        open_store(path)
    engine = engine_for(path)
    try:
        with engine.connect() as connection:
            assert inspect(connection).get_table_names() == ["users"]
    finally:
        engine.dispose()


def test_missing_revision_row(tmp_path: Path) -> None:
    path = str(tmp_path / "x.db")
    upgrade_database(path)
    _execute(path, "DELETE FROM alembic_version")
    with pytest.raises(NotADatabaseError, match="not a spectune database"):
        open_store(path)


def test_empty_file_becomes_a_database(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(NotADatabaseError, match="no spectune tables"):
        open_store(path, readonly=True)
    with open_store(path) as store:
        store.record(make_row())
    with open_store(path, readonly=True) as store:
        assert store.count() == 1


def test_checked_in_0002_file_is_read_as_is_and_upgraded_with_its_rows(tmp_path: Path) -> None:
    # Revision 0003 only added the nightly history: serving reads a 0002 file unchanged.
    copy = tmp_path / "schema_0002.db"
    shutil.copyfile(ASSETS / "schema_0002.db", copy)
    before = copy.read_bytes()
    with open_store(copy, readonly=True) as store:
        rows = store.rows()
    assert copy.read_bytes() == before
    assert [r.host for r in rows] == ["node-b", "node-a"]
    assert [h.host for h in rows[1].history] == ["node-c"]
    index = load_index(device=MI300X, software=SOFTWARE, kernel_hashes={KERNEL: KERNEL_HASH},
                       sources=[Source(name="old", url=parse_target(str(copy)))])
    assert index.sources[0].status == "read"
    assert upgrade_database(copy) == ("0002", HEAD_REVISION)
    with open_store(copy, readonly=True) as store:
        assert store.rows() == rows
    engine = engine_for(str(copy))
    try:
        with engine.connect() as connection:
            tables = set(inspect(connection).get_table_names())
    finally:
        engine.dispose()
    assert {"nightly_runs", "nightly_results", "tuned_configs"} <= tables


def test_asset_is_still_revision_0002() -> None:
    engine = engine_for(str(ASSETS / "schema_0002.db"))
    try:
        with engine.connect() as connection:
            version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
            tables = set(inspect(connection).get_table_names())
    finally:
        engine.dispose()
    assert version == "0002"
    assert "nightly_runs" not in tables


def test_checked_in_0003_file_is_read_as_not_compared_and_upgraded(tmp_path: Path) -> None:
    # Revision 0004 added the comparison with vLLM: a 0003 file serves its rows unchanged
    # (none routed to spectune, as not compared), and an upgrade keeps them so.
    copy = tmp_path / "schema_0003.db"
    shutil.copyfile(ASSETS / "schema_0003.db", copy)
    before = copy.read_bytes()
    with open_store(copy, readonly=True) as store:
        rows = store.rows()
    assert copy.read_bytes() == before
    assert [r.host for r in rows] == ["node-b", "node-a"]
    assert [h.host for h in rows[1].history] == ["node-c"]
    assert all(r.vllm == VllmComparison() and r.vs_vllm_ratio is None for r in rows)
    index = load_index(device=MI300X, software=SOFTWARE, kernel_hashes={KERNEL: KERNEL_HASH},
                       sources=[Source(name="old", url=parse_target(str(copy)))])
    assert index.sources[0].status == "read" and index.sources[0].used == 1
    entry = index.entry(device=MI300X, software=SOFTWARE, kernel=KERNEL,
                        problem=rows[1].problem)  # fmt: skip
    assert entry == (rows[1].config, "not measured", None)
    assert upgrade_database(copy) == ("0003", HEAD_REVISION)
    with open_store(copy, readonly=True) as store:
        assert store.rows() == rows
    engine = engine_for(str(copy))
    try:
        with engine.connect() as connection:
            stored = connection.execute(
                text("SELECT vs_vllm, vllm_p50_us, vllm_version, vllm_reason FROM tuned_configs")
            ).all()
    finally:
        engine.dispose()
    assert [tuple(each) for each in stored] == [("not measured", None, None, None)] * 2
    # The upgraded file records comparisons.
    compared = VllmComparison("faster", 14.0, "0.32.0")
    with open_store(copy) as store:
        assert store.set_vllm_comparison(rows[1].key, compared)
        (mi300x,) = store.rows(device_name="AMD_Instinct_MI300X")
    assert mi300x.vllm == compared and mi300x.vs_vllm_ratio == 1.4


def test_a_0003_nightly_history_reads_without_the_comparison_and_upgrades(
    tmp_path: Path,
) -> None:
    # Revision 0004 added the nightly history's comparison with vLLM: results of earlier
    # nights read it as None, read-only (no upgrade) or upgraded; later nights record it.
    from spectune.db import NightlyResult, night_results, record_result

    copy = tmp_path / "schema_0003.db"
    shutil.copyfile(ASSETS / "schema_0003.db", copy)
    engine = engine_for(str(copy))
    try:
        with engine.begin() as connection:  # a night as spectune wrote it at 0003
            connection.execute(text(
                "INSERT INTO nightly_runs (id, job, host, backend, arch, device_name, "
                "cu_count, warp_size, triton_version, torch_version, runtime_version, "
                "driver_version, spectune_version, budget_seconds, started_at, status) "
                "VALUES (1, 'job', 'node-a', 'hip', 'gfx942', 'AMD_Instinct_MI300X', 304, "
                "64, '3.2.0', '2.6.0', 'rt-1', 'd', '0.1.0', 60.0, "
                "'2026-01-02 03:04:05.000000', 'complete')"))
            connection.execute(text(
                "INSERT INTO nightly_results (run_id, kernel, kernel_hash, spec_len, batch, "
                "vocab, dtype, draft_probs, action, reason, verdict, tuned_p20_us, "
                "tuned_p50_us, tuned_p80_us, seconds, message, finished_at) VALUES (1, "
                f"'{KERNEL}', '{KERNEL_HASH}', 4, 8, 128256, 'bfloat16', 1, 'recheck', "
                "'recheck', 'ok', 9.0, 10.0, 11.0, 1.5, '', '2026-01-02 03:05:00.000000')"))
    finally:
        engine.dispose()
    with open_store(copy, readonly=True) as store:
        (old,) = night_results(store)
    assert (old.kernel, old.verdict, old.tuned is not None) == (KERNEL, "ok", True)
    assert (old.vs_vllm, old.vllm_p50, old.vllm_version, old.served_p50) == (None,) * 4
    assert old.vs_vllm_ratio is None
    assert upgrade_database(copy) == ("0003", HEAD_REVISION)
    engine = engine_for(str(copy))
    try:
        with engine.connect() as connection:
            columns = {c["name"] for c in inspect(connection).get_columns("nightly_results")}
    finally:
        engine.dispose()
    assert {"vs_vllm", "vllm_p50_us", "vllm_version", "served_p50_us"} <= columns
    compared = NightlyResult(
        kernel=KERNEL, kernel_hash=KERNEL_HASH, problem=old.problem, action="tune",
        reason="missing", verdict="inserted", vs_vllm="faster", vllm_p50=15.0,
        vllm_version="0.32.0", served_p50=10.0)
    with open_store(copy) as store:
        assert night_results(store) == [old]
        record_result(store, 1, compared)
        both = night_results(store)
    assert both[0] == old
    assert (both[1].vs_vllm, both[1].vllm_p50, both[1].vllm_version, both[1].served_p50) \
        == ("faster", 15.0, "0.32.0", 10.0)
    assert both[1].vs_vllm_ratio == 1.5
    with pytest.raises(ValueError, match="vs_vllm must be one of"):
        NightlyResult(kernel=KERNEL, kernel_hash=KERNEL_HASH, problem=old.problem,
                      action="tune", reason="missing", verdict="inserted", vs_vllm="slower")


def test_asset_is_still_revision_0003() -> None:
    engine = engine_for(str(ASSETS / "schema_0003.db"))
    try:
        with engine.connect() as connection:
            version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
            columns = {c["name"] for c in inspect(connection).get_columns("tuned_configs")}
    finally:
        engine.dispose()
    assert version == "0003"
    assert "vs_vllm" not in columns and "history" in columns


def test_a_0004_database_lacking_a_comparison_column_is_refused(db_url: str) -> None:
    upgrade_database(db_url)
    _execute(db_url, "ALTER TABLE tuned_configs DROP COLUMN vllm_version")
    with pytest.raises(SchemaError, match=r"lacks column\(s\) \['vllm_version'\]"):
        open_store(db_url, readonly=True)


def test_a_database_without_the_comparison_columns_is_served(db_url: str) -> None:
    # What a 0003 database is, on either storage: the readers read the comparison as
    # not measured (a literal in their SQL), without upgrading it.
    write_db(db_url, [make_row(vllm=VllmComparison("faster", 14.0, "0.32.0"))])
    for column in ("vs_vllm", "vllm_p50_us", "vllm_version", "vllm_reason", "vllm_peak_mib",
                   "tuned_peak_mib"):
        _execute(db_url, f"ALTER TABLE tuned_configs DROP COLUMN {column}")
    for column in ("vs_vllm", "vllm_p50_us", "vllm_version", "served_p50_us"):
        _execute(db_url, f"ALTER TABLE nightly_results DROP COLUMN {column}")
    _set_revision(db_url, "0003")
    with open_store(db_url, readonly=True) as store:
        assert store.rows() == [make_row()]
    index = load_index(device=MI300X, software=SOFTWARE, kernel_hashes={KERNEL: KERNEL_HASH},
                       sources=[Source(name="old", url=parse_target(db_url))])  # fmt: skip
    assert index.entry(device=MI300X, software=SOFTWARE, kernel=KERNEL,
                       problem=make_row().problem) == (make_row().config, "not measured", None)
    assert upgrade_database(db_url) == ("0003", HEAD_REVISION)
    with open_store(db_url, readonly=True) as store:
        assert store.rows() == [make_row()]
