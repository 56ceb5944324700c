"""A sweep's promotion on reruns: no config faster than itself, no verdict from noise
(nor a best from one noisy window: the study's finalists are measured side by side).

The toy family's real kernels under the interpreter, real SQLite databases and journal
storages. The default tile (16) is the slowest valid one and 1024 the fastest, by far
(75 and 2 steps over a row of 1200).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Mapping

import pytest
from click.testing import CliRunner

from spectune.cli import main
from spectune.db import TunedRow, open_store
from spectune.identity import detect_device, detect_software
from spectune.kernels import FAMILIES
from spectune.search import Search, SearchObserver, Status, TrialRecord
from spectune.space import Problem
from spectune.tuning.problems import SweepItem
from spectune.tuning.sweep import SweepOptions, _runners_up, run_item
from spectune.tuning.trial import TrialRunner
from tests.tuning.toy_family import ToyInputs, ToySumFamily

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("sweeps run kernels under TRITON_INTERPRET=1", allow_module_level=True)

TOY = ToySumFamily()
PROBLEM = Problem(spec_len=1, batch=2, vocab=1200)
ITEM = SweepItem(TOY.name, PROBLEM)
FASTEST = {"BLOCK": 1024, "BUG": 0}


def test_default_is_best_shows_no_speedup_over_itself(toy_registered, places) -> None:
    """One trial evaluates the default (the first warm start): it is the best. Before,
    it was timed twice and the two timings made up a speedup (1.09x) of it over itself."""
    options = SweepOptions(trials=1, db=places["db"], storage=places["storage"])
    result = run_item(ITEM, options=options)
    assert result.best_config == result.default_config == TOY.default_config(PROBLEM, "")
    assert result.promoted == "default is best"
    assert result.best is result.default  # one measurement stands for both
    assert result.speedup == 1.0
    assert open_store(places["db"]).rows() == []


def test_rerun_of_a_finished_study_keeps_its_verdict(toy_registered, places) -> None:
    """A rerun with nothing new to evaluate finds its best already in the database: up to
    date, nothing measured or written again. Before, best and default were measured again
    and the database weighed the new figures against its own (kept, replaced or
    unchanged, by noise)."""
    options = SweepOptions(trials=10, db=places["db"], storage=places["storage"])
    first = run_item(ITEM, options=options)
    assert first.best_config == FASTEST and first.promoted == "inserted"
    [row] = open_store(places["db"]).rows()
    for _ in range(2):
        again = run_item(ITEM, options=options)
        assert (again.trials, again.best_config) == (10, FASTEST)
        assert again.promoted == "up to date"
        # The figures shown are the row's: measured side by side when it was promoted.
        assert (again.default, again.best) == (row.default, row.tuned)
        assert again.speedup == row.speedup
        assert open_store(places["db"]).rows() == [row]  # same row, same history


def test_a_best_the_database_holds_from_another_study_is_up_to_date(
    toy_registered, places
) -> None:
    """The same config found by another host's study: nothing to decide, the row (and
    its provenance) stays as it is."""
    device, software = detect_device(), detect_software()
    runner = TrialRunner(family=TOY, problem=PROBLEM, backend=device.backend)
    default = TOY.default_config(PROBLEM, device.backend)
    row = TunedRow(
        device=device, software=software, kernel=TOY.name, kernel_hash=TOY.source_hash,
        problem=PROBLEM, config=FASTEST,
        tuned=runner.timer(lambda: TOY.launch(runner.inputs, FASTEST)),
        default=runner.timer(lambda: TOY.launch(runner.inputs, default)),
        trials=3, tuning_seconds=1.0, host=f"not-{socket.gethostname()}", study="elsewhere",
    )
    with open_store(places["db"]) as store:
        assert store.record(row).value == "inserted"
        [stored] = store.rows()
    options = SweepOptions(trials=10, db=places["db"], storage=places["storage"])
    result = run_item(ITEM, options=options)
    assert result.best_config == FASTEST and result.promoted == "up to date"
    [after] = open_store(places["db"]).rows()
    # Only its comparison with vLLM is new: tried under the installed vLLM, which has no
    # function for the toy family (so a night does not try again until vLLM changes).
    assert dataclasses.replace(after, vllm=stored.vllm) == stored
    assert after.vllm.verdict == "not measured" and TOY.name in (after.vllm.reason or "")


def test_a_new_best_is_weighed_against_the_database_row_side_by_side(
    toy_registered, places
) -> None:
    """The database holds a slower config for the key: the study's best is measured
    side by side with it (not with the default) and replaces it."""
    device, software = detect_device(), detect_software()
    runner = TrialRunner(family=TOY, problem=PROBLEM, backend=device.backend)
    slower = {"BLOCK": 64, "BUG": 0}
    default = TOY.default_config(PROBLEM, device.backend)
    with open_store(places["db"]) as store:
        store.record(TunedRow(
            device=device, software=software, kernel=TOY.name, kernel_hash=TOY.source_hash,
            problem=PROBLEM, config=slower,
            tuned=runner.timer(lambda: TOY.launch(runner.inputs, slower)),
            default=runner.timer(lambda: TOY.launch(runner.inputs, default)),
            trials=3, tuning_seconds=1.0, host="elsewhere", study="elsewhere",
        ))
    options = SweepOptions(trials=10, db=places["db"], storage=places["storage"])
    result = run_item(ITEM, options=options)
    assert result.best_config == FASTEST
    assert result.promoted == "replaced"
    [row] = open_store(places["db"]).rows()
    assert row.config == FASTEST and row.study == result.study
    assert [entry.config for entry in row.history] == [slower]


def test_cli_rerun_says_up_to_date(toy_registered, places) -> None:
    runner = CliRunner(env={"COLUMNS": "300"})  # the table's columns unabridged
    args = ["sweep", "--kernel", TOY.name, "--spec-lens", "1", "--batch-sizes", "2",
            "--vocab-sizes", "1200", "--trials", "10", "--db", places["db"],
            "--storage", places["storage"]]
    first = runner.invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "inserted" in first.output
    again = runner.invoke(main, args)
    assert again.exit_code == 0, again.output
    assert "up to date" in again.output


class _LoadedToy(ToySumFamily, SearchObserver):
    """The toy family on a host where a neighbour's load slows the fastest tile while the
    study runs (each of its launches waits 200 ms more, ten times its own time or more:
    with 40 ms, a host whose cores were busy elsewhere slowed the 256 tile enough to bring
    the loaded 1024 tile within a finalist ratio of 1.5, 1 run in 3) and
    stops when the study does; it counts launches."""

    def __init__(self) -> None:
        self.loaded = True
        self.launches = 0

    def launch(self, inputs: ToyInputs, config: Mapping[str, int]):  # type: ignore[no-untyped-def]
        self.launches += 1
        if self.loaded and config["BLOCK"] == FASTEST["BLOCK"]:
            time.sleep(0.2)
        return super().launch(inputs, config)

    def on_stop(self, result: object) -> None:
        self.loaded = False


def _loaded_sweep(places: dict[str, str], monkeypatch: pytest.MonkeyPatch, **options: object):
    toy = _LoadedToy()
    monkeypatch.setitem(FAMILIES, toy.name, toy)
    opts = SweepOptions(trials=10, db=places["db"], storage=places["storage"], **options)  # type: ignore[arg-type]
    result = run_item(ITEM, options=opts, observers=[toy])
    study = Search(space=toy.search_space(detect_device().backend), storage=places["storage"],
                   study_name=result.study)
    return toy, result, study


def test_the_study_best_from_a_loaded_window_loses_its_rematch(places, monkeypatch) -> None:
    """The load made the study's best the 256 tile; measured again side by side once it
    is gone, 1024 beats it and is promoted, with the trial that found it."""
    # Every valid tile is a finalist, however far behind the load put it.
    toy, result, study = _loaded_sweep(places, monkeypatch, finalists=4, finalist_ratio=100.0)
    assert study.best().config == {"BLOCK": 256, "BUG": 0}  # the load's verdict
    assert result.best_config == FASTEST and result.promoted == "inserted"
    [row] = open_store(places["db"]).rows()
    assert row.config == FASTEST and row.tuned == result.best
    [found] = [r for r in study.history() if r.config == FASTEST]
    assert result.best_evaluation == found.evaluation
    # A rerun with no trial since finds this study's own row: up to date, no launch.
    toy.launches = 0
    again = run_item(ITEM, options=SweepOptions(
        trials=10, db=places["db"], storage=places["storage"], finalists=4,
        finalist_ratio=100.0))
    assert (again.best_config, again.promoted, toy.launches) == (FASTEST, "up to date", 0)
    assert open_store(places["db"]).rows() == [row]


@pytest.mark.parametrize("options", [{"finalists": 1, "finalist_ratio": 100.0},
                                     {"finalists": 4, "finalist_ratio": 1.5}])
def test_without_the_rematch_the_loaded_window_decides(places, monkeypatch, options) -> None:
    """finalists=1: the study's best is promoted as it was timed (what the rematch
    fixes); so it is when the load put the fastest tile past the ratio (200 ms against
    the 256 tile's few)."""
    _, result, study = _loaded_sweep(places, monkeypatch, **options)
    assert result.best_config == study.best().config == {"BLOCK": 256, "BUG": 0}
    assert result.promoted == "inserted"


def _record(number: int, block: int, time_us: float | None, status: Status = Status.OK
            ) -> TrialRecord:
    return TrialRecord(number=number, evaluation=number + 1, config={"BLOCK": block},
                       status=status, time=time_us, failure=None, message="", cost=0.0,
                       warm_start=False)


def test_runners_up_are_the_next_fastest_configs_within_the_ratio() -> None:
    """Each config once (a resumed study repeats some), failures left out, fastest first,
    none past ``ratio`` times the best's time, at most ``count``."""
    best = _record(3, 256, 10.0)
    history = [_record(0, 16, 40.0), _record(1, 64, 14.0), _record(2, 1024, 12.0), best,
               _record(4, 64, 13.0), _record(5, 3, None, Status.FAIL), _record(6, 256, 11.0),
               _record(7, 512, 15.5)]
    assert [r.number for r in _runners_up(history, best, count=5, ratio=1.5)] == [2, 4]
    assert [r.number for r in _runners_up(history, best, count=1, ratio=1.5)] == [2]
    assert [r.number for r in _runners_up(history, best, count=5, ratio=1.6)] == [2, 4, 7]
    assert _runners_up(history, best, count=0, ratio=1.5) == []
    assert _runners_up(history, best, count=5, ratio=1.0) == []
