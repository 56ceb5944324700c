"""The Optuna sampler of the engine: it only ever proposes valid, unseen configurations.

:class:`SpaceSampler` is an Optuna sampler over a :class:`SpaceIndex`. It reads the
study, hands a strategy the evaluated rows (and those running in other workers), and
turns the row the strategy picks into the trial's parameters. A strategy can wrap any
Optuna sampler (its proposals outside the space, or already seen, are resampled and
then repaired to the nearest available row), or pick rows itself.

When nothing is left to propose the sampler marks the trial ``spectune.exhausted`` and
the engine stops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from spectune.search._recording import charged_status, config_of
from spectune.search._space_index import SpaceIndex
from spectune.search._strategy import History, ProposalContext, Strategy

__all__ = ["EXHAUSTED_KEY", "SpaceSampler", "history_of", "read_history"]

EXHAUSTED_KEY = "spectune.exhausted"


class SpaceSampler(optuna.samplers.BaseSampler):
    """An Optuna sampler that proposes only available rows of ``index``.

    Args:
        index: The enumerated space.
        strategy: What picks the rows.
        seed: Seed of the random generator.
    """

    def __init__(self, index: SpaceIndex, strategy: Strategy, *, seed: int | None = None) -> None:
        self.index = index
        self.strategy = strategy
        self.rng = np.random.default_rng(seed)
        # One random sampler, seeded once: a parameter that is not one of the index's
        # (another sampler's) is drawn reproducibly.
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._space = {n: d for n, d in index.distributions.items() if not d.single()}

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self._space)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        history = read_history(study, self.index, exclude=trial.number)
        config, exhausted = self.pick(study, trial, history)
        if exhausted:
            study._storage.set_trial_system_attr(trial._trial_id, EXHAUSTED_KEY, True)
        return {n: config[n] for n in search_space}

    def pick(
        self, study: optuna.Study, trial: FrozenTrial, history: History
    ) -> tuple[dict[str, int], bool]:
        """The strategy's next config given ``history``, and whether nothing was left
        (then the config is one already seen: the study's best, or its first)."""
        available = np.ones(len(self.index), dtype=bool)
        available[history.rows] = False
        available[history.pending] = False
        if not available.any():
            row = history.best_row()
            row = int(history.rows[0]) if row is None and len(history.rows) else row
            return self.index.config(0 if row is None else row), True
        ctx = ProposalContext(self.index, history, available, self.rng, study, trial)
        row = self.strategy.propose(ctx)
        if row is None or not available[row]:
            row = int(self.rng.choice(np.flatnonzero(available)))
        return self.index.config(row), False

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        choices = getattr(param_distribution, "choices", None)
        if choices is None:  # not one of ours; let Optuna's random sampler answer
            return self._random.sample_independent(study, trial, param_name,
                                                   param_distribution)
        return choices[int(self.rng.integers(len(choices)))]

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.strategy.before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self.strategy.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.rng = np.random.default_rng()
        self._random.reseed_rng()


def read_history(study: optuna.Study, index: SpaceIndex, *, exclude: int = -1) -> History:
    """Charged evaluations and pending rows of ``study`` (trial ``exclude`` left out)."""
    return history_of(study.get_trials(deepcopy=False), index, exclude=exclude)


def history_of(trials: Sequence[FrozenTrial], index: SpaceIndex, *, exclude: int = -1) -> History:
    """Charged evaluations and pending rows among ``trials`` (trial ``exclude`` left out)."""
    rows: list[int] = []
    times: list[float] = []
    pending: list[int] = []
    for t in trials:
        if t.number == exclude:
            continue
        if t.state == TrialState.RUNNING:
            row = index.row(t.params) if len(t.params) == len(index.names) else None
            if row is not None:
                pending.append(row)
            continue
        status = charged_status(t)
        if status is None:
            continue
        row = index.row(config_of(t))
        if row is None:
            continue
        rows.append(row)
        times.append(float(t.value) if status == "ok" and t.value is not None else np.nan)
    return History(
        rows=np.array(rows, dtype=np.int64),
        times=np.array(times, dtype=float),
        pending=np.array(pending, dtype=np.int64),
    )
