"""`spectune sweep` numbers: bounded by the kernels' declared limits, refused before any work.

Every refused case ends as one click usage error (exit 2) naming the option and the
limit, with nothing made: no study storage, no database. Nothing here runs a trial.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from spectune.cli import main
from spectune.kernels import FAMILIES, MAX_VOCAB, ProblemLimits, declared_limits
from spectune.tuning.sweep import MAX_SEED, SweepOptions, max_workers
from tests.tuning.toy_family import ToySumFamily

# A tiny problem: should a bound be missing, the sweep it would start stays small.
TINY = ["--spec-lens", "1", "--batch-sizes", "1", "--vocab-sizes", "7", "--trials", "1"]


class SmallToyFamily(ToySumFamily):
    """The toy family, declaring limits of its own (smaller than any real family's)."""

    name = "toy_small"
    limits = ProblemLimits(spec_len=3, batch=5, vocab=97)


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.setenv("SPECTUNE_USER_DB", str(tmp_path / "user.db"))
    monkeypatch.delenv("SPECTUNE_DB", raising=False)
    return {"db": tmp_path / "configs.db", "storage": tmp_path / "studies.journal",
            "home": tmp_path}


def _sweep(args: list[str], places: dict[str, Path]) -> Result:
    return CliRunner().invoke(main, [
        "sweep", *TINY, *args, "--db", str(places["db"]), "--storage", str(places["storage"]),
    ])


def _assert_refused(result: Result, places: dict[str, Path], *fragments: str) -> None:
    """Exit 2, one ``Error:`` line holding every fragment, no traceback, nothing made."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    for fragment in fragments:
        assert fragment in errors[0], (fragment, result.output)
    assert "Traceback" not in result.output
    assert not places["storage"].exists() and not places["db"].exists()
    assert sorted(p.name for p in places["home"].iterdir()) == []


def test_every_family_declares_its_limits() -> None:
    for name, family in FAMILIES.items():
        limits = declared_limits(family)
        assert isinstance(limits, ProblemLimits), name
        # The plugin routes no vocabulary past MAX_VOCAB to any family.
        assert limits.vocab == MAX_VOCAB, name
        assert limits.spec_len >= 8 and limits.batch >= 64, name  # the sweep's defaults


def test_declared_limits_are_positive_integers() -> None:
    with pytest.raises(ValueError, match=r"ProblemLimits\.vocab"):
        ProblemLimits(spec_len=1, batch=1, vocab=0)
    with pytest.raises(ValueError, match=r"ProblemLimits\.batch"):
        ProblemLimits(spec_len=1, batch=True, vocab=1)  # type: ignore[arg-type]
    assert declared_limits(ToySumFamily()) is None  # a family may declare none


_LIMITS = FAMILIES["rejection_sample"].limits  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        # Over the vocabulary limit: accepted before, the sweep reported "no result".
        (["--vocab-sizes", str(MAX_VOCAB + 1)], ["--vocab-sizes", str(MAX_VOCAB)]),
        # Far over it: 69 s and 12 GB of inputs, then a traceback.
        (["--vocab-sizes", "1000000000"], ["--vocab-sizes", str(MAX_VOCAB)]),
        (["--vocab-sizes", "7,1-3000000"], ["--vocab-sizes", str(MAX_VOCAB)]),
        (["--batch-sizes", "99999999999999999999999"], ["--batch-sizes", str(_LIMITS.batch)]),
        (["--batch-sizes", str(_LIMITS.batch + 1)], ["--batch-sizes", str(_LIMITS.batch)]),
        (["--spec-lens", str(_LIMITS.spec_len + 1)], ["--spec-lens", str(_LIMITS.spec_len)]),
        (["--spec-lens", "100000"], ["--spec-lens", str(_LIMITS.spec_len)]),
        # A range is refused as written, before it is expanded.
        (["--spec-lens", "1-99999999999999999999"], ["--spec-lens", str(_LIMITS.spec_len)]),
        (["--vocab-sizes", "9" * 5000], ["--vocab-sizes", "5000 digits", str(MAX_VOCAB)]),
        (["--seed", "99999999999999999999999"], ["--seed", str(MAX_SEED)]),
        (["--seed", "-1"], ["--seed", "x>=0"]),
        (["--workers", str(max_workers() + 1)], ["--workers", str(max_workers())]),
        (["--trials", "99999999999999999999999"], ["--trials", "configs"]),
        (["--patience", "99999999999999999999999"], ["--patience", "configs"]),
        (["--time-budget", "nan"], ["--time-budget", "finite"]),
        (["--time-budget", "inf"], ["--time-budget", "finite"]),
        (["--sampler", "nope"], ["--sampler", "'nope' is not one of"]),
    ],
)
def test_numbers_out_of_range_are_refused_before_any_work(
    places: dict[str, Path], args: list[str], fragments: list[str]
) -> None:
    _assert_refused(_sweep(args, places), places, *fragments)


def test_bounds_are_the_requested_families_declared_limits(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI holds no numbers of its own: a family declaring smaller limits gets them,
    named in the message; a value within every requested family's limits passes."""
    small = SmallToyFamily()
    monkeypatch.setitem(FAMILIES, small.name, small)
    for option, value, limit in (("--vocab-sizes", "98", "97"), ("--batch-sizes", "6", "5"),
                                 ("--spec-lens", "1-4", "3")):
        result = _sweep(["--kernel", "rejection_sample", "--kernel", small.name,
                         option, value], places)
        _assert_refused(result, places, option, limit, small.name)
    # The same value with only the real family requested is within its limits (the
    # sweep is not run here: --trials past the space stops it before any work).
    result = _sweep(["--kernel", "rejection_sample", "--vocab-sizes", "98",
                     "--trials", str(10**9)], places)
    _assert_refused(result, places, "--trials", "rejection_sample")


def test_trials_past_the_space_are_refused(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--trials 11 on the toy's 10 configs: no study could make them. (The default, 30,
    is not checked: a study stops when its space is exhausted.)"""
    small = SmallToyFamily()
    monkeypatch.setitem(FAMILIES, small.name, small)
    result = _sweep(["--kernel", small.name, "--trials", "11"], places)
    _assert_refused(result, places, "--trials", "10 configs")


@pytest.mark.parametrize(
    ("field", "value"),
    [("sampler", "nope"), ("seed", -1), ("seed", MAX_SEED + 1), ("workers", 0),
     ("workers", max_workers() + 1), ("trials", 0), ("patience", 0), ("time_budget", math.nan),
     ("time_budget", math.inf), ("trial_time_limit", -1.0), ("trials", True),
     ("finalists", 0), ("finalist_ratio", 0.9), ("finalist_ratio", math.nan)],
)
def test_sweep_options_are_checked_when_made(field: str, value: object) -> None:
    """Before: an unknown sampler or a bad seed ended in a traceback after the inputs
    were made (and the database opened)."""
    with pytest.raises(ValueError, match=field):
        SweepOptions(**{field: value})  # type: ignore[arg-type]


def _refuses_obvious_overcommit() -> bool:
    """Whether the kernel refuses an allocation far past RAM + swap at once (Linux's
    heuristic and strict modes) rather than handing out pages it cannot back."""
    try:
        mode = Path("/proc/sys/vm/overcommit_memory").read_text().strip()
    except OSError:
        return False
    return mode in ("0", "2")


@pytest.mark.skipif(not _refuses_obvious_overcommit(),
                    reason="an 8 TB allocation could be granted and then touched")
def test_inputs_within_the_limits_but_past_memory_are_one_line(places: dict[str, Path]) -> None:
    """Every number within the limits, 2**20 rows of 2**21 - 1 logits are 8 TB: one line
    (exit 1), not torch's allocation traceback."""
    result = _sweep(["--batch-sizes", str(_LIMITS.batch), "--vocab-sizes", str(MAX_VOCAB)],
                    places)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "do not fit in memory" in errors[0], result.output
    assert "--vocab-sizes" in errors[0] and "Traceback" not in result.output
    assert not places["storage"].exists() and not places["db"].exists()
