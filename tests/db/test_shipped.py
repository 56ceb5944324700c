"""The database shipped in the package, and what spectune.db may import."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from spectune.db import DatabaseError, default_sources, load_index, open_store
from spectune.db._locations import Source, shipped_db_path
from spectune.db._reader import HEAD_REVISION

from .conftest import KERNEL, KERNEL_HASH, MI300X, SOFTWARE, make_row

REPO = Path(__file__).resolve().parents[2]


def _build_script():  # type: ignore[no-untyped-def]
    path = REPO / "scripts" / "build_shipped_db.py"
    spec = importlib.util.spec_from_file_location("build_shipped_db", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_database_is_current_empty_and_small() -> None:
    path = shipped_db_path()
    assert path.stat().st_size <= 64 * 1024
    header = path.read_bytes()[:100]
    assert header[:16] == b"SQLite format 3\x00"
    assert header[18:20] == b"\x01\x01"  # rollback journal, not WAL: one self-contained file
    shipped = next(s for s in default_sources() if s.name == "shipped")
    assert shipped.immutable
    with open_store(shipped, readonly=True) as store:
        # No rows measured on real hardware exist yet: it ships empty, with the schema.
        assert store.count() == 0
        with pytest.raises(DatabaseError, match="read-only"):
            store.record(make_row())


def test_committed_file_is_what_the_build_script_writes(tmp_path: Path) -> None:
    out = tmp_path / "tuned.db"
    assert _build_script().build(out=out, rows_file=None) == 0
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(
        shipped_db_path().read_bytes()
    ).digest()
    assert not Path(f"{out}-wal").exists()


def test_build_script_refuses_interpreter_rows(tmp_path: Path) -> None:
    from spectune.db import write_rows_file
    from spectune.identity import DeviceIdentity

    cpu = DeviceIdentity("cpu-interpreter", "x86_64", "cpu", 2, 1)
    rows = tmp_path / "rows.json"
    write_rows_file([make_row(device=cpu, config={"BLOCK_V": 256, "num_warps": 1})], rows,
                    fmt="json")  # fmt: skip
    with pytest.raises(SystemExit, match="CPU interpreter"):
        _build_script().build(out=tmp_path / "x.db", rows_file=rows)
    hardware = tmp_path / "hw.json"
    write_rows_file([make_row()], hardware, fmt="json")
    assert _build_script().build(out=tmp_path / "hw.db", rows_file=hardware) == 1


def test_loading_the_shipped_database_writes_nothing() -> None:
    path = shipped_db_path()
    before = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    index = load_index(device=MI300X, software=SOFTWARE, kernel_hashes={KERNEL: KERNEL_HASH},
                       sources=[Source(name="shipped", url=default_sources()[-1].url,
                                       immutable=True)])  # fmt: skip
    assert index.sources[0].status == "read"
    assert index.sources[0].rows == 0
    assert (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns) == before
    for extra in ("-wal", "-shm", "-journal"):
        assert not Path(f"{path}{extra}").exists()
    assert HEAD_REVISION == "0004"


def test_reading_imports_no_triton_torch_kernels_tuner_vllm_or_alembic() -> None:
    code = (
        "import sys\n"
        "from spectune.db import load_index\n"
        "from spectune.identity import DeviceIdentity, SoftwareIdentity\n"
        "load_index(device=DeviceIdentity('hip', 'gfx942', 'X', 1, 64),\n"
        "           software=SoftwareIdentity('3', '2', 'r', '0'), kernel_hashes={})\n"
        "bad = [m for m in ('triton', 'torch', 'spectune.kernels', 'spectune.search',\n"
        "                   'spectune.tuning',\n"
        "                   'vllm', 'alembic') if m in sys.modules]\n"
        "print(bad)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


def test_nothing_read_is_executed_and_sql_is_never_formatted() -> None:
    """No deserializer that runs code, and no SQL built from strings, in spectune.db."""
    package = REPO / "spectune"
    sources = [*sorted((package / "db").rglob("*.py")), package / "promotion.py"]
    assert len(sources) > 10
    forbidden = (
        *("pickle", "PickleType", "marshal", "shelve", "eval(", "exec(", "yaml"),
        *('text(f"', "text(f'", 'exec_driver_sql(f"', "exec_driver_sql(f'", "% ("),
    )
    for path in sources:
        source = path.read_text()
        for word in forbidden:
            assert word not in source, f"{path.relative_to(REPO)} contains {word!r}"
