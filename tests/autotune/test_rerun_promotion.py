"""A sweep's promotion on reruns: no config faster than itself, no verdict from noise.

The toy family's real kernels under the interpreter, real SQLite databases and journal
storages. The default tile (16) is the slowest valid one and 1024 the fastest, by far
(75 and 2 steps over a row of 1200).
"""

from __future__ import annotations

import os
import socket

import pytest
from click.testing import CliRunner

from spectune.autotune.problems import SweepItem
from spectune.autotune.sweep import SweepOptions, run_item
from spectune.autotune.trial import TrialRunner
from spectune.cli import main
from spectune.db import TunedRow, open_store
from spectune.identity import detect_device, detect_software
from spectune.space import Problem
from tests.autotune.toy_family import ToySumFamily

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
    assert open_store(places["db"]).rows() == [stored]


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
