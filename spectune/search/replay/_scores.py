"""How a replay is scored: the fraction of the optimum after each evaluation, per budget.

After ``b`` evaluations the score of a run is the best recorded time of the space divided
by the recorded mean time of the configuration the search holds as best (the one with the
lowest time it observed); a run that has held nothing but failures scores 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BUDGETS",
    "BudgetResult",
    "ReplayReport",
    "budget_results",
    "budgets_up_to",
    "fraction_curve",
]

#: Budgets reported, up to the requested one.
BUDGETS = (10, 20, 50, 100, 200)


@dataclass(frozen=True)
class BudgetResult:
    """Scores at one budget over all seeds.

    Attributes:
        budget: Evaluations.
        median_fraction: Median fraction of the optimum reached by the engine.
        q25_fraction: Its lower quartile.
        q75_fraction: Its upper quartile.
        random_median_fraction: Median fraction reached by random search.
        random_q25_fraction: Random search's lower quartile.
        random_q75_fraction: Random search's upper quartile.
    """

    budget: int
    median_fraction: float
    q25_fraction: float
    q75_fraction: float
    random_median_fraction: float
    random_q25_fraction: float
    random_q75_fraction: float


@dataclass(frozen=True)
class ReplayReport:
    """The outcome of :func:`~spectune.search.replay.replay`.

    Attributes:
        file: The T4 file replayed.
        optimum: Best recorded time among correct configurations.
        sampler: The engine's strategy.
        repeats: Seeds per budget.
        noisy: Whether answers were single recorded runs.
        results: One entry per budget.
        engine_curves: Fraction of the optimum after each evaluation, one row per seed.
        random_curves: The same for random search.
        engine_seconds: Seconds the engine was charged per run (with ``noisy``, the
            recorded compile times and runtimes), plus its own time; one per seed.
    """

    file: str
    optimum: float
    sampler: str
    repeats: int
    noisy: bool
    results: tuple[BudgetResult, ...]
    engine_curves: np.ndarray
    random_curves: np.ndarray
    engine_seconds: np.ndarray

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document of ``spectune replay``."""
        return {
            "file": self.file,
            "optimum": self.optimum,
            "results": [
                {
                    "budget": r.budget,
                    "median_fraction": r.median_fraction,
                    "q25_fraction": r.q25_fraction,
                    "q75_fraction": r.q75_fraction,
                    "random_median_fraction": r.random_median_fraction,
                }
                for r in self.results
            ],
        }


def budgets_up_to(budget: int) -> list[int]:
    """The reported budgets up to ``budget`` (``budget`` itself included)."""
    out = [b for b in BUDGETS if b <= budget]
    if budget not in out:
        out.append(budget)
    return out


def fraction_curve(
    observed: Sequence[tuple[float, float]], *, optimum: float, budget: int
) -> np.ndarray:
    """Fraction of the optimum after each of ``budget`` evaluations.

    Args:
        observed: ``(observed time, recorded mean)`` per evaluation, ``inf`` for both
            when it failed.
        optimum: Best recorded time of the space.
        budget: Length of the curve; a run that ended early (exhausted space) keeps
            its last value.
    """
    out = np.zeros(budget)
    best_seen = math.inf
    held = math.inf  # recorded mean of the config held as best
    for i in range(budget):
        if i < len(observed):
            seen, mean = observed[i]
            if seen < best_seen:
                best_seen, held = seen, mean
        out[i] = optimum / held if math.isfinite(held) else 0.0
    return out


def budget_results(
    engine: np.ndarray, random: np.ndarray, *, budget: int
) -> tuple[BudgetResult, ...]:
    """Median and quartiles over seeds at each reported budget up to ``budget``.

    Args:
        engine: The engine's curves, one row per seed.
        random: Random search's curves, one row per seed.
        budget: The largest budget.
    """
    results = []
    for b in budgets_up_to(budget):
        e = engine[:, b - 1]
        r = random[:, b - 1]
        results.append(
            BudgetResult(
                budget=b,
                median_fraction=float(np.median(e)),
                q25_fraction=float(np.quantile(e, 0.25)),
                q75_fraction=float(np.quantile(e, 0.75)),
                random_median_fraction=float(np.median(r)),
                random_q25_fraction=float(np.quantile(r, 0.25)),
                random_q75_fraction=float(np.quantile(r, 0.75)),
            )
        )
    return tuple(results)
