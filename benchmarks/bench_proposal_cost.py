"""What a proposal of ``auto`` costs as a study grows, with the GP's BLAS on one thread
(as shipped) and on as many threads as BLAS picks by itself, side by side.

    python benchmarks/bench_proposal_cost.py ../shared/tuning-spaces/convolution_A100_T4.json.gz \
        --repeats 5 --budget 200

Replays ``auto`` on a recorded space (exact answers, so every evaluation is free) and
times each step from one evaluation to the next: the study read, the proposal (the GP's
fit and acquisition) and Optuna's bookkeeping. Both variants run the same seeds, one
after the other, in this process; the thread count is left to BLAS (no
``OPENBLAS_NUM_THREADS``), as in ``spectune sweep``. Prints, per variant, the mean
milliseconds per evaluation over evaluations 2-100 and 101-``budget``, the slowest one,
and the ratio of the two variants' means.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import optuna

from spectune.autotune import SpaceIndex, _gp, _strategies
from spectune.autotune.replay import RecordedSpace, engine_run, load_t4


class _Unlimited(_gp.GaussianProcess):
    """The GP without its one-thread limit (BLAS's own thread count)."""

    fit = _gp.GaussianProcess.fit.__wrapped__  # type: ignore[attr-defined]
    predict = _gp.GaussianProcess.predict.__wrapped__  # type: ignore[attr-defined]
    sample = _gp.GaussianProcess.sample.__wrapped__  # type: ignore[attr-defined]


@contextlib.contextmanager
def _gp_class(cls: type[_gp.GaussianProcess]) -> Iterator[None]:
    held = _strategies.GaussianProcess
    _strategies.GaussianProcess = cls  # type: ignore[misc]
    try:
        yield
    finally:
        _strategies.GaussianProcess = held  # type: ignore[misc]


def _step_times(
    space: RecordedSpace, index: SpaceIndex, *, repeats: int, budget: int
) -> np.ndarray:
    """Seconds from each evaluation to the next, per seed (column 0 unused)."""
    out = np.zeros((repeats, budget))
    stamps: list[float] = []

    def stamp(_fraction: float) -> None:
        stamps.append(time.perf_counter())

    for seed in range(repeats):
        stamps.clear()
        engine_run(space, budget=budget, sampler="auto", seed=seed, index=index,
                   on_evaluation=stamp)
        out[seed, 1:] = np.diff(stamps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=int, default=200)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if args.budget < 101:
        parser.error("--budget must be at least 101")
    space = load_t4(args.file)  # read and enumerated once for both variants
    index = SpaceIndex(space.space)
    means = {}
    print(f"| GP's BLAS | ms/eval 2-100 | ms/eval 101-{args.budget} | slowest ms |")
    print("|---|---|---|---|")
    for name, cls in (("one thread (shipped)", _gp.GaussianProcess), ("BLAS's own", _Unlimited)):
        with _gp_class(cls):
            steps = _step_times(space, index, repeats=args.repeats, budget=args.budget)
        early, late = steps[:, 1:100].mean() * 1e3, steps[:, 100:].mean() * 1e3
        means[name] = (early, late)
        print(f"| {name} | {early:.1f} | {late:.1f} | {steps.max() * 1e3:.0f} |", flush=True)
    (e1, l1), (e2, l2) = means.values()
    print(f"\nBLAS's own / one thread: {e2 / e1:.2f}x at 2-100, {l2 / l1:.2f}x at "
          f"101-{args.budget} ({args.repeats} seeds of {args.file.name})")


if __name__ == "__main__":
    main()
