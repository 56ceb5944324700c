"""The storage seam (``spectune/db/_backend.py``): each backend from its target forms, what
it says of the database and of the studies beside it, and the rule that no other module
of the package asks which storage it has."""

from __future__ import annotations

import ast
import sqlite3
from pathlib import Path

import pytest

from spectune.db import (
    STUDIES_JOURNAL_SUFFIX,
    STUDIES_SCHEMA,
    Backend,
    DatabaseError,
    PostgresBackend,
    SQLiteBackend,
    backend_of,
    display_storage,
    parse_target,
    study_rdb,
)
from spectune.db._backend import alter_in_batches, dialect_of

REPO = Path(__file__).resolve().parents[2]
SEAM = REPO / "spectune" / "db" / "_backend.py"


@pytest.mark.parametrize(
    "target",
    ["tuned.db", "./dir/tuned.db", Path("tuned.db"), "sqlite:///tuned.db", "sqlite:////tmp/t.db",
     "sqlite+pysqlite:////tmp/t.db"],
)
def test_a_path_or_sqlite_url_resolves_to_sqlite(target: str | Path) -> None:
    backend = backend_of(target)
    assert isinstance(backend, SQLiteBackend)
    assert backend.url == parse_target(target)
    assert backend_of(backend.url).url == backend.url  # a parsed URL resolves as is
    if "://" not in str(target):  # a path is taken from the current directory
        assert Path(backend.display()).is_absolute()
    assert backend.display() == backend.url.display() == str(backend.path)


@pytest.mark.parametrize(
    "target",
    ["postgresql+psycopg://user:secret@db.example:5433/tuned?sslmode=require",
     "postgresql+psycopg:///tuned", "postgresql+psycopg://user@[::1]/tuned"],
)
def test_a_postgresql_url_resolves_to_postgres(target: str) -> None:
    backend = backend_of(target)
    assert isinstance(backend, PostgresBackend)
    assert backend.display() == backend.url.display()
    assert "secret" not in backend.display()
    assert not backend.absent


@pytest.mark.parametrize(
    ("target", "why"),
    [("mysql://u@h/db", "unsupported database 'mysql'"),
     ("postgresql://u@h/db", "use the psycopg driver"),
     ("sqlite:///:memory:", "in-memory"),
     ("sqlite://", "in-memory"),
     ("", "must be a URL or a path")],
)
def test_a_target_no_backend_serves_is_refused(target: str, why: str) -> None:
    with pytest.raises(DatabaseError, match=why):
        backend_of(target)


def test_a_sqlite_file_is_absent_until_it_exists(tmp_path: Path) -> None:
    backend = backend_of(tmp_path / "t.db")
    assert backend.absent and backend.url.absent
    (tmp_path / "t.db").touch()
    assert not backend.absent and not backend.url.absent


def test_studies_live_beside_their_configs(tmp_path: Path) -> None:
    sqlite = backend_of(tmp_path / "tuned.db")
    assert sqlite.studies_storage() == str(tmp_path / ("tuned" + STUDIES_JOURNAL_SUFFIX))
    postgres = backend_of("postgresql+psycopg://u:p%2Fw@h:5432/db?sslmode=require")
    studies = postgres.studies_storage()
    assert studies.startswith("postgresql+psycopg://u:p%2Fw@h:5432/db?")
    assert f"options=-c%20search_path%3D{STUDIES_SCHEMA}" in studies
    assert "sslmode=require" in studies
    assert display_storage(studies).startswith("postgresql+psycopg://u:***@h:5432/db?")


def test_study_rdb_says_how_each_storage_opens() -> None:
    sqlite = study_rdb("sqlite:///x.db")
    assert not sqlite.server and sqlite.prepare is None
    assert sqlite.engine_kwargs == {"connect_args": {"timeout": 60}}
    postgres = study_rdb("postgresql+psycopg://u@h/db?options=-c%20search_path%3Ds")
    assert postgres.server and postgres.prepare is not None
    assert postgres.engine_kwargs == {"pool_pre_ping": True,
                                      "connect_args": {"connect_timeout": 10}}
    psycopg2 = study_rdb("postgresql://u@h/db")  # Optuna's own driver: no lock of ours
    assert psycopg2.server and psycopg2.prepare is None
    assert psycopg2.engine_kwargs["connect_args"] == {"connect_timeout": 10}
    other = study_rdb("mysql://u@h/db")
    assert other == (({"pool_pre_ping": True}), True, None)


def test_the_readers_sql_and_the_writers_batches_follow_the_connection(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / "t.db")
    try:
        assert dialect_of(connection) is SQLiteBackend.sql
    finally:
        connection.close()
    assert dialect_of(object()) is PostgresBackend.sql
    assert SQLiteBackend.sql.marker == "?" and PostgresBackend.sql.marker == "%s"
    from sqlalchemy import create_engine

    engine = create_engine(f"sqlite:///{tmp_path / 't.db'}")
    try:
        with engine.connect() as sa_connection:
            assert alter_in_batches(sa_connection)
    finally:
        engine.dispose()
    assert SQLiteBackend.write_lock_poll_s is not None
    assert PostgresBackend.write_lock_poll_s is None
    assert issubclass(SQLiteBackend, Backend) and issubclass(PostgresBackend, Backend)


# -- no module but the seam asks which storage it has -----------------------------------

#: Drivers only the seam imports.
_DRIVERS = frozenset({"sqlite3", "psycopg", "psycopg2"})
#: Attributes that name a storage (a URL's scheme or driver, SQLAlchemy's dialect name).
_STORAGE_ATTRIBUTES = frozenset({"backend", "driver", "drivername", "is_sqlite"})
_STORAGE_WORDS = ("sqlite", "postgres")


def _storage_word(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.lower().startswith(_STORAGE_WORDS)
    if isinstance(node, ast.Tuple):
        return any(_storage_word(element) for element in node.elts)
    return False


def _names_storage(node: ast.AST) -> bool:
    """``x.backend``, ``x.driver``, ``x.dialect.name``, ``x.get_backend_name()``."""
    if isinstance(node, ast.Call):
        node = node.func
    if not isinstance(node, ast.Attribute):
        return False
    if node.attr in _STORAGE_ATTRIBUTES or node.attr == "get_backend_name":
        return True
    return node.attr == "name" and isinstance(node.value, ast.Attribute) and (
        node.value.attr == "dialect"
    )


def dialect_branches(source: str) -> list[tuple[int, str]]:
    """Where ``source`` asks which storage it has: (line, what)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"imports {a.name}") for a in node.names
                      if a.name.split(".")[0] in _DRIVERS]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _DRIVERS:
            found.append((node.lineno, f"imports from {node.module}"))
        elif isinstance(node, ast.Attribute) and node.attr == "is_sqlite":
            found.append((node.lineno, "asks is_sqlite"))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_storage(s) for s in sides) and any(_storage_word(s) for s in sides):
                found.append((node.lineno, "compares a storage name"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith")
              and any(_storage_word(a) for a in node.args)):
            found.append((node.lineno, f"{node.func.attr} a storage name"))
    return found


def test_the_checker_finds_each_kind_of_branch() -> None:
    planted = (
        "import sqlite3\nfrom psycopg import errors\nurl.is_sqlite\n"
        "engine.dialect.name == 'postgresql'\nif url.backend != 'sqlite': pass\n"
        "storage.startswith(('mysql', 'sqlite'))\n"
        "fmt == 'sqlite'\ndevice.backend == CPU_BACKEND\n"  # not storages: not found
    )
    assert [line for line, _ in dialect_branches(planted)] == [1, 2, 3, 4, 5, 6]


def test_no_module_but_the_seam_branches_on_the_storage() -> None:
    found = {}
    for path in sorted((REPO / "spectune").rglob("*.py")):
        if path == SEAM:
            continue
        branches = dialect_branches(path.read_text(encoding="utf-8"))
        if branches:
            found[str(path.relative_to(REPO))] = branches
    assert found == {}
    assert dialect_branches(SEAM.read_text(encoding="utf-8"))  # the seam itself does
