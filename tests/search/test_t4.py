"""Reading and writing T4 files."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from spectune.cli import main
from spectune.search.replay import load_t4, write_t4
from spectune.search.replay._t4 import T4FileError


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
    with pytest.raises(ValueError, match="results: empty"):
        load_t4(empty)


def test_failures_are_written_as_kernel_tuner_writes_them(tmp_path: Path) -> None:
    """A failed configuration's time is a string (the schema allows no null there)."""
    path = write_t4(tmp_path / "f.json", _rows(), failure="compile")
    doc = json.loads(path.read_text())
    assert doc["results"][2]["measurements"][0]["value"] == "CompilationFailedConfig"
    # Files written by earlier versions (null) still load.
    doc["results"][2]["measurements"][0]["value"] = None
    path.write_text(json.dumps(doc))
    assert not load_t4(path).lookup({"bx": 32, "by": 2, "mode": 1}).ok


# --------------------------------------------------------------------------------------
# Bad files (issue 16, finding 9): one line naming the file, where and what; exit code 1
# --------------------------------------------------------------------------------------


def _valid_doc(tmp_path: Path) -> dict[str, Any]:
    return json.loads(write_t4(tmp_path / "valid.json", _rows()).read_text())


def _gz(path: Path, text: str) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(text)
    return path


def _changed(change: Callable[[dict[str, Any]], object]) -> Callable[[Path], Path]:
    """A builder of a gzip T4 file: the valid document, changed in place by ``change``."""
    def build(tmp_path: Path) -> Path:
        doc = _valid_doc(tmp_path)
        change(doc)
        return _gz(tmp_path / "bad_T4.json.gz", json.dumps(doc))
    return build


def _not_gzip(tmp_path: Path) -> Path:
    path = tmp_path / "bad_T4.json.gz"
    path.write_bytes(b"this is not gzip data at all")
    return path


def _truncated_gzip(tmp_path: Path) -> Path:
    whole = _gz(tmp_path / "whole.json.gz", json.dumps(_valid_doc(tmp_path))).read_bytes()
    path = tmp_path / "bad_T4.json.gz"
    path.write_bytes(whole[: len(whole) // 2])
    return path


def _time_1e400(tmp_path: Path) -> Path:
    # 1e400 is valid JSON syntax, and Python reads it as inf.
    text = json.dumps(_valid_doc(tmp_path)).replace('"value": 1.0', '"value": 1e400', 1)
    assert "1e400" in text
    return _gz(tmp_path / "bad_T4.json.gz", text)


def _set(path: tuple[str | int, ...], value: object) -> Callable[[dict[str, Any]], object]:
    def change(doc: dict[str, Any]) -> None:
        node: Any = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


#: (builder of the bad file, the JSON path named, a fragment of the problem)
BAD_FILES: dict[str, tuple[Callable[[Path], Path], str, str]] = {
    "not-gzip": (_not_gzip, "", "not a gzip file"),
    "truncated-gzip": (_truncated_gzip, "", "truncated gzip data"),
    "entry-not-object": (_changed(_set(("results", 1), 5)), "results[1]",
                         "must be an object, got number"),
    "configuration-null": (_changed(_set(("results", 1, "configuration"), None)),
                           "results[1].configuration", "must be an object, got null"),
    "time-1e400": (_time_1e400, "results[1].measurements[0].value",
                   "a time must be a finite number >= 0, got inf"),
    "measurements-string": (_changed(_set(("results", 0, "measurements"), "time")),
                            "results[0].measurements", "must be an array, got string"),
    "negative-time": (_changed(_set(("results", 3, "measurements", 0, "value"), -4.0)),
                      "results[3].measurements[0].value",
                      "a time must be a finite number >= 0, got -4.0"),
    "negative-runtime": (_changed(_set(("results", 0, "times", "runtimes", 1), -1.9)),
                         "results[0].times.runtimes[1]",
                         "a time must be a finite number >= 0, got -1.9"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_replay_of_a_bad_file_is_one_line_naming_where(case: str, tmp_path: Path) -> None:
    build, where, problem = BAD_FILES[case]
    path = build(tmp_path)
    result = CliRunner().invoke(
        main, ["replay", str(path), "--budget", "5", "--repeats", "1", "--json"]
    )
    # No exception escaped (CliRunner would keep it in result.exception), no "Aborted!".
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1, result.output
    prefix = f"Error: {path}: {where}: " if where else f"Error: {path}: "
    assert result.output.splitlines() == [result.output.strip()], result.output
    assert result.output.startswith(prefix) and problem in result.output, result.output
    with pytest.raises(T4FileError) as info:
        load_t4(path)
    assert (info.value.where, info.value.path) == (where, path)


def test_the_published_schema_is_what_is_checked(tmp_path: Path) -> None:
    """Required keys, the invalidity enum and the schema version, beside the times."""
    for change, where, problem in (
        (lambda d: d["results"][2].pop("invalidity"), "results[2].invalidity", "missing"),
        (lambda d: d["results"][2].pop("correctness"), "results[2].correctness", "missing"),
        (_set(("results", 0, "invalidity"), "ok"), "results[0].invalidity", "must be one of"),
        (_set(("results", 1, "times", "compilation"), "fast"), "results[1].times.compilation",
         "must be a number, got string"),
        (_set(("results", 1, "configuration", "by"), {"x": 1}), "results[1].configuration.by",
         "got object"),
        (_set(("schema_version",), "2.0.0"), "schema_version", "unsupported version"),
        (_set(("results", 1, "configuration"), {"bx": 1}), "results[1].configuration",
         "differ from results[0]'s"),
    ):
        doc = _valid_doc(tmp_path)
        change(doc)
        path = _gz(tmp_path / "s.json.gz", json.dumps(doc))
        with pytest.raises(T4FileError, match=re.escape(problem)) as info:
            load_t4(path)
        assert info.value.where == where


def test_non_finite_numbers_are_refused_not_skipped(tmp_path: Path) -> None:
    """NaN is not JSON; a huge integer is no time; a correct time of 0 cannot score."""
    text = json.dumps(_valid_doc(tmp_path)).replace('"runtimes": [2.1', '"runtimes": [NaN', 1)
    with pytest.raises(T4FileError, match="NaN is not a JSON number"):
        load_t4(_gz(tmp_path / "nan.json.gz", text))
    for value, problem in ((10**400, "a time must be"), (0, "must be positive")):
        doc = _valid_doc(tmp_path)
        doc["results"][1]["measurements"][0]["value"] = value
        with pytest.raises(T4FileError, match=problem):
            load_t4(_gz(tmp_path / "n.json.gz", json.dumps(doc)))
