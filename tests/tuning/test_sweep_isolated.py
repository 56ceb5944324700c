"""A sweep with isolated trials: configs that abort, segfault or hang fail their trials,
the sweep goes on, and the best valid config is promoted (CPU, Triton interpreter)."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from spectune.cli import main
from spectune.db import open_store
from spectune.kernels import FAMILIES
from spectune.space import Problem
from spectune.tuning.problems import SweepItem
from spectune.tuning.sweep import SweepOptions, run_item
from tests.tuning.crash_family import CrashFamily


@pytest.fixture
def crash_registered(monkeypatch: pytest.MonkeyPatch) -> CrashFamily:
    family = CrashFamily(faults=("abort", "hang", "segfault", "wrong"))
    monkeypatch.setitem(FAMILIES, family.name, family)
    return family


def test_a_sweep_survives_aborts_segfaults_and_hangs(
    crash_registered: CrashFamily, places: dict[str, str]
) -> None:
    item = SweepItem("crash_probe", Problem(spec_len=1, batch=1, vocab=256,
                                            dtype="float32", draft_probs=True))
    space_size = crash_registered.search_space("cpu-interpreter").size()
    options = SweepOptions(trials=space_size, db=places["db"], storage=places["storage"],
                           trial_time_limit=3.0, isolate=True, transfer=False)
    result = run_item(item, options=options)
    assert result.best_config == {"BLOCK": 256, "FAULT": 0}
    assert result.promoted == "inserted"
    assert result.trials == space_size and result.failed >= 4 and result.invalid == 1
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(places["storage"]))
    trials = optuna.load_study(study_name=result.study, storage=storage).trials
    failures = {t.user_attrs.get("spectune.failure") for t in trials}
    assert {"crash", "timeout"} <= failures
    messages = " ".join(str(t.user_attrs.get("spectune.message", "")) for t in trials)
    assert "SIGABRT" in messages and "SIGSEGV" in messages
    with open_store(places["db"], readonly=True) as store:
        (row,) = store.rows(kernel="crash_probe")
    assert row.config == {"BLOCK": 256, "FAULT": 0}
    assert multiprocessing.active_children() == []


def test_the_cli_isolates_on_request(
    crash_registered: CrashFamily, places: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(FAMILIES, "crash_probe", CrashFamily(faults=("abort",)))
    result = CliRunner().invoke(main, [
        "sweep", "--kernel", "crash_probe", "--spec-lens", "1", "--batch-sizes", "1",
        "--vocab-sizes", "256", "--trials", "4", "--isolate", "--no-transfer", "--json",
        "--db", places["db"], "--storage", places["storage"]])
    assert result.exit_code == 0, result.output
    (line,) = json.loads(result.stdout)
    assert line["best_config"] == {"BLOCK": 256, "FAULT": 0}
    assert line["failed"] >= 1


def test_isolation_is_checked(places: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="isolate"):
        SweepOptions(isolate="yes")  # type: ignore[arg-type]
    assert Path(places["db"]).exists() is False
