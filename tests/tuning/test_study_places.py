"""Studies live where the configs live, and say what they tune (for optuna-dashboard)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from spectune.cli import main
from tests.tuning.toy_family import ToySumFamily


def _sweep(db: Path) -> dict[str, object]:
    result = CliRunner().invoke(main, [
        "sweep", "--kernel", "toy_sum", "--spec-lens", "2", "--batch-sizes", "1",
        "--vocab-sizes", "64", "--trials", "3", "--no-transfer", "--json", "--db", str(db)])
    assert result.exit_code == 0, result.output
    (line,) = json.loads(result.stdout)
    return line


def test_each_database_keeps_its_own_studies_with_their_attributes(
    toy_registered: ToySumFamily, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECTUNE_USER_DB", str(tmp_path / "home" / "spectune.db"))
    monkeypatch.delenv("SPECTUNE_DB", raising=False)
    first = _sweep(tmp_path / "a.db")
    assert first["storage"] == str(tmp_path / "a.studies.journal")
    assert first["trials"] == 3
    # A sweep into another database starts its own study: nothing is resumed from a.db's.
    second = _sweep(tmp_path / "b.db")
    assert second["storage"] == str(tmp_path / "b.studies.journal")
    assert second["trials"] == 3
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(second["storage"])))
    (summary,) = optuna.get_all_study_summaries(storage)
    assert summary.user_attrs == {
        "kernel": "toy_sum", "kernel_hash": toy_registered.source_hash, "k": 2, "batch": 1,
        "vocab": 64, "dtype": "float32", "draft_probs": True, "device": "cpu",
        "backend": "cpu-interpreter", "arch": summary.user_attrs["arch"]}
    assert not (tmp_path / "home").exists()
