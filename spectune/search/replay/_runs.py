"""Replay runs: the search engine and random search answered from a recorded space.

Each proposal of the engine is answered from a T4 file (a
:class:`~spectune.search.replay.RecordedSpace`): the recorded mean time, or with
``noisy`` one recorded run drawn at random, charged with the recorded compile time.
Failed configurations are failed trials. Random search, drawing configurations of the
file uniformly without replacement (failures included), is the baseline. Both are scored
as fractions of the optimum (:func:`~spectune.search.replay.fraction_curve`).

The engine's strategies are anytime (none looks at the budget), so the score after
``b`` evaluations of one run of ``max(budgets)`` evaluations is the score of a run of
budget ``b``; one run per seed serves every budget.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from spectune.search._engine import Search
from spectune.search._outcome import Outcome
from spectune.search._space_index import SpaceIndex
from spectune.search._strategies import STRATEGIES, make_strategy
from spectune.search._strategy import Strategy
from spectune.search._transfer import TransferStrategy
from spectune.search.replay._scores import ReplayReport, budget_results, fraction_curve
from spectune.search.replay._t4 import RecordedSpace, load_t4

__all__ = ["StrategyFactory", "engine_run", "random_run", "replay"]

#: Builds a strategy from a seed.
StrategyFactory = Callable[[int], Strategy]


def replay(
    recorded: str | Path | RecordedSpace,
    *,
    budget: int = 100,
    repeats: int = 50,
    sampler: str | StrategyFactory = "auto",
    seed: int = 0,
    noisy: bool = False,
    workers: int = 1,
    progress: Callable[[int], None] | None = None,
    warm_start: Sequence[Mapping[str, int]] = (),
    prior: Sequence[Mapping[str, int]] = (),
) -> ReplayReport:
    """Replay the engine and random search on a recorded space.

    Args:
        recorded: A T4 file or a loaded :class:`RecordedSpace`.
        budget: Largest number of evaluations per run.
        repeats: Seeds per budget (engine and random search alike).
        sampler: Engine strategy: a name of :data:`~spectune.search.STRATEGIES`, or
            a picklable factory taking the seed and returning a
            :class:`~spectune.search.Strategy` (a strategy of your own).
        seed: Base seed; run ``i`` uses a seed derived from ``(seed, i)``.
        noisy: Answer with one recorded run instead of the mean.
        workers: Processes running seeds in parallel.
        progress: Called with the number of runs finished, after each (engine and
            random runs count alike; ``2 * repeats`` in all).
        warm_start: Configurations every engine run evaluates first, charged (a prior:
            :func:`~spectune.search.replay.prior_configs`); random search gets none.
        prior: Configurations proposed by a
            :class:`~spectune.search.TransferStrategy` around the strategy (on
            alternate turns, dropped when they stop improving); random search gets none.

    Raises:
        ValueError: naming the argument, for a non-positive budget, repeats or workers,
            or an unknown sampler.
    """
    for name, value in (("budget", budget), ("repeats", repeats), ("workers", workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(sampler, str) and sampler not in STRATEGIES:
        raise ValueError(f"sampler must be one of {sorted(STRATEGIES)}, got {sampler!r}")
    if not isinstance(sampler, str) and not callable(sampler):
        raise ValueError(f"sampler must be a name or a strategy factory, got {sampler!r}")
    space = recorded if isinstance(recorded, RecordedSpace) else load_t4(recorded)
    seeds = [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(repeats)]

    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done)

    engine: list[tuple[np.ndarray, float]] = []
    randoms: list[np.ndarray] = []
    if workers == 1:
        index = SpaceIndex(space.space)
        for s in seeds:
            engine.append(
                engine_run(space, budget=budget, sampler=sampler, seed=s, noisy=noisy,
                           index=index, warm_start=warm_start, prior=prior)
            )
            tick()
        for s in seeds:
            randoms.append(random_run(space, budget=budget, seed=s, noisy=noisy))
            tick()
    else:
        ctx = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(space,)
        ) as pool:
            futures = [pool.submit(_engine_job, budget, sampler, s, noisy, list(warm_start),
                                   list(prior)) for s in seeds]
            rfutures = [pool.submit(_random_job, budget, s, noisy) for s in seeds]
            for f in futures:
                engine.append(f.result())
                tick()
            for f in rfutures:
                randoms.append(f.result())
                tick()

    curves = np.vstack([c for c, _ in engine])
    rcurves = np.vstack(randoms)
    return ReplayReport(
        file=str(recorded if not isinstance(recorded, RecordedSpace) else recorded.name),
        optimum=space.optimum,
        sampler=sampler if isinstance(sampler, str) else getattr(sampler, "name", repr(sampler)),
        repeats=repeats,
        noisy=noisy,
        results=budget_results(curves, rcurves, budget=budget),
        engine_curves=curves,
        random_curves=rcurves,
        engine_seconds=np.array([s for _, s in engine]),
    )


def engine_run(
    space: RecordedSpace,
    *,
    budget: int,
    sampler: str | StrategyFactory,
    seed: int,
    noisy: bool = False,
    index: SpaceIndex | None = None,
    warm_start: Sequence[Mapping[str, int]] = (),
    prior: Sequence[Mapping[str, int]] = (),
    on_evaluation: Callable[[float], None] | None = None,
) -> tuple[np.ndarray, float]:
    """One engine run on a recorded space.

    Args:
        space: The recorded space.
        budget: Evaluations.
        sampler: A strategy name or a factory taking the seed.
        seed: Seed of the strategy and of the noisy answers.
        noisy: Answer with one recorded run instead of the mean, charging the recorded
            compile time and runtime.
        index: The space's enumeration, to reuse one across runs.
        warm_start: Configurations evaluated first (charged), in order.
        prior: Configurations a :class:`~spectune.search.TransferStrategy` proposes.
        on_evaluation: Called after each evaluation, before the next proposal, with
            that evaluation's fraction of the optimum by its recorded mean (0.0 for a
            failure): what a benchmark of single proposals reads
            (``benchmarks/bench_proposal_cost.py``).

    Returns:
        The best fraction of the optimum after each evaluation, and the seconds charged.
    """
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rng = np.random.default_rng(seed)
    observed: list[tuple[float, float]] = []  # (observed time, recorded mean) per evaluation

    def objective(config: dict[str, int]) -> Outcome:
        record = space.lookup(config)
        charged = record.compile_time / 1000.0 if noisy else 0.0
        if not record.ok:
            observed.append((math.inf, math.inf))
            if on_evaluation is not None:
                on_evaluation(0.0)
            return Outcome.failed(_failure_kind(record.status), record.status, cost=charged)
        assert record.time is not None
        value = _answer(record.time, record.runtimes, rng, noisy)
        observed.append((value, record.time))
        if on_evaluation is not None:
            on_evaluation(space.optimum / record.time)
        return Outcome.ok(value, cost=charged + (value / 1000.0 if noisy else 0.0))

    strategy = make_strategy(sampler, seed=seed) if isinstance(sampler, str) else sampler(seed)
    if prior:
        strategy = TransferStrategy(strategy, prior=prior)
    engine = Search(space=index or space.space, sampler=strategy, seed=seed,
                    warm_start=list(warm_start))
    result = engine.run(objective, max_evals=budget)
    return fraction_curve(observed, optimum=space.optimum, budget=budget), float(result.spent)


def random_run(space: RecordedSpace, *, budget: int, seed: int, noisy: bool = False) -> np.ndarray:
    """Random search without replacement over the recorded configurations.

    Failures are drawn too, and charged as evaluations.

    Args:
        space: The recorded space.
        budget: Evaluations.
        seed: Seed of the draw order and of the noisy answers.
        noisy: Answer with one recorded run instead of the mean.

    Returns:
        The fraction of the optimum after each evaluation.
    """
    rng = np.random.default_rng([seed, 1])
    records = list(space.records.values())
    order = rng.permutation(len(records))[:budget]
    observed = []
    for i in order:
        record = records[int(i)]
        if not record.ok or record.time is None:
            observed.append((math.inf, math.inf))
        else:
            observed.append((_answer(record.time, record.runtimes, rng, noisy), record.time))
    return fraction_curve(observed, optimum=space.optimum, budget=budget)


def _answer(mean: float, runtimes: Sequence[float], rng: np.random.Generator, noisy: bool) -> float:
    if noisy and runtimes:
        return float(runtimes[int(rng.integers(len(runtimes)))])
    return mean


def _failure_kind(status: str) -> str:
    return {"compile": "compile", "runtime": "runtime", "timeout": "timeout"}.get(status, "other")


_WORKER_SPACE: dict[str, Any] = {}


def _init_worker(space: RecordedSpace) -> None:
    _WORKER_SPACE["space"] = space
    _WORKER_SPACE["index"] = SpaceIndex(space.space)


def _engine_job(
    budget: int, sampler: str | StrategyFactory, seed: int, noisy: bool,
    warm_start: Sequence[Mapping[str, int]] = (),
    prior: Sequence[Mapping[str, int]] = (),
) -> tuple[np.ndarray, float]:
    return engine_run(
        _WORKER_SPACE["space"],
        budget=budget,
        sampler=sampler,
        seed=seed,
        noisy=noisy,
        index=_WORKER_SPACE.get("index"),
        warm_start=warm_start,
        prior=prior,
    )


def _random_job(budget: int, seed: int, noisy: bool) -> np.ndarray:
    return random_run(_WORKER_SPACE["space"], budget=budget, seed=seed, noisy=noisy)
