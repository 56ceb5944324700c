"""Transfer: a study starts from what other studies found, and stops trusting it fast.

A prior is an ordered list of configurations that did well elsewhere: the same kernel
tuned on other GPU models, neighbouring speculation lengths, batches or vocabularies on
this one (``spectune sweep`` reads them from the database), or the fastest
configurations of another recorded space (``spectune replay --prior``).
:class:`TransferStrategy` proposes them on alternate turns with the base strategy, and
drops the prior as soon as it stops paying off, so a prior that is wrong costs a few
evaluations, not the study:

* Turns alternate, the prior first: an evaluation from the prior, then one of the base
  strategy's, while the prior lasts. A prior configuration outside the space, or
  already evaluated or pending, is passed over.
* The study's first ``random_start`` evaluations, the prior's included, are all the
  start the base strategy gets: its turns until then are uniform draws, as its own start
  would have been, and it proposes from then on, on a history that holds the prior's
  evaluations too. (Measured by replay, ``benchmarks/bench_transfer.py``: starting the
  model only after ``random_start`` draws of its own delayed it by the prior's turns, and
  cost more at 20-50 evaluations than the clustered start it was meant to avoid.)
* The prior is dropped after ``misses`` of its evaluations in a row that missed: failed,
  or slower than the median of the base strategy's own successful evaluations so far.
  A prior evaluation made before any of those is judged once they come in, so a first
  pick as slow as can be counts as a miss, not as a free hit.

Everything is read from the study's history at each proposal, so a resumed study or
another worker reaches the same decisions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from spectune.search._strategy import History, ProposalContext, Strategy

__all__ = ["TransferStrategy"]


class TransferStrategy(Strategy):
    """A prior's configurations first, on alternate turns, until they stop paying off.

    Args:
        base: The strategy that searches on the other turns and after the prior.
        prior: Configurations to try, best first.
        misses: Prior evaluations in a row that miss (see :meth:`dropped`) and drop the
            prior.
        random_start: The study's first evaluations (the prior's included) before the
            base strategy proposes; its turns until then are uniform draws.
    """

    def __init__(
        self,
        base: Strategy,
        *,
        prior: Sequence[Mapping[str, int]],
        misses: int = 2,
        random_start: int = 5,
    ) -> None:
        if misses < 1:
            raise ValueError(f"misses must be >= 1, got {misses}")
        if random_start < 0:
            raise ValueError(f"random_start must be >= 0, got {random_start}")
        self.base = base
        self.prior = [dict(c) for c in prior]
        self.misses = misses
        self.random_start = random_start
        self.name = f"{base.name}+prior"
        self._rows: list[int] | None = None

    def prior_rows(self, ctx: ProposalContext) -> list[int]:
        """The prior as index rows, in order (configurations outside the space left out)."""
        if self._rows is None:
            rows: list[int] = []
            for config in self.prior:
                row = ctx.index.row(config)
                if row is not None and row not in rows:
                    rows.append(row)
            self._rows = rows
        return self._rows

    def propose(self, ctx: ProposalContext) -> int | None:
        h = ctx.history
        prior = self.prior_rows(ctx)
        members = set(prior)
        taken = [int(r) for r in (*h.rows, *h.pending)]
        from_prior = sum(1 for r in taken if r in members)
        own = len(taken) - from_prior
        if from_prior <= own:
            # The history is read for misses only while the prior has a pick left.
            pick = next((row for row in prior if ctx.available[row]), None)
            if pick is not None and not self.dropped(h, members):
                return pick
        if len(taken) < self.random_start:
            return None  # the sampler draws uniformly
        return self.base.propose(ctx)

    def dropped(self, history: History, members: set[int]) -> bool:
        """Whether the prior's last ``misses`` evaluations all missed.

        A prior evaluation hits when it is faster than the median of the base
        strategy's own successful evaluations so far (all of them, those after it
        included: the decision is made now, on what is known now; while the base has
        none, every successful one hits). A prior that still ranks its picks above the
        search's typical configuration keeps its turns, even when its first pick stays
        the best. A failure is a miss.
        """
        own = [float(t) for r, t in zip(history.rows, history.times, strict=True)
               if int(r) not in members and np.isfinite(t)]
        typical = float(np.median(own)) if own else math.inf
        run = 0
        for row, time in zip(history.rows, history.times, strict=True):
            if int(row) in members:
                run = 0 if np.isfinite(time) and time < typical else run + 1
        return run >= self.misses

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self.base.after_trial(study, trial, state, values)
