"""The parts of the default strategy: alignment features, posterior draws, escapes."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import optuna
import pytest

from spectune.search import (
    History,
    Outcome,
    ProposalContext,
    SpaceIndex,
    _gp,
    _strategies,
    search,
)
from spectune.search._gp import TYPICAL_NOISE, GaussianProcess
from spectune.search._strategies import (
    MODEL_POINTS,
    STRATEGIES,
    SWITCH_TURN_EVERY,
    GPStrategy,
    make_strategy,
    model_subset,
)
from spectune.space import Param, SearchSpace
from tests.search.conftest import spy_gp_acquisitions

optuna.logging.set_verbosity(optuna.logging.ERROR)


def test_auto_is_the_expected_improvement_trust_region_with_alignment_lines_and_escapes(
) -> None:
    strategy = make_strategy("auto", seed=0)
    assert isinstance(strategy, GPStrategy)
    assert strategy.name == "auto"
    assert (strategy.n_init, strategy.radius) == (5, 2)
    assert strategy.global_until == 10  # its first model proposals global
    assert strategy.margin == 6.0  # ... demanding an improvement of six spreads
    assert (strategy.lines_after, strategy.elites, strategy.stall) == (16, 5, 40)
    assert strategy.rough_lines == TYPICAL_NOISE  # draws on rough lines
    assert strategy.switch_turns == TYPICAL_NOISE  # turns to other switches when smooth
    assert strategy.plane_from == 10  # the block-size plane's term from the tenth on
    assert strategy.model_points == MODEL_POINTS
    # The product's names: auto and the baselines a user compares it with.
    assert list(STRATEGIES) == ["auto", "tpe", "optuna-gp", "random"]
    with pytest.raises(ValueError, match="elites must be >= 1, got 0"):
        GPStrategy(elites=0)
    with pytest.raises(ValueError, match="sampler must be one of"):
        make_strategy("gp-ei-margin")


def test_alignment_feature_is_the_power_of_two_dividing_each_value() -> None:
    space = SearchSpace(params=(
        Param("bx", (16, 32, 48, 64, 96)),       # not all powers of two: feature added
        Param("warps", (1, 2, 4, 8), power_of_two=True),  # powers of two: ordinal enough
        Param("flag", (0, 1)),                   # not all positive: no feature
        Param("fixed", (7,)),                    # one value: dropped
    ))
    index = SpaceIndex(space)
    plain = index.features()
    aligned = index.features(alignment=True)
    assert plain.shape == (len(index), 3)
    assert aligned.shape == (len(index), 4)
    np.testing.assert_array_equal(aligned[:, :3], plain)
    # Column-major, as they were first built: the GP's sums round in memory order.
    assert plain.flags.f_contiguous and aligned.flags.f_contiguous
    # 16 = 2^4, 32 = 2^5, 48 = 3 * 2^4, 64 = 2^6, 96 = 3 * 2^5: exponents 4 5 4 6 5 -> [0, 1]
    expected = {16: 0.0, 32: 0.5, 48: 0.0, 64: 1.0, 96: 0.5}
    for row in range(len(index)):
        assert aligned[row, 3] == expected[index.config(row)["bx"]]


def test_alignment_adds_nothing_when_every_value_has_the_same_alignment() -> None:
    index = SpaceIndex(SearchSpace(params=(Param("odd", (1, 3, 5, 7)), Param("b", (2, 4)))))
    assert index.features(alignment=True).shape == index.features().shape


def test_the_plane_is_the_columns_of_the_two_parameters_with_most_values() -> None:
    space = SearchSpace(params=(
        Param("flag", (0, 1)),
        Param("bx", (16, 32, 48, 64, 96)),       # 5 values, with an alignment column
        Param("tile", (1, 2, 3)),                 # 3 values, first of two equals
        Param("fixed", (7,)),                     # dropped from the features
        Param("stages", (2, 3, 4)),               # 3 values
    ))
    index = SpaceIndex(space)
    # Columns: flag 0, bx 1, tile 2, stages 3; alignment: bx 4, tile 5, stages 6.
    assert index.features(alignment=True).shape[1] == 7
    assert index.plane_columns() == [1, 2]
    assert index.plane_columns(alignment=True) == [1, 2, 4, 5]
    # Each plane column is a function of bx and tile alone; every other column is not.
    features = index.features(alignment=True)
    for column in range(features.shape[1]):
        seen: dict[tuple[int, int], set[float]] = {}
        for row in range(len(index)):
            config = index.config(row)
            seen.setdefault((config["bx"], config["tile"]), set()).add(features[row, column])
        on_plane = all(len(values) == 1 for values in seen.values())
        assert on_plane == (column in index.plane_columns(alignment=True)), column
    # With no more than two parameters of several values the plane is nearly all there
    # is: no term.
    two = SpaceIndex(SearchSpace(params=(Param("a", (1, 2, 3)), Param("b", (1, 2)),
                                         Param("c", (5,)))))
    assert two.plane_columns(alignment=True) == []


def test_a_kernel_term_must_name_columns_of_the_features() -> None:
    with pytest.raises(ValueError, match="among the 3 features"):
        GaussianProcess(3, terms=[[1, 3]])
    with pytest.raises(ValueError, match="among the 3 features"):
        GaussianProcess(3, terms=[[]])


@pytest.mark.parametrize("terms", [[], [[0, 2]], [[1], [0, 2]]])
def test_the_fit_gradient_matches_finite_differences(terms: list[list[int]]) -> None:
    rng = np.random.default_rng(3)
    x = rng.random((15, 3))
    y = np.sin(4 * x[:, 0]) * x[:, 2] + x[:, 1] + 0.05 * rng.standard_normal(15)
    y = (y - y.mean()) / y.std()
    gp = GaussianProcess(3, terms=terms)
    theta = gp.theta + rng.normal(0, 0.3, len(gp.theta))
    assert len(theta) == 3 + 2 + sum(len(t) + 1 for t in terms)
    diff2 = (x[:, None, :] - x[None, :, :]) ** 2
    parts = [(diff2[:, :, cols], ls, sf) for cols, ls, sf in gp._layout]
    _, grad = _gp._neg_log_posterior(theta, parts, y)
    step = 1e-6
    numeric = [
        (_gp._neg_log_posterior(theta + step * e, parts, y)[0]
         - _gp._neg_log_posterior(theta - step * e, parts, y)[0]) / (2 * step)
        for e in np.eye(len(theta))
    ]
    np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_a_plane_term_carries_a_block_size_trend_into_an_unseen_setting(seed: int) -> None:
    """Times: a smooth trend over a block-size plane, the same in every tile setting, an
    offset per setting and a rough part of each setting's own. Fitted on a quarter of
    five settings and a few configurations of the sixth, the model with a term over the
    plane predicts the trend in the sixth more closely than the one kernel over all."""
    rng = np.random.default_rng(seed)
    bx, by, tiles = 8, 8, 6
    a, b = np.meshgrid(np.arange(bx), np.arange(by), indexing="ij")
    trend = 0.15 * ((a - 2) ** 2 + (b - 5) ** 2)
    grid = np.array([(i, j, t) for i in range(bx) for j in range(by) for t in range(tiles)])
    own = 0.3 * rng.standard_normal((tiles, bx, by))
    y = (trend[grid[:, 0], grid[:, 1]] + rng.standard_normal(tiles)[grid[:, 2]]
         + own[grid[:, 2], grid[:, 0], grid[:, 1]])
    x = grid / np.array([bx - 1, by - 1, tiles - 1])
    last = grid[:, 2] == tiles - 1
    seen = rng.random(len(grid)) < np.where(last, 0.05, 0.25)
    unseen = last & ~seen
    fit = {}
    for terms in ([], [[0, 1]]):
        gp = GaussianProcess(3, terms=terms)
        gp.fit(x[seen], y[seen])
        mean, _ = gp.predict(x[unseen])
        fit[len(terms)] = np.corrcoef(mean, trend[grid[unseen, 0], grid[unseen, 1]])[0, 1]
    assert fit[1] > fit[0]


def test_posterior_draws_have_the_posterior_mean_and_spread() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((12, 2))
    y = np.sin(3 * x[:, 0]) + x[:, 1]
    gp = GaussianProcess(2)
    gp.fit(x, y)
    at = rng.random((6, 2))
    mean, sd = gp.predict(at)
    draws = np.stack([gp.sample(at, rng) for _ in range(4000)])
    # 4000 draws: the standard error of the mean is sd / 63; of the sd about sd / 89.
    np.testing.assert_allclose(draws.mean(0), mean, atol=float(5 * sd.max() / 63))
    np.testing.assert_allclose(draws.std(0), sd, rtol=0.1)
    # At an observed point the draw is pinned to the data (small noise).
    pinned = np.stack([gp.sample(x[:1], rng) for _ in range(200)])
    assert abs(pinned.mean() - y[0]) < 0.05 * (y.max() - y.min())


def test_the_fitted_noise_is_small_on_a_smooth_function_and_large_on_a_rough_one() -> None:
    rng = np.random.default_rng(1)
    x = rng.random((40, 2))
    smooth = GaussianProcess(2)
    smooth.fit(x, np.sin(3 * x[:, 0]) + x[:, 1])
    assert smooth.noise < TYPICAL_NOISE / 10
    # A smooth trend plus a jagged term the length scales cannot follow (as a block-size
    # plane where neighbouring sizes differ by a third): the fit explains it as noise.
    rough = GaussianProcess(2)
    rough.fit(x, x[:, 0] + 0.3 * rng.standard_normal(40))
    assert rough.noise > TYPICAL_NOISE


def test_the_gp_runs_its_linear_algebra_on_one_blas_thread() -> None:
    """Small solves only contend on threads (benchmarks/bench_proposal_cost.py): the GP
    limits every loaded BLAS to one thread while it works, and restores the caller's."""
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas_threads() -> set[int]:
        return {i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas"}

    seen: list[set[int]] = []

    class Watched(GaussianProcess):
        def _kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
            seen.append(blas_threads())
            return super()._kernel(a, b)

    rng = np.random.default_rng(0)
    x = rng.random((20, 3))
    gp = Watched(3)
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        assert blas_threads() == {2}
        gp.fit(x, x.sum(1))
        gp.predict(x[:4])
        gp.sample(x[:4], rng)
        assert blas_threads() == {2}
    assert len(seen) >= 4 and all(s == {1} for s in seen), seen


def _history(times: list[float]) -> History:
    return History(
        rows=np.arange(len(times)), times=np.array(times, dtype=float), pending=np.array([])
    )


def test_stall_alternates_global_proposals_until_the_best_improves() -> None:
    strategy = GPStrategy(stall=3)
    best_then_flat = [5.0, 1.0] + [2.0] * 8  # the best is evaluation 1
    escapes = [strategy._escaping(_history(best_then_flat[:n])) for n in range(2, 11)]
    # evaluations since the best: 0 1 2 3 4 5 6 7 8 -> escape at 3, 5, 7
    assert escapes == [False, False, False, True, False, True, False, True, False]
    assert not strategy._escaping(_history([*best_then_flat, 0.5]))  # improved
    assert not GPStrategy()._escaping(_history(best_then_flat))  # 8 since the best < 40
    nan = float("nan")  # failures after the best count as evaluations without improvement
    assert strategy._escaping(_history([2.0, nan, nan, nan]))


def _context(index: SpaceIndex, rows: list[int], times: list[float]) -> ProposalContext:
    """A proposal after evaluating ``rows`` (times; NaN: failed), nothing pending."""
    history = History(
        rows=np.array(rows), times=np.array(times, dtype=float), pending=np.array([])
    )
    available = np.ones(len(index), dtype=bool)
    available[rows] = False
    return ProposalContext(index, history, available, np.random.default_rng(0), None, None)


def _candidates(
    strategy: GPStrategy, index: SpaceIndex, rows: list[int], times: list[float]
) -> set[tuple[int, ...]]:
    """The configurations (as grid tuples) ``strategy`` would choose among next."""
    ctx = _context(index, rows, times)
    return {tuple(index.grid[r]) for r in strategy._candidates(ctx)}


def test_a_plane_term_models_the_two_parameters_with_most_values() -> None:
    index = SpaceIndex(SearchSpace(params=(
        Param("bx", (16, 32, 48, 64, 96)), Param("by", (1, 2, 4, 8), power_of_two=True),
        Param("tile", (1, 2, 3)), Param("flag", (0, 1)),
    )))
    strategy = GPStrategy(plane_from=0)
    rows = [0, 7, 30, 55, 90, 101]
    strategy.propose(_context(index, rows, [float(r % 7 + 1) for r in rows]))
    assert strategy._gp is not None
    # Columns: bx 0, by 1, tile 2, flag 3; alignment: bx 4, tile 5.
    assert [t.tolist() for t in strategy._gp.terms] == [[0, 1, 4]]
    assert len(strategy._gp.theta) == 6 + 2 + 4
    # plane_from: the model without the term until that many evaluations are in.
    late = GPStrategy(plane_from=8)
    late.propose(_context(index, rows, [float(r % 7 + 1) for r in rows]))
    assert late._gp is not None and late._gp.terms == []
    more = [*rows, 3, 77]
    late.propose(_context(index, more, [float(r % 7 + 1) for r in more]))
    assert [t.tolist() for t in late._gp.terms] == [[0, 1, 4]]
    with pytest.raises(ValueError, match="plane_from must be >= 0, got -1"):
        GPStrategy(plane_from=-1)


def _hamming(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return sum(x != y for x, y in zip(a, b, strict=True))


def test_candidates_move_from_the_trust_region_to_the_elites_lines_to_the_whole_space() -> None:
    index = SpaceIndex(SearchSpace(params=tuple(Param(n, (1, 2, 3, 4, 5)) for n in "abcd")))
    grid = [tuple(g) for g in index.grid]
    # Five distinct successes far apart (the best is row 0), a failure, then stalls.
    elites = [0, 156, 312, 468, 624]
    failed = 600
    strategy = GPStrategy(radius=2, global_until=0, lines_after=3, elites=4, stall=6)
    rows = [*elites, failed]
    times = [1.0, 2.0, 3.0, 4.0, 5.0, float("nan")]
    unseen = set(grid) - {grid[r] for r in rows}

    assert [grid[r] for r in elites] == [(v,) * 4 for v in range(5)]  # 4 apart each
    # 5 evaluations since the best: >= lines_after and < stall, so the lines through the
    # 4 best successes (the 5th success and the failure are no centres).
    lines = {g for g in unseen if any(_hamming(g, grid[e]) <= 1 for e in elites[:4])}
    assert len(lines) == 4 * 4 * 4
    assert _candidates(strategy, index, rows, times) == lines
    # Before lines_after (here: not yet), radius 2 around the best.
    strategy.lines_after = 100
    near_best = {g for g in unseen if _hamming(g, grid[0]) <= 2}
    assert _candidates(strategy, index, rows, times) == near_best
    # since = 6 = stall: an escape over the whole space; since = 7: back on the lines.
    strategy.lines_after = 3
    assert _candidates(strategy, index, [*rows, 7], [*times, 9.0]) == unseen - {grid[7]}
    assert _candidates(strategy, index, [*rows, 7, 8], [*times, 9.0, 9.0]) == (
        lines - {grid[7], grid[8]}
    )
    # An improvement resets the schedule: radius 2 around the new best (row 1).
    improved = _candidates(strategy, index, [*rows, 1], [*times, 0.5])
    assert improved == {g for g in unseen - {grid[1]} if _hamming(g, grid[1]) <= 2}
    # global_until: the whole space while fewer evaluations are in (here 7 of 8), then
    # the schedule as before.
    strategy.global_until = 8
    assert _candidates(strategy, index, [*rows, 1], [*times, 0.5]) == unseen - {grid[1]}
    assert _candidates(strategy, index, [*rows, 1, 2], [*times, 0.5, 9.0]) == {
        g for g in unseen - {grid[1], grid[2]} if _hamming(g, grid[1]) <= 2
    }


@pytest.mark.parametrize(
    ("rough_lines", "on_lines"),
    [(0.0, "sample"), (1.0, "predict")],  # the fitted noise is in (0, 1]
)
def test_rough_lines_take_a_thompson_draw_and_nothing_else_does(
    monkeypatch: pytest.MonkeyPatch, rough_lines: float, on_lines: str
) -> None:
    index = SpaceIndex(SearchSpace(params=tuple(Param(n, (1, 2, 3, 4, 5)) for n in "abcd")))
    grid = [tuple(g) for g in index.grid]
    calls = spy_gp_acquisitions(monkeypatch)  # which of the real GP's methods each proposal called
    strategy = GPStrategy(radius=2, global_until=0, lines_after=3, elites=4, stall=6,
                          rough_lines=rough_lines)
    rows = [0, 156, 312, 468, 624, 600]
    times = [1.0, 2.0, 3.0, 4.0, 5.0, float("nan")]

    def acquired(rows: list[int], times: list[float]) -> tuple[str, tuple[int, ...]]:
        calls.clear()
        row = strategy.propose(_context(index, rows, times))
        assert row is not None and len(calls) == 1
        return calls[0], grid[row]

    # 5 evaluations since the best: on the lines through the 4 best.
    used, proposed = acquired(rows, times)
    assert used == on_lines
    assert any(_hamming(proposed, grid[e]) <= 1 for e in rows[:4])
    # 6 since the best = stall: an escape over the whole space, by expected improvement.
    assert acquired([*rows, 7], [*times, 9.0])[0] == "predict"
    # 7: back on the lines.
    assert acquired([*rows, 7, 8], [*times, 9.0, 9.0])[0] == on_lines
    # An improvement: the trust region around the new best, by expected improvement.
    assert acquired([*rows, 1], [*times, 0.5])[0] == "predict"


def test_a_margin_measures_improvement_below_the_best_less_its_spreads_while_global() -> None:
    """Before ``global_until`` evaluations, expected improvement below the best log-time
    less ``margin`` standard deviations of the successful log-times (a failure enters
    the regression as the slowest success, not the spread); from then on, as without a
    margin, random generator for random generator."""
    import dataclasses

    from spectune.search._gp import expected_improvement

    index = SpaceIndex(SearchSpace(params=(Param("a", (1, 2, 3, 4, 5)), Param("b", (1, 2, 3)),
                                           Param("s", (0, 1)), Param("t", (0, 1)))))
    features = index.features(alignment=True)
    rows = [0, 37, 14, 51, 28, 5, 42, 59, 18, 33, 47]
    times = [9.0, 3.0, 7.0, 2.5, float("nan"), 4.0, 6.0, 5.0, 1.5, 2.0, 2.2]
    differs = 0
    for n in range(5, 12):
        ctx = _context(index, rows[:n], times[:n])
        picks, plain_picks = set(), set()
        for seed in range(40):
            seeded = dataclasses.replace(ctx, rng=np.random.default_rng(seed))
            picks.add(GPStrategy(global_until=10, margin=4.0).propose(seeded))
            seeded = dataclasses.replace(ctx, rng=np.random.default_rng(seed))
            plain_picks.add(GPStrategy(global_until=10, margin=0.0).propose(seeded))
        if n >= 10:
            assert picks == plain_picks
            continue
        y = np.log(times[:n])
        spread = float(np.nanstd(y))
        y = np.where(np.isnan(y), np.nanmax(y), y)
        gp = GaussianProcess(features.shape[1])
        gp.fit(features[rows[:n]], y)
        open_rows = np.setdiff1d(np.arange(len(index)), rows[:n])
        mean, sd = gp.predict(features[open_rows])
        ei = expected_improvement(mean, sd, float(y.min()) - 4.0 * spread)
        assert picks == set(open_rows[ei == ei.max()].tolist())
        differs += picks != plain_picks
    assert differs >= 2  # the margin changes what is proposed
    # The spread is the successes' alone: the imputed failure is not in it.
    history = _context(index, rows[:6], times[:6]).history
    logs = np.log(times[:6])
    imputed = np.where(np.isnan(logs), np.nanmax(logs), logs)
    target = GPStrategy(global_until=10, margin=4.0)._target(history, imputed)
    assert target == pytest.approx(np.nanmin(logs) - 4.0 * np.nanstd(logs))
    assert np.nanstd(logs) != pytest.approx(imputed.std())
    with pytest.raises(ValueError, match="margin must be >= 0, got -1"):
        GPStrategy(margin=-1.0)


@pytest.mark.parametrize("switch_turns", [0.0, 1.0])  # the fitted noise is in (0, 1]
def test_a_stalled_smooth_search_turns_to_other_switch_settings_every_third_proposal(
    monkeypatch: pytest.MonkeyPatch, switch_turns: float
) -> None:
    # Two sizes and two switches (two-valued parameters: four settings).
    space = SearchSpace(params=(Param("a", (1, 2, 3, 4, 5)), Param("b", (1, 2, 3, 4, 5)),
                                Param("s", (0, 1)), Param("t", (0, 1))))
    index = SpaceIndex(space)
    grid = [tuple(g) for g in index.grid]
    row = {g: r for r, g in enumerate(grid)}
    calls: list[str] = []
    real = GaussianProcess.sample

    def spy(self: GaussianProcess, *a: object) -> object:
        calls.append("sample")
        return real(self, *a)

    monkeypatch.setattr(GaussianProcess, "sample", spy)
    # Lines after 3 without improvement, escapes far off, every line proposal a draw.
    strategy = GPStrategy(radius=2, global_until=0, lines_after=3, elites=2, stall=50,
                          rough_lines=0.0, switch_turns=switch_turns)
    best = row[(2, 2, 0, 0)]
    rows = [row[(0, 0, 0, 0)], best, row[(4, 4, 0, 0)], row[(0, 4, 0, 0)], row[(4, 0, 0, 0)],
            row[(1, 3, 1, 1)], row[(3, 1, 0, 1)]]
    times = [3.0, 1.0, 3.5, 4.0, 4.5, 5.0, 5.5]  # 5 evaluations since the best

    def proposal(since: int) -> tuple[set[tuple[int, ...]], bool]:
        """The candidates after ``since`` evaluations without improvement, and whether
        the proposal was a draw."""
        extra = [row[(0, 1, 0, 0)], row[(0, 2, 0, 0)], row[(0, 3, 0, 0)]][: since - 5]
        ctx = _context(index, rows + extra, times + [6.0] * len(extra))
        calls.clear()
        assert strategy.propose(ctx) is not None
        return {grid[r] for r in strategy._candidates(ctx)}, calls == ["sample"]

    elsewhere = {g for g in grid if (g[2], g[3]) != (0, 0)}
    for since in (5, 6, 7, 8):
        candidates, drawn = proposal(since)
        turn = switch_turns == 1.0 and (since - 3) % SWITCH_TURN_EVERY == 0  # 6
        if turn:  # every configuration set otherwise, not yet seen; by expected improvement
            assert candidates == elsewhere - {grid[r] for r in rows} - {grid[row[(0, 1, 0, 0)]]}
            assert not drawn
        else:  # the lines through the two best, by a draw
            assert all(_hamming(g, grid[best]) <= 1 or _hamming(g, grid[rows[0]]) <= 1
                       for g in candidates)
            assert drawn
    # A space without switches has no turns.
    plain = SpaceIndex(SearchSpace(params=tuple(Param(n, (1, 2, 3, 4, 5)) for n in "abcd")))
    strategy = GPStrategy(radius=2, global_until=0, lines_after=3, elites=2, stall=50,
                          switch_turns=1.0)
    ctx = _context(plain, [0, 156, 312, 468, 624, 600], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert strategy.propose(ctx) is not None  # 5 since the best; 3 + 3 = 6 is no turn
    ctx = _context(plain, [0, 156, 312, 468, 624, 600, 7], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 6.0])
    strategy.propose(ctx)
    assert not strategy._switch_turn(ctx.history)
    assert all(_hamming(tuple(plain.grid[r]), tuple(plain.grid[0])) <= 1
               or _hamming(tuple(plain.grid[r]), tuple(plain.grid[156])) <= 1
               for r in strategy._candidates(ctx))


def _needle_space() -> tuple[SearchSpace, dict[str, int]]:
    """A rough 2-D plane where only power-of-two-aligned sizes are fast."""
    space = SearchSpace(params=(
        Param("bx", tuple(range(16, 257, 16))),
        Param("by", (1, 2, 3, 4, 6, 8)),
        Param("mode", (0, 1, 2)),
    ))
    return space, {"bx": 128, "by": 4, "mode": 1}


def _needle(config: Mapping[str, int]) -> Outcome:
    bx, by, mode = config["bx"], config["by"], config["mode"]
    aligned = (bx & -bx).bit_length()  # 5 for 16, 8 for 128, 9 for 256
    t = 10.0 - aligned + abs(by - 4) * 0.7 + (0 if mode == 1 else 1.5)
    t += 0.3 * ((bx * 7 + by * 13) % 5) / 5  # rough per-config term
    if bx == 256:
        t += 1.2  # the most aligned size is not the fastest
    return Outcome.ok(t)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_finds_an_aligned_optimum_of_a_rough_space(seed: int) -> None:
    space, optimum = _needle_space()
    index = SpaceIndex(space)
    best = min((index.config(r) for r in range(len(index))), key=lambda c: _needle(c).time)  # type: ignore[arg-type,return-value]
    assert best == optimum
    result = search(_needle, space=space, max_evals=40, sampler="auto", seed=seed)
    assert result.best_config == optimum


def test_past_its_limit_the_model_keeps_the_fastest_half_and_the_most_recent() -> None:
    y = np.array([5.0, 1.0, 4.0, 0.5, 3.0, 2.0, 6.0, 7.0])
    assert model_subset(y, 8).tolist() == list(range(8))  # at the limit: all
    # the two fastest (positions 3 and 1, however old) and the two latest of the rest
    assert model_subset(y, 4).tolist() == [1, 3, 6, 7]
    assert model_subset(y, 5).tolist() == [1, 3, 5, 6, 7]  # odd: the recent get one more
    ties = np.array([1.0, 1.0, 1.0, 2.0, 3.0])
    assert model_subset(ties, 2).tolist() == [0, 4]  # ties: the earlier counts as faster
    assert make_strategy("auto", seed=0).model_points == MODEL_POINTS
    with pytest.raises(ValueError, match="model_points must be >= 2, got 1"):
        GPStrategy(model_points=1)


@pytest.mark.parametrize("model_points", [1000, 24])  # 1000: all 60 observations
def test_the_gp_conditions_on_at_most_model_points_observations_and_then_scores_fewer_candidates(
    model_points: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    scored: list[int] = []

    class Recording(GaussianProcess):  # the real GP, recording how many it scores
        def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            scored.append(len(x))
            return super().predict(x)

    monkeypatch.setattr(_strategies, "GaussianProcess", Recording)
    monkeypatch.setattr(_strategies, "LATE_CANDIDATES", 10)
    space, _ = _needle_space()
    index = SpaceIndex(space)
    rows = list(np.random.default_rng(0).permutation(len(index))[:60])
    times = [_needle(index.config(r)).time for r in rows]  # type: ignore[arg-type]
    times[7] = float("nan")  # a failure: the slowest success, in the regression
    strategy = make_strategy("auto", seed=0)
    assert isinstance(strategy, GPStrategy)
    strategy.model_points = model_points
    ctx = _context(index, rows, times)
    region = len(strategy._candidates(ctx)) if model_points == 1000 else 0
    proposed = strategy.propose(ctx)
    assert proposed is not None and proposed not in rows
    y = np.log(np.array(times))
    y = np.where(np.isnan(y), np.nanmax(y), y)
    keep = model_subset(y, model_points)
    assert len(keep) == (60 if model_points == 1000 else 24)
    assert int(np.argmin(y)) in keep
    features = index.features(alignment=True)
    assert strategy._gp is not None and strategy._gp._x is not None
    np.testing.assert_array_equal(strategy._gp._x, features[np.array(rows)[keep]])
    # past the limit a proposal scores LATE_CANDIDATES of its region; within it, all
    assert scored == ([region] if model_points == 1000 else [10])
    assert model_points != 1000 or region > 10


def test_failures_next_to_the_fastest_configurations_make_them_look_slow() -> None:
    # One parameter, 20 values; faster towards x = 10, where a resource limit starts:
    # x >= 11 fails (as large tiles run out of registers). Evaluated: 0, 3, 6, 9 and
    # three failures past the limit.
    index = SpaceIndex(SearchSpace(params=(Param("x", tuple(range(20))),)))
    rows = [0, 3, 6, 9, 11, 13, 16]
    times = [16.0, 8.0, 4.0, 2.0, float("nan"), float("nan"), float("nan")]
    strategy = GPStrategy()
    strategy.propose(_context(index, rows, times))
    assert strategy._gp is not None and strategy._gp._x is not None
    mean, _ = strategy._gp.predict(index.features(alignment=True))
    # Failures enter as the slowest success: x = 10 is predicted slower than x = 9, by
    # more than 0.3 in log-time.
    assert len(strategy._gp._x) == 7
    assert mean[10] > np.log(2.0) + 0.3


# --------------------------------------------------------------------------------------
# Wrapped Optuna samplers
# --------------------------------------------------------------------------------------


class _Recording(optuna.samplers.RandomSampler):
    """Optuna's random sampler, recording the distributions and trials it is shown."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed=seed)
        self.shown: list[dict[str, optuna.distributions.BaseDistribution]] = []
        self.finished: list[int] = []

    def sample_independent(self, study, trial, name, dist):  # type: ignore[no-untyped-def]
        if not self.shown or name in self.shown[-1]:
            self.shown.append({})
            states = [t.state for t in study.get_trials(deepcopy=False)]
            self.finished.append(sum(s.is_finished() for s in states))
        self.shown[-1][name] = dist
        return super().sample_independent(study, trial, name, dist)


def _ordered_space() -> SearchSpace:
    return SearchSpace(params=(
        Param("BLOCK", (256, 512, 1024, 2048, 4096), power_of_two=True),
        Param("STAGES", (1, 2, 3)),
        Param("ONE", (7,)),
    ))


def test_a_wrapped_sampler_sees_ordered_positions_not_categories() -> None:
    from spectune.search._strategies import OptunaStrategy

    recording = _Recording(seed=0)
    strategy = OptunaStrategy(recording, name="recording")
    space = _ordered_space()
    engine_result = search(lambda c: Outcome.ok(float(c["BLOCK"] + c["STAGES"])), space=space,
                           sampler=strategy, max_evals=6)
    assert len(engine_result.history) == 6
    for shown in recording.shown:
        # Single-valued parameters are not asked; the others are ordinal integers.
        assert set(shown) == {"BLOCK", "STAGES"}
        assert shown["BLOCK"] == optuna.distributions.IntDistribution(0, 4)
        assert shown["STAGES"] == optuna.distributions.IntDistribution(0, 2)
    # Its study holds the charged evaluations made before each proposal (a proposal
    # that lands on a seen config is asked again, on the same history).
    assert recording.finished == sorted(recording.finished)
    assert recording.finished[0] == 0 and recording.finished[-1] == 5


def test_tpe_runs_on_ordered_positions_and_stays_reproducible() -> None:
    space = _ordered_space()

    def objective(config: Mapping[str, int]) -> Outcome:
        return Outcome.ok(abs(np.log2(config["BLOCK"]) - 10.0) + abs(config["STAGES"] - 2) + 1)

    runs = [search(objective, space=space, sampler="tpe", seed=3, max_evals=12)
            for _ in range(2)]
    configs = [[r.config for r in run.history] for run in runs]
    assert configs[0] == configs[1]
    assert all(space.is_valid(c) for c in configs[0])
    assert len({tuple(sorted(c.items())) for c in configs[0]}) == 12  # never repeated


def test_space_sampler_draws_foreign_parameters_reproducibly() -> None:
    """A parameter that is not the index's is drawn by one seeded random sampler (not a
    fresh unseeded one per call)."""
    from spectune.search._sampler import SpaceSampler
    from spectune.search._strategies import RandomStrategy

    index = SpaceIndex(_ordered_space())
    foreign = optuna.distributions.FloatDistribution(0.0, 1.0)

    def draws(seed: int) -> list[float]:
        sampler = SpaceSampler(index, RandomStrategy(), seed=seed)
        study = optuna.create_study(sampler=sampler)
        return [study.ask({"extra": foreign}).params["extra"] for _ in range(5)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)
