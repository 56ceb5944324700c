"""What a proposal of ``auto`` costs as a study grows, side by side with variants of it:
the GP's BLAS on as many threads as BLAS picks by itself instead of one (``blas``), and
the GP conditioned on every observation and scoring every candidate however long the
study, without the ``MODEL_POINTS`` and ``LATE_CANDIDATES`` limits (``all``), and
``auto`` before its kernel term over the block-size plane (``margin``).

    python benchmarks/bench_proposal_cost.py ../shared/tuning-spaces/convolution_A100_T4.json.gz \
        --repeats 5 --budget 200
    python benchmarks/bench_proposal_cost.py ../shared/tuning-spaces/dedispersion_A100_T4.json.gz \
        --repeats 2 --budget 800 --variants shipped,all

Replays ``auto`` on a recorded space (exact answers, so every evaluation is free) and
times each step from one evaluation to the next: the study read, the proposal (the GP's
fit and acquisition) and Optuna's bookkeeping. Every variant runs the same seeds, one
after the other, in this process; the thread count is left to BLAS (no
``OPENBLAS_NUM_THREADS``), as in ``spectune sweep``. Prints, per variant, the mean
milliseconds per evaluation over evaluations 2-100, 101-200, 201-400 and so on to
``--budget``, the slowest one, and each variant's ratio to the first.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import optuna

from spectune.search import SpaceIndex, Strategy, _gp, _strategies
from spectune.search.replay import RecordedSpace, StrategyFactory, engine_run, load_t4


class _Unlimited(_gp.GaussianProcess):
    """The GP without its one-thread limit (BLAS's own thread count)."""

    fit = _gp.GaussianProcess.fit.__wrapped__  # type: ignore[attr-defined]
    predict = _gp.GaussianProcess.predict.__wrapped__  # type: ignore[attr-defined]
    sample = _gp.GaussianProcess.sample.__wrapped__  # type: ignore[attr-defined]


def _auto_without_limits(seed: int) -> Strategy:
    """``auto`` on every observation and candidate (``auto`` before the limits)."""
    strategy = _strategies.make_strategy("auto", seed=seed)
    assert isinstance(strategy, _strategies.GPStrategy)
    strategy.model_points = None
    return strategy


#: Variant key: its label, the GP class and the strategy it runs with.
VARIANTS: dict[str, tuple[str, type[_gp.GaussianProcess], str | StrategyFactory]] = {
    "shipped": ("shipped", _gp.GaussianProcess, "auto"),
    "blas": ("BLAS's own threads", _Unlimited, "auto"),
    "all": ("all observations", _gp.GaussianProcess, _auto_without_limits),
    "margin": ("without the plane's term (gp-ei-margin)", _gp.GaussianProcess, "gp-ei-margin"),
}


@contextlib.contextmanager
def _gp_class(cls: type[_gp.GaussianProcess]) -> Iterator[None]:
    held = _strategies.GaussianProcess
    _strategies.GaussianProcess = cls  # type: ignore[misc]
    try:
        yield
    finally:
        _strategies.GaussianProcess = held  # type: ignore[misc]


def _step_times(
    space: RecordedSpace,
    index: SpaceIndex,
    *,
    sampler: str | StrategyFactory,
    repeats: int,
    budget: int,
) -> np.ndarray:
    """Seconds from each evaluation to the next, per seed (column 0 unused)."""
    out = np.zeros((repeats, budget))
    stamps: list[float] = []

    def stamp(_fraction: float) -> None:
        stamps.append(time.perf_counter())

    for seed in range(repeats):
        stamps.clear()
        engine_run(space, budget=budget, sampler=sampler, seed=seed, index=index,
                   on_evaluation=stamp)
        out[seed, 1:] = np.diff(stamps)
    return out


def _windows(budget: int) -> list[tuple[int, int]]:
    """Evaluation ranges the table reports: 2-100, then doubling (101-200, 201-400, ...),
    the last one ending at ``budget``."""
    out, lo, hi = [(2, 100)], 101, 200
    while lo <= budget:
        out.append((lo, min(hi, budget)))
        lo, hi = hi + 1, 2 * hi
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--variants", default="shipped,blas",
                        help=f"comma-separated, the first the reference: {', '.join(VARIANTS)}")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if args.budget < 101:
        parser.error("--budget must be at least 101")
    chosen = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown or not chosen:
        parser.error(f"--variants: choose among {', '.join(VARIANTS)}, got {args.variants!r}")
    space = load_t4(args.file)  # read and enumerated once for every variant
    index = SpaceIndex(space.space)
    windows = _windows(args.budget)
    means = {}
    print("| variant | " + " | ".join(f"ms/eval {lo}-{hi}" for lo, hi in windows)
          + " | slowest ms |")
    print("|---" * (len(windows) + 2) + "|")
    for key in chosen:
        label, gp_class, sampler = VARIANTS[key]
        with _gp_class(gp_class):
            steps = _step_times(space, index, sampler=sampler, repeats=args.repeats,
                                budget=args.budget)
        # steps[:, i] is the step that ends at evaluation i + 1
        means[label] = [steps[:, lo - 1:hi].mean() * 1e3 for lo, hi in windows]
        print(f"| {label} | " + " | ".join(f"{m:.1f}" for m in means[label])
              + f" | {steps.max() * 1e3:.0f} |", flush=True)
    ref, *others = means
    for label in others:
        ratios = ", ".join(f"{o / r:.2f}x at {lo}-{hi}" for o, r, (lo, hi)
                           in zip(means[label], means[ref], windows, strict=True))
        print(f"\n{label} / {ref}: {ratios} ({args.repeats} seeds of {args.file.name})")


if __name__ == "__main__":
    main()
