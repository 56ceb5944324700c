"""Kernel Tuner's search strategies as peers, replayed on the same recorded spaces.

Benchmark-only (``pip install 'spectune[bench]'``): Kernel Tuner 1.5 runs in its
simulation mode, answering every configuration from a cache file written here from the
T4 file. Everything else is as in :func:`spectune.search.replay.replay`: the same
space (every recorded configuration, failures included), the same seeds, the same score
(best recorded time over the recorded mean of the configuration held as best), and the
same random-search baseline.

How the evaluations are counted, and how that differs from Kernel Tuner's own reports:

* Evaluation ``i`` of a curve is the ``i``-th *distinct* configuration Kernel Tuner ran,
  which is also what its ``max_fevals`` counts: a configuration it asks for again is
  answered from its cache and not charged. Ours never asks twice.
* Failed configurations (recorded compile or run-time failures) are charged, by Kernel
  Tuner and by us alike. Kernel Tuner's own ``tune_cache`` instead restricts the space to
  the configurations that succeeded, so a strategy never meets a failure there; figures
  published from it are not comparable with ours.
* A strategy that stops before its budget (``dual_annealing``: scipy's ``maxfun`` also
  counts the repeats; ``simulated_annealing``: its schedule ends at 0.75 x the budget)
  keeps its last score for the remaining budgets.
* Kernel Tuner draws from Python's and NumPy's global generators, seeded here per run;
  ``diff_evo`` and ``bayes_opt`` also draw a Latin hypercube from a generator that is
  not seeded, so their runs do not repeat exactly.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import random
import tempfile
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from spectune.search.replay import RecordedSpace
from spectune.search.replay._runs import random_run
from spectune.search.replay._scores import ReplayReport, budget_results, fraction_curve

__all__ = ["KT_STRATEGIES", "kt_replay", "write_kt_cache"]

#: The Kernel Tuner strategies compared (the issue's list, plus particle swarm).
KT_STRATEGIES = (
    "genetic_algorithm",
    "dual_annealing",
    "greedy_ils",
    "simulated_annealing",
    "bayes_opt",
    "random_sample",
    "pso",
)

#: Kernel Tuner's names for the recorded failure kinds (anything else: a run-time failure).
_FAILED = {"compile": "CompilationFailedConfig"}


def _file_values(space: RecordedSpace, key: tuple[int, ...]) -> tuple[Any, ...]:
    out = []
    for name, code in zip(space.space.names, key, strict=True):
        decode = space.decode.get(name)
        out.append(decode[code] if decode else code)
    return tuple(out)


def _cache_key(values: Sequence[Any]) -> str:
    # Kernel Tuner keys its cache by the comma-joined str() of the values.
    return ",".join(str(v) for v in values)


def write_kt_cache(space: RecordedSpace, path: Path) -> dict[str, list[Any]]:
    """Write ``space`` as a Kernel Tuner cache file; return its tunable parameters."""
    names = list(space.space.names)
    rows = {key: _file_values(space, key) for key in space.records}
    tune_params = {
        name: sorted({values[i] for values in rows.values()}) for i, name in enumerate(names)
    }
    cache: dict[str, dict[str, Any]] = {}
    for key, record in space.records.items():
        entry: dict[str, Any] = dict(zip(names, rows[key], strict=True))
        if record.ok and record.time is not None:
            entry.update(time=record.time, times=list(record.runtimes))
        else:
            entry["time"] = _FAILED.get(record.status, "RuntimeFailedConfig")
        entry.update(compile_time=record.compile_time, verification_time=0, benchmark_time=0)
        cache[_cache_key(rows[key])] = entry
    document = {
        "device_name": "replay", "kernel_name": space.name, "problem_size": [1],
        "tune_params_keys": names, "tune_params": tune_params, "objective": "time",
        "cache": cache,
    }
    path.write_text(json.dumps(document))
    return tune_params


def kt_run(
    space: RecordedSpace, *, strategy: str, budget: int, seed: int, cache: Path,
    tune_params: dict[str, list[Any]],
) -> np.ndarray:
    """One Kernel Tuner run; the fraction of the optimum after each distinct evaluation."""
    import kernel_tuner
    from constraint import FunctionConstraint

    names = list(space.space.names)
    members = {_file_values(space, key) for key in space.records}

    def recorded(*values: Any) -> bool:  # the space: every configuration of the file
        return values in members

    random.seed(seed)
    np.random.seed(seed % 2**32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            results, _ = kernel_tuner.tune_kernel(
                space.name, "", (1,), [], tune_params, strategy=strategy,
                strategy_options={"max_fevals": budget}, cache=str(cache),
                simulation_mode=True, restrictions=[FunctionConstraint(recorded)],
                quiet=True, verbose=False,
            )
    seen: set[str] = set()
    observed: list[tuple[float, float]] = []
    for result in results:
        key = _cache_key([result[n] for n in names])
        if key in seen:
            continue
        seen.add(key)
        time = result.get("time")
        ok = "__error__" not in result and isinstance(time, int | float) and math.isfinite(time)
        observed.append((float(time), float(time)) if ok else (math.inf, math.inf))
    return fraction_curve(observed[:budget], optimum=space.optimum, budget=budget)


_WORKER: dict[str, Any] = {}


def _init(space: RecordedSpace, cache: Path, tune_params: dict[str, list[Any]]) -> None:
    _WORKER.update(space=space, cache=cache, tune_params=tune_params)


def _job(strategy: str, budget: int, seed: int) -> np.ndarray:
    return kt_run(_WORKER["space"], strategy=strategy, budget=budget, seed=seed,
                  cache=_WORKER["cache"], tune_params=_WORKER["tune_params"])


def kt_replay(
    space: RecordedSpace, *, strategy: str, budget: int, repeats: int, seed: int = 0,
    workers: int = 1,
) -> ReplayReport:
    """Kernel Tuner's ``strategy`` replayed like :func:`~spectune.search.replay.replay`.

    Args:
        space: The recorded space.
        strategy: A Kernel Tuner strategy name (see :data:`KT_STRATEGIES`).
        budget: Distinct evaluations per run.
        repeats: Seeds; run ``i`` uses the seed :func:`replay` gives run ``i``.
        seed: Base seed.
        workers: Processes running seeds in parallel.
    """
    seeds = [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(repeats)]
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache.json"
        tune_params = write_kt_cache(space, cache)
        if workers == 1:
            curves = [kt_run(space, strategy=strategy, budget=budget, seed=s, cache=cache,
                             tune_params=tune_params) for s in seeds]
        else:
            ctx = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init,
                                     initargs=(space, cache, tune_params)) as pool:
                curves = list(pool.map(_job, [strategy] * repeats, [budget] * repeats, seeds))
    randoms = [random_run(space, budget=budget, seed=s) for s in seeds]
    engine, rand = np.vstack(curves), np.vstack(randoms)
    return ReplayReport(
        file=space.name, optimum=space.optimum, sampler=f"kt-{strategy}", repeats=repeats,
        noisy=False, results=budget_results(engine, rand, budget=budget), engine_curves=engine,
        random_curves=rand, engine_seconds=np.zeros(repeats),
    )
