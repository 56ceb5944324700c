"""`spectune sweep` and `spectune replay` arguments: choices, usage errors, missing extras.

Nothing here runs a kernel or a search: every case ends before the first trial.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from spectune.cli import main
from spectune.kernels import FAMILIES
from spectune.search import STRATEGIES
from spectune.search.replay import write_t4

ROOT = Path(__file__).resolve().parents[2]
EXTRA = "pip install 'spectune[tune]'"


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("SPECTUNE_USER_DB", str(tmp_path / "user.db"))
    monkeypatch.delenv("SPECTUNE_DB", raising=False)
    return {"db": str(tmp_path / "configs.db"), "storage": str(tmp_path / "studies.journal")}


@pytest.fixture
def t4_file(tmp_path: Path) -> Path:
    rows = [({"a": a}, float(1 + a), [float(1 + a)], 1.0) for a in range(4)]
    return write_t4(tmp_path / "tiny_T4.json.gz", rows)


def test_bad_sweep_arguments_are_usage_errors(places: dict[str, str]) -> None:
    runner = CliRunner()
    for args, fragments in (
        (["--spec-lens", "3-1"], ["--spec-lens"]),
        (["--kernel", "nope"], ["--kernel", "'nope' is not", *map(repr, FAMILIES)]),
        (["--batch-sizes", "x"], ["--batch-sizes"]),
        (["--sampler", "bogus"], ["--sampler", "'bogus' is not one of", *map(repr, STRATEGIES)]),
        (["--dtype", "int8"], ["--dtype", "'int8' is not one of", "'bfloat16'"]),
    ):
        result = runner.invoke(main, ["sweep", *args, "--db", places["db"]])
        assert result.exit_code == 2, result.output
        for fragment in fragments:
            assert fragment in result.output, (args, result.output)


def test_replay_rejects_an_unknown_sampler_before_reading_the_file(t4_file: Path) -> None:
    result = CliRunner().invoke(main, ["replay", str(t4_file), "--sampler", "bogus"])
    assert result.exit_code == 2, result.output
    assert "'bogus' is not one of" in result.output
    assert all(repr(name) in result.output for name in STRATEGIES)


def test_help_lists_the_registered_choices() -> None:
    runner = CliRunner()
    sweep_help = runner.invoke(main, ["sweep", "--help"])
    assert sweep_help.exit_code == 0, sweep_help.output
    assert "[" + "|".join(sorted(STRATEGIES)) + "]" in sweep_help.output
    assert "[" + "|".join(sorted(FAMILIES)) + "]" in sweep_help.output
    replay_help = runner.invoke(main, ["replay", "--help"])
    assert replay_help.exit_code == 0, replay_help.output
    assert "[" + "|".join(sorted(STRATEGIES)) + "]" in replay_help.output


def test_sweep_and_db_show_offer_json_and_wide() -> None:
    """The results' two other forms: every column (--wide), or JSON on stdout (--json)."""
    runner = CliRunner()
    for args in (["sweep", "--help"], ["db", "show", "--help"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, result.output
        assert "--json" in result.output and "--wide" in result.output, result.output


def _spectune(
    args: list[str], *, hide: str, home: Path
) -> subprocess.CompletedProcess[str]:
    """``spectune ARGS`` in a fresh interpreter, with module ``hide`` made unimportable.

    Databases and studies default to ``home``, should the command get that far.
    """
    env = dict(os.environ, SPECTUNE_USER_DB=str(home / "user.db"))
    env.pop("SPECTUNE_DB", None)
    code = (
        "import sys\n"
        + f"sys.modules[{hide!r}] = None\n"
        + "from spectune.cli import main\n"
        + f"main({args!r}, prog_name='spectune')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )


def test_listing_the_commands_imports_no_tuner_dependency() -> None:
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from spectune.cli import main\n"
        "result = CliRunner().invoke(main, ['--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "assert 'sweep' in result.output and 'replay' in result.output, result.output\n"
        "print(sorted(m for m in ('optuna', 'numpy', 'scipy', 'matplotlib', 'torch')"
        " if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("hide", ["optuna", "scipy"])
@pytest.mark.parametrize("command", ["sweep", "replay"])
def test_a_missing_tuner_dependency_is_one_line(
    command: str, hide: str, t4_file: Path, tmp_path: Path
) -> None:
    if command == "sweep":
        args = ["sweep", "--trials", "1", "--db", str(tmp_path / "configs.db"),
                "--storage", str(tmp_path / "studies.journal")]
    else:
        args = ["replay", str(t4_file)]
    done = _spectune(args, hide=hide, home=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"Error: spectune {command} needs the tuner's dependencies ({hide} is missing): {EXTRA}"
    ]


def test_replay_plot_without_matplotlib_is_one_line(t4_file: Path, tmp_path: Path) -> None:
    done = _spectune(
        ["replay", str(t4_file), "--plot", str(tmp_path / "x.png")], hide="matplotlib",
        home=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"Error: spectune replay needs the tuner's dependencies (matplotlib is missing): {EXTRA}"
    ]
    assert not (tmp_path / "x.png").exists()
