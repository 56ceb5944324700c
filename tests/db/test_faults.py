"""Faults: killed writers, corrupt and truncated files, nothing executed from a database."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from spectune.db import DatabaseError, load_index, open_store
from spectune.db._locations import Source, parse_target
from spectune.db.errors import NotADatabaseError

from .conftest import KERNEL, KERNEL_HASH, MI300X, SOFTWARE, make_row

REPO = Path(__file__).resolve().parents[2]

# A writer that commits 10 rows, then inserts 500 more in a transaction it never ends.
_KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    from sqlalchemy.orm import Session
    from spectune.db import open_store
    from spectune.db._models import TunedConfigRecord
    from spectune.db._writer import record_values
    from tests.db.conftest import make_row

    store = open_store(sys.argv[1])
    store.record_many([make_row(spec_len=k) for k in range(1, 11)])
    with Session(store._engine) as session, session.begin():
        for k in range(11, 511):
            session.add(TunedConfigRecord(**record_values(make_row(spec_len=k))))
        session.flush()
        print("in transaction", flush=True)
        time.sleep(120)
    """
)


def test_process_killed_mid_transaction_leaves_a_consistent_file(tmp_path: Path) -> None:
    path = tmp_path / "killed.db"
    writer = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None
        line = writer.stdout.readline()
        assert line.strip() == "in transaction", writer.stderr.read() if writer.stderr else ""
        assert (tmp_path / "killed.db-wal").stat().st_size > 0  # uncommitted pages on disk
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.wait(timeout=30)
    assert writer.returncode == -signal.SIGKILL
    with open_store(path, readonly=True) as store:
        assert store.count() == 10
        assert sorted(r.problem.spec_len for r in store.rows()) == list(range(1, 11))
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        connection.close()
    start = time.monotonic()
    with open_store(path) as store:  # the dead writer's lock is gone: no busy wait
        store.record(make_row(spec_len=600))
        assert store.count() == 11
    assert time.monotonic() - start < 5


def _valid_db(path: Path, rows: int = 300) -> Path:
    with open_store(path) as store:
        store.record_many([make_row(spec_len=k, host="h" * 200) for k in range(1, rows + 1)])
    # The last connection to close folds the WAL into the main file and removes it.
    assert not Path(f"{path}-wal").exists()
    return path


def test_truncated_file_gives_one_clear_error(tmp_path: Path) -> None:
    path = _valid_db(tmp_path / "t.db")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    for extra in ("-wal", "-shm"):
        Path(f"{path}{extra}").unlink(missing_ok=True)
    with pytest.raises(DatabaseError) as caught, open_store(path, readonly=True) as store:
        store.rows()
    message = str(caught.value)
    assert str(path) in message
    assert "\n" not in message
    index = load_index(device=MI300X, software=SOFTWARE, kernel_hashes={KERNEL: KERNEL_HASH},
                       sources=[Source(name="t", url=parse_target(str(path)))])  # fmt: skip
    assert index.sources[0].status == "error"


@pytest.mark.parametrize(
    "content",
    [b"not a database at all\n" * 200, b"SQLite format 3\x00" + os.urandom(8192), b"\x00" * 100],
)
def test_non_sqlite_and_corrupt_files(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.db"
    path.write_bytes(content)
    with pytest.raises(NotADatabaseError, match=r"bad.db (is not a SQLite database|is corrupt)"):
        open_store(path, readonly=True)
    with pytest.raises(NotADatabaseError):
        open_store(path)
    assert path.read_bytes() == content  # the writer did not "repair" someone's file


def test_missing_file_for_readers(tmp_path: Path) -> None:
    with pytest.raises(NotADatabaseError, match="no database file"):
        open_store(tmp_path / "absent.db", readonly=True)
    assert not (tmp_path / "absent.db").exists()


def test_stored_strings_are_data_not_code(tmp_path: Path) -> None:
    """Whatever a file holds is bound as parameters and parsed as JSON, never run."""
    path = tmp_path / "x.db"
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    with open_store(path) as store:
        store.record(make_row(host=payload, study="'); DROP TABLE tuned_configs; --"))
        (row,) = store.rows()
    assert row.host == payload
    assert row.study == "'); DROP TABLE tuned_configs; --"
    with open_store(path, readonly=True) as store:
        assert store.count() == 1
    assert not marker.exists()
