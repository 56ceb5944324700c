"""The sampling benchmark runs (``--quick``: tiny shapes under the interpreter, its
figures meaningless on CPU): what keeps benchmarks/bench_sampling.py from rotting between
the GPU sessions that run it for real (scripts/gpu_check.sh)."""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _benchmark(name: str) -> ModuleType:
    """The benchmark script ``benchmarks/<name>.py``, imported as a module."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_sampling_benchmark_quick_run_checks_every_kernel(tmp_path: Path) -> None:
    if not os.environ.get("CI"):  # in CI a missing vllm is a failure, not a skip
        pytest.importorskip("vllm")
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_sampling.py", "--quick", "--json", str(out)],
        cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True,
        text=True, timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    records = json.loads(out.read_text())
    kernels = {r["kernel"] for r in records}
    assert kernels == {"top_k_top_p", "temperature", "min_p", "gumbel", "chain vs fused"}
    assert len(records) == 2 * len(kernels)  # two shapes in --quick
    assert all(r["vllm_us"] > 0 and r["ours_us"] > 0 for r in records)
    assert "geometric-mean speedup" in done.stdout


def test_folded_benchmark_quick_run_counts_fewer_bytes_folded(tmp_path: Path) -> None:
    out = tmp_path / "bench-folded.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_folded.py", "--quick", "--json", str(out)],
        cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True,
        text=True, timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "count"
    # The counter on a copy-like kernel: exactly 2*N*V*4 bytes of logits, plus each
    # program's int32 request state and float32 temperature.
    check = report["counter_check"]
    assert check["ok"]
    assert check["logit_bytes"] == 2 * check["rows"] * check["vocab"] * 4
    assert check["counted_bytes"] == check["logit_bytes"] + 8 * check["programs"]
    records = report["records"]
    assert {r["runner"] for r in records} == {"mrv2", "v1"}
    for r in records:
        assert r["tokens_equal"], r
        assert 0 < r["folded_bytes"] < r["unfolded_bytes"], r
        assert r["unfolded_bytes"] == sum(r["unfolded_steps"].values())
        assert r["folded_steps"]["pre-pass"] > 0 and r["folded_steps"]["verify"] > 0
    mrv2 = next(r for r in records if r["runner"] == "mrv2")
    assert mrv2["unfolded_chain"] == ["copy", "temperature", "min-p", "top-k/top-p", "verify"]
    assert mrv2["buffer_bytes"] == mrv2["rows"] * mrv2["vocab"] * 4
    assert report["mismatches"] == 0
    assert "| runner |" in done.stdout


def test_kernel_tuner_peers_replay_the_same_space_and_seeds(tmp_path: Path) -> None:
    """benchmarks/kt_peers.py: Kernel Tuner's strategies in simulation mode on a recorded
    space, failures charged, scored as our replays are; a budget past the space's size
    lets random_sample evaluate every configuration and find the optimum."""
    if not os.environ.get("CI"):  # scripts/test.sh installs it: in CI a skip would hide rot
        pytest.importorskip("kernel_tuner", reason="the bench extra: pip install '.[bench]'")
    kt_replay = _benchmark("kt_peers").kt_replay
    from spectune.search.replay import SyntheticSpec, load_t4, replay, write_synthetic

    spec = SyntheticSpec(tiles=2, knobs=1, switches=0, interactions=1, roughness=0.1,
                         fail_fraction=0.2, max_configs=60)
    space = load_t4(write_synthetic(tmp_path / "s_T4.json.gz", spec, seed=3))
    size = len(space.records)
    assert any(not r.ok for r in space.records.values())  # failures are in the space
    report = kt_replay(space, strategy="random_sample", budget=size, repeats=2)
    assert report.engine_curves.shape == (2, size)
    assert np.all(report.engine_curves[:, -1] == 1.0)
    assert np.all(np.diff(report.engine_curves, axis=1) >= 0)
    # The random-search baseline is ours, on the seeds replay() gives its runs.
    ours = replay(space, budget=size, repeats=2, sampler="random")
    assert np.array_equal(report.random_curves, ours.random_curves)
    ga = kt_replay(space, strategy="genetic_algorithm", budget=20, repeats=2)
    assert np.all((ga.engine_curves >= 0) & (ga.engine_curves <= 1))


def test_every_replay_variant_searches_a_generated_space(tmp_path: Path) -> None:
    """The variants docs/replay.md reports figures of still build and propose (to 40
    evaluations: past the lines and the switch turns of the gp-ei family)."""
    variants = _benchmark("bench_replay").VARIANTS
    from spectune.search import SpaceIndex
    from spectune.search.replay import engine_run, load_t4, write_synthetic

    recorded = load_t4(write_synthetic(tmp_path / "s.json.gz", seed=3))
    index = SpaceIndex(recorded.space)
    assert {"gp-ei-rough-spread", "gp-ei-rough-clip50", "gp-ei-rough-ctx", "gp-ei-switch-cover",
            "gp-ei-switch-coverval"} <= set(variants)
    for name, factory in variants.items():
        curve, _ = engine_run(recorded, budget=40, sampler=factory, seed=1, index=index)
        assert curve.shape == (40,) and 0 < curve[-1] <= 1, name
        assert np.all(np.diff(curve) >= 0), name  # the best so far


def _small_context(rows: list[int], times: list[float]) -> tuple[object, list[tuple[int, ...]]]:
    """A proposal context on a 5 x 3 space with two switches, after ``rows``."""
    from spectune.search import History, ProposalContext, SpaceIndex
    from spectune.space import Param, SearchSpace

    index = SpaceIndex(SearchSpace(params=(Param("a", (1, 2, 3, 4, 5)), Param("b", (1, 2, 3)),
                                           Param("s", (0, 1)), Param("t", (0, 1)))))
    available = np.ones(len(index), dtype=bool)
    available[rows] = False
    history = History(rows=np.array(rows), times=np.array(times), pending=np.array([]))
    ctx = ProposalContext(index, history, available, np.random.default_rng(0), None, None)
    return ctx, [tuple(int(v) for v in g) for g in index.grid]


@pytest.mark.parametrize(("variant", "covered"), [
    ("gp-ei-switch-cover", {(0, 1), (1, 0)}),  # the settings never held
    ("gp-ei-switch-coverval", {(1, 1)}),  # s = 1 and t = 1, each held twice against three
])
def test_cover_variants_take_model_proposals_1_3_5_in_the_least_held_switches(
    variant: str, covered: set[tuple[int, int]]
) -> None:
    variants = _benchmark("bench_replay").VARIANTS
    _, grid = _small_context([], [])
    row = {g: r for r, g in enumerate(grid)}
    # Five random configurations: three with both switches 0, two with both 1.
    start = [(0, 0, 0, 0), (4, 2, 0, 0), (2, 1, 0, 0), (1, 0, 1, 1), (3, 2, 1, 1)]
    more = [(0, 1, 0, 0), (1, 1, 0, 0), (2, 2, 0, 0)]

    def candidates(strategy: object, n: int) -> set[tuple[int, ...]]:
        rows = [row[g] for g in (start + more)[:n]]
        ctx, _ = _small_context(rows, [float(t) for t in range(1, n + 1)])
        proposed = strategy.propose(ctx)  # type: ignore[attr-defined]
        chosen = {grid[r] for r in strategy._candidates(ctx)}  # type: ignore[attr-defined]
        assert grid[proposed] in chosen
        return chosen

    strategy = variants[variant](0)
    unseen = set(grid) - set(start)
    # Model proposal 1 (evaluation 6): only the least-held switches, all of them.
    assert candidates(strategy, 5) == {g for g in unseen if g[2:] in covered}
    # Proposal 2: the whole space (global until 10), as gp-ei-switch.
    assert candidates(strategy, 6) == unseen - {more[0]}
    # Proposal 3 covers again (the three more held with both switches 0 change nothing).
    assert candidates(strategy, 7) == {g for g in unseen - set(more) if g[2:] in covered}


@pytest.mark.parametrize(("variant", "early"), [
    ("gp-ei-switch-rand10", ["predict", None, "predict", None, "predict"]),  # None: uniform
    ("gp-ei-switch-tswide10", ["sample"] * 5),
])
def test_early_variants_change_only_the_five_proposals_before_ten_evaluations(
    monkeypatch: pytest.MonkeyPatch, variant: str, early: list[str | None]
) -> None:
    """Model proposals 1-5 (evaluations 6-10) as the variant names them, each over the
    whole space; from the tenth evaluation on, expected improvement in the trust region,
    as ``auto``."""
    from tests.tuning.conftest import spy_gp_acquisitions

    calls = spy_gp_acquisitions(monkeypatch)
    strategy = _benchmark("bench_replay").VARIANTS[variant](0)
    _, grid = _small_context([], [])
    rows = [0, 7, 14, 21, 28, 35, 42, 49, 56, 59]
    used: list[str | None] = []
    for n in range(5, 11):
        ctx, _ = _small_context(rows[:n], [float(t) for t in range(n, 0, -1)])
        calls.clear()
        proposed = strategy.propose(ctx)  # type: ignore[attr-defined]
        used.append(calls[0] if calls else None)
        assert (proposed is None) == (used[-1] is None)
        region = {grid[r] for r in strategy._candidates(ctx)}  # type: ignore[attr-defined]
        best = grid[rows[n - 1]]
        if n < 10:  # the whole space, less what is evaluated
            assert region == set(grid) - {grid[r] for r in rows[:n]}
        else:  # the trust region around the best (the latest, fastest)
            assert region and all(sum(a != b for a, b in zip(g, best, strict=True)) <= 2
                       for g in region)
    assert used == [*early, "predict"]


def test_blind_proposals_follow_a_model_of_the_other_parameters_and_draw_the_switches(
) -> None:
    """``gp-ei-switch-blind24``'s model proposals 2 and 4 (evaluations 7 and 9): the
    parameters that are not switches at the best expected improvement of a GP on them
    alone, the switches uniform; proposals 1, 3 and 5 are ``gp-ei-switch``'s (``auto``
    when the variant was written), random generator for random generator."""
    import dataclasses

    from spectune.search import STRATEGIES, SpaceIndex
    from spectune.search._gp import GaussianProcess, expected_improvement
    from spectune.space import Param, SearchSpace

    variants = _benchmark("bench_replay").VARIANTS
    _, grid = _small_context([], [])
    # The space without its switches, and where each of its configurations sits in grid.
    plain = SpaceIndex(SearchSpace(params=(Param("a", (1, 2, 3, 4, 5)), Param("b", (1, 2, 3)))))
    features = plain.features(alignment=True)
    rows = [0, 7, 14, 21, 28, 35, 42, 49, 56]
    times = [9.0, 3.0, 7.0, 2.5, 8.0, 4.0, 6.0, 5.0, 1.5]
    for n in range(5, 10):
        ctx, _ = _small_context(rows[:n], times[:n])
        picks, base_picks = set(), set()
        for seed in range(40):
            seeded = dataclasses.replace(ctx, rng=np.random.default_rng(seed))
            picks.add(grid[variants["gp-ei-switch-blind24"](0).propose(seeded)])
            seeded = dataclasses.replace(ctx, rng=np.random.default_rng(seed))
            base_picks.add(grid[STRATEGIES["gp-ei-switch"](0).propose(seeded)])
        if n - 5 not in (1, 3):
            assert picks == base_picks
            continue
        gp = GaussianProcess(features.shape[1])
        plain_rows = [grid[r][0] * 3 + grid[r][1] for r in rows[:n]]
        gp.fit(features[plain_rows], np.log(times[:n]))
        mean, sd = gp.predict(features)
        ei = expected_improvement(mean, sd, float(np.log(min(times[:n]))))
        best = tuple(int(v) for v in plain.grid[int(np.argmax(ei))])
        assert {g[:2] for g in picks} == {best}
        # Every setting of the switches not yet evaluated with those values is drawn.
        assert {g[2:] for g in picks} == {
            g[2:] for r, g in enumerate(grid) if g[:2] == best and r not in rows[:n]}
        assert len({g[2:] for g in picks}) > 1


def test_margin_variants_are_gp_ei_margin_with_its_margin_set() -> None:
    """``-margin6`` is ``gp-ei-margin`` (measured under that name) and ``-margin4``
    differs from it in the margin alone (what a margin does:
    tests/search/test_strategies.py); ``gp-ei-margin-plane10`` is ``auto``
    (``gp-ei-plane``, measured under that name), ``gp-ei-margin`` with the plane's
    kernel term from 10 evaluations on, and ``gp-ei-margin-plane`` has the term from
    the start."""
    from spectune.search import STRATEGIES

    variants = _benchmark("bench_replay").VARIANTS
    margin = STRATEGIES["gp-ei-margin"](0)
    four, six = variants["gp-ei-switch-margin4"](0), variants["gp-ei-switch-margin6"](0)
    assert vars(six).keys() == vars(margin).keys()
    assert all(vars(six)[k] == vars(margin)[k] for k in vars(margin) if not k.startswith("_"))
    assert four.margin == 4.0 and margin.margin == 6.0
    assert all(vars(four)[k] == vars(margin)[k] for k in vars(margin)
               if not k.startswith("_") and k != "margin")
    auto, plane10 = STRATEGIES["auto"](0), variants["gp-ei-margin-plane10"](0)
    plane = variants["gp-ei-margin-plane"](0)
    public = [k for k in vars(margin) if not k.startswith("_")]
    assert all(vars(plane10)[k] == vars(auto)[k] for k in public)
    assert auto.plane_term and not margin.plane_term
    assert (auto.plane_from, plane.plane_from) == (10, 0)
    others = [k for k in public if k not in ("plane_term", "plane_from")]
    assert all(vars(auto)[k] == vars(margin)[k] == vars(plane)[k] for k in others)


def test_near_turns_change_the_switches_and_at_most_one_other_parameter() -> None:
    """``gp-ei-switch-near1``'s turn (forced here; when it fires is ``auto``'s own rule,
    tested in tests/autotune) keeps to the best's other values but one."""
    class Turning(_benchmark("bench_replay")._NearTurns):  # type: ignore[misc, name-defined]
        def _switch_turn(self, history: object) -> bool:
            return True

    strategy = Turning(others=1, failures="worst", alignment=True, lines_after=16)
    ctx, grid = _small_context([0, 7, 14, 21, 28, 35], [5.0, 4.0, 1.0, 3.0, 6.0, 2.0])
    best = grid[ctx.history.best_row()]  # type: ignore[attr-defined]
    proposed = strategy.propose(ctx)
    chosen = {grid[r] for r in strategy._candidates(ctx)}
    assert grid[proposed] in chosen
    seen = {grid[r] for r in ctx.history.rows}  # type: ignore[attr-defined]
    assert chosen == {g for g in set(grid) - seen
                      if g[2:] != best[2:] and (g[0] != best[0]) + (g[1] != best[1]) <= 1}
    # Without the limit, the turn is auto's: every configuration of another setting.
    strategy = Turning(others=None, failures="worst", alignment=True, lines_after=16)
    strategy.propose(ctx)
    assert {grid[r] for r in strategy._candidates(ctx)} == {
        g for g in set(grid) - seen if g[2:] != best[2:]}


def _forced_rough_candidates(cls_name: str, **kw: object
                             ) -> tuple[set[tuple[int, ...]], list[tuple[int, ...]], list[int]]:
    """The candidates of ``bench_replay.<cls_name>``'s proposal on rough lines (forced),
    with lines through the 2 elites after 5 evaluations without improvement; the
    configurations never evaluated, the grid and the evaluated rows beside. The best
    is row 14, the second best row 35, five evaluations since the best."""
    class Rough(getattr(_benchmark("bench_replay"), cls_name)):  # type: ignore[misc]
        def _rough_lines(self, history: object) -> bool:
            return True

    rows = [0, 7, 14, 21, 28, 35, 41, 50]
    times = [5.0, 4.0, 1.0, 3.0, 6.0, 2.0, 7.0, 8.0]
    ctx, grid = _small_context(rows, times)
    strategy = Rough(failures="worst", alignment=True, lines_after=5, elites=2, **kw)
    strategy.propose(ctx)
    return {grid[r] for r in strategy._candidates(ctx)}, grid, rows


@pytest.mark.parametrize("mode", ["union", "alt"])
def test_rough_region_draws_also_cover_the_trust_region(mode: str) -> None:
    """``gp-ei-switch-rtr`` / ``-rtr-alt`` on rough lines (forced here): the lines through
    the elites and the radius-2 region around the best, together or in turns."""
    chosen, grid, rows = _forced_rough_candidates("_RoughRegion", mode=mode)
    seen = {grid[r] for r in rows}
    best, second = grid[14], grid[35]
    lines = {g for g in set(grid) - seen
             if min(sum(a != b for a, b in zip(g, c, strict=True)) for c in (best, second)) <= 1}
    region = {g for g in set(grid) - seen if sum(a != b for a, b in zip(g, best, strict=True)) <= 2}
    # Five evaluations since the best: odd, so the alternating draw takes the region.
    assert chosen == (lines | region if mode == "union" else region)


@pytest.mark.parametrize("mode", ["alt", "only"])
@pytest.mark.parametrize("uniform", [False, True])
def test_consensus_draws_keep_every_value_the_elites_share(mode: str, uniform: bool) -> None:
    """``gp-ei-switch-cons-*`` on rough lines (forced here): the draws cover the
    configurations that keep the values all elites share (by the model, or one drawn
    uniformly), in turns with the lines or instead of them."""
    chosen, grid, rows = _forced_rough_candidates("_EliteConsensus", mode=mode,
                                                  uniform=uniform)
    seen = {grid[r] for r in rows}
    best, second = grid[14], grid[35]
    shared = [j for j in range(4) if best[j] == second[j]]
    assert 0 < len(shared) < 4
    consensus = {g for g in set(grid) - seen if all(g[j] == best[j] for j in shared)}
    # Five evaluations since the best: odd, so the alternating draw takes the consensus.
    if uniform:
        assert len(chosen) == 1 and chosen <= consensus
    else:
        assert chosen == consensus


def test_hidden_probes_leave_the_model_unless_they_are_the_best() -> None:
    """``gp-ei-switch-hcover``: the probes at evaluations 6, 8 and 10 are left out of the
    GP's fit, but for the one that is the best so far."""
    strategy = _benchmark("bench_replay").VARIANTS["gp-ei-switch-hcover"](0)
    rows = [0, 7, 14, 21, 28, 35, 41, 50, 3, 9]
    times = [5.0, 4.0, 6.0, 3.0, 7.0, 8.0, 9.0, 1.0, 4.5, 2.0]  # probes: 35, 50 (best), 9
    ctx, _ = _small_context(rows, times)
    strategy.propose(ctx)
    feats = ctx.index.features(alignment=True)  # type: ignore[attr-defined]
    fitted = {tuple(x) for x in strategy._gp._x}
    assert fitted == {tuple(feats[r]) for r in rows if r not in (35, 9)}


def test_lines_start_sooner_only_while_the_fit_is_rough() -> None:
    """``gp-ei-switch-rough4``: on the lines after 4 evaluations without improvement when
    the fitted noise exceeds ``rough_lines``, after ``lines_after`` (16) when it does not."""
    strategy = _benchmark("bench_replay").VARIANTS["gp-ei-switch-rough4"](0)
    times = [5.0, 1.0, 6.0, 7.0, 8.0, 9.0]  # the best, then four without improvement
    ctx, _ = _small_context([0, 7, 14, 21, 28, 35], times)
    strategy.propose(ctx)
    history = ctx.history  # type: ignore[attr-defined]
    gp = strategy._gp
    for noise, on_lines in [(0.5, True), (1e-4, False)]:
        gp.theta[gp.dims + 1] = np.log(noise)  # the fitted noise, as the fit stores it
        assert gp.noise == pytest.approx(noise)
        assert strategy._on_lines(history) is on_lines
    gp.theta[gp.dims + 1] = np.log(0.5)
    ctx, _ = _small_context([0, 7, 14, 21, 28], times[:5])  # three without improvement
    assert not strategy._on_lines(ctx.history)  # type: ignore[attr-defined]


def test_gain_stall_counts_from_the_last_improvement_above_the_threshold() -> None:
    """``gp-ei-switch-gain5``: a best improved by under 5 % does not reset the count of
    evaluations without improvement; a failure never does."""
    strategy = _benchmark("bench_replay").VARIANTS["gp-ei-switch-gain5"](0)
    history = _small_context([0, 7, 14, 21, 28, 35], [10.0, 9.0, 8.8, float("nan"), 8.5, 8.7])[0]
    # 9.0 improves 10 % on 10.0; 8.8 and 8.5 are 2.2 % and 3.4 % steps: 4 since the 9.0.
    assert strategy._since_best(history.history) == 4  # type: ignore[attr-defined]
    plain = _benchmark("bench_replay").VARIANTS["gp-ei-switch-gain2"](0)
    # With 2 %, the 8.8 (2.2 %) and the 8.5 (3.4 %) count: 1 since the 8.5.
    assert plain._since_best(history.history) == 1  # type: ignore[attr-defined]


def _late_history(since_best: int) -> object:
    """A proposal context of 12 + ``since_best`` evaluations, the best (1.0) the 12th."""
    n = 12 + since_best
    times = [5.0 + (i % 7) for i in range(n)]
    times[11] = 1.0
    return _small_context([(7 * i) % 60 for i in range(n)], times)[0]


def test_late_plane_proposes_with_the_plain_model_before_ten_evaluations() -> None:
    """``gp-ei-margin-plane10`` (``auto``): ``gp-ei-margin``'s model (no kernel term)
    while fewer than 10 evaluations are in, so its proposals there are
    ``gp-ei-margin``'s; from 10 on the model with the term over the two parameters with
    most values."""
    from spectune.search import STRATEGIES

    times = [5.0, 3.0, 7.0, 2.0, 6.0, 4.0, 8.0]
    rows = [0, 11, 23, 35, 47, 52, 58]
    strategy = _benchmark("bench_replay").VARIANTS["gp-ei-margin-plane10"](0)
    margin = STRATEGIES["gp-ei-margin"](0)
    for n in range(5, len(rows) + 1):  # 5-7 evaluations in
        ctx = _small_context(rows[:n], times[:n])[0]
        assert strategy.propose(ctx) == margin.propose(_small_context(rows[:n], times[:n])[0])
        assert strategy._gp.terms == []
    strategy.propose(_late_history(0))  # 12 in
    # a and b have most values: their ordinal columns 0, 1 and alignment columns 4, 5.
    assert [t.tolist() for t in strategy._gp.terms] == [[0, 1, 4, 5]]
    assert strategy.plane_from == 10 and strategy.margin == 6.0


@pytest.mark.parametrize(("variant", "in_region", "on_lines"), [
    ("gp-ei-margin-lm0.25-all", True, True), ("gp-ei-margin-lm0.5-lines", False, True),
    ("gp-ei-margin-lm0.25-tr", True, False)])
def test_late_margin_applies_in_its_phase_from_ten_evaluations(
        variant: str, in_region: bool, on_lines: bool) -> None:
    """``gp-ei-margin-lm*``: from ``global_until`` (10) on, expected improvement is
    measured below the best less ``late`` spreads of the log-times in the trust region
    (before 16 evaluations without improvement), on the lines (after), or both."""
    strategy = _benchmark("bench_replay").VARIANTS[variant](0)
    late = strategy.late
    assert late > 0 and strategy.margin == 6.0
    for since, margined in [(3, in_region), (20, on_lines)]:
        ctx = _late_history(since)
        history = ctx.history  # type: ignore[attr-defined]
        assert strategy._on_lines(history) is (since >= 16)
        y = np.log(history.times)
        want = np.log(1.0) - (late * y.std() if margined else 0.0)
        assert strategy._target(history, y) == pytest.approx(want)
    with pytest.raises(ValueError, match="phase"):
        _benchmark("bench_replay")._LateMargin(late=0.5, phase="line")


@pytest.mark.parametrize("top", [None, 1])
def test_setting_centres_turn_near_each_other_settings_best(top: int | None) -> None:
    """``gp-ei-margin-sc`` / ``-sc1``: a switch turn (forced here) chooses among the
    configurations of another setting within one change of that setting's fastest
    (of the fastest other setting only, with ``top=1``)."""
    class Turning(_benchmark("bench_replay")._SettingCentres):  # type: ignore[misc, name-defined]
        def _switch_turn(self, history: object) -> bool:
            return True

    strategy = Turning(top=top, radius=1, failures="worst", alignment=True, lines_after=16)
    rows, times = [0, 7, 14, 21, 28, 35, 41], [5.0, 4.0, 1.0, 3.0, 6.0, 2.0, 2.5]
    ctx, grid = _small_context(rows, times)
    strategy.propose(ctx)
    chosen = {grid[r] for r in strategy._candidates(ctx)}
    best = grid[14]
    fastest: dict[tuple[int, ...], tuple[int, ...]] = {}
    for r, _ in sorted(zip(rows, times, strict=True), key=lambda rt: rt[1]):
        if grid[r][2:] != best[2:]:
            fastest.setdefault(grid[r][2:], grid[r])
    assert len(fastest) >= 2  # two other settings, so top=1 leaves one out
    centres = list(fastest.values())[:top]
    seen = {grid[r] for r in rows}
    assert chosen == {g for g in set(grid) - seen for c in centres
                      if g[2:] == c[2:] and (g[0] != c[0]) + (g[1] != c[1]) <= 1}


def test_rough_everywhere_draws_in_the_trust_region_while_the_fit_is_rough() -> None:
    """``gp-ei-margin-rough-all``: from ``global_until`` (10) on, a Thompson draw whenever
    the fitted noise exceeds ``rough_lines``, before the lines too; ``auto`` draws
    only on the lines."""
    from spectune.search import STRATEGIES

    variants = _benchmark("bench_replay").VARIANTS
    ctx = _late_history(3)  # in the trust region: 3 evaluations since the best
    for name, rough_draws in [("gp-ei-margin-rough-all", True), ("auto", False)]:
        strategy = (variants.get(name) or STRATEGIES[name])(0)
        strategy.propose(ctx)
        gp = strategy._gp
        for noise, drawn in [(0.5, rough_draws), (1e-4, False)]:
            gp.theta[gp.dims + 1] = np.log(noise)  # the fitted noise, as the fit stores it
            assert strategy._rough_lines(ctx.history) is drawn, (name, noise)  # type: ignore[attr-defined]
    early = _small_context([0, 7, 14, 21, 28, 35], [5.0, 4.0, 1.0, 3.0, 6.0, 2.0])[0]
    strategy = variants["gp-ei-margin-rough-all"](0)
    strategy.propose(early)
    strategy._gp.theta[strategy._gp.dims + 1] = np.log(0.5)
    assert not strategy._rough_lines(early.history)  # type: ignore[attr-defined]


def test_alignment_of_keeps_the_alignment_features_of_block_sizes_only() -> None:
    """``gp-ei-margin-al8`` / ``-al-none``: the alignment columns of the parameters whose
    values are all multiples of 8 (block sizes) are kept, those of small factors (tiles)
    dropped; with no granule the features are the ordinal ones alone."""
    from spectune.search import SpaceIndex
    from spectune.space import Param, SearchSpace

    bench = _benchmark("bench_replay")
    index = SpaceIndex(SearchSpace(params=(
        Param("block", (16, 32, 48, 64)), Param("tile", (1, 2, 3, 4)),
        Param("pitch", (8, 12, 16, 20)), Param("s", (0, 1)))))
    full, ordinal = index.features(alignment=True), index.features(alignment=False)
    assert full.shape[1] == ordinal.shape[1] + 3  # block's, tile's and pitch's alignment
    block_alignment = full[:, 4]
    # 16, 32, 48, 64: largest powers of two 2^4, 2^5, 2^4, 2^6, scaled to [0, 1]
    assert np.array_equal(block_alignment, np.array([0.0, 0.5, 0.0, 1.0])[index.grid[:, 0]])
    kept = bench._aligned_features(index, 8)
    assert np.array_equal(kept, np.c_[ordinal, block_alignment])
    assert np.array_equal(bench._aligned_features(index, None), ordinal)
    assert np.array_equal(bench._aligned_features(index, 1), full)
    strategy = bench.VARIANTS["gp-ei-margin-al8"](0)
    ctx = _late_history(3)
    strategy.propose(ctx)
    assert np.array_equal(strategy._features,
                          bench._aligned_features(ctx.index, 8))  # type: ignore[attr-defined]


@pytest.mark.parametrize("variant", ["gp-ei-margin-ks-tr", "gp-ei-margin-ks-all"])
def test_keep_switches_holds_the_region_to_the_best_switch_setting(variant: str) -> None:
    """``gp-ei-margin-ks-tr``: the trust region holds only the best's switch setting, the
    lines do not; ``-ks-all``: both do. ``auto``'s region, less the other settings."""
    from spectune.search import STRATEGIES

    strategy, auto = _benchmark("bench_replay").VARIANTS[variant](0), STRATEGIES["auto"](0)
    for since, held in [(3, True), (20, variant.endswith("all"))]:
        ctx = _late_history(since)
        for s in (strategy, auto):
            s.propose(ctx)
        best = ctx.history.best_row()  # type: ignore[attr-defined]
        if since == 20:
            assert auto._on_lines(ctx.history) and not auto._switch_turn(ctx.history)  # type: ignore[attr-defined]
        grid = ctx.index.grid  # type: ignore[attr-defined]
        region, wide = strategy._candidates(ctx), auto._candidates(ctx)
        same = wide[(grid[wide][:, 2:] == grid[best][2:]).all(axis=1)]
        assert 0 < len(same) < len(wide)
        assert set(region.tolist()) == set((same if held else wide).tolist()), since


@pytest.mark.parametrize("every", [2, 3])
def test_plane_turns_choose_in_the_best_plane_of_the_two_largest_parameters(every: int) -> None:
    """``gp-ei-margin-pl<every>``: in the trust region, every ``every``-th proposal since
    the best chooses among the unseen configurations that keep the best's values of all
    but the two parameters with most values (``a``, ``b``); ``-pl<every>d`` draws there
    while the fit is rough. Not on the lines."""
    from spectune.search import STRATEGIES

    variants = _benchmark("bench_replay").VARIANTS
    auto = STRATEGIES["auto"](0)
    for since in range(0, 6):
        ctx = _late_history(since)
        strategy = variants[f"gp-ei-margin-pl{every}"](0)
        drawing = variants[f"gp-ei-margin-pl{every}d"](0)
        for s in (strategy, drawing, auto):
            s.propose(ctx)
        grid, best = ctx.index.grid, ctx.history.best_row()  # type: ignore[attr-defined]
        unseen = np.flatnonzero(ctx.available)  # type: ignore[attr-defined]
        turn = since % every == every - 1
        plane = unseen[(grid[unseen][:, 2:] == grid[best][2:]).all(axis=1)]
        want = plane if turn else auto._candidates(ctx)
        assert set(strategy._candidates(ctx).tolist()) == set(want.tolist()), since
        gp = drawing._gp
        gp.theta[gp.dims + 1] = np.log(0.5)  # a rough fit, as the fit stores it
        assert drawing._rough_lines(ctx.history) is turn  # type: ignore[attr-defined]
        gp.theta[gp.dims + 1] = np.log(1e-4)  # a smooth one
        assert not drawing._rough_lines(ctx.history)  # type: ignore[attr-defined]
        gp.theta[gp.dims + 1] = np.log(0.5)
        assert not strategy._rough_lines(ctx.history)  # type: ignore[attr-defined]
    lines = _late_history(20)
    strategy = variants[f"gp-ei-margin-pl{every}"](0)
    strategy.propose(lines)
    auto.propose(lines)
    assert set(strategy._candidates(lines).tolist()) == set(auto._candidates(lines).tolist())


def test_leave_one_out_reports_peers_beside_and_never_chooses_them(tmp_path: Path) -> None:
    out = tmp_path / "loo.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_replay.py", "--leave-one-out", "--no-shared",
         "--synthetic", "2", "--repeats", "2", "--budget", "20", "--samplers", "random,gp-tr",
         "--peers", "tpe", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    loo = json.loads(out.read_text())["leave_one_out"]
    assert loo["candidates"] == ["random", "gp-tr"] and loo["peers"] == ["tpe"]
    runs = json.loads(out.read_text())["runs"]
    for held in loo["held_out"]:
        assert held["chosen"] in ("random", "gp-tr")
        tpe = next(r for r in runs if r["file"] == held["file"] and r["sampler"] == "tpe")
        assert held["peers"]["tpe"] == tpe["results"]
    assert "| held-out file | evals | ours (chosen) | tpe | random |" in done.stdout
    unmet = json.loads(out.read_text())["unmet_goals"]
    assert unmet == _benchmark("bench_replay").unmet_goals(loo)
    assert f"Goals unmet: {len(unmet) or 'none'}" in done.stdout
    fragile = json.loads(out.read_text())["fragile_goals"]
    assert fragile == _benchmark("bench_replay").fragile_goals(loo)
    assert f"Goals met within the seeds' noise: {len(fragile) or 'none'}" in done.stdout
    for line in unmet + fragile:  # every seed's fraction is stored: each has its interval
        assert "margin 95 % interval" in line
    for run in runs:
        for cell in run["results"]:
            assert len(cell["fractions"]) == len(cell["random_fractions"]) == 2
            assert cell["median_fraction"] == pytest.approx(np.median(cell["fractions"]))
    for run in runs:  # where the median reaches 95 %, printed beside the cells
        at = run["median95_at"]
        assert at is None or 1 <= at <= 20
        assert f"median95@{at or '-'} " in done.stdout


def _bench_replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/bench_replay.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)


def test_stored_runs_judged_together_give_what_one_run_gives(tmp_path: Path) -> None:
    """Files measured apart (``--out``), then judged with ``--from``: the same rule,
    table and goals as when measured in one ``--leave-one-out`` run."""
    common = ["--no-shared", "--repeats", "2", "--budget", "20",
              "--samplers", "random,gp-tr", "--peers", "tpe"]
    one, a, b, merged = (tmp_path / f"{n}.json" for n in ("one", "a", "b", "merged"))
    together = _bench_replay("--leave-one-out", "--synthetic", "2", *common, "--out", str(one))
    assert together.returncode == 0, together.stderr[-3000:]
    for start, out in (("0", a), ("1", b)):
        apart = _bench_replay("--synthetic", "1", "--synthetic-start", start, *common,
                              "--out", str(out))
        assert apart.returncode == 0, apart.stderr[-3000:]
    judged = _bench_replay("--leave-one-out", "--from", f"{a},{b}",
                           "--out", str(merged))
    assert judged.returncode == 0, judged.stderr[-3000:]
    expected = json.loads(one.read_text())
    got = json.loads(merged.read_text())
    assert got["leave_one_out"] == expected["leave_one_out"]
    assert (got["unmet_goals"], got["fragile_goals"]) == (
        expected["unmet_goals"], expected["fragile_goals"])
    table = together.stdout[together.stdout.index("| held-out file"):]
    assert judged.stdout == table

    # --samplers keeps those candidates only; the peers stay.
    only = _bench_replay("--leave-one-out", "--from", f"{a},{b}", "--samplers", "gp-tr",
                         "--out", str(merged))
    assert only.returncode == 0, only.stderr[-3000:]
    loo = json.loads(merged.read_text())["leave_one_out"]
    assert loo["candidates"] == ["gp-tr"] and loo["peers"] == ["tpe"]
    assert [h["chosen"] for h in loo["held_out"]] == ["gp-tr", "gp-tr"]
    ordered = _benchmark("bench_replay").stored_runs([a, b], candidates=["gp-tr", "random"])
    assert [r["sampler"] for r in ordered if r["file"] == "synthetic0"] == [
        "gp-tr", "random", "tpe"]  # the order given, which ties go by; peers after

    # A peer run on some files only: the others' cells say so and the rest is judged.
    rows = json.loads(b.read_text())
    no_peer = tmp_path / "no_peer.json"
    no_peer.write_text(json.dumps([r for r in rows if r["sampler"] != "tpe"]))
    partial = _bench_replay("--leave-one-out", "--from", f"{a},{no_peer}", "--out", str(merged))
    assert partial.returncode == 0, partial.stderr[-3000:]
    held = {h["file"]: h for h in json.loads(merged.read_text())["leave_one_out"]["held_out"]}
    assert set(held["synthetic0"]["peers"]) == {"tpe"} and held["synthetic1"]["peers"] == {}
    cells = [line for line in partial.stdout.splitlines()
             if re.match(r"\| synthetic1 \| \d+ \|", line)]
    assert len(cells) == 2 and all("| - |" in line for line in cells), cells

    # Without --leave-one-out, --from merges into --out.
    merge = _bench_replay("--from", f"{a},{no_peer}", "--out", str(merged))
    assert merge.returncode == 0, merge.stderr[-3000:]
    assert json.loads(merged.read_text()) == json.loads(a.read_text()) + json.loads(
        no_peer.read_text())

    # What cannot be judged together is refused with the reason, nothing half-printed.
    no_gp = tmp_path / "no_gp.json"
    no_gp.write_text(json.dumps([r for r in rows if r["sampler"] != "gp-tr"]))
    short = tmp_path / "short.json"
    short.write_text(json.dumps([{**r, "results": r["results"][:1]} for r in rows]))
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps([{"file": "synthetic1"}]))
    for stored, reason in (
        (f"{a},{a}", "is in both"),
        (f"{a},{no_gp}", "gp-tr has no run on synthetic1"),
        (f"{a},{short}", "different budgets"),
        (f"{foreign}", "holds no runs of bench_replay.py --out"),
        (f"{tmp_path / 'absent.json'}", "absent.json"),
    ):
        refused = _bench_replay("--leave-one-out", "--from", stored)
        assert refused.returncode == 2 and reason in refused.stderr, refused.stderr
        assert refused.stdout == ""
    alone = _bench_replay("--from", str(a))
    assert alone.returncode == 2 and "--from needs --leave-one-out" in alone.stderr


def test_median_reaches_is_the_first_evaluation_whose_median_is_at_the_level() -> None:
    median_reaches = _benchmark("bench_replay").median_reaches
    curves = np.array([[0.5, 0.9, 0.96, 1.0],
                       [0.2, 0.95, 0.95, 0.95],
                       [0.1, 0.3, 0.5, 1.0]])
    # Medians per evaluation: 0.2, 0.9, 0.95, 1.0 (no single seed's curve decides).
    assert median_reaches(curves, 0.95) == 3
    assert median_reaches(curves, 0.9) == 2
    assert median_reaches(curves, 1.0) == 4
    assert median_reaches(curves, 1.01) is None
    # An even number of seeds: the mean of the middle two (0.9 and 1.0 at the first).
    assert median_reaches(np.array([[0.9, 1.0], [1.0, 1.0]]), 0.95) == 1


def test_proposal_cost_benchmark_times_its_variants_on_the_same_seeds(
    tmp_path: Path,
) -> None:
    from spectune.search.replay import write_synthetic

    space = write_synthetic(tmp_path / "s.json.gz", seed=3)
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_proposal_cost.py", str(space), "--repeats", "1",
         "--budget", "205", "--variants", "shipped,blas,all"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == ("| variant | ms/eval 2-100 | ms/eval 101-200 | ms/eval 201-205 | "
                       "slowest ms |")
    assert [r.split(" | ")[0] for r in rows[1:]] == [
        "| shipped", "| BLAS's own threads", "| all observations"]
    assert all(len(r.split(" | ")) == 5 for r in rows[1:])
    assert "BLAS's own threads / shipped: " in done.stdout
    assert "all observations / shipped: " in done.stdout
    failed = subprocess.run(
        [sys.executable, "benchmarks/bench_proposal_cost.py", str(space), "--variants",
         "shipped,fast"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert failed.returncode == 2 and "--variants" in failed.stderr, failed.stderr


def test_early_picks_benchmark_gives_every_strategy_the_same_random_start(
    tmp_path: Path,
) -> None:
    picks = _benchmark("bench_early_picks").picks
    from spectune.search import SpaceIndex
    from spectune.search.replay import load_t4, write_synthetic

    space = write_synthetic(tmp_path / "s.json.gz", seed=4)
    recorded = load_t4(space)
    index = SpaceIndex(recorded.space)
    ours = picks(recorded, index, "auto", repeats=3)
    rand = picks(recorded, index, "random", repeats=3)
    assert ours.shape == rand.shape == (3, 10)
    assert np.all((ours >= 0) & (ours <= 1))
    np.testing.assert_array_equal(ours[:, :5], rand[:, :5])  # the shared random start
    assert not np.array_equal(ours[:, 5:], rand[:, 5:])  # the model's picks differ
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_early_picks.py", str(space), "--repeats", "2",
         "--samplers", "random,auto"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert [line.split(" | ")[1] for line in done.stdout.splitlines()[2:]] == ["random", "auto"]
    # The generated spaces of bench_replay.py, beside a file.
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_early_picks.py", str(space), "--synthetic", "1",
         "--synthetic-start", "7", "--repeats", "2", "--samplers", "random"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    names = [line.split(" | ")[0] for line in done.stdout.splitlines()[2:]]
    assert names == ["| s", "| synthetic7"]


def _methodology() -> object:
    """benchmarks/bench_methodology.py, imported (it needs the bench extra)."""
    if not os.environ.get("CI"):  # scripts/test.sh installs it: in CI a skip would hide rot
        pytest.importorskip("autotuning_methodology",
                            reason="the bench extra: pip install '.[bench]'")
    return _benchmark("bench_methodology")


def test_methodology_score_is_one_at_the_optimum_and_below_zero_at_the_slowest(
    tmp_path: Path,
) -> None:
    """The package's standardisation: a curve on the optimum from the first evaluation
    scores 1, one stuck on the slowest correct configuration scores below random (0),
    and a curve between the two lies between; failures before the first success are
    left out of the median as the package leaves them out."""
    m = _methodology()
    from spectune.search.replay import load_t4, write_synthetic

    path = write_synthetic(tmp_path / "s_T4.json.gz", seed=5)
    space = load_t4(path)
    stats = m.package_statistics(path, tmp_path)
    budget = 60
    top = m.score(stats, np.ones((3, budget)), optimum=space.optimum)
    assert top["score"] == pytest.approx(1.0)
    assert top["first"] >= 1 and top["last"] <= budget
    assert top["cut_at_budget"] == (top["cutoff"] > budget)
    slowest = max(r.time for r in space.records.values() if r.ok)
    stuck = m.score(stats, np.full((3, budget), space.optimum / slowest),
                    optimum=space.optimum)["score"]
    assert stuck < 0
    ours = m.replay(space, budget=budget, repeats=3, sampler="auto").engine_curves
    assert stuck < m.score(stats, ours, optimum=space.optimum)["score"] <= 1.0
    late = np.ones((3, budget))
    late[:, :5] = 0.0  # no correct configuration in the first five evaluations
    assert m.score(stats, late, optimum=space.optimum)["score"] < 1.0
    with pytest.raises(ValueError, match="does not"):
        m.score(stats, np.full((3, budget), 0.123456789), optimum=space.optimum)


def _run_methodology(
    tmp_path: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]]]:
    """``bench_methodology.py --no-shared *args``, which must succeed, and its rows."""
    out = tmp_path / "m.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_methodology.py", "--no-shared", *args,
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done, json.loads(out.read_text())["rows"]


def test_methodology_benchmark_scores_engine_and_peers_on_the_same_spaces(
    tmp_path: Path,
) -> None:
    _methodology()
    done, rows = _run_methodology(
        tmp_path, "--synthetic", "2", "--repeats", "2", "--budget", "30",
        "--samplers", "auto,random", "--peers", "kt-random_sample")
    assert {(r["file"], r["strategy"]) for r in rows} == {
        (f"synthetic{i}", s) for i in (0, 1) for s in ("auto", "random", "kt-random_sample")}
    assert all(isinstance(r["score"], float) for r in rows)
    assert "| space | evaluations | auto | random | kt-random_sample |" in done.stdout
    assert "| **aggregate** |" in done.stdout


def test_methodology_full_budget_runs_each_space_to_its_own_cutoff(tmp_path: Path) -> None:
    """``--budget full``: each space's runs end at its 95 % cut-off, so no range is cut
    and every score covers the package's whole range; a budget that is neither a
    positive number nor ``full`` is a usage error."""
    m = _methodology()
    done, rows = _run_methodology(
        tmp_path, "--synthetic", "2", "--synthetic-start", "3", "--repeats", "2",
        "--budget", "full", "--samplers", "random")
    assert [r["file"] for r in rows] == ["synthetic3", "synthetic4"]
    files = m.synthetic_files(tmp_path, count=2, start=3)  # the spaces the script made
    for row, path in zip(rows, files, strict=True):
        assert (row["first"], row["last"]) == m.cutoffs(m.package_statistics(path, tmp_path))
        assert row["cutoff"] == row["last"] and row["cut_at_budget"] is False
        assert isinstance(row["score"], float)
    assert "cut-off" not in done.stdout.split("| synthetic3 |")[1].splitlines()[0]
    for bad in ("0", "fully"):
        failed = subprocess.run(
            [sys.executable, "benchmarks/bench_methodology.py", "--no-shared", "--budget", bad],
            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        )
        assert failed.returncode == 2 and "--budget" in failed.stderr, failed.stderr


def _held(file: str, ours: list[float], random: list[float],
          peers: dict[str, list[float]]) -> dict[str, object]:
    """One held-out file as ``leave_one_out`` records it, at budgets 10, 20, 50, 100."""
    budgets = (10, 20, 50, 100)
    return {"file": file, "chosen": "auto", "repeats": 3,
            "results": [{"budget": b, "median_fraction": o, "random_median_fraction": r}
                        for b, o, r in zip(budgets, ours, random, strict=True)],
            "peers": {p: [{"budget": b, "median_fraction": v}
                          for b, v in zip(budgets, values, strict=True)]
                      for p, values in peers.items()}}


def test_unmet_goals_names_each_cell_that_misses_a_goal() -> None:
    unmet_goals = _benchmark("bench_replay").unmet_goals
    met = _held("a", [0.5, 0.8, 0.9, 0.96], [0.4, 0.5, 0.6, 0.7],
                {"ga": [0.9, 0.8, 0.9, 0.96], "tpe": [0.1, 0.1, 0.1, 0.1]})
    # A peer ahead at 10 is no goal (only 20, 50, 100); ties with a peer meet it.
    assert unmet_goals({"held_out": [met]}) == []
    missed = _held("b", [0.3, 0.6, 0.7, 0.931], [0.3, 0.5, 0.6, 0.7],
                   {"ga": [0.2, 0.5, 0.71, 0.9], "tpe": [0.2, 0.65, 0.6, 0.8]})
    assert unmet_goals({"held_out": [met, missed]}) == [
        "b at 10: 0.300 <= random 0.300",   # level with random search is not above it
        "b at 20: 0.600 < tpe 0.650",       # the best peer of the cell is named
        "b at 50: 0.700 < ga 0.710",
        "b at 100: 0.931 < 0.95",
    ]
    # Without peers only the level and random search are goals.
    alone = _held("c", [0.3, 0.6, 0.7, 0.95], [0.2, 0.7, 0.6, 0.7], {})
    assert unmet_goals({"held_out": [alone]}) == ["c at 20: 0.600 <= random 0.700"]


def _seeded(file: str, ours: list[float], random: list[float], peer: list[float]
            ) -> dict[str, object]:
    """One held-out file at budget 100 alone, every side's per-seed fractions given."""
    def cell(values: list[float], **more: object) -> dict[str, object]:
        return {"budget": 100, "median_fraction": float(np.median(values)),
                "fractions": values, **more}

    return {"file": file, "chosen": "auto", "repeats": len(ours),
            "results": [cell(ours, random_median_fraction=float(np.median(random)),
                             random_fractions=random)],
            "peers": {"ga": [cell(peer)]}}


def test_goal_checks_say_whether_the_seeds_settle_each_verdict() -> None:
    bench = _benchmark("bench_replay")
    # Settled both ways: short of the level and the peer by 0.1 on every seed; above
    # random search on every seed.
    settled = _seeded("s", [0.85] * 100, [0.5] * 100, [0.95] * 100)
    checks = {c.goal: c for c in bench.goal_checks({"held_out": [settled]})}
    assert not checks["level"].met and checks["level"].clear
    assert checks["level"].interval == pytest.approx((-0.1, -0.1))
    assert not checks["peer"].met and checks["peer"].clear
    assert checks["random"].met and checks["random"].clear
    assert bench.unmet_goals({"held_out": [settled]}) == [
        "s at 100: 0.850 < 0.95 (margin 95 % interval -0.100 to -0.100: clear)",
        "s at 100: 0.850 < ga 0.950 (margin 95 % interval -0.100 to -0.100: clear)",
    ]
    assert bench.fragile_goals({"held_out": [settled]}) == []
    # Seeds split between two basins either side of the peer: the medians meet the
    # peer's goal, but half the resamples put our median in the lower basin.
    split = _seeded("t", [0.9] * 49 + [1.0] * 51, [0.5] * 100, [0.96] * 100)
    checks = {c.goal: c for c in bench.goal_checks({"held_out": [split]})}
    assert checks["peer"].met and checks["peer"].clear is False
    low, high = checks["peer"].interval
    assert low < 0 < high
    assert checks["level"].met and checks["level"].clear is False  # 0.9 < 0.95 in resamples
    assert bench.fragile_goals({"held_out": [split]}) == [checks["level"].line,
                                                          checks["peer"].line]
    # A tie with random search on every seed is a settled miss (above it is the goal).
    tie = _seeded("u", [0.3] * 10, [0.3] * 10, [0.1] * 10)
    random_check = next(c for c in bench.goal_checks({"held_out": [tie]}) if c.goal == "random")
    assert not random_check.met and random_check.clear
    # The same run gives the same intervals (a fixed generator).
    assert bench.goal_checks({"held_out": [split]}) == bench.goal_checks({"held_out": [split]})


def test_replay_benchmark_seed_gives_another_seed_set_for_engine_and_peers(
    tmp_path: Path,
) -> None:
    """``--seed 1``: every candidate and Kernel Tuner peer runs the seeds ``replay(...,
    seed=1)`` derives, not those of the default base 0."""
    if not os.environ.get("CI"):  # scripts/test.sh installs it: in CI a skip would hide rot
        pytest.importorskip("kernel_tuner", reason="the bench extra: pip install '.[bench]'")
    from spectune.search.replay import load_t4, replay, write_synthetic

    path = write_synthetic(tmp_path / "synthetic3.json.gz", seed=3)
    curves = {}
    for seed in (0, 1):
        out = tmp_path / f"seed{seed}.json"
        done = subprocess.run(
            [sys.executable, "benchmarks/bench_replay.py", "--files", str(path), "--repeats",
             "3", "--budget", "15", "--samplers", "gp-tr", "--peers", "kt-random_sample",
             "--seed", str(seed), "--out", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        runs = {r["sampler"]: r for r in json.loads(out.read_text())}
        assert {r["seed"] for r in runs.values()} == {seed}
        curves[seed] = runs
    direct = replay(load_t4(path), budget=15, repeats=3, sampler="gp-tr", seed=1)
    assert curves[1]["gp-tr"]["results"] == _benchmark("bench_replay").budget_cells(direct)
    assert curves[0]["gp-tr"]["results"] != curves[1]["gp-tr"]["results"]
    assert (curves[0]["kt-random_sample"]["results"]
            != curves[1]["kt-random_sample"]["results"])


def test_transfer_variant_keeps_the_prior_out_of_the_base_strategys_history(
    tmp_path: Path,
) -> None:
    """``bench_transfer.py --base-sees own``: the base strategy proposes on its own
    evaluations only, while the prior still takes its alternate turns first."""
    bench = _benchmark("bench_transfer")
    from spectune.search import Strategy

    seen: list[list[int]] = []

    class Recorder(Strategy):
        name = "recorder"

        def propose(self, ctx):  # type: ignore[no-untyped-def]
            seen.append([int(r) for r in ctx.history.rows])
            return None

    rows = [0, 7, 14, 21, 28]
    ctx, _ = _small_context(rows, [5.0, 4.0, 6.0, 3.0, 7.0])
    prior = [ctx.index.config(7), ctx.index.config(21), ctx.index.config(40)]  # type: ignore[attr-defined]
    bench.OwnEvaluations(Recorder(), prior=prior).propose(ctx)
    assert seen == [[0, 14, 28]]

    from spectune.search import SpaceIndex
    from spectune.search.replay import engine_run, load_t4, prior_configs, write_synthetic

    target = load_t4(write_synthetic(tmp_path / "t.json.gz", seed=3))
    configs = prior_configs(load_t4(write_synthetic(tmp_path / "p.json.gz", seed=4)), target)
    assert configs
    index = SpaceIndex(target.space)
    first = [index.row(c) for c in configs]
    picks: list[int] = []
    factory = functools.partial(bench.own_transfer, sampler="auto", prior=configs)
    strategy = factory(1)
    propose = strategy.propose

    def recording(ctx):  # type: ignore[no-untyped-def]
        row = propose(ctx)
        picks.append(len(ctx.history.rows) if row in first else -1)
        return row

    strategy.propose = recording  # type: ignore[method-assign]
    curve, _ = engine_run(target, budget=30, sampler=lambda seed: strategy, seed=1, index=index)
    assert curve.shape == (30,) and np.all(np.diff(curve) >= 0)
    assert picks[0] == 0  # the prior's first pick is the study's first evaluation


def test_transfer_gain_interval_is_paired_over_the_same_seeds() -> None:
    bench = _benchmark("bench_transfer")
    rng = np.random.default_rng(5)
    base = rng.uniform(0.2, 0.9, size=200)  # seeds that differ far more than the gain
    lo, hi = bench.paired_interval(base + 0.05, base)
    # The same gain on every seed is exact, however the seeds spread.
    assert lo == pytest.approx(0.05) and hi == pytest.approx(0.05)
    lo, hi = bench.paired_interval(base, base)
    assert lo == hi == 0
    lo, hi = bench.paired_interval(base - 0.02, base)
    assert lo == pytest.approx(-0.02) and hi == pytest.approx(-0.02)
    with pytest.raises(ValueError, match="same seeds"):
        bench.paired_interval(base[:10], base)


def test_transfer_benchmark_prints_each_gain_with_its_interval(tmp_path: Path) -> None:
    from spectune.search.replay import write_synthetic

    write_synthetic(tmp_path / "target_T4.json.gz", seed=3)
    write_synthetic(tmp_path / "other_T4.json.gz", seed=4)
    out = tmp_path / "transfer.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_transfer.py", "--dir", str(tmp_path),
         "--pairs", "target:other", "--repeats", "6", "--budget", "12", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = json.loads(out.read_text())
    assert report["budgets"] == [10, 12]
    records = report["records"]
    assert [r["prior"] for r in records] == ["adversarial (its slowest)", "other"]
    for r in records:
        for (lo, hi), gain in zip(r["transfer_gain_95"],
                                  np.subtract(r["transfer"], r["none"]), strict=True):
            assert -1 <= lo <= hi <= 1
            assert f"{gain:+.3f} [{lo:+.3f} to {hi:+.3f}]" in done.stdout
    assert "95 % paired bootstrap interval" in done.stdout
