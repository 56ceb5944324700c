"""``spectune db``: the commands, and one clear line (never a traceback) on every error."""

from __future__ import annotations

import io
import json
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from spectune.cli import main
from spectune.db import VllmComparison, open_store, read_rows_file, write_rows_file
from spectune.db._files import rows_to_json
from spectune.db._reader import HEAD_REVISION
from spectune.identity import DeviceIdentity

from .conftest import ASSETS, H200, make_row

REPO = Path(__file__).resolve().parents[2]
# The rejection kernel's real space on HIP (the CLI checks against the registry).
HIP_CONFIG = {"BLOCK_V": 1024, "SPLITS": 1, "num_warps": 4, "num_stages": 2, "waves_per_eu": 0}
CUDA_CONFIG = {"BLOCK_V": 2048, "SPLITS": 2, "num_warps": 8, "num_stages": 1}


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["db", *args], env={"COLUMNS": "250", **(env or {})})


def assert_clean_failure(result: Result, *fragments: str) -> str:
    """Exit 1 with exactly one line on stderr, naming the problem, and no traceback."""
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def user_db(tmp_path: Path) -> Path:
    """The user database (SPECTUNE_USER_DB from conftest) with three rows."""
    path = tmp_path / "home" / "spectune.db"
    with open_store(path) as store:
        store.record_many(
            [
                make_row(config=HIP_CONFIG),
                make_row(batch=16, config=HIP_CONFIG, kernel="other_kernel"),
                make_row(device=H200, config=CUDA_CONFIG),
            ]
        )
    return path


def test_show_table_and_filters(user_db: Path) -> None:
    result = run("show")
    assert result.exit_code == 0, result.output
    assert "3 tuned rows" in result.stdout
    assert "AMD_Instinct_MI300X" in result.stdout and "NVIDIA_H200" in result.stdout
    assert "BLOCK_V=1024,SPLITS=1" in result.stdout
    assert "1.50x" in result.stdout
    assert "2 tuned rows" in run("show", "--gpu", "mi300x").stdout
    assert "1 tuned rows" in run("show", "--gpu", "sm_90").stdout
    assert "1 tuned rows" in run("show", "--kernel", "other_kernel").stdout
    assert "0 tuned rows" in run("show", "--gpu", "gfx90a").stdout


def test_show_json_is_the_rows(user_db: Path) -> None:
    result = run("show", "--json")
    assert result.exit_code == 0
    with open_store(user_db, readonly=True) as store:
        assert json.loads(result.stdout) == json.loads(rows_to_json(store.rows()))
    filtered = json.loads(run("show", "--json", "--gpu", "H200").stdout)
    assert [row["device_name"] for row in filtered] == ["NVIDIA_H200"]


def test_show_one_database_prints_strings_literally(tmp_path: Path) -> None:
    path = tmp_path / "[bold red]x[/bold red].db"
    path.parent.mkdir()  # the "/" makes "[bold red]x[" a folder: writers create none
    with open_store(path) as store:
        store.record(make_row())
    # Wide enough that the source column never wraps, however deep pytest's tmp_path is
    # (xdist workers add a level); only --wide shows the source.
    result = run("show", "--wide", "--db", str(path), env={"COLUMNS": "600"})
    assert result.exit_code == 0
    assert "[bold red]x[/bold red].db" in result.stdout


LONG_CONFIG = {"BLOCK_V": 8192, "SPLITS": 4, "num_warps": 8, "num_stages": 2, "waves_per_eu": 2}
H100 = DeviceIdentity(backend="cuda", arch="sm_90", device_name="NVIDIA_H100_80GB_HBM3",
                      cu_count=132, warp_size=32)


@pytest.fixture
def long_rows(tmp_path: Path) -> Path:
    """A database of rows with realistic long values: names, vocabularies, configs."""
    path = tmp_path / "long.db"
    with open_store(path) as store:
        store.record_many([
            make_row(kernel="rejection_sample_mrv2_folded", vocab=151936, config=LONG_CONFIG,
                     p50=1234.56, default_p50=2345.67,
                     vllm=VllmComparison("faster", 2000.0, "0.32.0", peak_mib=48.0,
                                         tuned_peak_mib=12.5)),
            make_row(device=H100, kernel="rejection_sample_folded", spec_len=8, batch=64,
                     dtype="float16", draft_probs=False, config=CUDA_CONFIG,
                     vllm=VllmComparison("not faster", 9.0, "0.33.0")),
            make_row(device=H200, config=CUDA_CONFIG, p50=123456.78, default_p50=234567.89),
        ])  # fmt: skip
    return path


def _whole(token: str, text: str) -> bool:
    """Whether ``token`` appears in ``text`` as a whole, not cut or glued to another."""
    return re.search(rf"(?<![\w.]){re.escape(token)}(?![\w.])", text) is not None


@pytest.mark.parametrize("columns", [80, 100, 132])
def test_show_fits_the_terminal_and_cuts_no_value(long_rows: Path, columns: int) -> None:
    result = run("show", "--db", str(long_rows), env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert all(len(line) <= columns for line in out.splitlines()), out
    assert "3 tuned rows" in out
    for token in (
        "rejection_sample_mrv2_folded", "rejection_sample_folded", "rejection_sample",
        "AMD_Instinct_MI300X", "NVIDIA_H100_80GB_HBM3", "NVIDIA_H200", "gfx942", "sm_90",
        "1235", "1.90x", "123457", "10.00", "1.50x", "1.62x", "0.90x",
        *(f"{k}={v}" for k, v in {**LONG_CONFIG, **CUDA_CONFIG}.items()),
    ):  # fmt: skip
        assert _whole(token, out), (token, out)
    # vs vLLM: vLLM's p50 over the tuned p50 where compared, a dash where not.
    [h200] = [line for line in out.splitlines() if "NVIDIA_H200" in line]
    assert h200.split()[-2:] == ["1.90x", "—"], out
    for shape in ("k=4 B=8 V=151936 bf16", "k=8 B=64 V=128256 fp16 no-dp"):
        assert shape in out, (shape, out)
    # The columns only --wide shows.
    assert "3.2.0" not in out and "2026-01-02" not in out and str(long_rows) not in out
    assert "2346" not in out and "0.32.0" not in out
    assert "12.5" not in out and "48.0" not in out and "MiB" not in out  # peak memory


def test_show_puts_the_config_below_its_problem(long_rows: Path) -> None:
    out = run("show", "--db", str(long_rows), "--kernel", "rejection_sample_mrv2_folded",
              env={"COLUMNS": "80"}).stdout
    lines = out.splitlines()
    [first] = [i for i, line in enumerate(lines) if "rejection_sample_mrv2_folded" in line]
    assert "AMD_Instinct_MI300X" in lines[first] and "1.90x" in lines[first]
    assert lines[first].endswith("1.62x")
    below = "".join(line.split("  ")[0].strip() for line in lines[first + 1 :])
    assert "BLOCK_V=8192,SPLITS=4,num_warps=8,num_stages=2,waves_per_eu=2" in below, out


def test_show_wide_has_every_column_whole(long_rows: Path) -> None:
    result = run("show", "--wide", "--db", str(long_rows), env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    for header in ("kernel", "device", "arch", "draft probs", "config", "p50 µs",
                   "default p50 µs", "speedup", "vs vLLM", "vLLM version", "peak MiB",
                   "vLLM peak MiB", "triton", "tuned (UTC)", "source"):
        assert header in out, (header, out)
    # Widened past 80 rather than folded: a row and its config on one line.
    [row] = [line for line in out.splitlines() if "rejection_sample_mrv2_folded" in line]
    for cell in ("AMD_Instinct_MI300X", "gfx942", "151936", "bfloat16", "yes", "1234.56",
                 "2345.67", "1.90x", "1.62x", "0.32.0", "3.2.0",
                 "2026-01-02 03:04",
                 str(long_rows),
                 "BLOCK_V=8192,SPLITS=4,num_warps=8,num_stages=2,waves_per_eu=2"):
        assert cell in row, (cell, row)
    # Peak device memory of one call, the config's then vLLM's, after the vLLM version;
    # measured on GPUs only: a dash where there is none.
    assert re.search(r"0\.32\.0\s*│\s*12\.5\s*│\s*48\.0\s*│", row), row
    [h200] = [line for line in out.splitlines() if "NVIDIA_H200" in line]
    assert re.search(r"—\s*│\s*—\s*│\s*—\s*│\s*—\s*│", h200), h200


def test_show_json_ignores_the_table_options(long_rows: Path) -> None:
    plain = run("show", "--json", "--db", str(long_rows), env={"COLUMNS": "80"})
    wide = run("show", "--json", "--wide", "--db", str(long_rows), env={"COLUMNS": "80"})
    assert plain.exit_code == wide.exit_code == 0
    assert plain.stdout == wide.stdout
    with open_store(long_rows, readonly=True) as store:
        assert plain.stdout == rows_to_json(store.rows())
    peaks = [(r["vllm_peak_mib"], r["tuned_peak_mib"]) for r in json.loads(plain.stdout)]
    assert sorted(peaks, key=str) == sorted([(48.0, 12.5), (None, None), (None, None)], key=str)


def test_phrases_wrap_between_phrases_only() -> None:
    from rich.console import Console

    from spectune.cli.db import Phrases

    cell = Phrases([(["rejection_sample", "k=4 B=8 V=128256 bf16"], "", " "),
                    (["BLOCK_V=1024", "SPLITS=1", "num_warps=4"], "dim", ","),
                    ([], "", " ")])  # fmt: skip

    def lines(width: int) -> list[str]:
        console = Console(file=io.StringIO(), width=width)
        console.print(cell)
        return [line.rstrip() for line in console.file.getvalue().splitlines()]

    assert lines(80) == ["rejection_sample k=4 B=8 V=128256 bf16",
                         "BLOCK_V=1024,SPLITS=1,num_warps=4"]  # fmt: skip
    assert lines(25) == ["rejection_sample", "k=4 B=8 V=128256 bf16",
                         "BLOCK_V=1024,SPLITS=1,", "num_warps=4"]  # fmt: skip
    # A phrase wider than the cell wraps at its own spaces.
    assert lines(16)[:3] == ["rejection_sample", "k=4 B=8 V=128256", "bf16"]


def test_show_with_no_databases(tmp_path: Path) -> None:
    result = run("show")
    assert result.exit_code == 0
    assert "0 tuned rows" in result.stdout


def test_export_import_round_trip(user_db: Path, tmp_path: Path) -> None:
    for fmt in ("json", "csv"):
        out = tmp_path / f"rows.{fmt}"
        # Rows of a kernel family not installed here cannot be checked: not importable.
        result = run("export", str(out), "--format", fmt)
        assert result.exit_code == 0, result.output
        assert "exported 3 rows" in result.stderr
        target = tmp_path / f"imported-{fmt}.db"
        assert_clean_failure(
            run("import", str(out), "--into", str(target)),
            "no search space for kernel family 'other_kernel'",
        )
        result = run("export", str(out), "--format", fmt, "--kernel", "rejection_sample")
        assert "exported 2 rows" in result.stderr
        result = run("import", str(out), "--into", str(target))
        assert result.exit_code == 0, result.output
        assert "2 inserted" in result.stderr
        with open_store(target, readonly=True) as a, open_store(user_db, readonly=True) as b:
            assert a.rows() == b.rows(kernel="rejection_sample")


def test_export_vllm_json(user_db: Path, tmp_path: Path) -> None:
    result = run("export", str(tmp_path / "vllm"), "--format", "vllm-json", "--gpu", "H200")
    assert result.exit_code == 0, result.output
    (file,) = (tmp_path / "vllm").iterdir()
    assert file.name == "kernel=rejection_sample,device_name=NVIDIA_H200.json"
    table = json.loads(file.read_text())
    assert table["spec_len=4,vocab=128256,dtype=bfloat16,draft_probs=true"] == {"8": CUDA_CONFIG}


def test_import_defaults_to_the_user_database(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    write_rows_file([make_row(config=HIP_CONFIG)], path, fmt="json")
    result = run("import", str(path))
    assert result.exit_code == 0, result.output
    with open_store(tmp_path / "home" / "spectune.db", readonly=True) as store:
        assert store.count() == 1


def test_merge_command(tmp_path: Path) -> None:
    a, b, dst = (str(tmp_path / n) for n in ("a.db", "b.db", "dst.db"))
    with open_store(a) as store:
        store.record(make_row(config=HIP_CONFIG, p50=10.0, host="a"))
    with open_store(b) as store:
        store.record(make_row(config={**HIP_CONFIG, "BLOCK_V": 2048}, p50=8.0, host="b"))
    result = run("merge", a, b, "--into", dst)
    assert result.exit_code == 0, result.output
    assert "1 replaced" in result.stderr
    with open_store(dst, readonly=True) as store:
        (row,) = store.rows()
    assert (row.host, [h.host for h in row.history]) == ("b", ["a"])


def test_upgrade_command(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    shutil.copyfile(ASSETS / "schema_0001.db", old)
    assert_clean_failure(run("show", "--db", str(old)), "older than", "spectune db upgrade")
    result = run("upgrade", "--db", str(old))
    assert result.exit_code == 0
    # To the newest revision this spectune knows, however many follow 0001.
    assert f"schema revision 0001 -> {HEAD_REVISION}" in result.stderr
    assert "2 tuned rows" in run("show", "--db", str(old)).stdout
    assert f"already at schema revision {HEAD_REVISION}" in run("upgrade", "--db", str(old)).stderr


def _running_row() -> Any:
    from spectune.identity import detect_device, detect_software
    from spectune.kernels import FAMILIES

    device = detect_device()
    family = FAMILIES["rejection_sample"]
    config = next(iter(family.search_space(device.backend)))
    return make_row(device=device, software=detect_software(), kernel_hash=family.source_hash,
                    config=config)  # fmt: skip


def test_validate_says_why_rows_are_not_usable(user_db: Path) -> None:
    with open_store(user_db) as store:
        store.record(_running_row())
    result = run("validate", "--json")
    assert result.exit_code == 0, result.output
    verdicts = json.loads(result.stdout)
    assert len(verdicts) == 4
    usable = [v for v in verdicts if v["usable"]]
    assert [v["row"]["backend"] for v in usable] == ["cpu-interpreter"]
    other = next(v for v in verdicts if v["row"]["kernel"] == "other_kernel")
    assert any("measured on another device" in r for r in other["reasons"])
    assert "kernel family 'other_kernel' is not installed here" in other["reasons"]
    assert any(r.startswith("triton 3.2.0 (here ") for r in other["reasons"])
    table = run("validate")
    assert table.exit_code == 0
    assert "1 of 4 rows usable on cpu" in table.stdout


def test_cli_works_without_the_kernel_registry(
    user_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "spectune.kernels", None)  # import now fails
    result = run("validate")
    assert result.exit_code == 0, result.output
    assert "note: kernel registry unavailable" in result.stderr
    assert "0 of 3 rows usable" in result.stdout
    path = tmp_path / "rows.json"
    write_rows_file([make_row(config={"BLOCK_V": 1000})], path, fmt="json")
    result = run("import", str(path), "--into", str(tmp_path / "x.db"))
    assert result.exit_code == 0  # only the shape can be checked
    assert "cannot be checked against a search space" in result.stderr


def _file(tmp_path: Path, name: str, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


def _db_with(tmp_path: Path, statement: str) -> str:
    path = str(tmp_path / "altered.db")
    with open_store(path) as store:
        store.record(make_row())
    connection = sqlite3.connect(path)
    with connection:
        connection.execute(statement)
    connection.close()
    return path


BROKEN_DATABASES = {
    "text file": (lambda t: _file(t, "notes.db", b"hello\n" * 300), "is not a SQLite database"),
    "corrupt": (lambda t: _file(t, "c.db", b"SQLite format 3\x00" + b"\xab" * 5000),
                "c.db"),
    "missing": (lambda t: str(t / "nope.db"), "no database file"),
    "newer schema": (lambda t: _db_with(t, "UPDATE alembic_version SET version_num = '0042'"),
                     "newer spectune"),
    "missing table": (lambda t: _db_with(t, "DROP TABLE tuned_configs"), "missing table"),
    "foreign": (lambda t: _db_with(t, "DROP TABLE alembic_version"), "not a spectune database"),
    "bad url": (lambda t: "mysql://root@localhost/x", "unsupported database 'mysql'"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BROKEN_DATABASES))
@pytest.mark.parametrize("command", ["show", "validate", "export"])
def test_broken_databases_fail_cleanly(case: str, command: str, tmp_path: Path) -> None:
    make, fragment = BROKEN_DATABASES[case]
    target = make(tmp_path)
    args = [command, "--db", target] if command != "export" else [
        command, str(tmp_path / "out.json"), "--db", target]  # fmt: skip
    assert_clean_failure(run(*args), fragment)


def test_broken_user_database_fails_cleanly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "spectune.db").write_bytes(b"garbage" * 1000)
    assert_clean_failure(run("show"), "spectune.db is not a SQLite database")


def _rows_file(tmp_path: Path, **changes: Any) -> str:
    data = json.loads(rows_to_json([make_row(config=HIP_CONFIG)]))
    data[0].update(changes)
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(data))
    return str(path)


BAD_IMPORTS = {
    "unknown key": ({"config": {**HIP_CONFIG, "BLOCK_Q": 64}}, "unknown config key"),
    "not a power of two": ({"config": {**HIP_CONFIG, "BLOCK_V": 1000}}, "power of two"),
    "negative": ({"config": {**HIP_CONFIG, "num_warps": -4}}, "must not be negative"),
    "sql in a name": ({"device_name": "x'); DROP TABLE tuned_configs;--"}, "device_name"),
    "path in a name": ({"kernel": "../../etc/passwd"}, "kernel must be"),
    "escape codes": ({"host": "\x1b]0;pwned\x07"}, "control or format characters"),
    "speedup lie": ({"speedup": 99.0}, "speedup"),
}


@pytest.mark.parametrize("case", sorted(BAD_IMPORTS))
def test_bad_imports_fail_cleanly_and_write_nothing(case: str, tmp_path: Path) -> None:
    changes, fragment = BAD_IMPORTS[case]
    target = tmp_path / "into.db"
    message = assert_clean_failure(
        run("import", _rows_file(tmp_path, **changes), "--into", str(target)), "row 1", fragment
    )
    assert "\x1b" not in message
    assert not target.exists()


def test_bad_files_fail_cleanly(tmp_path: Path) -> None:
    assert_clean_failure(run("import", _file(tmp_path, "a.json", b"[{")), "not valid JSON")
    assert_clean_failure(run("import", _file(tmp_path, "a.txt", b"[]")), "pass a format")
    assert_clean_failure(run("import", _file(tmp_path, "b.csv", b"a,b\n1,2\n")), "CSV header")
    blocked = _file(tmp_path, "file", b"")
    result = run("export", str(Path(blocked) / "out.json"))
    assert_clean_failure(result, f"{blocked}: File exists")


def test_merge_with_an_invalid_source_fails_cleanly(tmp_path: Path) -> None:
    good = str(tmp_path / "good.db")
    with open_store(good) as store:
        store.record(make_row(config=HIP_CONFIG))
    bad = _file(tmp_path, "bad.db", b"\x00garbage" * 100)
    dst = tmp_path / "dst.db"
    assert_clean_failure(run("merge", good, bad, "--into", str(dst)), "bad.db")
    assert not dst.exists()
    invalid = str(tmp_path / "invalid.db")
    with open_store(invalid) as store:
        store.record(make_row(config={**HIP_CONFIG, "BLOCK_V": 96}))
    assert_clean_failure(run("merge", good, invalid, "--into", str(dst)), "power of two")


def test_real_process_prints_one_line_and_exits_non_zero(tmp_path: Path) -> None:
    bad = _file(tmp_path, "bad.db", b"definitely not sqlite\n" * 50)
    completed = subprocess.run(
        [sys.executable, "-c", "from spectune.cli import main; main()", "db", "show", "--db", bad],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 1
    assert completed.stdout == ""
    assert completed.stderr.strip().splitlines() == [
        f"Error: {bad} is not a SQLite database (file is not a database)"
    ]


def test_exported_rows_read_back_with_the_api(user_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "all.csv"
    assert run("export", str(out), "--format", "csv", "--kernel", "other_kernel").exit_code == 0
    assert [r.kernel for r in read_rows_file(out)] == ["other_kernel"]
