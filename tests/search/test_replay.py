"""Replay of recorded spaces: the library function and the ``spectune replay`` command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from spectune.cli import main
from spectune.search import STRATEGIES
from spectune.search.replay import (
    SyntheticSpec,
    engine_run,
    load_t4,
    prior_configs,
    random_run,
    replay,
    write_synthetic,
    write_t4,
)

SMALL = SyntheticSpec(
    tiles=2, knobs=1, switches=1, interactions=1, roughness=0.05, fail_fraction=0.1, max_configs=400
)


@pytest.fixture(scope="module")
def small_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("t4") / "small_T4.json.gz", SMALL, seed=4)


def test_json_has_exactly_the_documented_keys(small_file: Path) -> None:
    result = CliRunner().invoke(
        main, ["replay", str(small_file), "--budget", "20", "--repeats", "3", "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert list(doc) == ["file", "optimum", "results"]
    assert doc["file"] == str(small_file)
    assert doc["optimum"] == pytest.approx(load_t4(small_file).optimum)
    assert [r["budget"] for r in doc["results"]] == [10, 20]
    for r in doc["results"]:
        assert list(r) == [
            "budget",
            "median_fraction",
            "q25_fraction",
            "q75_fraction",
            "random_median_fraction",
        ]
        assert 0.0 <= r["q25_fraction"] <= r["median_fraction"] <= r["q75_fraction"] <= 1.0


def test_table_and_plot(small_file: Path, tmp_path: Path) -> None:
    png = tmp_path / "curve.png"
    result = CliRunner().invoke(
        main,
        [
            "replay",
            str(small_file),
            "--budget",
            "12",
            "--repeats",
            "2",
            "--noisy",
            "--plot",
            str(png),
            "--sampler",
            "tpe",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "random median" in result.stdout and "12" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_unknown_sampler(small_file: Path) -> None:
    result = CliRunner().invoke(main, ["replay", str(small_file), "--sampler", "annealing"])
    assert result.exit_code == 2  # a usage error, before anything runs
    assert "--sampler" in result.output
    assert "'annealing' is not one of" in result.output
    assert all(repr(name) in result.output for name in STRATEGIES)


def test_engine_beats_random_and_reaches_the_optimum(small_file: Path) -> None:
    report = replay(small_file, budget=50, repeats=6, seed=1)
    by_budget = {r.budget: r for r in report.results}
    assert by_budget[50].median_fraction >= 0.95
    assert by_budget[50].median_fraction > by_budget[50].random_median_fraction
    assert report.engine_curves.shape == (6, 50)
    assert np.all(np.diff(report.engine_curves, axis=1) >= 0)  # exact answers: monotone


def test_failed_configs_are_charged_and_never_held(tmp_path: Path) -> None:
    # Row a=1 fails; the best recorded time (a=0, b=0) is 1.0.
    rows = [
        ({"a": a, "b": b}, (None if a == 1 else float(1 + a + b)), [], 100.0)
        for a in range(4)
        for b in range(3)
    ]
    space = load_t4(write_t4(tmp_path / "f.json.gz", rows))
    curve, _ = engine_run(space, budget=12, sampler="random", seed=0)
    assert curve[-1] == 1.0  # all twelve evaluated, failures included: optimum found
    assert random_run(space, budget=12, seed=0)[-1] == 1.0
    # A failure is charged as an evaluation and scores nothing: with one failing and
    # one good config, runs that draw the failure first score 0 after one evaluation.
    tiny = load_t4(
        write_t4(tmp_path / "g.json.gz", [({"a": 0}, None, [], 1.0), ({"a": 1}, 2.0, [2.0], 1.0)])
    )
    firsts = set()
    for seed in range(12):
        for run in (
            random_run(tiny, budget=2, seed=seed),
            engine_run(tiny, budget=2, sampler="auto", seed=seed)[0],
        ):
            assert run[-1] == 1.0
            firsts.add(float(run[0]))
    assert firsts == {0.0, 1.0}


def test_on_evaluation_sees_every_evaluation_and_its_running_best_is_the_curve(
    tmp_path: Path,
) -> None:
    # Row a=1 fails; the others take 1 + a + b, the optimum 1.0 at a=0, b=0.
    rows = [
        ({"a": a, "b": b}, (None if a == 1 else float(1 + a + b)), [], 100.0)
        for a in range(4)
        for b in range(3)
    ]
    space = load_t4(write_t4(tmp_path / "f.json.gz", rows))
    recorded = sorted([0.0] * 3 + [1.0 / (1 + a + b) for a in (0, 2, 3) for b in range(3)])
    seen: list[float] = []
    curve, _ = engine_run(space, budget=12, sampler="auto", seed=2, on_evaluation=seen.append)
    assert sorted(seen) == pytest.approx(recorded)  # each of the twelve, failures as 0.0
    assert np.array_equal(np.maximum.accumulate(seen), curve)


def test_noisy_answers_are_judged_by_the_recorded_mean(tmp_path: Path) -> None:
    # Config b=1 has the better mean but one very lucky run for b=0 makes it look best.
    rows = [({"b": 0}, 2.0, [0.5, 3.5, 2.0, 2.0], 10.0), ({"b": 1}, 1.0, [1.0, 1.0], 10.0)]
    space = load_t4(write_t4(tmp_path / "n.json.gz", rows))
    fooled = 0
    for seed in range(20):
        curve, seconds = engine_run(space, budget=2, sampler="random", seed=seed, noisy=True)
        assert curve[-1] in (0.5, 1.0)
        fooled += curve[-1] == 0.5
        assert seconds >= 0.02  # two recorded compile times of 10 ms are charged
    assert 0 < fooled < 20


def test_replay_with_two_workers_matches_one(small_file: Path) -> None:
    one = replay(small_file, budget=15, repeats=2, seed=3, sampler="random")
    two = replay(small_file, budget=15, repeats=2, seed=3, sampler="random", workers=2)
    assert np.array_equal(one.engine_curves, two.engine_curves)
    assert np.array_equal(one.random_curves, two.random_curves)


def test_replay_validates_arguments(small_file: Path) -> None:
    with pytest.raises(ValueError, match="repeats"):
        replay(small_file, repeats=0)
    with pytest.raises(ValueError, match="sampler"):
        replay(small_file, sampler="annealing")


def test_bench_replay_leave_one_out_chooses_on_the_other_files(tmp_path: Path) -> None:
    """benchmarks/bench_replay.py --leave-one-out: for each file, the candidate best on
    the others is chosen and reported on the file left out; the worst held-out file is
    the figure per budget."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "loo.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_replay.py", "--leave-one-out", "--no-shared",
         "--synthetic", "3", "--repeats", "2", "--budget", "20", "--samplers",
         "random,auto", "--out", str(out)],
        cwd=root, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    report = json.loads(out.read_text())
    loo, runs = report["leave_one_out"], report["runs"]
    assert loo["candidates"] == ["random", "auto"]
    files = [h["file"] for h in loo["held_out"]]
    assert files == ["synthetic0", "synthetic1", "synthetic2"]

    def score(file: str, sampler: str) -> float:
        run = next(r for r in runs if r["file"] == file and r["sampler"] == sampler)
        return sum(b["median_fraction"] for b in run["results"]) / len(run["results"])

    for held in loo["held_out"]:
        others = [f for f in files if f != held["file"]]
        mean = {c: sum(score(f, c) for f in others) / len(others) for c in loo["candidates"]}
        assert held["chosen"] == max(loo["candidates"], key=lambda c: (mean[c], c == "random"))
        own = next(r for r in runs if r["file"] == held["file"] and r["sampler"] == held["chosen"])
        assert held["results"] == own["results"]  # reported on the file it never saw
    for i, worst in enumerate(loo["worst"]):
        assert worst["budget"] == [10, 20][i]
        assert worst["median_fraction"] == min(
            h["results"][i]["median_fraction"] for h in loo["held_out"])
    assert "| **worst held-out** |" in done.stdout


def test_prior_configs_are_the_priors_fastest_the_target_holds(tmp_path: Path) -> None:
    prior = load_t4(write_synthetic(tmp_path / "a_T4.json.gz", SMALL, seed=5))
    target = load_t4(write_synthetic(tmp_path / "b_T4.json.gz", SMALL, seed=6))
    configs = prior_configs(prior, target, top=3)
    fastest = sorted((r.time, k) for k, r in prior.records.items() if r.ok)
    held = [dict(zip(prior.space.names, k, strict=True)) for _, k in fastest
            if k in target.records]
    assert configs == held[:3]
    # Another kernel (other parameters): nothing transfers, nothing is charged.
    other = SyntheticSpec(tiles=1, knobs=2, switches=0, interactions=1, roughness=0.05,
                          fail_fraction=0.1, max_configs=200)
    unrelated = load_t4(write_synthetic(tmp_path / "c_T4.json.gz", other, seed=7))
    assert set(unrelated.space.names) != set(target.space.names)
    assert prior_configs(unrelated, target) == []
    with pytest.raises(ValueError, match="top"):
        prior_configs(prior, target, top=0)


def test_replay_with_a_prior_evaluates_its_configs_first_and_reports_both(
    tmp_path: Path,
) -> None:
    """``--prior`` runs the engine through TransferStrategy: every run starts with the
    prior's best (its fraction of the optimum at once); the same seeds without the
    prior are reported beside."""
    prior_file = write_synthetic(tmp_path / "a_T4.json.gz", SMALL, seed=5)
    target_file = write_synthetic(tmp_path / "b_T4.json.gz", SMALL, seed=6)
    target = load_t4(target_file)
    first = prior_configs(load_t4(prior_file), target, top=1)
    report = replay(target_file, budget=10, repeats=2, prior=first)
    record = target.lookup(first[0])
    expected = target.optimum / record.time if record.ok else 0.0
    assert np.allclose(report.engine_curves[:, 0], expected)
    assert np.array_equal(report.engine_curves,
                          replay(target_file, budget=10, repeats=2, prior=first).engine_curves)

    result = CliRunner().invoke(main, ["replay", str(target_file), "--prior", str(prior_file),
                                       "--prior-top", "1", "--budget", "10", "--repeats", "2",
                                       "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert list(doc) == ["prior", "prior_configs", "with_prior", "without_prior"]
    assert doc["prior_configs"] == 1
    assert doc["with_prior"]["results"][0]["median_fraction"] == pytest.approx(
        float(np.median(report.engine_curves[:, 9])))
    table = CliRunner().invoke(main, ["replay", str(target_file), "--prior", str(prior_file),
                                      "--budget", "10", "--repeats", "2"])
    assert table.exit_code == 0, table.output
    assert "with prior" in table.output and "gain" in table.output
