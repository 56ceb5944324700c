"""The public API of ``spectune.db``, and what importing it and serving configs import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

import spectune.db

from .conftest import KERNEL, KERNEL_HASH, MI300X, SOFTWARE, make_row, write_db

PUBLIC = [
    "Backend",
    "ConfigIndex",
    "DatabaseError",
    "DatabaseURL",
    "IndexEntry",
    "NightlyResult",
    "NightlyRun",
    "PostgresBackend",
    "Provenance",
    "RecordOutcome",
    "SQLiteBackend",
    "STUDIES_JOURNAL_SUFFIX",
    "STUDIES_SCHEMA",
    "Source",
    "Store",
    "StudyRDB",
    "TunedRow",
    "VS_VLLM_VERDICTS",
    "VllmComparison",
    "backend_of",
    "batch_bucket",
    "check_row",
    "default_sources",
    "display_storage",
    "effective_rows",
    "finish_night",
    "import_rows",
    "is_permanent",
    "load_index",
    "lost_connection",
    "merge_databases",
    "night_results",
    "nights",
    "open_store",
    "parse_target",
    "read_rows_file",
    "record_result",
    "rows_to_json",
    "start_night",
    "study_rdb",
    "upgrade_database",
    "user_db_path",
    "utc_now",
    "write_database",
    "write_rows_file",
    "write_target",
]


def test_every_public_name_is_importable() -> None:
    assert sorted(spectune.db.__all__) == PUBLIC
    for name in spectune.db.__all__:
        assert getattr(spectune.db, name) is not None, name
        assert name in dir(spectune.db)
    with pytest.raises(AttributeError):
        spectune.db.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    namespace: dict[str, Any] = {}
    exec("from spectune.db import *", namespace)
    assert set(spectune.db.__all__) <= set(namespace)
    assert [outcome.value for outcome in spectune.db.RecordOutcome] == [
        "inserted", "replaced", "kept", "unchanged"
    ]  # fmt: skip


_CHILD = textwrap.dedent(
    """
    import json, sys
    import spectune.db
    from spectune.db import load_index
    from spectune.identity import DeviceIdentity, SoftwareIdentity

    device = DeviceIdentity(**json.loads(sys.argv[1]))
    software = SoftwareIdentity(**json.loads(sys.argv[2]))
    index = load_index(device=device, software=software,
                       kernel_hashes=json.loads(sys.argv[3]))
    heavy = sorted(m for m in sys.modules
                   if m.split(".")[0] in ("sqlalchemy", "alembic", "psycopg"))
    print(json.dumps({"heavy": heavy, "len": len(index),
                      "sources": [[s.name, s.status, s.rows] for s in index.sources]}))
    """
)


@pytest.mark.parametrize(
    "form", ["path", "url", "user-only", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_import_and_load_never_import_sqlalchemy(
    form: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    user = write_db(tmp_path / "home" / "spectune.db", [make_row(batch=16)])
    environment = dict(os.environ, SPECTUNE_USER_DB=user)
    environment.pop("SPECTUNE_DB", None)
    if form == "postgresql":
        environment["SPECTUNE_DB"] = write_db(request.getfixturevalue("pg_url"),
                                              [make_row(batch=8)])  # fmt: skip
    elif form != "user-only":
        env_db = write_db(tmp_path / "env.db", [make_row(batch=8)])
        environment["SPECTUNE_DB"] = env_db if form == "path" else "sqlite:///" + env_db
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(asdict(MI300X)), json.dumps(asdict(SOFTWARE)),
         json.dumps({KERNEL: KERNEL_HASH})],
        capture_output=True, text=True, env=environment, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    heavy = {name.split(".")[0] for name in found["heavy"]}
    assert heavy == ({"psycopg"} if form == "postgresql" else set())
    names = [name for name, _, _ in found["sources"]]
    if form == "user-only":
        assert names == ["user", "shipped"]
        assert found["len"] == 1
    else:
        assert names == ["SPECTUNE_DB", "user", "shipped"]
        assert found["len"] == 2
    assert all(status == "read" for _, status, _ in found["sources"])
