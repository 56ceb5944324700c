"""The strategy interface: what a strategy sees of a study, and what it must answer.

A :class:`Strategy` picks the next configuration to evaluate as a row of the
:class:`~spectune.search.SpaceIndex`, given a :class:`ProposalContext`: the enumerated
space, the study's :class:`History` (evaluated and pending rows) and the mask
of rows still available. The engine builds the context at each proposal; the named
strategies (:data:`~spectune.search.STRATEGIES`) are built on the same interface.
All three classes are public (``from spectune.search import Strategy, ...``): a
strategy of your own plugs into the engine and into replay without touching the package.
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

    Read from the study at every proposal, so it holds the evaluations of every worker
    and of earlier sessions of a resumed study, warm-start and prior configurations
    included.

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
        """Mask over :attr:`rows`: the successful evaluations."""
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
    """Picks the next configuration to evaluate; subclass it to write a strategy.

    Override :meth:`propose` (and, if the strategy keeps state in step with Optuna's
    trials, :meth:`before_trial` and :meth:`after_trial`) and set :attr:`name`. The
    engine calls :meth:`propose` once per trial with a fresh :class:`ProposalContext`;
    everything a proposal needs is in it, so a strategy that reads only the context
    agrees with itself across resumed studies and between workers. Draw random numbers
    from ``ctx.rng`` (seeded by the engine), so a seed reproduces a run.

    A strategy plugs in wherever a strategy name does: ``Search(sampler=strategy)``,
    ``search(..., sampler=strategy)``, and in replay as a picklable factory taking the
    seed, ``replay(FILE, sampler=factory)`` (``functools.partial`` of a module-level
    function, or the class itself when its constructor takes the seed)::

        import numpy as np
        from spectune.search import ProposalContext, Strategy

        class NearBest(Strategy):
            # Uniform among the configurations one parameter from the best so far.
            name = "near-best"

            def propose(self, ctx: ProposalContext) -> int | None:
                best = ctx.history.best_row()
                if best is None:
                    return None  # nothing succeeded yet: a uniform draw
                rows = np.flatnonzero(ctx.available)
                changed = (ctx.index.grid[rows] != ctx.index.grid[best]).sum(axis=1)
                near = rows[changed == 1]
                return int(ctx.rng.choice(near)) if len(near) else None

    Only the public methods here are the interface: a strategy of your own overrides
    those, and builds on a named strategy by wrapping it (build it with
    ``STRATEGIES[name](seed)`` and call its :meth:`propose` on the turns it should
    take), as :class:`~spectune.search.TransferStrategy` wraps its base.

    Attributes:
        name: A short name for reports.
    """

    name = "strategy"

    def propose(self, ctx: ProposalContext) -> int | None:
        """The next configuration to evaluate.

        Args:
            ctx: The space, the history and what is still available.

        Returns:
            A row of ``ctx.index`` that ``ctx.available`` allows, or ``None`` to let the
            engine draw an available row uniformly (with the same generator). A row
            that is not available is replaced by such a draw too.
        """
        raise NotImplementedError

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Called by Optuna before each trial (nothing by default)."""

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        """Called by Optuna after each trial (nothing by default)."""
