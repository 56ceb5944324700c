"""Fixtures of the search tests: a PostgreSQL database for the fleet tests, and a spy on
which of the GP's acquisitions a proposal used."""

from __future__ import annotations

import pytest

from spectune.search._gp import GaussianProcess

# A fresh database on the PostgreSQL test server, as the database tests get one.
from tests.db.conftest import pg_url  # noqa: F401


def spy_gp_acquisitions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that records, in order, each call of the real GP's ``sample`` (a Thompson
    draw) and ``predict`` (expected improvement), by name; the calls still run."""
    calls: list[str] = []
    for method in ("sample", "predict"):
        real = getattr(GaussianProcess, method)

        def spy(self: GaussianProcess, *a: object, _real=real, _name=method) -> object:
            calls.append(_name)
            return _real(self, *a)

        monkeypatch.setattr(GaussianProcess, method, spy)
    return calls
