"""The serving path's sqlite3 reader: same index and same refusals as SQLAlchemy's, lighter.

``load_index`` reads SQLite files with the standard library (``spectune.db._sqlite``);
PostgreSQL keeps the SQLAlchemy reader (``_load_with_sqlalchemy``), which also reads
SQLite files. These tests run both readers on the same files and compare what they
find, row for row and error for error.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

import spectune.db
from spectune.db import ConfigIndex, Source, display_url, load_index, parse_target
from spectune.db._checks import Checker, Spaces
from spectune.db._index import _load_place, _load_with_sqlalchemy
from spectune.db._locations import sqlite_file_target
from spectune.db._revision import TABLE_COLUMNS
from spectune.space import Param, SearchSpace

from .conftest import ASSETS, H200, KERNEL, KERNEL_HASH, MI300X, SOFTWARE, SPACE, make_row, write_db

OTHER = "other_family"
OTHER_HASH = "feedfacefeedface"
OTHER_SPACE = SearchSpace(params=(Param("BLOCK_V", (128, 256)), Param("num_warps", (1, 2))))
HASHES = {KERNEL: KERNEL_HASH, OTHER: OTHER_HASH}
SPACES = {KERNEL: SPACE, OTHER: OTHER_SPACE}
VALID = [
    {"BLOCK_V": 1024, "num_warps": 4, "waves_per_eu": 1},
    {"BLOCK_V": 512, "num_warps": 2, "waves_per_eu": 0},
    {"BLOCK_V": 2048, "num_warps": 8, "waves_per_eu": 2},
]


def mixed_rows() -> list[Any]:
    """Rows of every verdict: usable (sharing configs), another device, Triton, hash..."""
    rows = []
    for i, batch in enumerate((1, 2, 4, 8, 16, 32, 64, 128)):
        for k in (1, 2, 3):
            for draft in (True, False):
                rows.append(make_row(batch=batch, spec_len=k, draft_probs=draft,
                                     config=VALID[(i + k) % 3]))  # fmt: skip
    rows += [
        make_row(batch=256, device=H200, config={"BLOCK_V": 1024, "num_warps": 4}),
        make_row(batch=256, device=replace(MI300X, cu_count=80)),
        make_row(batch=256, device=replace(MI300X, warp_size=32)),
        make_row(batch=256, software=replace(SOFTWARE, triton="3.1.0")),
        make_row(batch=256, kernel_hash="0000000000000000"),
        make_row(batch=512, config={"BLOCK_V": 1000, "num_warps": 4, "waves_per_eu": 0}),
        make_row(batch=1024, config={"BLOCK_V": 1024, "num_warps": 4, "bogus": 1}),
        make_row(batch=2048, config={"BLOCK_V": 256, "num_warps": 8, "waves_per_eu": 0}),
        make_row(batch=2048, dtype="float16", config={"BLOCK_V": 1024, "num_warps": 4}),
        make_row(batch=4096, kernel="not_installed"),
        make_row(batch=8, kernel=OTHER, kernel_hash=OTHER_HASH,
                 config={"BLOCK_V": 128, "num_warps": 2}),
        make_row(batch=16, kernel=OTHER, kernel_hash=OTHER_HASH,
                 config={"BLOCK_V": 1024, "num_warps": 2}),
        make_row(batch=32, kernel=OTHER, kernel_hash=KERNEL_HASH,
                 config={"BLOCK_V": 128, "num_warps": 2}),
    ]
    return rows


def hand_edit(path: str | Path, batch: int, config_sql: str, *args: object) -> None:
    """Set the stored config of the rows of ``batch`` as a hand edit would."""
    connection = sqlite3.connect(path)
    with connection:
        connection.execute(f"UPDATE tuned_configs SET config = {config_sql} WHERE batch = ?",
                           (*args, batch))  # fmt: skip
    connection.close()


def mixed_db(path: Path) -> str:
    write_db(path, mixed_rows())
    hand_edit(path, 1, "?", "{not json")
    hand_edit(path, 2, "?", json.dumps({"BLOCK_V": True, "num_warps": 4, "waves_per_eu": 0}))
    hand_edit(path, 4, "?", 42)
    hand_edit(path, 8, "?", json.dumps([1, 2]))
    hand_edit(path, 16, "?", "{}")
    hand_edit(path, 32, "?", b'{"BLOCK_V": 512, "num_warps": 2, "waves_per_eu": 0}')
    return str(path)


def checker(spaces: Spaces | None = SPACES, **overrides: Any) -> Checker:
    arguments = {"device": MI300X, "software": SOFTWARE, "kernel_hashes": HASHES,
                 "spaces": spaces} | overrides  # fmt: skip
    return Checker(**arguments)


def both_readers(
    sources: list[Source], spaces: Spaces | None = SPACES, **overrides: Any
) -> tuple[ConfigIndex, ConfigIndex]:
    """The index of the sqlite3 reader and of the SQLAlchemy reader, same arguments."""
    indexes = []
    for read in (_load_place, _load_with_sqlalchemy):
        check = checker(spaces, **overrides)
        entries: dict[tuple[Any, ...], dict[str, int]] = {}
        reports = []
        for source in sources:
            try:
                reports.append(read(source, check, entries))  # type: ignore[arg-type]
            except Exception as exc:  # _load_with_sqlalchemy raises: report as load_index does
                from spectune.db._index import _skipped

                reports.append(_skipped(source.name, source.location, exc))
        running = (*check.running_device, check.software.triton)
        indexes.append(ConfigIndex(running=running, entries=entries, sources=reports))
    return indexes[0], indexes[1]


def same(fast: ConfigIndex, slow: ConfigIndex) -> None:
    assert fast._entries == slow._entries
    assert {k: type(v) for k, v in fast._entries.items()} == {
        k: type(v) for k, v in slow._entries.items()
    }
    assert fast.sources == slow.sources
    assert fast._running == slow._running


def source(name: str, path: str | Path, *, immutable: bool = False) -> Source:
    return Source(name=name, url=parse_target(str(path)), immutable=immutable)


@pytest.mark.parametrize(
    "spaces", [SPACES, None, {KERNEL: SPACE}], ids=["spaces", "shape-only", "one-space"]
)
def test_sqlite3_reader_builds_the_same_index_as_sqlalchemy(
    tmp_path: Path, spaces: Spaces | None
) -> None:
    mixed = mixed_db(tmp_path / "mixed.db")
    second = write_db(tmp_path / "second.db", [
        make_row(batch=64, config=VALID[2]),  # same key as a mixed row: the first wins
        make_row(batch=1, config=VALID[0]),  # the key whose mixed row is unusable
        make_row(batch=8192, config=VALID[1]),
    ])  # fmt: skip
    sources = [
        source("mixed", mixed),
        source("absent", tmp_path / "absent.db"),
        source("second", second, immutable=True),
    ]
    fast, slow = both_readers(sources, spaces)
    same(fast, slow)
    assert len(fast) > 10
    assert [s.status for s in fast.sources] == ["read", "absent", "read"]
    mixed_report = fast.sources[0]
    assert 0 < mixed_report.usable < mixed_report.rows == len(mixed_rows())
    # And load_index itself (the public entry point) gives that index.
    public = load_index(device=MI300X, software=SOFTWARE, kernel_hashes=HASHES, spaces=spaces,
                        sources=sources)  # fmt: skip
    same(public, slow)


def test_sqlite3_reader_matches_on_other_running_systems(tmp_path: Path) -> None:
    sources = [source("mixed", mixed_db(tmp_path / "mixed.db"))]
    for overrides in (
        {"device": H200},
        {"device": replace(MI300X, cu_count=80)},
        {"software": replace(SOFTWARE, triton="3.1.0")},
        {"kernel_hashes": {}},
        {"kernel_hashes": {OTHER: OTHER_HASH}},
        {"kernel_hashes": {KERNEL: "0000000000000000"}},
    ):
        fast, slow = both_readers(sources, **overrides)
        same(fast, slow)


def test_sqlite_urls_and_paths_with_odd_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "a dir?#%20 é"
    folder.mkdir()
    path = write_db(folder / "t.db", [make_row()])
    monkeypatch.chdir(tmp_path)
    for target, found in (
        (path, 1),
        ("sqlite:///" + quote(path), 1),
        (f"sqlite:///{quote(folder.name)}/t.db", 1),
        (f"sqlite:///{folder.name.replace('?', '%3F')}/t.db", 0),  # '%20' unquoted: absent
    ):
        assert sqlite_file_target(target) is not None
        fast, slow = both_readers([source("odd", target)])
        same(fast, slow)
        assert len(fast) == found, fast.describe()


TARGETS = [
    "tuned.db",
    "dir/tuned.db",
    "~/tuned.db",
    "/abs/tuned.db",
    "a b.db",
    "sqlite:///rel.db",
    "sqlite:////abs/x.db",
    "sqlite+pysqlite:///x%20y.db",
    "sqlite:///a@b:c/d.db",
    "sqlite:///x#y.db",
    "sqlite:///",
    "sqlite://",
    "sqlite:///:memory:",
    "sqlite:///x.db?mode=ro",
    "sqlite+pysqlcipher:///x.db",
    "SQLITE:///x.db",
    " sqlite:///x.db",
    "sqlite://host/x.db",
    "postgresql+psycopg://u:p@h/db",
    "postgresql://u@h/db",
    "mysql://x@y/z",
    "   ",
    "",
]


@pytest.mark.parametrize("target", TARGETS)
def test_sqlite_file_target_agrees_with_parse_target(target: str) -> None:
    found = sqlite_file_target(target)
    if found is None:
        return  # load_index asks parse_target, as before
    url = parse_target(target)
    assert url.get_backend_name() == "sqlite"
    assert found == url.database == display_url(url)


def _revision(path: Path, *versions: str) -> None:
    connection = sqlite3.connect(path)
    with connection:
        connection.execute("DELETE FROM alembic_version")
        connection.executemany("INSERT INTO alembic_version VALUES (?)", [(v,) for v in versions])
    connection.close()


def _sql(path: Path, *statements: str) -> None:
    connection = sqlite3.connect(path)
    with connection:
        for statement in statements:
            connection.execute(statement)
    connection.close()


def _bad_file(kind: str, path: Path) -> Path:
    if kind == "text":
        path.write_bytes(b"this is not a database\n" * 100)
    elif kind == "corrupt":
        path.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 16)
    elif kind == "zeros":
        path.write_bytes(b"\x00" * 4096)
    elif kind == "empty-file":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    elif kind == "foreign":
        _sql(path, "CREATE TABLE things (id INTEGER PRIMARY KEY, name TEXT)")
    elif kind == "revision-0001":
        shutil.copyfile(ASSETS / "schema_0001.db", path)
    else:
        write_db(path, [make_row()])
        if kind == "newer-revision":
            _revision(path, "9999")
        elif kind == "several-revisions":
            _revision(path, "0001", "0002")
        elif kind == "no-revision-row":
            _revision(path)
        elif kind == "missing-table":
            _sql(path, "DROP TABLE tuned_configs")
        elif kind == "missing-column":
            _sql(path, "ALTER TABLE tuned_configs DROP COLUMN study")
        elif kind == "no-version-column":
            _sql(path, "DROP TABLE alembic_version",
                 "CREATE TABLE alembic_version (version TEXT)")  # fmt: skip
        elif kind == "truncated":
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2])
        else:
            raise AssertionError(kind)
    return path


BAD_KINDS = [
    "text",
    "corrupt",
    "zeros",
    "empty-file",
    "directory",
    "foreign",
    "revision-0001",
    "newer-revision",
    "several-revisions",
    "no-revision-row",
    "missing-table",
    "missing-column",
    "no-version-column",
    "truncated",
]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_files_are_skipped_with_the_same_reason(kind: str, tmp_path: Path) -> None:
    bad = _bad_file(kind, tmp_path / f"{kind}.db")
    good = write_db(tmp_path / "good.db", [make_row()])
    sources = [source("bad", bad), source("good", good)]
    fast, slow = both_readers(sources)
    same(fast, slow)
    report = fast.sources[0]
    assert report.status == "error", report
    assert report.error and "\n" not in report.error
    assert str(bad) in report.error or kind == "several-revisions"
    assert fast.sources[1].status == "read"
    assert len(fast) == 1
    # The public entry point never raises on it either.
    index = load_index(device=MI300X, software=SOFTWARE, kernel_hashes=HASHES, spaces=SPACES,
                       sources=sources)  # fmt: skip
    same(index, slow)


def test_table_columns_are_the_models() -> None:
    from spectune.db._models import TunedConfigRecord

    assert set(TABLE_COLUMNS) == set(TunedConfigRecord.__table__.columns.keys())
    assert len(TABLE_COLUMNS) == len(set(TABLE_COLUMNS))


def test_every_public_name_is_importable() -> None:
    for name in spectune.db.__all__:
        assert getattr(spectune.db, name) is not None, name
        assert name in dir(spectune.db)
    with pytest.raises(AttributeError):
        spectune.db.no_such_name  # noqa: B018
    namespace: dict[str, Any] = {}
    exec("from spectune.db import *", namespace)
    assert set(spectune.db.__all__) <= set(namespace)


_CHILD = textwrap.dedent(
    """
    import json, sys
    import spectune.db
    from spectune.db import load_index
    from spectune.identity import DeviceIdentity, SoftwareIdentity

    device = DeviceIdentity(**json.loads(sys.argv[1]))
    software = SoftwareIdentity(**json.loads(sys.argv[2]))
    index = load_index(device=device, software=software,
                       kernel_hashes=json.loads(sys.argv[3]))
    heavy = sorted(m for m in sys.modules
                   if m.split(".")[0] in ("sqlalchemy", "alembic", "psycopg"))
    print(json.dumps({"heavy": heavy, "len": len(index),
                      "sources": [[s.name, s.status, s.rows] for s in index.sources]}))
    """
)


@pytest.mark.parametrize("form", ["path", "url", "user-only"])
def test_import_and_load_from_sqlite_never_import_sqlalchemy(
    form: str, tmp_path: Path
) -> None:
    from dataclasses import asdict

    user = write_db(tmp_path / "home" / "spectune.db", [make_row(batch=16)])
    env_db = write_db(tmp_path / "env.db", [make_row(batch=8)])
    environment = dict(os.environ, SPECTUNE_USER_DB=user)
    environment.pop("SPECTUNE_DB", None)
    if form == "path":
        environment["SPECTUNE_DB"] = env_db
    elif form == "url":
        environment["SPECTUNE_DB"] = "sqlite:///" + env_db
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(asdict(MI300X)), json.dumps(asdict(SOFTWARE)),
         json.dumps({KERNEL: KERNEL_HASH})],
        capture_output=True, text=True, env=environment, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["heavy"] == []
    names = [name for name, _, _ in found["sources"]]
    if form == "user-only":
        assert names == ["user", "shipped"]
        assert found["len"] == 1
    else:
        assert names == ["SPECTUNE_DB", "user", "shipped"]
        assert found["len"] == 2
    assert all(status == "read" for _, status, _ in found["sources"])
