"""The strategies the engine searches with, by name.

* ``auto``: a Gaussian process on the log-times (failures enter as the slowest success),
  over the ordinal encoding plus each integer parameter's power-of-two alignment, its
  kernel a Matérn over all of them plus, from the tenth evaluation on, one over the two
  parameters with the most values (the block sizes, mostly: a trend there is carried
  across the other parameters' settings); after 5 random configurations, each proposal
  is the configuration of highest expected improvement, over the whole space until 10
  evaluations are in (measured there below the best log-time less 6 standard
  deviations of the log-times so far, so those first proposals go where the model is
  unsure rather than where it predicts a little better than a few random
  configurations), then among those that differ from the best one in at most two
  parameters (a Hamming trust region). After 16 evaluations without improvement the
  candidates become the lines through the 5 best configurations evaluated (each with
  one parameter changed), and after 40 every other proposal is taken over the whole
  space instead, until the best improves. On the lines, when the fitted noise exceeds
  what the fit expects (the space is rough where the model looks), the proposal is a
  Thompson draw instead of expected improvement; when it fits smoothly (the basin is
  exhausted), every third proposal is taken among the configurations whose switches
  (two-valued parameters) are set otherwise than the best's. Past 256 observations the
  GP conditions on the fastest 128 and the most recent of the rest, and each proposal
  scores at most 2048 candidates (a uniform sample of its region), so a proposal's cost
  stops growing with the study. Chosen by leave-one-out over twelve recorded and
  generated spaces (docs/replay.md).
* ``tpe``: Optuna's multivariate TPE (constant liar, 10 random start-up trials), a
  baseline.
* ``optuna-gp``: Optuna's ``GPSampler``, a baseline (slow: it refits per proposal).
* ``random``: uniform over the configurations not yet seen.

Both Optuna samplers work on the ordered positions of the values
(:class:`OptunaStrategy`). A strategy of your own is a
:class:`~spectune.search.Strategy`; ``Search(sampler=...)`` and
``replay(sampler=...)`` take it (or a factory of it) beside these names.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, IntDistribution
from optuna.study import StudyDirection
from optuna.trial import TrialState

from spectune.search._gp import TYPICAL_NOISE, GaussianProcess, expected_improvement
from spectune.search._space_index import SpaceIndex
from spectune.search._strategy import History, ProposalContext, Strategy

__all__ = [
    "LATE_CANDIDATES",
    "MODEL_POINTS",
    "STRATEGIES",
    "SWITCH_TURN_EVERY",
    "THOMPSON_CANDIDATES",
    "GPStrategy",
    "OptunaStrategy",
    "RandomStrategy",
    "make_strategy",
    "model_subset",
]


#: Most candidates one Thompson draw covers (the draw is cubic in their number).
THOMPSON_CANDIDATES = 1000

#: Most observations the GP conditions on (its fit is cubic in their number, its
#: prediction quadratic): past it, the fastest half and the most recent of the rest.
MODEL_POINTS = 256

#: Most candidates a proposal scores once the GP is at its ``MODEL_POINTS`` limit: a
#: uniform sample of them past it (a prediction costs observations x candidates; on a
#: space of 11130 configurations, whose escapes score them all, predictions were three
#: quarters of a proposal's time at 600 evaluations with the observation limit alone).
LATE_CANDIDATES = 2048

#: Every how many proposals a stalled, smooth search turns to other switch settings
#: (``GPStrategy(switch_turns=...)``).
SWITCH_TURN_EVERY = 3


class RandomStrategy(Strategy):
    """Uniform over the available configurations."""

    name = "random"

    def propose(self, ctx: ProposalContext) -> int | None:
        return int(ctx.rng.choice(np.flatnonzero(ctx.available)))


class GPStrategy(Strategy):
    """``auto``: a GP on log-times picks the next configuration, in phases.

    The defaults are ``auto``'s; the arguments exist so tests can reach each phase in a
    few evaluations.

    The model's features are the ordinal encoding plus each integer parameter's
    power-of-two alignment (:meth:`SpaceIndex.features`); failed configurations (compile
    errors, out of resources, wrong results) enter the regression as successes as slow
    as the slowest one, so the model ranks the neighbours of a failing region poor (the
    fastest configurations often lie right next to a resource limit).

    Args:
        n_init: Random configurations evaluated before the model is used (warm-start
            configurations count towards them).
        radius: Trust region: only configurations differing from the best one in at
            most ``radius`` parameters are candidates. When the region holds no
            available configuration, the whole space is used.
        global_until: While fewer than this many evaluations are in, the candidates
            are the whole space, not the trust region (a best among a handful of
            random configurations says little about where the optimum lies).
        margin: While fewer than ``global_until`` evaluations are in, expected
            improvement is measured below the best log-time less ``margin`` standard
            deviations of the successful log-times so far (0: below the best). A model
            of a handful of random configurations is confident about averages it has
            barely seen; demanding an improvement on the scale of the spread it has seen
            makes its first proposals favour what it is unsure of over what it predicts
            a little better than the best so far. In the spread's own units, so the same
            on every space.
        stall: After this many evaluations without improvement, every other proposal
            is taken from the whole space (escape from a poor region) until the best
            improves.
        lines_after: After this many evaluations without improvement (and until the
            best improves), the candidates are the configurations that differ in at
            most one parameter from any of the ``elites`` best evaluated ones, instead
            of the trust region around the best alone. A best in a local basin keeps the
            trust region from reaching a better basin several parameters away; the
            runners-up often lie on the way to it.
        elites: How many of the best evaluated configurations the lines go through.
        rough_lines: On the lines, a Thompson draw (the minimum of one joint posterior
            draw over at most :data:`THOMPSON_CANDIDATES` candidates) instead of
            expected improvement whenever the fitted noise variance
            (:attr:`GaussianProcess.noise`, a share of the log-times' variance) exceeds
            this. Timings repeat to a few percent, so a large fitted noise means the
            model is taking a rough region for noise, and there its ranking of the lines
            (which expected improvement follows) is the least to be trusted: an
            isolated optimum one parameter from an elite is ranked as the rough
            region's average. A draw spreads the proposals over what the model cannot
            tell apart.
        switch_turns: After ``lines_after`` evaluations without improvement, every
            :data:`SWITCH_TURN_EVERY`-th proposal that is no escape, while the fitted
            noise variance is at most this, is taken among the configurations whose
            switches (the two-valued parameters, such as shared memory or read-only
            loads) are set otherwise than the best's (never in a space without
            switches). A stalled search that the model fits smoothly has exhausted its
            basin, and a basin is often one setting of the switches: the lines change
            one parameter at a time, and the first configurations tried with another
            setting are slower than the best, so a search that found its first good
            configurations with one setting rarely leaves it.
        plane_from: From this many evaluations on, the kernel has a second Matérn term
            over the two parameters with the most values
            (:meth:`SpaceIndex.plane_columns`; :class:`GaussianProcess` ``terms``),
            usually the block sizes; before them the model is the one kernel over all
            features (with a handful of random configurations a second kernel has too
            little to fit). What a block shape does often holds across the tiles and
            switches, but the one kernel, its length scales short where the space is
            rough, takes a shape's time in one setting to say little about another; the
            term carries that trend across settings. No term where the space has at
            most two parameters of several values.
        model_points: Most observations the model conditions on (see
            :func:`model_subset`); past it, a proposal also scores at most
            :data:`LATE_CANDIDATES` candidates, a uniform sample of its region, so its
            cost stops growing with the study.

    Raises:
        ValueError: naming the argument, for ``elites`` below 1, a negative ``margin``
            or ``plane_from``, or ``model_points`` below 2.

    The model is conditioned on all data at every proposal, up to ``model_points``
    observations; its hyperparameters are refitted at every proposal up to 50
    observations, then every ``n // 25`` (the fit is most of the cost and changes little
    from one observation to the next).
    """

    name = "auto"

    def __init__(
        self,
        *,
        n_init: int = 5,
        radius: int = 2,
        global_until: int = 10,
        margin: float = 6.0,
        stall: int = 40,
        lines_after: int = 16,
        elites: int = 5,
        rough_lines: float = TYPICAL_NOISE,
        switch_turns: float = TYPICAL_NOISE,
        plane_from: int = 10,
        model_points: int = MODEL_POINTS,
    ) -> None:
        if elites < 1:
            raise ValueError(f"elites must be >= 1, got {elites}")
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        if plane_from < 0:
            raise ValueError(f"plane_from must be >= 0, got {plane_from}")
        if model_points < 2:
            raise ValueError(f"model_points must be >= 2, got {model_points}")
        self.n_init = n_init
        self.radius = radius
        self.global_until = global_until
        self.margin = margin
        self.stall = stall
        self.lines_after = lines_after
        self.elites = elites
        self.rough_lines = rough_lines
        self.switch_turns = switch_turns
        self.plane_from = plane_from
        self.model_points = model_points
        self._gp: GaussianProcess | None = None
        # The model without the plane's term and, where the space has a plane, the one
        # with it.
        self._models: tuple[GaussianProcess, GaussianProcess | None] | None = None
        self._features: np.ndarray | None = None
        self._settings: np.ndarray | None = None  # per row, its switches' setting
        self._fitted_at = 0

    def propose(self, ctx: ProposalContext) -> int | None:
        h = ctx.history
        if len(h.rows) < self.n_init or not h.ok.any():
            return None  # random
        if self._models is None:
            self._features = ctx.index.features(alignment=True)
            dims = self._features.shape[1]
            plane = ctx.index.plane_columns(alignment=True)
            self._models = (GaussianProcess(dims),
                            GaussianProcess(dims, terms=[plane]) if plane else None)
            self._settings = _switch_settings(ctx.index)
        plain, planed = self._models
        self._gp = planed if planed is not None and len(h.rows) >= self.plane_from else plain
        feats = self._features
        assert feats is not None
        rows, y = self._observations(h)
        n = len(y)
        refit = n <= 50 or n - self._fitted_at >= n // 25 or n < self._fitted_at
        if refit:
            self._fitted_at = n
        keep = model_subset(y, self.model_points)
        self._gp.fit(feats[rows[keep]], y[keep], optimize=refit)

        candidates = self._candidates(ctx)
        if len(keep) < n and len(candidates) > LATE_CANDIDATES:
            candidates = ctx.rng.choice(candidates, LATE_CANDIDATES, replace=False)
        if self._rough_lines(h):
            if len(candidates) > THOMPSON_CANDIDATES:
                candidates = ctx.rng.choice(candidates, THOMPSON_CANDIDATES, replace=False)
            draw = self._gp.sample(feats[candidates], ctx.rng)
            return int(candidates[int(np.argmin(draw))])
        mean, sd = self._gp.predict(feats[candidates])
        ei = expected_improvement(mean, sd, self._target(h, y))
        top = np.flatnonzero(ei == ei.max())
        return int(candidates[top[int(ctx.rng.integers(len(top)))]])

    def _observations(self, history: History) -> tuple[np.ndarray, np.ndarray]:
        """The rows the model regresses on and their log-times, failures as the slowest
        success."""
        y = np.log(history.times)
        return history.rows, np.where(np.isnan(y), np.nanmax(y), y)

    def _target(self, history: History, y: np.ndarray) -> float:
        """The log-time expected improvement is measured below: the best one so far
        (``y``: the regression targets), less the ``margin`` while it applies."""
        best = float(np.min(y))
        if not self.margin or len(history.rows) >= self.global_until:
            return best
        return best - self.margin * self._spread(history)

    @staticmethod
    def _spread(history: History) -> float:
        """The standard deviation of the successful log-times (0 with fewer than two):
        the unit of ``margin``. Failures are left out, imputed or not."""
        ok = np.log(history.times[history.ok])
        return float(ok.std()) if len(ok) > 1 else 0.0

    def _candidates(self, ctx: ProposalContext) -> np.ndarray:
        """The available rows this proposal chooses among (the region of its phase).

        The whole space when the region holds no available configuration.
        """
        h = ctx.history
        candidates = np.flatnonzero(ctx.available)
        if len(h.rows) < self.global_until or self._escaping(h):
            return candidates
        if self._switch_turn(h):
            assert self._settings is not None
            setting = self._settings
            other = candidates[setting[candidates] != setting[h.best_row()]]
            return other if len(other) else candidates
        if self._on_lines(h):
            grid = ctx.index.grid[candidates]
            centres = ctx.index.grid[h.fastest_rows(self.elites)]
            near = ((grid[:, None, :] != centres[None, :, :]).sum(axis=2) <= 1).any(axis=1)
            region = candidates[near]
        else:
            region = self._trust_region(ctx, candidates)
        return region if len(region) else candidates

    def _trust_region(self, ctx: ProposalContext, candidates: np.ndarray) -> np.ndarray:
        """The ``candidates`` within ``radius`` changed parameters of the best
        configuration (possibly none)."""
        grid = ctx.index.grid[candidates]
        near = (grid != ctx.index.grid[ctx.history.best_row()]).sum(axis=1) <= self.radius
        return candidates[near]

    def _since_best(self, history: History) -> int:
        """Evaluations since the best one."""
        return len(history.times) - 1 - int(np.nanargmin(history.times))

    def _on_lines(self, history: History) -> bool:
        """Whether this proposal searches the elites' lines (see ``lines_after``)."""
        return self._since_best(history) >= self.lines_after

    def _rough_lines(self, history: History) -> bool:
        """Whether this proposal is a Thompson draw on rough lines (see ``rough_lines``)."""
        assert self._gp is not None
        return (
            self._on_lines(history)
            and not self._escaping(history)
            and not self._switch_turn(history)
            and self._gp.noise > self.rough_lines
        )

    def _switch_turn(self, history: History) -> bool:
        """Whether this proposal leaves the best's switch setting (see ``switch_turns``)."""
        if self._gp is None or self._settings is None:  # before the first model
            return False
        since = self._since_best(history)
        return (
            since >= self.lines_after
            and (since - self.lines_after) % SWITCH_TURN_EVERY == 0
            and not self._escaping(history)
            and self._gp.noise <= self.switch_turns
        )

    def _escaping(self, history: History) -> bool:
        """Whether this proposal leaves the trust region (see ``stall``)."""
        since = self._since_best(history)
        return since >= self.stall and (since - self.stall) % 2 == 0


def model_subset(y: np.ndarray, limit: int) -> np.ndarray:
    """Which of the observations ``y`` (in trial order) the GP conditions on.

    All of them up to ``limit``; past it, the ``limit // 2`` fastest
    and, of the rest, the most recent: what the search is near now, and the region it
    has already left summarised by its best points, so the model's cost stops growing
    with the study while the configurations that decide the next proposal stay in it.
    Positions into ``y``, ascending.
    """
    n = len(y)
    if n <= limit:
        return np.arange(n)
    fastest = np.argsort(y, kind="stable")[: limit // 2]
    rest = np.setdiff1d(np.arange(n), fastest)  # ascending: trial order
    return np.sort(np.r_[fastest, rest[len(rest) - (limit - len(fastest)):]])


def _switch_columns(index: SpaceIndex) -> list[int]:
    """The columns of the switches: the two-valued parameters."""
    return [j for j, v in enumerate(index.values) if len(v) == 2]


def _switch_settings(index: SpaceIndex) -> np.ndarray | None:
    """Per row, a code of its switches' values (two-valued parameters; the same code, the
    same setting); ``None`` in a space without switches."""
    switches = _switch_columns(index)
    if not switches:
        return None
    _, codes = np.unique(index.grid[:, switches], axis=0, return_inverse=True)
    return codes.reshape(-1)


class OptunaStrategy(Strategy):
    """Proposals of an Optuna sampler, kept inside the space and unseen.

    The sampler works in a study of its own, rebuilt from the history at each proposal,
    in which every parameter is the position of its value in the parameter's ordered
    value list (an ``IntDistribution``): tile sizes, splits and warps are ordered
    quantities, and a sampler that models ordered integers (TPE's Parzen estimators, a
    GP's kernels) then sees that 2048 lies between 1024 and 4096, which a categorical
    would hide; power-of-two lists become evenly spaced, on a log scale. Charged
    evaluations are its finished trials (failed and invalid ones as FAIL); rows other
    workers are evaluating are its running ones.

    A proposal outside the space or already seen is resampled up to ``tries`` times,
    then repaired: the available configuration nearest to it (fewest differing
    parameters, then smallest ordinal distance) is used.

    Args:
        sampler: The Optuna sampler.
        tries: Proposals asked of ``sampler`` per trial before repairing.
        name: Strategy name for reports.
    """

    def __init__(self, sampler: optuna.samplers.BaseSampler, *, tries: int = 5, name: str) -> None:
        self.sampler = sampler
        self.tries = tries
        self.name = name

    def propose(self, ctx: ProposalContext) -> int | None:
        index = ctx.index
        columns = [j for j, card in enumerate(index.cards) if card > 1]
        dists: dict[str, BaseDistribution] = {
            index.names[j]: IntDistribution(0, int(index.cards[j]) - 1) for j in columns
        }
        shadow = self._shadow(ctx, columns, dists)
        wanted: dict[str, int] = {}
        for _ in range(self.tries):
            positions = shadow.ask(dists).params
            # Clamped: a sampler may answer outside the distribution it was given.
            grid_row = [
                min(max(int(positions[index.names[j]]), 0), int(index.cards[j]) - 1)
                if j in columns else 0
                for j in range(len(index.names))
            ]
            wanted = {
                n: int(vals[i])
                for n, vals, i in zip(index.names, index.values, grid_row, strict=True)
            }
            row = index.row(wanted)
            if row is not None and ctx.available[row]:
                return row
        return _nearest(ctx, wanted)

    def _shadow(
        self, ctx: ProposalContext, columns: list[int], dists: dict[str, BaseDistribution]
    ) -> optuna.Study:
        """The sampler's study: the history, in ordinal positions."""
        index, history = ctx.index, ctx.history
        names = [index.names[j] for j in columns]
        # Built by hand, not by optuna.create_study: that logs a line per study.
        storage = optuna.storages.InMemoryStorage()
        name = storage.get_study_name_from_id(
            storage.create_new_study([StudyDirection.MINIMIZE], study_name=f"{self.name}-shadow")
        )
        shadow = optuna.Study(study_name=name, storage=storage, sampler=self.sampler)
        trials = []
        for row, time in zip(history.rows.tolist(), history.times.tolist(), strict=True):
            params = dict(zip(names, index.grid[row, columns].tolist(), strict=True))
            finished = not np.isnan(time)
            trials.append(optuna.trial.create_trial(
                params=params, distributions=dists,
                value=time if finished else None,
                state=TrialState.COMPLETE if finished else TrialState.FAIL,
            ))
        for row in history.pending.tolist():
            params = dict(zip(names, index.grid[row, columns].tolist(), strict=True))
            trials.append(optuna.trial.create_trial(params=params, distributions=dists,
                                                    state=TrialState.RUNNING))
        shadow.add_trials(trials)
        return shadow


def _nearest(ctx: ProposalContext, wanted: dict[str, int]) -> int:
    index = ctx.index
    target = np.array(
        [
            min(range(len(vals)), key=lambda i, v=wanted[n], vs=vals: abs(vs[i] - v))
            for n, vals in zip(index.names, index.values, strict=True)
        ]
    )
    candidates = np.flatnonzero(ctx.available)
    grid = index.grid[candidates]
    span = np.maximum(index.cards - 1, 1)
    hamming = (grid != target).sum(axis=1)
    ordinal = (np.abs(grid - target) / span).sum(axis=1)
    score = hamming + ordinal / (len(index.names) + 1)
    top = np.flatnonzero(score == score.min())
    return int(candidates[top[int(ctx.rng.integers(len(top)))]])


def _tpe(seed: int | None) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(
        multivariate=True,
        constant_liar=True,
        n_startup_trials=10,
        seed=seed,
    )


#: Strategy factories by name; each takes the seed.
STRATEGIES: dict[str, Callable[[int | None], Strategy]] = {
    "auto": lambda seed: GPStrategy(),
    "tpe": lambda seed: OptunaStrategy(_tpe(seed), name="tpe"),
    # Optuna's own GP (a baseline), on the ordered positions.
    "optuna-gp": lambda seed: OptunaStrategy(optuna.samplers.GPSampler(seed=seed),
                                             name="optuna-gp"),
    "random": lambda seed: RandomStrategy(),
}


def make_strategy(name: str, *, seed: int | None = None) -> Strategy:
    """The strategy called ``name`` (one of :data:`STRATEGIES`).

    Raises:
        ValueError: naming ``name`` when it is unknown.
    """
    if name not in STRATEGIES:
        raise ValueError(f"sampler must be one of {sorted(STRATEGIES)}, got {name!r}")
    return STRATEGIES[name](seed)
