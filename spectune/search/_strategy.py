"""The strategy interface: what a strategy sees of a study, and what it must answer.

A :class:`Strategy` picks the next configuration to evaluate as a row of the
:class:`~spectune.search.SpaceIndex`, given a :class:`ProposalContext`: the enumerated
space, the study's :class:`History` (evaluated and pending rows) and the mask
of rows still available. The engine's sampler (:mod:`spectune.search._sampler`) builds
the context; the registered strategies live in :mod:`spectune.search._strategies`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from spectune.search._space_index import SpaceIndex

__all__ = ["History", "ProposalContext", "Strategy"]


@dataclass(frozen=True)
class History:
    """What a strategy knows of the study.

    Attributes:
        rows: Index rows of the charged evaluations, in trial order.
        times: Their times; NaN for failed and invalid ones.
        pending: Rows being evaluated by other workers.
    """

    rows: np.ndarray
    times: np.ndarray
    pending: np.ndarray

    @property
    def ok(self) -> np.ndarray:
        return ~np.isnan(self.times)

    def best_row(self) -> int | None:
        """Row of the best time so far, ``None`` before any success."""
        if not self.ok.any():
            return None
        return int(self.rows[int(np.nanargmin(self.times))])

    def fastest_rows(self, count: int) -> np.ndarray:
        """Rows of the ``count`` fastest successes (fewer if fewer succeeded), fastest
        first, ties in trial order."""
        order = np.argsort(np.where(self.ok, self.times, np.inf), kind="stable")
        return self.rows[order[: min(count, int(self.ok.sum()))]]


@dataclass(frozen=True)
class ProposalContext:
    """Everything a strategy may use to pick the next row.

    Attributes:
        index: The enumerated space.
        history: Evaluated and pending rows.
        available: Mask over index rows: neither evaluated nor pending.
        rng: The sampler's random generator.
        study: The Optuna study (for strategies wrapping an Optuna sampler).
        trial: The trial being sampled.
    """

    index: SpaceIndex
    history: History
    available: np.ndarray
    rng: np.random.Generator
    study: optuna.Study
    trial: FrozenTrial


class Strategy:
    """Picks the next row to evaluate. Subclasses override :meth:`propose`."""

    name = "strategy"

    def propose(self, ctx: ProposalContext) -> int | None:
        """An available row, or ``None`` to let the sampler pick one at random."""
        raise NotImplementedError

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Called by Optuna before each trial."""

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        """Called by Optuna after each trial."""
