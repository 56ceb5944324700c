"""Fixtures of the sweep tests: the toy kernel family registered, and a sweep's places."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectune.kernels import FAMILIES

# A fresh database on the PostgreSQL test server, as the database tests get one.
from tests.db.conftest import pg_url  # noqa: F401
from tests.tuning.toy_family import ToySumFamily


@pytest.fixture
def toy_registered(monkeypatch: pytest.MonkeyPatch) -> ToySumFamily:
    """The toy family, findable by name as the sweep looks families up."""
    toy = ToySumFamily()
    monkeypatch.setitem(FAMILIES, toy.name, toy)
    return toy


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A configs database and a study journal of the test's own (the user database too)."""
    monkeypatch.setenv("SPECTUNE_USER_DB", str(tmp_path / "user.db"))
    monkeypatch.delenv("SPECTUNE_DB", raising=False)
    return {"db": str(tmp_path / "configs.db"), "storage": str(tmp_path / "studies.journal")}
