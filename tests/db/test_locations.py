"""Where databases are: SPECTUNE_DB, the user database, the shipped one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spectune.db import DatabaseError, default_sources, user_db_path
from spectune.db._locations import DatabaseURL, parse_target, shipped_db_path, write_target


def test_paths_become_sqlite_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = parse_target("rel/x.db")
    assert url.backend == "sqlite"
    assert url.is_sqlite
    assert url.database == str(tmp_path / "rel" / "x.db")
    odd = tmp_path / "a dir?#" / "t.db"
    assert parse_target(str(odd)).database == str(odd)
    assert parse_target(odd).database == str(odd)


def test_urls_are_checked() -> None:
    assert parse_target("sqlite:////tmp/x.db").database == "/tmp/x.db"
    pg = parse_target("postgresql+psycopg://u:secret@127.0.0.1:5432/db")
    assert "secret" not in pg.display()
    assert "secret" not in repr(pg)
    with pytest.raises(DatabaseError, match="unsupported database 'mysql'"):
        parse_target("mysql://u@h/db")
    with pytest.raises(DatabaseError, match="psycopg"):
        parse_target("postgresql://u@h/db")
    with pytest.raises(DatabaseError, match="in-memory"):
        parse_target("sqlite://")
    with pytest.raises(DatabaseError, match="URL or a path"):
        parse_target("  ")


def test_unparsable_url_does_not_echo_credentials() -> None:
    with pytest.raises(DatabaseError) as caught:
        parse_target("postgresql+psycopg://user:hunter2@host:notaport/db")
    assert "hunter2" not in str(caught.value)


def test_user_database_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert user_db_path() == tmp_path / "home" / "spectune.db"  # the conftest override
    monkeypatch.delenv("SPECTUNE_USER_DB")
    import platformdirs

    assert user_db_path() == Path(platformdirs.user_data_dir("spectune")) / "spectune.db"


def test_sources_in_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    names = [s.name for s in default_sources()]
    assert names == ["user", "shipped"]
    monkeypatch.setenv("SPECTUNE_DB", str(tmp_path / "env.db"))
    sources = default_sources()
    assert [s.name for s in sources] == ["SPECTUNE_DB", "user", "shipped"]
    assert sources[0].url.database == str(tmp_path / "env.db")
    assert sources[1].url.database == str(tmp_path / "home" / "spectune.db")
    assert sources[2].url.database == str(shipped_db_path())
    assert [s.immutable for s in sources] == [False, False, True]


def test_writers_write_to_spectune_db_else_user(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert write_target().database == str(tmp_path / "home" / "spectune.db")
    monkeypatch.setenv("SPECTUNE_DB", "postgresql+psycopg://u@127.0.0.1/x")
    assert write_target().backend == "postgresql"


def test_shipped_database_is_in_the_package() -> None:
    import spectune

    assert shipped_db_path() == Path(spectune.__file__).parent / "data" / "tuned.db"
    assert shipped_db_path().is_file()


# What SQLAlchemy's make_url gave for these targets (the parser used before ours), as
# (driver, database, display), or the refusal: our parser must keep reading them so.
TARGETS = {
    "tuned.db": ("sqlite", "{here}/tuned.db", "{here}/tuned.db"),
    "~/tuned.db": ("sqlite", "{home}/tuned.db", "{home}/tuned.db"),
    "dir/tuned.db": ("sqlite", "{here}/dir/tuned.db", "{here}/dir/tuned.db"),
    "/abs/tuned.db": ("sqlite", "/abs/tuned.db", "/abs/tuned.db"),
    "a b.db": ("sqlite", "{here}/a b.db", "{here}/a b.db"),
    "sqlite:///rel.db": ("sqlite", "rel.db", "rel.db"),
    "sqlite:////abs/x.db": ("sqlite", "/abs/x.db", "/abs/x.db"),
    "sqlite+pysqlite:///x%20y.db": ("sqlite+pysqlite", "x y.db", "x y.db"),
    "sqlite:///a@b:c/d.db": ("sqlite", "a@b:c/d.db", "a@b:c/d.db"),
    "sqlite:///x#y.db": ("sqlite", "x#y.db", "x#y.db"),
    "sqlite:///x.db?mode=ro": ("sqlite", "x.db", "x.db"),
    "sqlite+pysqlcipher:///x.db": ("sqlite+pysqlcipher", "x.db", "x.db"),
    "sqlite://host/x.db": ("sqlite", "x.db", "x.db"),
    "postgresql+psycopg://u:p@h/db": (
        "postgresql+psycopg", "db", "postgresql+psycopg://u:***@h/db"),
    "postgresql+psycopg://u:secret@127.0.0.1:5432/db": (
        "postgresql+psycopg", "db", "postgresql+psycopg://u:***@127.0.0.1:5432/db"),
    "postgresql+psycopg://u%40x:p%3Aw@[::1]:5/d%20b?sslmode=require&application_name=a+b": (
        "postgresql+psycopg", "d b",
        "postgresql+psycopg://u%40x:***@[::1]:5/d b?application_name=a+b&sslmode=require"),
    "postgresql+psycopg:///db": ("postgresql+psycopg", "db", "postgresql+psycopg:///db"),
    "postgresql+psycopg://h": ("postgresql+psycopg", None, "postgresql+psycopg://h"),
    "sqlite:///": "in-memory",
    "sqlite://": "in-memory",
    "sqlite:///:memory:": "in-memory",
    "SQLITE:///x.db": "unsupported database 'SQLITE' in SQLITE:///x.db",
    " sqlite:///x.db": "cannot parse database URL (unparsable)",
    "postgresql://u@h/db": "use the psycopg driver for PostgreSQL",
    "mysql://x@y/z": "unsupported database 'mysql' in mysql://x@y/z: use a file path",
    "postgresql+psycopg://user:hunter2@host:notaport/db": "cannot parse database URL",
    "postgresql+psycopg://u:p@h:/db": "cannot parse database URL",
    "://x": "cannot parse database URL",
    "sql ite://x": "cannot parse database URL",
    "   ": "must be a URL or a path",
    "": "must be a URL or a path",
}  # fmt: skip


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_targets_read_as_before(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    expected = TARGETS[target]
    if isinstance(expected, str):
        with pytest.raises(DatabaseError, match=re.escape(expected)):
            parse_target(target)
        return
    places = {"here": tmp_path, "home": Path.home()}
    driver, database, shown = (
        part if part is None else part.format(**places) for part in expected
    )
    url = parse_target(target)
    assert (url.driver, url.database, url.display()) == (driver, database, shown)
    if "://" in target:  # the writers' engines get what SQLAlchemy read before
        from sqlalchemy.engine import make_url

        assert url.sqlalchemy_url() == make_url(target)


def test_repeated_query_parameters_are_refused() -> None:
    with pytest.raises(DatabaseError, match="cannot parse"):
        parse_target("postgresql+psycopg://u@h/db?x=1&x=2")


def test_postgres_connection_parameters() -> None:
    url = parse_target("postgresql+psycopg://u%40x:p%3Aw@[::1]:5/d%20b?sslmode=require")
    assert url.connect_params() == {
        "host": "::1", "port": 5, "user": "u@x", "password": "p:w", "dbname": "d b",
        "sslmode": "require",
    }  # fmt: skip
    assert parse_target("postgresql+psycopg:///db").connect_params() == {"dbname": "db"}
    assert DatabaseURL.sqlite_file("x.db").database == str(Path("x.db").absolute())
