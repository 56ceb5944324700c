"""Where databases are: SPECTUNE_DB, the user database, the shipped one."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectune.db import (
    DatabaseError,
    default_sources,
    display_url,
    parse_target,
    shipped_db_path,
    user_db_path,
    write_target,
)


def test_paths_become_sqlite_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = parse_target("rel/x.db")
    assert url.get_backend_name() == "sqlite"
    assert url.database == str(tmp_path / "rel" / "x.db")
    odd = tmp_path / "a dir?#" / "t.db"
    assert parse_target(str(odd)).database == str(odd)
    assert parse_target(odd).database == str(odd)


def test_urls_are_checked() -> None:
    assert parse_target("sqlite:////tmp/x.db").database == "/tmp/x.db"
    pg = parse_target("postgresql+psycopg://u:secret@127.0.0.1:5432/db")
    assert "secret" not in display_url(pg)
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
    assert write_target().get_backend_name() == "postgresql"


def test_shipped_database_is_in_the_package() -> None:
    import spectune

    assert shipped_db_path() == Path(spectune.__file__).parent / "data" / "tuned.db"
    assert shipped_db_path().is_file()
