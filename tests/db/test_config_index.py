"""load_index / ConfigIndex: the never-raising reader of the serving path."""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from spectune.db import ConfigIndex, IndexEntry, VllmComparison, load_index
from spectune.db._locations import Source, parse_target
from spectune.space import Problem

from .conftest import H200, KERNEL, KERNEL_HASH, MI300X, SOFTWARE, SPACE, make_row, write_db

HASHES = {KERNEL: KERNEL_HASH}


def source(name: str, path: str, *, immutable: bool = False) -> Source:
    return Source(name=name, url=parse_target(path), immutable=immutable)


def load(sources: list[Source] | None = None, **overrides: object) -> ConfigIndex:
    arguments = {"device": MI300X, "software": SOFTWARE, "kernel_hashes": HASHES,
                 "spaces": {KERNEL: SPACE}, "sources": sources} | overrides  # fmt: skip
    return load_index(**arguments)  # type: ignore[arg-type]


def lookup(index: ConfigIndex, **problem: object) -> dict[str, int] | None:
    fields = {"spec_len": 4, "batch": 8, "vocab": 128256, "dtype": "bfloat16",
              "draft_probs": True} | problem  # fmt: skip
    return index.lookup(
        device=MI300X, software=SOFTWARE, kernel=KERNEL, problem=Problem(**fields)  # type: ignore[arg-type]
    )


def test_lookup_goes_to_the_nearest_batch_bucket(tmp_path: Path) -> None:
    small = {"BLOCK_V": 512, "num_warps": 2, "waves_per_eu": 0}
    big = {"BLOCK_V": 2048, "num_warps": 8, "waves_per_eu": 2}
    path = write_db(tmp_path / "a.db", [make_row(batch=8, config=small),
                                        make_row(batch=16, config=big)])  # fmt: skip
    index = load([source("a", path)])
    assert len(index) == 2
    assert lookup(index, batch=8) == small
    assert lookup(index, batch=11) == small
    assert lookup(index, batch=12) == big
    assert lookup(index, batch=22) == big
    # Bucket 32 and bucket 4 have no row: the caller uses the kernel's default.
    assert lookup(index, batch=23) is None
    assert lookup(index, batch=5) is None
    # Every other problem field is exact.
    assert lookup(index, spec_len=5) is None
    assert lookup(index, vocab=128000) is None
    assert lookup(index, dtype="float16") is None
    assert lookup(index, draft_probs=False) is None


def test_draft_probs_flag_is_part_of_the_key(db_url: str) -> None:
    with_probs = {"BLOCK_V": 512, "num_warps": 2, "waves_per_eu": 0}
    without = {"BLOCK_V": 2048, "num_warps": 8, "waves_per_eu": 0}
    write_db(db_url, [make_row(draft_probs=True, config=with_probs),
                      make_row(draft_probs=False, config=without)])  # fmt: skip
    index = load([Source(name="db", url=parse_target(db_url))])
    assert lookup(index, draft_probs=True) == with_probs
    assert lookup(index, draft_probs=False) == without


def test_lookup_needs_the_running_device_and_triton(tmp_path: Path) -> None:
    index = load([source("a", write_db(tmp_path / "a.db", [make_row()]))])
    problem = Problem(4, 8, 128256, "bfloat16", True)
    assert index.lookup(device=MI300X, software=SOFTWARE, kernel=KERNEL, problem=problem)
    assert index.lookup(device=H200, software=SOFTWARE, kernel=KERNEL, problem=problem) is None
    newer = replace(SOFTWARE, triton="3.3.0")
    assert index.lookup(device=MI300X, software=newer, kernel=KERNEL, problem=problem) is None
    assert index.lookup(device=MI300X, software=SOFTWARE, kernel="x", problem=problem) is None


def test_returned_config_is_a_copy(tmp_path: Path) -> None:
    index = load([source("a", write_db(tmp_path / "a.db", [make_row()]))])
    lookup(index)["BLOCK_V"] = 1  # type: ignore[index]
    assert lookup(index)["BLOCK_V"] == 1024  # type: ignore[index]


def test_rows_not_usable_here_are_left_out(tmp_path: Path) -> None:
    rows = [
        make_row(batch=1),
        make_row(batch=2, device=H200, config={"BLOCK_V": 1024, "num_warps": 4}),
        make_row(batch=4, device=replace(MI300X, cu_count=80)),
        make_row(batch=8, software=replace(SOFTWARE, triton="3.1.0")),
        make_row(batch=16, kernel_hash="feedface"),
        make_row(batch=32, config={"BLOCK_V": 1000, "num_warps": 4, "waves_per_eu": 0}),
        make_row(batch=64, config={"BLOCK_V": 1024, "num_warps": 4, "bogus": 1}),
        make_row(batch=128, kernel="another_family"),
    ]
    index = load([source("a", write_db(tmp_path / "a.db", rows))])
    assert len(index) == 1
    assert lookup(index, batch=1) is not None
    for batch in (2, 4, 8, 16, 32, 64, 128):
        assert lookup(index, batch=batch) is None
    (report,) = index.sources
    assert (report.status, report.rows, report.usable, report.used) == ("read", 8, 1, 1)


def test_earlier_source_wins_per_key(tmp_path: Path) -> None:
    user_config = {"BLOCK_V": 2048, "num_warps": 8, "waves_per_eu": 2}
    shipped = write_db(tmp_path / "shipped.db", [make_row(batch=8), make_row(batch=16)])
    user = write_db(tmp_path / "user.db", [make_row(batch=8, config=user_config)])
    index = load([source("user", user), source("shipped", shipped, immutable=True)])
    assert lookup(index, batch=8) == user_config
    assert lookup(index, batch=16) is not None
    assert [(s.name, s.rows, s.usable, s.used) for s in index.sources] == [
        ("user", 1, 1, 1),
        ("shipped", 2, 2, 1),
    ]


def test_failing_space_lookup_makes_rows_unusable_not_the_load(tmp_path: Path) -> None:
    def broken(kernel: str, backend: str) -> None:
        raise RuntimeError("registry exploded")

    index = load([source("a", write_db(tmp_path / "a.db", [make_row()]))], spaces=broken)
    assert len(index) == 0
    assert (index.sources[0].status, index.sources[0].rows) == ("read", 1)


def test_unusable_row_does_not_hide_a_usable_one(tmp_path: Path) -> None:
    invalid = {"BLOCK_V": 3, "num_warps": 4, "waves_per_eu": 0}
    user = write_db(tmp_path / "user.db", [make_row(config=invalid)])
    shipped = write_db(tmp_path / "shipped.db", [make_row()])
    index = load([source("user", user), source("shipped", shipped)])
    assert lookup(index) == make_row().config


def test_default_sources_spectune_db_then_user_then_shipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_config = {"BLOCK_V": 256, "num_warps": 4, "waves_per_eu": 0}
    user_config = {"BLOCK_V": 512, "num_warps": 4, "waves_per_eu": 0}
    user_rows = [make_row(config=user_config), make_row(batch=16, config=user_config)]
    write_db(tmp_path / "home" / "spectune.db", user_rows)
    index = load()
    assert lookup(index) == user_config
    assert [s.name for s in index.sources] == ["user", "shipped"]
    assert index.sources[1].status == "read"  # the shipped database: empty, with the schema
    monkeypatch.setenv("SPECTUNE_DB", write_db(tmp_path / "env.db", [make_row(config=env_config)]))
    index = load()
    assert lookup(index) == env_config
    assert lookup(index, batch=16) == user_config
    assert "SPECTUNE_DB" in index.describe()


def test_absent_user_database_is_not_created(tmp_path: Path) -> None:
    index = load()
    assert index.sources[0].status == "absent"
    assert not (tmp_path / "home").exists()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_loading_never_writes(tmp_path: Path) -> None:
    path = Path(write_db(tmp_path / "a.db", [make_row()]))
    shipped = Path(write_db(tmp_path / "shipped.db", [make_row(batch=16)]))
    before = {p: (_digest(p), p.stat().st_mtime_ns) for p in (path, shipped)}
    load([source("a", str(path)), source("shipped", str(shipped), immutable=True)])
    assert {p: (_digest(p), p.stat().st_mtime_ns) for p in (path, shipped)} == before


BAD_FILES = {
    "text.db": b"this is not a database\n" * 100,
    "corrupt.db": b"SQLite format 3\x00" + bytes(range(256)) * 16,
    "empty-header.db": b"\x00" * 4096,
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_sources_are_logged_and_skipped(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = tmp_path / name
    bad.write_bytes(BAD_FILES[name])
    good = write_db(tmp_path / "good.db", [make_row()])
    with caplog.at_level(logging.WARNING, logger="spectune.db"):
        index = load([source("bad", str(bad)), source("good", good)])
    assert lookup(index) is not None
    assert index.sources[0].status == "error"
    assert str(bad) in index.sources[0].error or "database" in index.sources[0].error
    assert any("skipping tuned-config database" in r.message for r in caplog.records)
    assert "Traceback" not in caplog.text


def test_unreachable_postgres_is_skipped(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/nothing"
    good = write_db(tmp_path / "good.db", [make_row()])
    index = load([Source(name="pg", url=parse_target(url)), source("good", good)])
    assert index.sources[0].status == "error"
    assert "cannot connect" in index.sources[0].error
    assert lookup(index) is not None


def test_bad_spectune_db_is_skipped_and_bad_arguments_give_an_empty_index(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write_db(tmp_path / "home" / "spectune.db", [make_row()])
    monkeypatch.setenv("SPECTUNE_DB", "mysql://x@y/z")
    index = load()
    assert [(s.name, s.status) for s in index.sources] == [
        ("SPECTUNE_DB", "error"), ("user", "read"), ("shipped", "read")
    ]
    assert "unsupported database 'mysql'" in index.sources[0].error
    assert lookup(index) == make_row().config
    monkeypatch.delenv("SPECTUNE_DB")
    assert len(load()) == 1
    assert len(load(device="MI300X")) == 0
    assert len(load(kernel_hashes=None)) == 0


def entry(index: ConfigIndex, **problem: object) -> IndexEntry | None:
    fields = {"spec_len": 4, "batch": 8, "vocab": 128256, "dtype": "bfloat16",
              "draft_probs": True} | problem  # fmt: skip
    return index.entry(
        device=MI300X, software=SOFTWARE, kernel=KERNEL, problem=Problem(**fields)  # type: ignore[arg-type]
    )


def test_entry_holds_the_comparison_with_vllm(db_url: str) -> None:
    other = {"BLOCK_V": 2048, "num_warps": 8, "waves_per_eu": 2}
    write_db(db_url, [
        make_row(batch=8, vllm=VllmComparison("faster", 14.0, "0.32.0")),
        make_row(batch=16, config=other, vllm=VllmComparison("not faster", 9.0, "0.33.0")),
        make_row(batch=32, vllm=VllmComparison(reason="vLLM is not installed")),
    ])  # fmt: skip
    index = load([Source(name="db", url=parse_target(db_url))])
    found = entry(index, batch=11)  # bucket 8, as lookup matches
    assert found == IndexEntry(make_row().config, "faster", "0.32.0")
    assert isinstance(found, IndexEntry)
    assert (found.config, found.vs_vllm, found.vllm_version) == tuple(found)
    assert entry(index, batch=16) == (other, "not faster", "0.33.0")
    assert entry(index, batch=32) == (make_row().config, "not measured", None)
    for batch in (11, 16, 32):
        assert entry(index, batch=batch).config == lookup(index, batch=batch)  # type: ignore[union-attr]
    assert entry(index, batch=64) is None and lookup(index, batch=64) is None
    assert index.count_faster(vllm_version="0.32.0") == 1
    assert index.count_faster(vllm_version="0.33.0") == 0  # "not faster" there
    assert index.count_faster(vllm_version=None) == 0
    assert ConfigIndex().count_faster(vllm_version="0.32.0") == 0
    assert entry(index, vocab=1000) is None
    entry(index).config["BLOCK_V"] = 1  # type: ignore[union-attr]
    assert entry(index).config["BLOCK_V"] == 1024  # type: ignore[union-attr]
    problem = Problem(4, 8, 128256, "bfloat16", True)
    assert index.entry(device=H200, software=SOFTWARE, kernel=KERNEL, problem=problem) is None
    assert index.entry(device=None, software=None, kernel=None, problem=None) is None  # type: ignore[arg-type]


def test_a_malformed_comparison_reads_as_not_measured(tmp_path: Path) -> None:
    compared = VllmComparison("faster", 14.0, "0.32.0")
    path = write_db(tmp_path / "a.db", [make_row(batch=b, vllm=compared) for b in (1, 2, 4, 8)])
    with sqlite3.connect(path) as edit:  # edited by hand: never served as "faster"
        edit.execute("UPDATE tuned_configs SET vs_vllm = 'FASTER!' WHERE batch = 1")
        edit.execute("UPDATE tuned_configs SET vllm_version = NULL WHERE batch = 2")
        edit.execute("UPDATE tuned_configs SET vllm_version = '../0.32' WHERE batch = 4")
    edit.close()
    index = load([source("a", path)])
    assert [entry(index, batch=b) for b in (1, 2, 4, 8)] == [
        *[(make_row().config, "not measured", None)] * 3,
        (make_row().config, "faster", "0.32.0"),
    ]
    (report,) = index.sources
    assert (report.rows, report.usable, report.used, report.malformed) == (4, 4, 4, 0)


def test_lookup_never_raises_on_garbage(tmp_path: Path) -> None:
    index = load([source("a", write_db(tmp_path / "a.db", [make_row()]))])
    assert index.lookup(device=None, software=None, kernel=None, problem=None) is None  # type: ignore[arg-type]
    bad_problem = Problem(4, 8, 128256)
    object.__setattr__(bad_problem, "batch", -3)
    found = index.lookup(device=MI300X, software=SOFTWARE, kernel=KERNEL, problem=bad_problem)
    assert found is None


def test_postgres_source_through_spectune_db(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    write_db(pg_url, [make_row()])
    monkeypatch.setenv("SPECTUNE_DB", pg_url)
    index = load()
    assert lookup(index) == make_row().config
    assert index.sources[0].name == "SPECTUNE_DB"
    assert index.sources[0].rows == 1
