"""Reading and writing T4 files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from spectune.autotune.replay import load_t4, write_t4


def _rows():  # type: ignore[no-untyped-def]
    return [
        ({"bx": 16, "by": 1, "mode": "fast"}, 2.0, [2.1, 1.9], 500.0),
        ({"bx": 32, "by": 1, "mode": "fast"}, 1.0, [1.0, 1.0], 600.0),
        ({"bx": 32, "by": 2, "mode": "slow"}, None, [], 700.0),
        ({"bx": 64, "by": 2, "mode": "slow"}, 4.0, [4.0], 800.0),
    ]


def test_round_trip_space_records_and_optimum(tmp_path: Path) -> None:
    path = write_t4(tmp_path / "x_T4.json.gz", _rows(), failure="compile")
    rec = load_t4(path)
    assert rec.name == "x_T4"
    assert rec.space.names == ("bx", "by", "mode")
    assert rec.space.param("bx").values == (16, 32, 64)
    assert rec.space.param("mode").values == (0, 1)  # strings become codes, in order
    assert rec.decode["mode"] == ("fast", "slow")
    assert rec.optimum == 1.0
    assert len(rec.records) == 4
    failed = rec.lookup({"bx": 32, "by": 2, "mode": 1})
    assert not failed.ok and failed.status == "compile" and failed.time is None
    assert failed.compile_time == 700.0
    good = rec.lookup({"bx": 16, "by": 1, "mode": 0})
    assert good.ok and good.time == 2.0 and good.runtimes == (2.1, 1.9)
    # Membership is the constraint: a combination absent from the file is not valid.
    assert rec.space.is_valid({"bx": 64, "by": 2, "mode": 1})
    assert not rec.space.is_valid({"bx": 64, "by": 1, "mode": 0})
    assert rec.space.size() == 4


def test_plain_json_and_shared_format(tmp_path: Path) -> None:
    doc = {
        "metadata": {"timeunit": "miliseconds"},
        "results": [
            {
                "configuration": {"a": 1, "b": 0},
                "invalidity": "correct",
                "correctness": 1,
                "measurements": [{"name": "time", "value": 3.0, "unit": ""}],
                "times": {"compilation": 10.0, "runtimes": [3.0, 3.0]},
                "objectives": ["time"],
            },
            {
                "configuration": {"a": 2, "b": 0},
                "invalidity": "runtime",
                "correctness": 0,
                "measurements": [],
                "times": {"compilation": 5.0},
                "objectives": ["time"],
            },
        ],
    }
    path = tmp_path / "y.json"
    path.write_text(json.dumps(doc))
    rec = load_t4(path)
    assert rec.optimum == 3.0
    assert not rec.lookup({"a": 2, "b": 0}).ok


def test_files_without_correct_results_are_refused(tmp_path: Path) -> None:
    path = write_t4(tmp_path / "z.json.gz", [({"a": 1}, None, [], 1.0)])
    with pytest.raises(ValueError, match="no correct configuration"):
        load_t4(path)
    empty = tmp_path / "e.json.gz"
    with gzip.open(empty, "wt") as fh:
        fh.write(json.dumps({"results": []}))
    with pytest.raises(ValueError, match="no 'results'"):
        load_t4(empty)
