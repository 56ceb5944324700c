"""The one reader per storage (``spectune.db._reader``): SQLite with ``sqlite3``, PostgreSQL
with ``psycopg``, the same SQL.

``load_index`` is checked against an oracle built from the per-row validator
(``check_row``) on rows of every verdict, including rows edited by hand; the store's
readers and ``load_index`` refuse the same databases with the same one-line messages.
Every test that can runs on both storages.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from spectune.db import ConfigIndex, DatabaseError, TunedRow, load_index, open_store
from spectune.db._checks import Spaces, check_row
from spectune.db._locations import Source, parse_target
from spectune.db._reader import HEAD_REVISION
from spectune.db.errors import InvalidRowError
from spectune.identity import DeviceIdentity, SoftwareIdentity
from spectune.space import Param, Problem, SearchSpace

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


def is_postgres(db: str) -> bool:
    return db.startswith("postgresql")


def run_sql(db: str, *statements: str, params: Sequence[Any] = ()) -> None:
    """Run statements on a database as a hand edit would (``?`` placeholders)."""
    if is_postgres(db):
        import psycopg

        with psycopg.connect(**parse_target(db).connect_params()) as connection:
            for statement in statements:
                connection.execute(statement.replace("?", "%s"), params or None)
        return
    connection = sqlite3.connect(db)
    try:
        with connection:
            for statement in statements:
                connection.execute(statement, params)
    finally:
        connection.close()


def mixed_rows() -> list[TunedRow]:
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
    ]  # fmt: skip
    return rows


# Configs stored by hand, per batch (every row of the batch): what a stored value a
# TunedRow would refuse does to the serving path. PostgreSQL's json column holds
# only JSON, so the values that are not JSON are SQLite's alone.
EDITS: dict[int, object] = {
    2: json.dumps({"BLOCK_V": True, "num_warps": 4, "waves_per_eu": 0}),
    4: "42",
    8: json.dumps([1, 2]),
    16: "{}",
}
SQLITE_EDITS: dict[int, object] = {
    1: "{not json",
    4: 42,
    32: b'{"BLOCK_V": 512, "num_warps": 2, "waves_per_eu": 0}',
}


def edits_for(db: str) -> dict[int, object]:
    return EDITS if is_postgres(db) else {**EDITS, **SQLITE_EDITS}


def mixed_db(db: str) -> str:
    write_db(db, mixed_rows())
    for batch, value in edits_for(db).items():
        placeholder = "CAST(? AS json)" if is_postgres(db) else "?"
        run_sql(db, f"UPDATE tuned_configs SET config = {placeholder} WHERE batch = ?",
                params=(value, batch))  # fmt: skip
    return db


def as_stored(row: TunedRow, edits: dict[int, object]) -> TunedRow | None:
    """The row as the database holds it after the edits; ``None`` if no row could be."""
    if row.problem.batch not in edits:
        return row
    try:
        config = json.loads(edits[row.problem.batch])  # type: ignore[arg-type]
        return replace(row, config=config)
    except (TypeError, ValueError):
        return None


def oracle(
    sources: Sequence[tuple[str, list[TunedRow], dict[int, object]]],
    *,
    spaces: Spaces | None,
    device: DeviceIdentity = MI300X,
    software: SoftwareIdentity = SOFTWARE,
    kernel_hashes: dict[str, str] = HASHES,
) -> tuple[dict[tuple[Any, ...], dict[str, int]], list[tuple[str, str, int, int, int]]]:
    """What load_index must find, by ``check_row`` on each row: entries and reports."""
    entries: dict[tuple[Any, ...], dict[str, int]] = {}
    reports = []
    for name, rows, edits in sources:
        usable = used = 0
        for row in rows:
            stored = as_stored(row, edits)
            if stored is None or not check_row(stored, device=device, software=software,
                                                kernel_hashes=kernel_hashes,
                                                spaces=spaces).usable:  # fmt: skip
                continue
            usable += 1
            p = stored.problem
            key = (stored.kernel, p.spec_len, p.batch, p.vocab, p.dtype, p.draft_probs)
            if key not in entries:
                entries[key] = stored.config
                used += 1
        reports.append((name, "read", len(rows), usable, used))
    return entries, reports


def assert_index(index: ConfigIndex, entries: dict[tuple[Any, ...], dict[str, int]],
                 *, device: DeviceIdentity = MI300X,
                 software: SoftwareIdentity = SOFTWARE) -> None:  # fmt: skip
    assert len(index) == len(entries)
    for (kernel, k, batch, vocab, dtype, draft), config in entries.items():
        problem = Problem(spec_len=k, batch=batch, vocab=vocab, dtype=dtype, draft_probs=draft)
        found = index.lookup(device=device, software=software, kernel=kernel, problem=problem)
        assert found == config, (kernel, problem)
        assert type(found) is dict


def load(sources: list[Source], spaces: Spaces | None = SPACES, **system: Any) -> ConfigIndex:
    arguments = {"device": MI300X, "software": SOFTWARE, "kernel_hashes": HASHES} | system
    return load_index(spaces=spaces, sources=sources, **arguments)


def reports(index: ConfigIndex) -> list[tuple[str, str, int, int, int]]:
    return [(s.name, s.status, s.rows, s.usable, s.used) for s in index.sources]


@pytest.mark.parametrize(
    "spaces", [SPACES, None, {KERNEL: SPACE}], ids=["spaces", "shape-only", "one-space"]
)
def test_index_is_what_the_validator_says(
    db_url: str, tmp_path: Path, spaces: Spaces | None
) -> None:
    mixed = mixed_db(db_url)
    second_rows = [
        make_row(batch=64, config=VALID[2]),  # same key as a mixed row: the first wins
        make_row(batch=1, config=VALID[0]),  # the key whose mixed row may be unusable
        make_row(batch=8192, config=VALID[1]),
    ]
    second = write_db(tmp_path / "second.db", second_rows)
    sources = [
        Source(name="mixed", url=parse_target(mixed)),
        Source(name="absent", url=parse_target(str(tmp_path / "absent.db"))),
        Source(name="second", url=parse_target(second), immutable=True),
    ]
    index = load(sources, spaces)
    entries, expected = oracle(
        [("mixed", mixed_rows(), edits_for(db_url)), ("second", second_rows, {})],
        spaces=spaces,
    )
    assert_index(index, entries)
    assert reports(index) == [expected[0], ("absent", "absent", 0, 0, 0), expected[1]]
    assert len(index) > 10
    assert 0 < index.sources[0].usable < index.sources[0].rows == len(mixed_rows())


@pytest.mark.parametrize(
    "system",
    [
        {"device": H200},
        {"device": replace(MI300X, cu_count=80)},
        {"software": replace(SOFTWARE, triton="3.1.0")},
        {"kernel_hashes": {}},
        {"kernel_hashes": {OTHER: OTHER_HASH}},
        {"kernel_hashes": {KERNEL: "0000000000000000"}},
    ],
    ids=["h200", "partition", "triton", "no-kernels", "other-kernel", "other-hash"],
)
def test_index_on_other_running_systems(db_url: str, system: dict[str, Any]) -> None:
    index = load([Source(name="mixed", url=parse_target(mixed_db(db_url)))], **system)
    entries, expected = oracle([("mixed", mixed_rows(), edits_for(db_url))], spaces=SPACES,
                               **system)  # fmt: skip
    assert_index(index, entries, **{k: v for k, v in system.items() if k != "kernel_hashes"})
    assert reports(index) == expected


def test_store_names_a_row_edited_into_nonsense(db_url: str) -> None:
    write_db(db_url, [make_row(batch=1), make_row(batch=2)])
    bad = "{}" if is_postgres(db_url) else "{not json"
    placeholder = "CAST(? AS json)" if is_postgres(db_url) else "?"
    run_sql(db_url, f"UPDATE tuned_configs SET config = {placeholder} WHERE batch = 2",
            params=(bad,))  # fmt: skip
    with open_store(db_url, readonly=True) as store:
        assert store.count() == 2
        with pytest.raises(InvalidRowError, match=r"row id \d+: config (must not be empty|is not)"):
            store.rows()
        assert len(store.rows(kernel=KERNEL, device_name="NVIDIA_H200")) == 0


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
        assert parse_target(target).is_sqlite
        index = load([Source(name="odd", url=parse_target(target))])
        assert len(index) == found, index.describe()
        assert index.sources[0].status == ("read" if found else "absent")


def _bad_database(kind: str, db: str) -> str:
    """Make ``db`` a database of ``kind``; returns it (SQLite: a file path)."""
    path = Path(db)
    if kind == "text":
        path.write_bytes(b"this is not a database\n" * 100)
    elif kind == "corrupt":
        path.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 16)
    elif kind == "zeros":
        path.write_bytes(b"\x00" * 4096)
    elif kind == "empty-file":
        path.write_bytes(b"")
    elif kind == "empty" and is_postgres(db):
        pass  # a new PostgreSQL database: no tables at all
    elif kind == "directory":
        path.mkdir()
    elif kind == "foreign":
        run_sql(db, "CREATE TABLE things (id INTEGER PRIMARY KEY, name TEXT)")
    elif kind == "revision-0001" and not is_postgres(db):
        shutil.copyfile(ASSETS / "schema_0001.db", path)
    else:
        write_db(db, [make_row()])
        statements = {
            "revision-0001": ("ALTER TABLE tuned_configs DROP COLUMN history",
                              "UPDATE alembic_version SET version_num = '0001'"),
            "newer-revision": ("UPDATE alembic_version SET version_num = '9999'",),
            "several-revisions": ("INSERT INTO alembic_version VALUES ('0001')",),
            "no-revision-row": ("DELETE FROM alembic_version",),
            "missing-table": ("DROP TABLE tuned_configs",),
            "missing-column": ("ALTER TABLE tuned_configs DROP COLUMN study",),
            "no-version-column": ("DROP TABLE alembic_version",
                                  "CREATE TABLE alembic_version (version TEXT)"),
        }  # fmt: skip
        if kind == "truncated":
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2])
        else:
            run_sql(db, *statements[kind])
    return db


NOT_SQLITE = "{db} is not a SQLite database (file is not a database)"
#: Each kind of database a reader refuses, and the one line it says (``{db}``: where).
BAD = {
    "text": NOT_SQLITE,
    "corrupt": NOT_SQLITE,
    "zeros": NOT_SQLITE,
    "empty-file": "{db} has no spectune tables",
    "empty": "{db} has no spectune tables",
    "directory": "no database file at {db}",
    "truncated": "{db} is corrupt (database disk image is malformed)",
    "foreign": "{db} is not a spectune database (it has tables [\"'things'\"] but no schema "
    "revision)",
    "revision-0001": f"{{db}} has schema revision 0001, older than this spectune's "
    f"{HEAD_REVISION}; run: spectune db upgrade --db {{db}}",
    "newer-revision": "{db} has schema revision '9999', which this spectune does not know "
    f"(newest known: {HEAD_REVISION}); it was written by a newer spectune: upgrade spectune "
    "to use it",
    "several-revisions": f"several schema revisions recorded: [\"'0001'\", \"'{HEAD_REVISION}'\"]",
    "no-revision-row": "{db} is not a spectune database (it has tables [\"'alembic_version'\", "
    "\"'nightly_results'\", \"'nightly_runs'\", \"'tuned_configs'\"] but no schema revision)",
    "missing-table": "{db} is missing table 'tuned_configs'",
    "missing-column": "{db}: table 'tuned_configs' lacks column(s) ['study']",
    "no-version-column": "{db}: no such column: version_num",
}
#: What PostgreSQL says where SQLite's words are SQLite's.
BAD_POSTGRES = {"no-version-column": '{db}: column "version_num" does not exist'}
#: Kinds only a file can be, and kinds only a server's database is.
FILE_ONLY = ("text", "corrupt", "zeros", "empty-file", "directory", "truncated")
SERVER_ONLY = ("empty",)
BAD_CASES = [
    *(pytest.param(kind, "sqlite", id=f"sqlite-{kind}") for kind in BAD if kind not in SERVER_ONLY),
    *(pytest.param(kind, "postgresql", id=f"postgresql-{kind}", marks=pytest.mark.postgres)
      for kind in BAD if kind not in FILE_ONLY),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "storage"), BAD_CASES)
def test_bad_databases_are_refused_with_one_clear_line(
    kind: str, storage: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if storage == "sqlite":
        db_url = str(tmp_path / "tuned.db")
    else:
        db_url = request.getfixturevalue("pg_url")
    bad = _bad_database(kind, db_url)
    where = parse_target(bad).display()
    message = (BAD_POSTGRES if is_postgres(db_url) else {}).get(kind, BAD[kind])
    message = message.format(db=where)
    good = write_db(tmp_path / "good.db", [make_row()])
    # The serving path logs it and goes on to the next source...
    index = load([Source(name="bad", url=parse_target(bad)),
                  Source(name="good", url=parse_target(good))])  # fmt: skip
    assert (index.sources[0].status, index.sources[0].error) == ("error", message)
    assert index.sources[1].status == "read"
    assert len(index) == 1
    # ... and every other reader refuses it with the same words.
    with pytest.raises(DatabaseError) as caught:
        open_store(bad, readonly=True)
    assert str(caught.value) == message


def test_reading_postgres_is_read_only(pg_url: str) -> None:
    write_db(pg_url, [make_row()])
    from spectune.db._reader import reading

    with pytest.raises(DatabaseError, match="read-only"), reading(parse_target(pg_url)) as reader:
        reader._connection.execute("DELETE FROM tuned_configs")
    with open_store(pg_url, readonly=True) as store:
        assert store.count() == 1
