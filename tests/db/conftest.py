"""Fixtures of the database tests: isolated locations, rows, SQLite and PostgreSQL URLs."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from spectune.db import TunedRow, open_store
from spectune.identity import DeviceIdentity, SoftwareIdentity
from spectune.promotion import Timing
from spectune.space import Constraint, Param, Problem, SearchSpace

ASSETS = Path(__file__).parent / "assets"

MI300X = DeviceIdentity(
    backend="hip", arch="gfx942", device_name="AMD_Instinct_MI300X", cu_count=304, warp_size=64
)
H200 = DeviceIdentity(
    backend="cuda", arch="sm_90", device_name="NVIDIA_H200", cu_count=132, warp_size=32
)
SOFTWARE = SoftwareIdentity(
    triton="3.2.0", torch="2.6.0", runtime="hip-6.2.41133", spectune="0.1.0"
)
KERNEL = "rejection_sample"
KERNEL_HASH = "0123456789abcdef"
T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)

#: A small space like the kernel's: power-of-two tiles, a HIP-only knob, a constraint.
SPACE = SearchSpace(
    params=(
        Param("BLOCK_V", (256, 512, 1024, 2048), power_of_two=True),
        Param("num_warps", (1, 2, 4, 8), power_of_two=True),
        Param("waves_per_eu", (0, 1, 2), backends=("hip",)),
    ),
    constraints=(
        Constraint("BLOCK_V >= 64 * num_warps", lambda c: c["BLOCK_V"] >= 64 * c["num_warps"]),
    ),
)
CONFIG = {"BLOCK_V": 1024, "num_warps": 4, "waves_per_eu": 1}


def make_row(
    *,
    device: DeviceIdentity = MI300X,
    software: SoftwareIdentity = SOFTWARE,
    kernel: str = KERNEL,
    kernel_hash: str = KERNEL_HASH,
    spec_len: int = 4,
    batch: int = 8,
    vocab: int = 128256,
    dtype: str = "bfloat16",
    draft_probs: bool = True,
    config: dict[str, Any] | None = None,
    p50: float = 10.0,
    spread: float = 0.2,
    default_p50: float = 15.0,
    host: str = "node-a",
    study: str = "study-1",
    tuned_at: datetime = T0,
    **extra: Any,
) -> TunedRow:
    """A valid row; keyword arguments change one field at a time."""
    return TunedRow(
        device=device,
        software=software,
        kernel=kernel,
        kernel_hash=kernel_hash,
        problem=Problem(
            spec_len=spec_len, batch=batch, vocab=vocab, dtype=dtype, draft_probs=draft_probs
        ),
        config=dict(CONFIG if config is None else config),
        tuned=Timing(p50 - spread, p50, p50 + spread),
        default=Timing(default_p50 - 0.5, default_p50, default_p50 + 0.5),
        trials=extra.pop("trials", 64),
        tuning_seconds=extra.pop("tuning_seconds", 42.5),
        host=host,
        study=study,
        tuned_at=tuned_at,
        **extra,
    )


def later(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def write_db(target: str | Path, rows: list[TunedRow]) -> str:
    """Create (or add to) a database holding ``rows``; returns ``target`` as a string."""
    with open_store(target) as store:
        store.record_many(rows)
    return str(target)


@pytest.fixture(autouse=True)
def _isolated_locations(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads SPECTUNE_DB from the outside or touches the real user database."""
    monkeypatch.delenv("SPECTUNE_DB", raising=False)
    monkeypatch.setenv("SPECTUNE_USER_DB", str(tmp_path / "home" / "spectune.db"))


def pg_server_url() -> str:
    """The test server's URL; skips without one, fails in CI (it must not skip there)."""
    url = os.environ.get("SPECTUNE_TEST_PG_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail(
                "SPECTUNE_TEST_PG_URL is not set but CI is: scripts/test.sh starts the "
                "server with scripts/postgres.sh; the PostgreSQL tests must not skip in CI"
            )
        pytest.skip(
            "SPECTUNE_TEST_PG_URL not set "
            "(export SPECTUNE_TEST_PG_URL=$(bash scripts/postgres.sh) to run these)"
        )
    return url


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database on the test server, dropped afterwards."""
    base = make_url(pg_server_url())
    name = f"spectune_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        yield base.set(database=name).render_as_string(hide_password=False)
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test on an embedded SQLite file and on a PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "tuned.db")
    return request.getfixturevalue("pg_url")
