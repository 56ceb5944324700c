"""Concurrent writers: 4 processes writing at once lose no row and no provenance.

Each process writes its rows one transaction per row (as the tuner does), starting at
the same moment on a database that does not exist yet (so they also race to create
the schema). Some keys are written by every process: those rows must end up with one
winner and the other three provenances in its history.

The race to create a database is also run on its own, many times over: a SQLite file's
first switch to WAL fails at once ("database is locked", no busy wait) for a process
that loses it, which one run of the long test meets only now and then.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from spectune.db import DatabaseError, RecordOutcome, open_store

from .conftest import later, make_row

PROCESSES = 4


def _rows(worker: int, own: int, shared: int) -> list[Any]:
    rows = [
        make_row(spec_len=worker + 1, batch=2 ** (i % 12), vocab=1000 + i // 12, host=f"w{worker}")
        for i in range(own)
    ]
    rows += [
        make_row(spec_len=99, vocab=1000 + i, host=f"w{worker}", p50=10.0 + worker,
                 tuned_at=later(worker))
        for i in range(shared)
    ]  # fmt: skip
    return rows


def _writer(target: str, worker: int, own: int, shared: int, barrier: Any, out: Any) -> None:
    rows = _rows(worker, own, shared)
    barrier.wait()
    start = time.perf_counter()
    slowest = 0.0
    outcomes: dict[str, int] = {}
    with open_store(target) as store:
        for row in rows:
            t = time.perf_counter()
            outcome = store.record(row)
            slowest = max(slowest, time.perf_counter() - t)
            outcomes[outcome.value] = outcomes.get(outcome.value, 0) + 1
    out.put((worker, time.perf_counter() - start, slowest, outcomes))


def _opener(paths: list[str], barrier: Any, out: Any) -> None:
    failures: list[str] = []
    for path in paths:
        barrier.wait()
        try:
            with open_store(path) as store:
                store.rows()
        except DatabaseError as exc:
            failures.append(f"{Path(path).name}: {exc}")
    out.put(failures)


def run_together(function: Any, args: list[tuple[Any, ...]]) -> list[Any]:
    """``function(*a, barrier, out)`` in one spawned process per ``a`` of ``args``, all
    sharing a barrier; each puts one result on ``out``. The results, in arrival order."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(args))
    out = context.Queue()
    processes = [context.Process(target=function, args=(*a, barrier, out)) for a in args]
    for p in processes:
        p.start()
    results = [out.get(timeout=300) for _ in processes]
    for p in processes:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def run_writers(target: str, *, own: int, shared: int) -> dict[str, Any]:
    start = time.perf_counter()
    results = run_together(_writer, [(target, w, own, shared) for w in range(PROCESSES)])
    wall = time.perf_counter() - start
    outcomes: dict[str, int] = {}
    for _, _, _, counts in results:
        for name, n in counts.items():
            outcomes[name] = outcomes.get(name, 0) + n
    return {
        "wall_s": wall,
        "write_s": max(r[1] for r in results),
        "slowest_transaction_s": max(r[2] for r in results),
        "outcomes": outcomes,
    }


def check_nothing_lost(target: str, *, own: int, shared: int) -> None:
    with open_store(target, readonly=True) as store:
        rows = store.rows()
    assert len(rows) == PROCESSES * own + shared
    expected = {
        (row.key, row.host) for w in range(PROCESSES) for row in _rows(w, own, shared)
    }
    found = {(row.key, row.host) for row in rows}
    found |= {(row.key, h.host) for row in rows for h in row.history}
    assert found == expected  # every write is there, as a row or in a row's history
    winners = [row for row in rows if row.problem.spec_len == 99]
    assert len(winners) == shared
    for row in winners:
        # 10, 11, 12, 13 µs: the 10 µs row beats the rest by >= 3% with ranges apart.
        assert row.host == "w0"
        assert sorted(h.host for h in row.history) == ["w1", "w2", "w3"]


def test_four_sqlite_writers_lose_nothing(tmp_path: Path, record_property: Any) -> None:
    target = str(tmp_path / "concurrent.db")
    own, shared = 950, 50
    figures = run_writers(target, own=own, shared=shared)
    check_nothing_lost(target, own=own, shared=shared)
    outcomes = figures["outcomes"]
    assert sum(outcomes.values()) == PROCESSES * (own + shared)
    assert outcomes[RecordOutcome.INSERTED.value] == PROCESSES * own + shared
    connection = sqlite3.connect(target)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        connection.close()
    record_property("sqlite_concurrency", figures)
    print(f"\nSQLite, {PROCESSES} processes x {own + shared} rows, one transaction each: {figures}")


def test_processes_racing_to_create_a_database_all_open_it(tmp_path: Path) -> None:
    # 60 new files, each opened by 4 processes released at the same moment.
    paths = [str(tmp_path / f"race{i}.db") for i in range(60)]
    results = run_together(_opener, [(paths,)] * PROCESSES)
    assert [failure for failures in results for failure in failures] == []
    for path in paths:
        with open_store(path, readonly=True) as store:
            assert store.rows() == []


@pytest.mark.postgres
def test_four_postgres_writers_lose_nothing(pg_url: str, record_property: Any) -> None:
    own, shared = 150, 50
    figures = run_writers(pg_url, own=own, shared=shared)
    check_nothing_lost(pg_url, own=own, shared=shared)
    record_property("postgres_concurrency", figures)
    print(f"\nPostgreSQL, {PROCESSES} processes x {own + shared} rows: {figures}")
