"""Import and merge: all or nothing, conflicts by the promotion rule, provenance kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectune.db import (
    InvalidRowError,
    Source,
    check_configs,
    effective_rows,
    import_rows,
    merge_databases,
    open_store,
    parse_target,
    rows_to_json,
    write_rows_file,
)

from .conftest import KERNEL, SPACE, later, make_row, write_db

SPACES = {KERNEL: SPACE}


def test_merge_keeps_the_significantly_faster_config_and_all_provenance(
    db_url: str, tmp_path: Path
) -> None:
    slow = make_row(p50=10.0, host="a", study="s-a")
    fast = make_row(p50=8.0, host="b", study="s-b", tuned_at=later(1),
                    config={"BLOCK_V": 2048, "num_warps": 8, "waves_per_eu": 0})  # fmt: skip
    barely = make_row(p50=7.9, spread=0.5, host="c", study="s-c", tuned_at=later(2),
                      config={"BLOCK_V": 512, "num_warps": 2, "waves_per_eu": 0})  # fmt: skip
    only_in_b = make_row(batch=64, host="b", study="s-b", tuned_at=later(1))
    a = write_db(tmp_path / "a.db", [slow])
    b = write_db(tmp_path / "b.db", [fast, only_in_b])
    c = write_db(tmp_path / "c.db", [barely])
    report = merge_databases([a, b, c], into=db_url, spaces=SPACES)
    assert (report.inserted, report.replaced, report.kept, report.unchanged) == (2, 1, 1, 0)
    with open_store(db_url, readonly=True) as store:
        rows = {row.problem.batch: row for row in store.rows()}
    merged = rows[8]
    assert merged.config == fast.config  # 20% faster and ranges apart: replaced
    assert (merged.host, merged.study) == ("b", "s-b")  # c: 1.25% faster, overlapping: kept b
    assert [(h.host, h.study) for h in merged.history] == [("a", "s-a"), ("c", "s-c")]
    assert merged.history[0].tuned == slow.tuned
    assert rows[64] == only_in_b
    # Merging again changes nothing.
    again = merge_databases([a, b, c], into=db_url, spaces=SPACES)
    assert (again.unchanged, again.total) == (4, 4)


def test_merge_into_itself_and_order_independence(tmp_path: Path) -> None:
    slow = make_row(p50=10.0, host="a")
    fast = make_row(p50=8.0, host="b", tuned_at=later(1),
                    config={"BLOCK_V": 2048, "num_warps": 8, "waves_per_eu": 0})  # fmt: skip
    a = write_db(tmp_path / "a.db", [slow])
    b = write_db(tmp_path / "b.db", [fast])
    merge_databases([a, b], into=tmp_path / "ab.db")
    merge_databases([b, a], into=tmp_path / "ba.db")
    with open_store(tmp_path / "ab.db") as ab, open_store(tmp_path / "ba.db") as ba:
        assert ab.rows() == ba.rows()
    assert merge_databases([a], into=a).unchanged == 1


def test_merge_refuses_invalid_configs_and_writes_nothing(tmp_path: Path) -> None:
    good = write_db(tmp_path / "good.db", [make_row()])
    bad = write_db(tmp_path / "bad.db", [make_row(batch=2),
                                         make_row(config={"BLOCK_V": 768, "num_warps": 4,
                                                          "waves_per_eu": 0})])  # fmt: skip
    dst = tmp_path / "dst.db"
    with pytest.raises(InvalidRowError, match=r"bad.db: row 2 .*power of two"):
        merge_databases([good, bad], into=dst, spaces=SPACES)
    assert not dst.exists()


def test_merge_of_a_missing_source_fails_cleanly(tmp_path: Path) -> None:
    from spectune.db import NotADatabaseError

    with pytest.raises(NotADatabaseError, match="no database file"):
        merge_databases([tmp_path / "nope.db"], into=tmp_path / "dst.db")
    with pytest.raises(ValueError, match="sources"):
        merge_databases([], into=tmp_path / "dst.db")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"BLOCK_V": 1024, "num_warps": 4, "waves_per_eu": 0, "BLOCK_K": 16}, "unknown"),
        ({"BLOCK_V": 96, "num_warps": 1, "waves_per_eu": 0}, "power of two"),
    ],
)
def test_import_checks_configs_against_the_space(
    config: dict[str, int], message: str, db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "rows.json"
    write_rows_file([make_row(batch=1), make_row(config=config)], path, fmt="json")
    with open_store(db_url) as store:
        store.record(make_row(batch=128))
    with pytest.raises(InvalidRowError, match=f"row 2 .*{message}"):
        import_rows(path, into=db_url, spaces=SPACES)
    with open_store(db_url, readonly=True) as store:
        assert [r.problem.batch for r in store.rows()] == [128]  # row 1 was not imported


def test_import_rejects_negative_values_before_any_space(tmp_path: Path) -> None:
    data = json.loads(rows_to_json([make_row()]))
    data[0]["config"]["num_warps"] = -4
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidRowError, match="must not be negative"):
        import_rows(path, into=tmp_path / "dst.db")


def test_import_into_the_write_target(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "rows.csv"
    rows = [make_row(batch=b) for b in (1, 2, 4)]
    write_rows_file(rows, path, fmt="csv")
    report = import_rows(path, spaces=SPACES)
    assert report.inserted == 3
    with open_store(tmp_path / "home" / "spectune.db", readonly=True) as store:
        assert store.rows() == rows
    assert import_rows(path, into=db_url).inserted == 3


def test_check_configs_without_spaces_checks_nothing() -> None:
    check_configs([make_row(config={"BLOCK_V": 3})], spaces=None, where="x")
    with pytest.raises(InvalidRowError, match="x: row 1"):
        check_configs([make_row(config={"BLOCK_V": 3})], spaces=SPACES, where="x")


def test_effective_rows_apply_precedence(tmp_path: Path) -> None:
    first = write_db(tmp_path / "first.db", [make_row(host="first")])
    second = write_db(tmp_path / "second.db", [make_row(host="second"),
                                               make_row(batch=16, host="second")])  # fmt: skip
    sources = [Source(name="one", url=parse_target(first)),
               Source(name="absent", url=parse_target(str(tmp_path / "none.db"))),
               Source(name="two", url=parse_target(second))]  # fmt: skip
    found = [(source.name, row.host, row.problem.batch) for source, row in effective_rows(sources)]
    assert found == [("one", "first", 8), ("two", "second", 16)]
