"""Store: recording by the promotion rule, reading back exactly, warm-start queries;
import and merge: all or nothing, conflicts by the promotion rule, provenance kept.

The store's tests run on an embedded SQLite file and on PostgreSQL.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectune.db import (
    DatabaseError,
    RecordOutcome,
    Store,
    VllmComparison,
    effective_rows,
    import_rows,
    merge_databases,
    open_store,
    write_rows_file,
)
from spectune.db._files import rows_to_json
from spectune.db._locations import Source, parse_target
from spectune.db.errors import InvalidRowError, NotADatabaseError
from spectune.identity import DeviceIdentity
from spectune.space import Problem

from .conftest import H200, KERNEL, MI300X, SOFTWARE, SPACE, later, make_row, write_db

SPACES = {KERNEL: SPACE}


@pytest.fixture
def store(db_url: str) -> Store:
    with open_store(db_url) as opened:
        yield opened


def test_new_database_is_empty_and_round_trips_rows(store: Store) -> None:
    assert store.count() == 0
    rows = [
        make_row(),
        make_row(batch=16, config={"BLOCK_V": 512, "num_warps": 2}),
        make_row(device=H200, config={"BLOCK_V": 2048, "num_warps": 8}, p50=7.77777777),
    ]
    report = store.record_many(rows)
    assert (report.inserted, report.total) == (3, 3)
    assert store.count() == 3
    assert sorted(store.rows(), key=lambda r: r.key) == sorted(rows, key=lambda r: r.key)


def test_recording_the_same_measurement_twice_changes_nothing(store: Store) -> None:
    row = make_row()
    assert store.record(row) is RecordOutcome.INSERTED
    assert store.record(row) is RecordOutcome.UNCHANGED
    assert store.rows() == [row]


def test_significantly_faster_row_replaces_and_keeps_provenance(store: Store) -> None:
    old = make_row(p50=10.0, host="node-a", study="s1")
    new = make_row(p50=9.0, host="node-b", study="s2", tuned_at=later(5),
                   config={"BLOCK_V": 2048, "num_warps": 8})  # fmt: skip
    store.record(old)
    assert store.record(new) is RecordOutcome.REPLACED
    (stored,) = store.rows()
    assert stored.config == new.config
    assert stored.tuned == new.tuned
    assert stored.host == "node-b"
    assert [h.identity for h in stored.history] == [old.provenance.identity]
    assert stored.history[0].config == old.config


def test_insignificant_gain_keeps_incumbent_and_both_provenances(store: Store) -> None:
    old = make_row(p50=10.0)
    # 2% faster: below the 3% threshold.
    new = make_row(p50=9.8, spread=0.01, host="node-b", tuned_at=later(5),
                   config={"BLOCK_V": 512, "num_warps": 2})  # fmt: skip
    store.record(old)
    assert store.record(new) is RecordOutcome.KEPT
    (stored,) = store.rows()
    assert stored.config == old.config
    assert [h.host for h in stored.history] == ["node-b"]
    # Overlapping ranges also keep the incumbent, even at a 5% median gain.
    noisy = make_row(p50=9.5, spread=1.0, host="node-c", tuned_at=later(9))
    assert store.record(noisy) is RecordOutcome.KEPT
    assert [h.host for h in store.rows()[0].history] == ["node-b", "node-c"]


FASTER = VllmComparison("faster", 14.0, "0.32.0")
NOT_FASTER = VllmComparison("not faster", 9.0, "0.33.0")
OTHER_CONFIG = {"BLOCK_V": 2048, "num_warps": 8, "waves_per_eu": 2}


def test_the_comparison_with_vllm_is_stored(store: Store) -> None:
    rows = [make_row(vllm=FASTER), make_row(batch=16, vllm=VllmComparison(reason="no vLLM"))]
    store.record_many(rows)
    assert store.rows() == rows


def test_a_fresher_comparison_of_the_same_config_replaces_the_held_one(store: Store) -> None:
    store.record(make_row(p50=10.0, vllm=FASTER))
    # Same config, measured later, not significantly faster: the incumbent's figures
    # stay, the comparison is the new one's.
    again = make_row(p50=10.1, host="node-b", tuned_at=later(5), vllm=NOT_FASTER)
    assert store.record(again) is RecordOutcome.KEPT
    (stored,) = store.rows()
    assert (stored.host, stored.tuned, stored.vllm) == ("node-a", make_row().tuned, NOT_FASTER)
    assert [h.host for h in stored.history] == ["node-b"]
    # A later measurement without vLLM (no version) keeps the comparison there is...
    absent = make_row(p50=10.0, host="node-c", tuned_at=later(9),
                      vllm=VllmComparison(reason="vLLM is not installed"))  # fmt: skip
    assert store.record(absent) is RecordOutcome.KEPT
    assert store.rows()[0].vllm == NOT_FASTER
    # ...and so does an older one, recorded (merged) after.
    older = make_row(p50=10.0, host="node-d", tuned_at=later(-60), vllm=FASTER)
    assert store.record(older) is RecordOutcome.KEPT
    assert store.rows()[0].vllm == NOT_FASTER


def test_a_config_keeps_its_own_comparison(store: Store) -> None:
    store.record(make_row(p50=10.0, vllm=FASTER))
    # Another config, not significantly faster: the incumbent and its comparison stay.
    close = make_row(p50=9.9, host="b", tuned_at=later(1), config=OTHER_CONFIG, vllm=NOT_FASTER)
    assert store.record(close) is RecordOutcome.KEPT
    assert store.rows()[0].vllm == FASTER
    # Another config that replaces it brings its own (here: none).
    fast = make_row(p50=5.0, host="c", tuned_at=later(2), config=OTHER_CONFIG)
    assert store.record(fast) is RecordOutcome.REPLACED
    assert store.rows()[0].vllm == VllmComparison()


def test_set_vllm_comparison_changes_only_the_comparison(store: Store) -> None:
    row = make_row(history=(make_row(host="old", tuned_at=later(-5)).provenance,))
    store.record_many([row, make_row(batch=16)])
    assert store.set_vllm_comparison(row.key, FASTER) is True
    assert store.rows() == [row.replace_vllm(FASTER), make_row(batch=16)]
    assert store.rows()[0].vs_vllm_ratio == 1.4
    assert store.set_vllm_comparison(row.key, VllmComparison(reason="vLLM is not installed"))
    assert store.rows()[0].vllm.reason == "vLLM is not installed"
    assert store.set_vllm_comparison(make_row(batch=32).key, FASTER) is False
    assert store.count() == 2
    with pytest.raises(TypeError, match="VllmComparison"):
        store.set_vllm_comparison(row.key, "faster")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key must hold 13 values"):
        store.set_vllm_comparison(row.key[:3], FASTER)


def test_set_vllm_comparison_on_a_read_only_store(db_url: str) -> None:
    write_db(db_url, [make_row()])
    with open_store(db_url, readonly=True) as store, \
            pytest.raises(DatabaseError, match="read-only"):
        store.set_vllm_comparison(make_row().key, FASTER)


def test_merges_carry_the_comparison_of_the_row_they_keep(tmp_path: Path) -> None:
    a = write_db(tmp_path / "a.db", [make_row(p50=10.0, host="a", vllm=FASTER)])
    b = write_db(tmp_path / "b.db", [make_row(p50=5.0, host="b", tuned_at=later(1),
                                              config=OTHER_CONFIG, vllm=NOT_FASTER)])
    merge_databases([a, b], into=tmp_path / "ab.db")
    merge_databases([b, a], into=tmp_path / "ba.db")
    with open_store(tmp_path / "ab.db") as ab, open_store(tmp_path / "ba.db") as ba:
        assert [r.vllm for r in ab.rows()] == [r.vllm for r in ba.rows()] == [NOT_FASTER]
    exported = tmp_path / "rows.json"
    write_rows_file([make_row(vllm=FASTER)], exported, fmt="json")
    import_rows(exported, into=tmp_path / "c.db")
    with open_store(tmp_path / "c.db") as c:
        assert c.rows()[0].vllm == FASTER


def test_min_gain_is_passed_through(store: Store) -> None:
    store.record(make_row(p50=10.0))
    faster = make_row(p50=9.0, spread=0.01, host="b", tuned_at=later(1))
    assert store.record(faster, min_gain=0.2) is RecordOutcome.KEPT
    assert store.record(faster, min_gain=0.05) is RecordOutcome.REPLACED


def test_duplicate_keys_within_one_batch_are_resolved_in_order(store: Store) -> None:
    rows = [make_row(p50=10.0), make_row(p50=5.0, host="b", tuned_at=later(1)),
            make_row(p50=9.0, host="c", tuned_at=later(2))]  # fmt: skip
    report = store.record_many(rows)
    assert (report.inserted, report.replaced, report.kept) == (1, 1, 1)
    (stored,) = store.rows()
    assert stored.host == "b"
    assert {h.host for h in stored.history} == {"node-a", "c"}


def test_rows_filters(store: Store) -> None:
    store.record_many([make_row(), make_row(device=H200), make_row(kernel="other_kernel")])
    assert {r.device.device_name for r in store.rows(kernel=KERNEL)} == {
        "AMD_Instinct_MI300X",
        "NVIDIA_H200",
    }
    assert [r.kernel for r in store.rows(device_name="NVIDIA_H200")] == [KERNEL]
    assert store.rows(device_name="nope") == []


def test_best_configs_near(store: Store) -> None:
    configs = [{"BLOCK_V": v, "num_warps": 4} for v in (256, 512, 1024, 2048)]
    store.record_many(
        [
            make_row(spec_len=4, batch=8, config=configs[0], p50=10.0),
            make_row(spec_len=4, batch=16, config=configs[1]),
            make_row(spec_len=8, batch=64, config=configs[2]),
            make_row(spec_len=2, batch=8, config=configs[0], p50=5.0),  # same config again
            make_row(spec_len=4, batch=8, dtype="float32", config=configs[3]),  # other dtype
            make_row(spec_len=4, batch=8, device=H200, config=configs[3]),  # other device
        ]
    )
    near = store.best_configs_near(
        kernel=KERNEL, device=MI300X, problem=Problem(4, 10, 128256, "bfloat16", True)
    )
    assert [r.config["BLOCK_V"] for r in near] == [256, 512, 1024]
    assert (near[0].problem.spec_len, near[0].problem.batch) == (4, 8)
    assert len(store.best_configs_near(kernel=KERNEL, device=MI300X, problem=near[0].problem,
                                       limit=1)) == 1  # fmt: skip
    assert store.best_configs_near(
        kernel=KERNEL, device=MI300X, problem=near[0].problem, triton="9.9"
    ) == []
    other = DeviceIdentity("hip", "gfx942", "AMD_Instinct_MI300X", 80, 64)  # a partition
    assert store.best_configs_near(kernel=KERNEL, device=other, problem=near[0].problem) == []


def test_best_configs_near_on_other_devices_for_a_new_gpu(store: Store) -> None:
    """The rows other GPU models hold, nearest problem first, then the same backend and
    architecture: what a study on a GPU with no rows of its own starts from."""
    mi325 = DeviceIdentity("hip", "gfx942", "AMD_Instinct_MI325X", 304, 64)
    configs = [{"BLOCK_V": v, "num_warps": 4} for v in (256, 512, 1024, 2048)]
    store.record_many([
        make_row(spec_len=4, batch=8, device=H200, config=configs[0]),
        make_row(spec_len=4, batch=8, device=mi325, config=configs[1]),
        make_row(spec_len=2, batch=8, device=mi325, config=configs[2]),
        make_row(spec_len=4, batch=8, config=configs[3]),  # this device's own row
    ])
    problem = Problem(4, 8, 128256, "bfloat16", True)
    others = store.best_configs_near(kernel=KERNEL, device=MI300X, problem=problem,
                                     other_devices=True)
    assert [r.config["BLOCK_V"] for r in others] == [512, 256, 1024]
    assert [r.device for r in others] == [mi325, H200, mi325]
    own = store.best_configs_near(kernel=KERNEL, device=MI300X, problem=problem)
    assert [r.config["BLOCK_V"] for r in own] == [2048]


def test_best_configs_near_validates_arguments(store: Store) -> None:
    with pytest.raises(ValueError, match="limit"):
        store.best_configs_near(kernel=KERNEL, device=MI300X, problem=Problem(1, 1, 8), limit=0)
    with pytest.raises(TypeError, match="problem"):
        store.best_configs_near(kernel=KERNEL, device=MI300X, problem=(1, 1, 8))  # type: ignore[arg-type]


def test_reads_do_not_wait_for_a_writer(db_url: str) -> None:
    import time

    from sqlalchemy.orm import Session

    from spectune.db._models import TunedConfigRecord
    from spectune.db._writer import record_values

    with open_store(db_url) as writer, open_store(db_url) as reader:
        writer.record(make_row(batch=1))
        with Session(writer._engine) as session, session.begin():
            session.add(TunedConfigRecord(**record_values(make_row(batch=2))))
            session.flush()  # the writer now holds the database's write lock
            start = time.monotonic()
            assert reader.count() == 1
            assert [r.problem.batch for r in reader.rows()] == [1]
            near = reader.best_configs_near(
                kernel=KERNEL, device=MI300X, problem=Problem(4, 2, 128256, "bfloat16")
            )
            assert len(near) == 1
            assert time.monotonic() - start < 2  # not the 30 s busy timeout
        assert reader.count() == 2


def test_read_only_store_refuses_writes(db_url: str) -> None:
    with open_store(db_url) as writer:
        writer.record(make_row())
    with open_store(db_url, readonly=True) as reader:
        assert reader.count() == 1
        with pytest.raises(DatabaseError, match="read-only"):
            reader.record(make_row(batch=2))


def test_record_checks_configs_against_given_spaces(store: Store) -> None:
    invalid = make_row(batch=2, config={"BLOCK_V": 768, "num_warps": 4, "waves_per_eu": 0})
    with pytest.raises(InvalidRowError, match=r"row 2 .*power of two"):
        store.record_many([make_row(), invalid], spaces={KERNEL: SPACE})
    with pytest.raises(InvalidRowError, match="no search space for kernel family"):
        store.record(make_row(kernel="unknown_kernel"), spaces={KERNEL: SPACE})
    assert store.count() == 0
    assert store.record(make_row(), spaces={KERNEL: SPACE}) is RecordOutcome.INSERTED


def test_record_many_rejects_non_rows(store: Store) -> None:
    with pytest.raises(TypeError, match=r"rows\[1\]"):
        store.record_many([make_row(), {"kernel": KERNEL}])  # type: ignore[list-item]
    assert store.count() == 0


def test_software_other_than_triton_is_not_part_of_the_key(store: Store) -> None:
    from dataclasses import replace

    store.record(make_row())
    newer_torch = make_row(software=replace(SOFTWARE, torch="2.7.0"), host="b", tuned_at=later(1))
    assert store.record(newer_torch) is RecordOutcome.KEPT
    other_triton = make_row(software=replace(SOFTWARE, triton="3.3.0"))
    assert store.record(other_triton) is RecordOutcome.INSERTED
    assert store.count() == 2


# -- import, merge, and what readers see ----------------------------------------------


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


def test_effective_rows_apply_precedence(tmp_path: Path) -> None:
    first = write_db(tmp_path / "first.db", [make_row(host="first")])
    second = write_db(tmp_path / "second.db", [make_row(host="second"),
                                               make_row(batch=16, host="second")])  # fmt: skip
    sources = [Source(name="one", url=parse_target(first)),
               Source(name="absent", url=parse_target(str(tmp_path / "none.db"))),
               Source(name="two", url=parse_target(second))]  # fmt: skip
    found = [(source.name, row.host, row.problem.batch) for source, row in effective_rows(sources)]
    assert found == [("one", "first", 8), ("two", "second", 16)]
