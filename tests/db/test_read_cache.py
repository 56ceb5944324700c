"""The read cache: what load_index read from a SQLite file, kept while the file is unchanged.

A load served from the cache gives what reading the file gives (rows, counts, malformed
rows, lookups), since only what SQLite returned is kept and every check runs again; any
change of the file, or of its -wal, means reading it again.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from array import array
from pathlib import Path
from typing import Any

import pytest

import spectune.db._config_index as config_index
from spectune.db import ConfigIndex, Source, VllmComparison, load_index, parse_target
from spectune.db._read_cache import _FORMAT, ReadCache, wait_kept
from spectune.space import Problem

from .conftest import KERNEL, KERNEL_HASH, MI300X, SOFTWARE, SPACE, make_row, write_db

HASHES = {KERNEL: KERNEL_HASH}


@pytest.fixture(autouse=True)
def _settled_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Files count as settled as soon as written (the tests make no concurrent writes),
    and the user database's folder exists (the cache is made only beside it)."""
    monkeypatch.setattr("spectune.db._read_cache.SETTLED_S", 0.0)
    (tmp_path / "home").mkdir()


def load(path: Path, *, kernel_hashes: dict[str, str] = HASHES) -> ConfigIndex:
    return load_index(device=MI300X, software=SOFTWARE, kernel_hashes=kernel_hashes,
                      spaces={KERNEL: SPACE},
                      sources=[Source(name="db", url=parse_target(str(path)))])  # fmt: skip


def kept(tmp_path: Path) -> list[Path]:
    wait_kept()  # a load keeps what it read on a thread of its own
    return sorted((tmp_path / "home").glob("spectune.db.read-cache/*.rows"))


def summary(index: ConfigIndex) -> list[tuple[Any, ...]]:
    return [(s.name, s.status, s.rows, s.usable, s.used, s.malformed) for s in index.sources]


def no_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("the database was read")

    monkeypatch.setattr(config_index, "reading", fail)


def problem(**fields: Any) -> Problem:
    values = {"spec_len": 4, "batch": 8, "vocab": 128256, "dtype": "bfloat16",
              "draft_probs": True} | fields  # fmt: skip
    return Problem(**values)


def test_an_unchanged_file_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = Path(write_db(tmp_path / "env.db", [make_row(batch=b) for b in (1, 2, 4, 8)]))
    first = load(path)
    assert len(kept(tmp_path)) == 1
    no_reading(monkeypatch)
    again = load(path)
    assert summary(again) == summary(first) == [("db", "read", 4, 4, 4, 0)]
    found = again.lookup(device=MI300X, software=SOFTWARE, kernel=KERNEL, problem=problem())
    assert found == make_row().config


def test_the_rows_are_kept_after_the_load_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Writing the copy is off the worker's start-up path: the load does not wait for it.
    release = threading.Event()
    real_keep = ReadCache.keep

    def keep_when_released(self: ReadCache, total: int, groups: Any) -> None:
        release.wait(30)
        real_keep(self, total, groups)

    monkeypatch.setattr(ReadCache, "keep", keep_when_released)
    path = Path(write_db(tmp_path / "env.db", [make_row(batch=b) for b in (1, 2)]))
    started = time.monotonic()
    index = load(path)
    assert time.monotonic() - started < 20
    assert summary(index) == [("db", "read", 2, 2, 2, 0)]
    assert not list((tmp_path / "home").glob("spectune.db.read-cache/*.rows"))
    release.set()
    assert len(kept(tmp_path)) == 1
    no_reading(monkeypatch)
    assert summary(load(path)) == summary(index)


def test_malformed_and_unusable_rows_count_alike(tmp_path: Path) -> None:
    rows = [make_row(spec_len=k) for k in (1, 2, 3)]
    rows.append(make_row(spec_len=4, config={"BLOCK_V": 1000, "num_warps": 4, "waves_per_eu": 0}))
    path = Path(write_db(tmp_path / "env.db", rows))
    with sqlite3.connect(path) as edit:  # a config edited into nonsense
        edit.execute("UPDATE tuned_configs SET config = '{\"BLOCK_V\": ' WHERE spec_len = 2")
    edit.close()
    first, again = load(path), load(path)
    assert kept(tmp_path)
    assert summary(again) == summary(first)
    assert summary(first)[0] == ("db", "read", 4, 2, 2, 1)


@pytest.mark.parametrize("how", ["a row added", "a row changed", "the file replaced"])
def test_a_changed_file_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    path = Path(write_db(tmp_path / "env.db", [make_row(batch=1)]))
    assert summary(load(path))[0][2:5] == (1, 1, 1)
    if how == "a row added":  # into the -wal file (a writer's connection is WAL)
        write_db(path, [make_row(batch=2)])
        expected = (2, 2, 2)
    elif how == "a row changed":
        with sqlite3.connect(path) as edit:
            edit.execute("UPDATE tuned_configs SET config = '{\"BLOCK_V\": 256, "
                         "\"num_warps\": 8, \"waves_per_eu\": 0}'")  # fmt: skip
        edit.close()
        expected = (1, 0, 0)  # 256 < 64 * 8: outside the space now
    else:
        other = Path(write_db(tmp_path / "other.db", [make_row(batch=b) for b in (1, 2, 4)]))
        other.replace(path)
        expected = (3, 3, 3)
    assert summary(load(path))[0][2:5] == expected


def test_files_not_settled_are_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("spectune.db._read_cache.SETTLED_S", 3600.0)
    path = Path(write_db(tmp_path / "env.db", [make_row()]))
    load(path)
    assert not kept(tmp_path)


def test_nothing_is_kept_without_the_user_database_folder(tmp_path: Path) -> None:
    (tmp_path / "home").rmdir()
    path = Path(write_db(tmp_path / "env.db", [make_row()]))
    assert summary(load(path))[0][2:5] == (1, 1, 1)
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    "damage", ["empty", "not ours", "truncated", "longer", "another key", "index out of range"]
)
def test_a_bad_cache_file_means_reading(tmp_path: Path, damage: str) -> None:
    path = Path(write_db(tmp_path / "env.db", [make_row(batch=b) for b in (1, 2)]))
    first = load(path)
    (file,) = kept(tmp_path)
    content = file.read_bytes()
    header, _, payload = content.partition(b"\n")
    if damage == "empty":
        content = b""
    elif damage == "not ours":
        content = b"\xe9" * 64
    elif damage == "truncated":
        content = content[:-8]
    elif damage == "longer":
        content += array("q", [0]).tobytes()
    elif damage == "another key":
        described = json.loads(header)
        described["key"][1] = str(tmp_path / "elsewhere.db")
        content = json.dumps(described).encode() + b"\n" + payload
    else:  # the last value of the config column: an index past its strings
        content = content[:-8] + array("q", [99]).tobytes()
    file.write_bytes(content)
    assert summary(load(path)) == summary(first)
    assert load(path).lookup(device=MI300X, software=SOFTWARE, kernel=KERNEL,
                             problem=problem(batch=2)) == make_row().config  # fmt: skip


def test_rows_of_other_values_are_not_kept(tmp_path: Path) -> None:
    path = Path(write_db(tmp_path / "env.db", [make_row(spec_len=k) for k in (1, 2)]))
    with sqlite3.connect(path) as edit:  # a BLOB where the config is: a malformed row
        edit.execute("UPDATE tuned_configs SET config = ? WHERE spec_len = 2", (b"\xff\x00",))
    edit.close()
    first = load(path)
    assert summary(first)[0] == ("db", "read", 2, 1, 1, 1)
    assert not kept(tmp_path)
    assert summary(load(path)) == summary(first)


def test_other_kernel_hashes_replace_the_kept_rows(tmp_path: Path) -> None:
    path = Path(write_db(tmp_path / "env.db", [make_row()]))
    load(path)
    before = kept(tmp_path)
    assert summary(load(path, kernel_hashes={KERNEL: "feedface"}))[0][2:5] == (1, 0, 0)
    after = kept(tmp_path)
    assert len(after) == len(before) == 1 and after != before


def reads_counted(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The databases read from now on (not their kept rows)."""
    read: list[object] = []
    real = config_index.reading

    def counting(url: Any, **options: Any) -> Any:
        read.append(url)
        return real(url, **options)

    monkeypatch.setattr(config_index, "reading", counting)
    return read


def test_the_comparison_with_vllm_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    faster = VllmComparison("faster", 14.0, "0.32.0")
    raised = VllmComparison(version="0.32.0", reason="vLLM's function raised: boom")
    rows = [make_row(batch=1, vllm=faster), make_row(batch=2, vllm=raised), make_row(batch=4)]
    path = Path(write_db(tmp_path / "env.db", rows))
    first = load(path)
    assert kept(tmp_path)
    no_reading(monkeypatch)
    again = load(path)
    expected = [(make_row().config, "faster", "0.32.0"),
                (make_row().config, "not measured", "0.32.0"),
                (make_row().config, "not measured", None)]  # fmt: skip
    for index in (first, again):
        found = [index.entry(device=MI300X, software=SOFTWARE, kernel=KERNEL,
                             problem=problem(batch=b)) for b in (1, 2, 4)]  # fmt: skip
        assert found == expected


def test_a_cache_file_of_the_old_format_means_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Format 1 kept no comparison with vLLM, and no NULL: its files must not be used.
    path = Path(write_db(tmp_path / "env.db", [make_row(vllm=VllmComparison(
        "faster", 14.0, "0.32.0"))]))  # fmt: skip
    load(path)
    (file,) = kept(tmp_path)
    header, _, payload = file.read_bytes().partition(b"\n")
    described = json.loads(header)
    assert described["key"][0] == _FORMAT and _FORMAT.startswith("spectune-read-cache-2-")
    described["key"][0] = _FORMAT.replace("-2-", "-1-")
    file.write_bytes(json.dumps(described).encode() + b"\n" + payload)
    read = reads_counted(monkeypatch)
    again = load(path)
    assert len(read) == 1
    assert again.entry(device=MI300X, software=SOFTWARE, kernel=KERNEL,
                       problem=problem()) == (make_row().config, "faster", "0.32.0")


def test_postgres_is_not_cached() -> None:
    from spectune.db import parse_target

    url = parse_target("postgresql+psycopg://user@localhost:1/db")
    assert ReadCache.of(url, running=(), kernel_hashes={}, columns=()) is None
