"""What `spectune sweep` prints: a results table that fits 80 columns, --wide, --json.

The table is checked directly with realistic long values (kernel names, vocabularies,
five-parameter configs, six-digit timings), and the command end to end on the toy family.
"""

from __future__ import annotations

import io
import json
import re

import pytest
from click.testing import CliRunner, Result
from rich.console import Console

from spectune.cli import main
from spectune.cli.sweep import _print_table, _results_json
from spectune.db import VllmComparison
from spectune.kernels import FAMILIES
from spectune.promotion import Timing
from spectune.space import Problem
from spectune.tuning.problems import SweepItem
from spectune.tuning.sweep import SweepResult
from tests.tuning.toy_family import ToySumFamily

LONG_CONFIG = {"BLOCK_V": 8192, "SPLITS": 4, "num_warps": 8, "num_stages": 2,
               "waves_per_eu": 2}

#: Every key of a result's JSON object, in order.
JSON_KEYS = [
    "kernel", "spec_len", "batch", "vocab", "dtype", "draft_probs", "device_name", "study",
    "storage", "default_p20_us", "default_p50_us", "default_p80_us", "best_p20_us",
    "best_p50_us", "best_p80_us", "speedup", "trials", "best_evaluation", "failed",
    "invalid", "stop_reason", "promoted", "best_config", "default_config", "seconds",
    "vs_vllm", "vllm_p50_us", "vllm_version", "vllm_reason", "served_p50_us",
]


def _result(
    kernel: str, problem: Problem, *, default: float | None, best: float | None,
    config: dict[str, int] | None, promoted: str, vllm: VllmComparison | None = None,
) -> SweepResult:
    def timing(p50: float | None) -> Timing | None:
        return None if p50 is None else Timing(p50 * 0.9, p50, p50 * 1.1)

    return SweepResult(
        item=SweepItem(kernel, problem), study=f"{kernel}-study", default_config={"BLOCK_V": 1024},
        default=timing(default), best_config=config, best=timing(best), trials=30, failed=2,
        invalid=1, stop_reason="max evaluations", promoted=promoted, seconds=12.5,
        vllm=vllm, served=timing(best) if vllm is not None and vllm.p50_us else None,
    )


RESULTS = [
    _result("rejection_sample_mrv2_folded", Problem(4, 8, 151936, "bfloat16"),
            default=123456.7, best=98765.4, config=LONG_CONFIG, promoted="default is best"),
    _result("rejection_sample_folded", Problem(8, 64, 128256, "float16", draft_probs=False),
            default=12.3, best=10.1, promoted="inserted",
            config={"BLOCK_V": 2048, "SPLITS": 2, "num_warps": 8, "num_stages": 1},
            vllm=VllmComparison(verdict="faster", p50_us=15.15, version="0.33.0")),
    _result("rejection_sample_mrv2", Problem(1, 1, 4099), default=None, best=None, config=None,
            promoted="no result"),
]


def _render(results: list[SweepResult], *, width: int, wide: bool = False) -> str:
    console = Console(file=io.StringIO(), width=width)
    _print_table(results, wide=wide, console=console)
    return console.file.getvalue()  # type: ignore[attr-defined]


def _whole(token: str, text: str) -> bool:
    """Whether ``token`` appears in ``text`` as a whole, not cut or glued to another."""
    return re.search(rf"(?<![\w.]){re.escape(token)}(?![\w.])", text) is not None


@pytest.mark.parametrize("width", [80, 100, 132])
def test_the_table_fits_the_terminal_and_cuts_no_value(width: int) -> None:
    out = _render(RESULTS, width=width)
    assert all(len(line) <= width for line in out.splitlines()), out
    assert "sweep results" in out
    for token in ("rejection_sample_mrv2_folded", "rejection_sample_folded",
                  "rejection_sample_mrv2", "123457", "98765", "1.25x", "12.30", "10.10",
                  "1.22x", "default is best", "inserted", "no result", "no-dp",
                  *(f"{k}={v}" for k, v in LONG_CONFIG.items()), "num_stages=1"):
        assert _whole(token, out), (token, out)
    # Each problem's shape stays on one line, next to or below its kernel.
    for shape in ("k=4 B=8 V=151936 bf16", "k=8 B=64 V=128256 fp16 no-dp", "k=1 B=1 V=4099 fp32"):
        assert shape in out, (shape, out)


def test_the_table_puts_the_config_below_its_problem() -> None:
    lines = _render(RESULTS[:1], width=80).splitlines()
    [first] = [i for i, line in enumerate(lines) if "rejection_sample_mrv2_folded" in line]
    assert "123457" in lines[first] and "98765" in lines[first]
    below = " ".join(line.strip() for line in lines[first + 1:])
    assert "BLOCK_V=8192,SPLITS=4," in below and "waves_per_eu=2" in below


def test_the_wide_table_has_every_column_whole() -> None:
    out = _render(RESULTS, width=80, wide=True)
    for header in ("kernel", "k", "batch", "vocab", "dtype", "default µs", "best µs",
                   "speedup", "trials", "fail/invalid", "database", "config"):
        assert header in out, (header, out)
    # Widened past 80 rather than folded: each row and its config on one line.
    [row] = [line for line in out.splitlines() if "rejection_sample_mrv2_folded" in line]
    for cell in ("151936", "bfloat16", "123456.7", "98765.4", "2/1", "default is best",
                 "BLOCK_V=8192 SPLITS=4 num_warps=8 num_stages=2 waves_per_eu=2"):
        assert cell in row, (cell, row)
    # Nothing is widened that fits.
    assert all(len(line) <= 300 for line in _render(RESULTS, width=300, wide=True).splitlines())


def test_json_is_one_flat_object_per_problem_with_nulls_for_missing_values() -> None:
    doc = json.loads(_results_json(RESULTS, storage="/tmp/studies.journal",
                                   device_name="AMD_Instinct_MI300X"))
    assert [list(entry) for entry in doc] == [JSON_KEYS] * 3
    first, _, missing = doc
    assert first["kernel"] == "rejection_sample_mrv2_folded"
    assert (first["spec_len"], first["batch"], first["vocab"]) == (4, 8, 151936)
    assert (first["dtype"], first["draft_probs"]) == ("bfloat16", True)
    assert first["default_p50_us"] == 123456.7 and first["best_p50_us"] == 98765.4
    assert first["best_p20_us"] == pytest.approx(98765.4 * 0.9)
    assert first["speedup"] == pytest.approx(123456.7 / 98765.4)
    assert first["best_config"] == LONG_CONFIG and first["default_config"] == {"BLOCK_V": 1024}
    assert (first["trials"], first["failed"], first["invalid"]) == (30, 2, 1)
    assert first["promoted"] == "default is best" and first["stop_reason"] == "max evaluations"
    assert first["storage"] == "/tmp/studies.journal" and first["seconds"] == 12.5
    assert first["device_name"] == "AMD_Instinct_MI300X"
    for key in ("default_p20_us", "default_p50_us", "default_p80_us", "best_p20_us",
                "best_p50_us", "best_p80_us", "speedup", "best_config", "vs_vllm",
                "vllm_p50_us", "served_p50_us"):
        assert missing[key] is None, key
    versus = doc[1]
    assert (versus["vs_vllm"], versus["vllm_version"]) == ("faster", "0.33.0")
    assert versus["vllm_p50_us"] == 15.15 and versus["served_p50_us"] == 10.1


# --------------------------------------------------------------------------------------
# The command, end to end on the toy family
# --------------------------------------------------------------------------------------


class _LongNamedToy(ToySumFamily):
    """The toy family under a name as long as the real families' longest."""

    name = "toy_sum_with_a_long_family_name"


@pytest.fixture
def long_toy(monkeypatch: pytest.MonkeyPatch) -> _LongNamedToy:
    toy = _LongNamedToy()
    monkeypatch.setitem(FAMILIES, toy.name, toy)
    return toy


def _sweep(places: dict[str, str], kernel: str, *extra: str, columns: int = 80) -> Result:
    return CliRunner().invoke(main, [
        "sweep", "--kernel", kernel, "--spec-lens", "1-2", "--batch-sizes", "2",
        "--vocab-sizes", "300", "--trials", "3", "--db", places["db"],
        "--storage", places["storage"], *extra,
    ], env={"COLUMNS": str(columns)})


def test_cli_sweep_table_fits_80_columns(
    long_toy: _LongNamedToy, places: dict[str, str]
) -> None:
    result = _sweep(places, long_toy.name)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "sweep results" in out and "problem / best config" in out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert out.count(long_toy.name) == 2, out  # one line per problem, the name whole
    for shape in ("k=1 B=2 V=300 fp32", "k=2 B=2 V=300 fp32"):
        assert shape in out, out
    # The progress bars and notes are on stderr, not in the table.
    assert "device" in result.stderr and "studies" not in out


def test_cli_sweep_wide_and_json(long_toy: _LongNamedToy, places: dict[str, str]) -> None:
    wide = _sweep(places, long_toy.name, "--wide")
    assert wide.exit_code == 0, wide.output
    assert "fail/invalid" in wide.stdout and "trials" in wide.stdout
    rows = [line for line in wide.stdout.splitlines() if long_toy.name in line]
    assert len(rows) == 2, wide.stdout
    assert all("300" in row and "float32" in row and "fp32" not in row for row in rows)

    done = _sweep(places, long_toy.name, "--json")
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)  # stdout is the JSON document and nothing else
    assert [list(entry) for entry in doc] == [JSON_KEYS] * 2
    assert [(e["kernel"], e["spec_len"], e["batch"], e["vocab"]) for e in doc] == [
        (long_toy.name, 1, 2, 300), (long_toy.name, 2, 2, 300)]
    assert all(e["storage"] == places["storage"] and e["trials"] >= 3 for e in doc)
    assert all(e["best_config"]["BUG"] == 0 and e["default_config"] == {"BLOCK": 16, "BUG": 0}
               for e in doc)
    # The studies resumed: the database already holds their best, or the default is it.
    assert all(e["promoted"] in ("up to date", "default is best", "not faster", "inserted",
                                 "replaced", "kept", "unchanged") for e in doc)
    assert "sweep results" not in done.output
