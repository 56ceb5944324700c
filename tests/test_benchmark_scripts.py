"""Every benchmark script runs: each of ``benchmarks/*.py`` and ``scripts/bench_*.py`` on
its smallest arguments (its figures meaningless), so that a script cannot rot between the
sessions that run it for real. A script added without an entry here fails
:func:`test_every_benchmark_script_has_an_entry`.

The scripts that need the ``bench`` extra (Kernel Tuner, the autotuning-methodology
score) run too: ``scripts/test.sh`` installs it, and in CI a missing extra fails instead
of skipping. ``bench_fleet.py`` needs a PostgreSQL server (``SPECTUNE_TEST_PG_URL``, which
``scripts/test.sh`` starts).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Generous: each entry takes seconds to a minute under the interpreter on 2 cores.
TIMEOUT_S = 600

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

#: What an entry's arguments may ask for, made in the test's temporary folder.
Args = Callable[[Path], list[str]]


def _space(folder: Path) -> str:
    """A generated T4 tuning space (the replay benchmarks' input)."""
    from spectune.search.replay import write_synthetic

    return str(write_synthetic(folder / "space_T4.json.gz", seed=3))


def _transfer_pair(folder: Path) -> str:
    """Two generated T4 spaces, ``target`` and ``other``; their folder."""
    from spectune.search.replay import write_synthetic

    write_synthetic(folder / "target_T4.json.gz", seed=3)
    write_synthetic(folder / "other_T4.json.gz", seed=4)
    return str(folder)


def _pg_url() -> str:
    url = os.environ.get("SPECTUNE_TEST_PG_URL")
    if not url:
        pytest.skip("SPECTUNE_TEST_PG_URL not set (export SPECTUNE_TEST_PG_URL=$(bash "
                    "scripts/postgres.sh) to run it)")
    return url


def _bench_extra() -> None:
    if not os.environ.get("CI"):  # scripts/test.sh installs it: in CI a skip would hide rot
        pytest.importorskip("autotuning_methodology",
                            reason="the bench extra: pip install '.[bench]'")
        pytest.importorskip("kernel_tuner", reason="the bench extra: pip install '.[bench]'")


#: Script -> (its smallest arguments, what it needs first). Where a script is a module
#: (``kt_peers.py``: Kernel Tuner's strategies as peers), the entry runs the script that
#: uses it, as its first argument.
ENTRIES: dict[str, tuple[Args, Callable[[], object] | None]] = {
    "benchmarks/bench_db_load.py": (lambda tmp: ["--rows", "100", "--repeat", "1"], None),
    "benchmarks/bench_fleet.py": (
        lambda tmp: ["--pg-url", _pg_url(), "--workers", "1", "--trials", "2", "--scale", "0",
                     "--samplers", "random", "--space", _space(tmp)], None),
    "benchmarks/bench_plugin.py": (lambda tmp: ["--quick"], None),
    "benchmarks/kt_peers.py": (
        lambda tmp: ["benchmarks/bench_replay.py", "--no-shared", "--synthetic", "1",
                     "--repeats", "1", "--budget", "10", "--samplers", "random",
                     "--peers", "kt-random_sample"], _bench_extra),
    "scripts/bench_verify.py": (lambda tmp: ["--quick"], None),
    "scripts/bench_verify_mrv2.py": (lambda tmp: ["--quick"], None),
    # Every family, on the installed vLLM, is tests/test_gpu_check.py's rehearsal.
    "scripts/bench_vs_vllm.py": (
        lambda tmp: ["--quick", "--families", "temperature", "sample"], None),
}


#: Scripts that a test of tests/test_benchmarks.py already runs as a user would (a
#: subprocess on small arguments, its output checked): run once in CI, not twice.
RUN_ELSEWHERE: dict[str, str] = {
    "benchmarks/bench_folded.py": "test_folded_benchmark_quick_run_counts_fewer_bytes_folded",
    "benchmarks/bench_methodology.py":
        "test_methodology_benchmark_scores_engine_and_peers_on_the_same_spaces",
    "benchmarks/bench_proposal_cost.py":
        "test_proposal_cost_benchmark_times_auto_in_windows_of_evaluations",
    "benchmarks/bench_replay.py": "test_leave_one_out_reports_peers_beside_and_never_chooses_them",
    "benchmarks/bench_sampling.py": "test_sampling_benchmark_quick_run_checks_every_kernel",
    "benchmarks/bench_transfer.py": "test_transfer_benchmark_prints_each_gain_with_its_interval",
}


def _is_module(script: str) -> bool:
    """A module of the benchmarks (no ``__main__`` block): run through its user."""
    return 'if __name__ == "__main__":' not in (ROOT / script).read_text(encoding="utf-8")


def test_every_benchmark_script_has_an_entry() -> None:
    found = sorted(
        str(path.relative_to(ROOT))
        for pattern in ("benchmarks/*.py", "scripts/bench_*.py")
        for path in ROOT.glob(pattern)
    )
    assert sorted([*ENTRIES, *RUN_ELSEWHERE]) == found
    assert not set(ENTRIES) & set(RUN_ELSEWHERE)


def test_the_tests_that_run_the_other_scripts_exist() -> None:
    """Each script left to tests/test_benchmarks.py is run there by the named test (in its
    body, or in a ``_run_*`` helper it calls)."""
    source = (ROOT / "tests" / "test_benchmarks.py").read_text(encoding="utf-8")
    functions = dict(re.findall(r"\ndef (\w+)\((.*?)(?=\n(?:def |@)|\Z)", source, re.S))
    for script, test in RUN_ELSEWHERE.items():
        assert test in functions, f"{script}: tests/test_benchmarks.py has no {test}"
        body = functions[test] + "".join(
            functions.get(helper, "") for helper in re.findall(r"(_run_\w+)\(", functions[test]))
        assert script in body, f"{test} does not run {script}"


@pytest.mark.parametrize("script", sorted(ENTRIES))
def test_benchmark_script_runs_on_its_smallest_arguments(script: str, tmp_path: Path) -> None:
    make_args, requirement = ENTRIES[script]
    if requirement is not None:
        requirement()
    args = make_args(tmp_path)
    command = [sys.executable, *(args if _is_module(script) else [script, *args])]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "SPECTUNE_USER_DB": str(tmp_path / "user.db")}  # never the user's own database
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, (
        f"{' '.join(command[1:])} exited {done.returncode} after {seconds:.0f} s:\n"
        + (done.stdout + done.stderr)[-4000:]
    )
    assert done.stdout.strip(), f"{script} printed nothing"
